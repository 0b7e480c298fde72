//! The walls around code that reads untrusted files: the document reader (`hillside-ingest`) and
//! poppler's `pdftotext`. A parser bug there must not become the user's files or the network:
//!
//! - a system-call filter (seccomp) refuses sockets, new processes (threads are allowed), a
//!   second program, tracing, signals to other processes and io_uring (whose operations the
//!   filter would not see), and every call that changes the filesystem; the reader may not open
//!   a file at all;
//! - Landlock, where the kernel has it (Linux 5.13 and later), confines what can be opened: the
//!   reader nothing, `pdftotext` its one input file and the system's read-only folders it loads
//!   from (`/usr`, `/lib`, `/etc/fonts`, …), and it may run `pdftotext` alone;
//! - resource limits: open files, the size of any file written (none), new processes.
//!
//! A kernel without Landlock still filters system calls, so neither reads a user's file or
//! reaches the network; but `pdftotext` could then read any file the user can (its output only
//! comes back as the document's text, to the same user).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// What the confined program is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinee {
    /// The reader: opens nothing, runs nothing.
    Reader,
    /// `pdftotext`, about to be run: its `execve` is allowed.
    Poppler,
}

/// What Landlock lets `pdftotext` do with a file or a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadAndRun,
}

/// A filter and a ruleset, made before a child is forked so that applying them in the child
/// (between fork and exec) allocates nothing.
pub struct Walls {
    filter: Vec<libc::sock_filter>,
    /// The Landlock ruleset; `None` where the kernel lacks Landlock.
    ruleset: Option<OwnedFd>,
    open_files: u64,
}

impl Walls {
    /// The walls for `who`. `own_pid`: the process they are for, where it is known (the only
    /// one it may signal); `readable` (Poppler only): what it may read, and whether it may also
    /// run programs there (its own, the dynamic loader).
    pub fn new(who: Confinee, own_pid: Option<u32>, readable: &[(&Path, Access)]) -> io::Result<Self> {
        let ruleset = landlock::ruleset(who, readable)?;
        let open_files = match who {
            Confinee::Reader => 32,
            Confinee::Poppler => 64,
        };
        Ok(Self { filter: seccomp::program(who, own_pid), ruleset, open_files })
    }

    /// Whether a Landlock ruleset is among the walls.
    pub fn has_landlock(&self) -> bool {
        self.ruleset.is_some()
    }

    /// Applies the walls to this process (and every thread and child it makes from now on).
    /// Async-signal-safe: only system calls, so that it can run between fork and exec.
    pub fn enter(&self) -> io::Result<()> {
        set_limit(libc::RLIMIT_NOFILE, self.open_files)?;
        set_limit(libc::RLIMIT_FSIZE, 0)?;
        // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(ruleset) = &self.ruleset {
            landlock::restrict_self(ruleset)?;
        }
        seccomp::install(&self.filter)
    }
}

/// No new processes from here on (threads count too, so a process calls it once its threads
/// are started). Root is exempt from this limit; the filter refuses a fork for everyone.
pub fn no_more_processes() -> io::Result<()> {
    set_limit(libc::RLIMIT_NPROC, 0)
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads the one struct it is given.
    match unsafe { libc::setrlimit(resource, &limit) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

mod seccomp {
    use super::Confinee;

    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xc000_00b7;
    /// `struct seccomp_data`: the call's number, its architecture, then its arguments.
    const NR: u32 = 0;
    const ARCH_AT: u32 = 4;
    const fn arg_low(i: u32) -> u32 {
        16 + 8 * i
    }

    fn load(at: u32) -> libc::sock_filter {
        libc::sock_filter { code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, jt: 0, jf: 0, k: at }
    }
    fn jump(op: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter { code: (libc::BPF_JMP | op | libc::BPF_K) as u16, jt, jf, k }
    }
    fn ret(k: u32) -> libc::sock_filter {
        libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k }
    }
    fn errno(e: i32) -> u32 {
        RET_ERRNO | e as u32
    }

    /// Calls refused outright, with the error each gets.
    fn refused(who: Confinee) -> Vec<(libc::c_long, u32)> {
        let eperm = errno(libc::EPERM);
        let eacces = errno(libc::EACCES);
        let mut calls = vec![
            // No network.
            (libc::SYS_socket, eacces),
            (libc::SYS_socketpair, eacces),
            // No other program, no tracing, no signals but to itself (tgkill below).
            (libc::SYS_execveat, eperm),
            (libc::SYS_ptrace, eperm),
            (libc::SYS_process_vm_readv, eperm),
            (libc::SYS_process_vm_writev, eperm),
            (libc::SYS_kill, eperm),
            (libc::SYS_tkill, eperm),
            (libc::SYS_pidfd_open, eperm),
            (libc::SYS_pidfd_send_signal, eperm),
            // Its operations would pass the filter unseen.
            (libc::SYS_io_uring_setup, eperm),
            // Nothing on the filesystem changes.
            (libc::SYS_unlinkat, eacces),
            (libc::SYS_renameat2, eacces),
            (libc::SYS_mkdirat, eacces),
            (libc::SYS_mknodat, eacces),
            (libc::SYS_linkat, eacces),
            (libc::SYS_symlinkat, eacces),
            (libc::SYS_fchmodat, eacces),
            (libc::SYS_fchownat, eacces),
            (libc::SYS_truncate, eacces),
            (libc::SYS_mount, eperm),
            (libc::SYS_chroot, eperm),
            (libc::SYS_setxattr, eacces),
            (libc::SYS_removexattr, eacces),
        ];
        #[cfg(target_arch = "x86_64")]
        calls.extend([
            (libc::SYS_fork, eperm),
            (libc::SYS_vfork, eperm),
            (libc::SYS_unlink, eacces),
            (libc::SYS_rename, eacces),
            (libc::SYS_renameat, eacces),
            (libc::SYS_rmdir, eacces),
            (libc::SYS_mkdir, eacces),
            (libc::SYS_mknod, eacces),
            (libc::SYS_link, eacces),
            (libc::SYS_symlink, eacces),
            (libc::SYS_chmod, eacces),
            (libc::SYS_chown, eacces),
            (libc::SYS_lchown, eacces),
            (libc::SYS_creat, eacces),
        ]);
        if who == Confinee::Reader {
            calls.extend([(libc::SYS_execve, eperm), (libc::SYS_openat, eacces), (libc::SYS_openat2, eacces)]);
            #[cfg(target_arch = "x86_64")]
            calls.push((libc::SYS_open, eacces));
        }
        calls
    }

    /// The filter: a foreign architecture is killed, refused calls get their error, `clone`
    /// makes threads only, `clone3` is refused as unknown (so the C library falls back to
    /// `clone`, whose flags the filter can see), `tgkill` signals only `own_pid`.
    pub fn program(who: Confinee, own_pid: Option<u32>) -> Vec<libc::sock_filter> {
        let mut p = vec![load(ARCH_AT), jump(libc::BPF_JEQ, ARCH, 1, 0), ret(RET_KILL_PROCESS), load(NR)];
        // x32 calls are numbered from 2^30 and take another table.
        #[cfg(target_arch = "x86_64")]
        p.extend([jump(libc::BPF_JGE, 0x4000_0000, 0, 1), ret(RET_KILL_PROCESS)]);
        for (call, action) in refused(who) {
            p.extend([jump(libc::BPF_JEQ, call as u32, 0, 1), ret(action)]);
        }
        p.extend([jump(libc::BPF_JEQ, libc::SYS_clone3 as u32, 0, 1), ret(errno(libc::ENOSYS))]);
        if let Some(pid) = own_pid {
            p.extend([
                jump(libc::BPF_JEQ, libc::SYS_tgkill as u32, 0, 4),
                load(arg_low(0)),
                jump(libc::BPF_JEQ, pid, 0, 1),
                ret(RET_ALLOW),
                ret(errno(libc::EPERM)),
            ]);
        }
        // Last, since it loads an argument: clone with CLONE_THREAD, or nothing.
        p.extend([
            jump(libc::BPF_JEQ, libc::SYS_clone as u32, 0, 4),
            load(arg_low(0)),
            jump(libc::BPF_JSET, libc::CLONE_THREAD as u32, 0, 1),
            ret(RET_ALLOW),
            ret(errno(libc::EPERM)),
            ret(RET_ALLOW),
        ]);
        p
    }

    pub fn install(filter: &[libc::sock_filter]) -> std::io::Result<()> {
        let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
        // SAFETY: the kernel copies the program, which lives (in `filter`) for the whole call.
        let done = unsafe {
            libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &program as *const libc::sock_fprog)
        };
        match done {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

mod landlock {
    use super::{Access, AsRawFd, Confinee, FromRawFd, OwnedFd, Path};
    use std::io;

    // The kernel's numbers (uapi/linux/landlock.h); the same on every architecture.
    const SYS_CREATE_RULESET: libc::c_long = 444;
    const SYS_ADD_RULE: libc::c_long = 445;
    const SYS_RESTRICT_SELF: libc::c_long = 446;
    const CREATE_RULESET_VERSION: u32 = 1;
    const RULE_PATH_BENEATH: u32 = 1;
    const EXECUTE: u64 = 1 << 0;
    const READ_FILE: u64 = 1 << 2;
    const READ_DIR: u64 = 1 << 3;
    /// Every filesystem right of each ABI version (1: 13 rights, 2: +refer, 3: +truncate,
    /// 5: +ioctl on devices).
    fn fs_rights(abi: i64) -> u64 {
        match abi {
            1 => (1 << 13) - 1,
            2 => (1 << 14) - 1,
            3 | 4 => (1 << 15) - 1,
            _ => (1 << 16) - 1,
        }
    }
    /// Network rights (ABI 4: bind and connect over TCP) and scopes (ABI 6: abstract Unix
    /// sockets and signals outside the domain).
    fn net_rights(abi: i64) -> u64 {
        if abi >= 4 {
            0b11
        } else {
            0
        }
    }
    fn scopes(abi: i64) -> u64 {
        if abi >= 6 {
            0b11
        } else {
            0
        }
    }

    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }

    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }

    fn abi() -> i64 {
        // SAFETY: with a null attribute and this flag the call only returns the ABI version.
        unsafe { libc::syscall(SYS_CREATE_RULESET, std::ptr::null::<RulesetAttr>(), 0, CREATE_RULESET_VERSION) }
    }

    /// The ruleset for `who`: the reader may open nothing; pdftotext may read `readable` (its
    /// input and the system folders it loads from) and run the programs among them. `None`
    /// where the kernel has no Landlock.
    pub fn ruleset(who: Confinee, readable: &[(&Path, Access)]) -> io::Result<Option<OwnedFd>> {
        let abi = abi();
        if abi < 1 {
            return Ok(None);
        }
        let attr =
            RulesetAttr { handled_access_fs: fs_rights(abi), handled_access_net: net_rights(abi), scoped: scopes(abi) };
        // SAFETY: the kernel reads `attr`, of the size given, and returns a new descriptor.
        let fd = unsafe { libc::syscall(SYS_CREATE_RULESET, &attr as *const RulesetAttr, size_of::<RulesetAttr>(), 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just returned, owned by nobody else.
        let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if who == Confinee::Poppler {
            for &(path, access) in readable {
                let Ok(opened) = std::fs::File::open(path) else { continue }; // not on this system
                let is_dir = opened.metadata().is_ok_and(|m| m.is_dir());
                let run = if access == Access::ReadAndRun { EXECUTE } else { 0 };
                let rights = if is_dir { READ_FILE | READ_DIR | run } else { READ_FILE | run };
                let rule = PathBeneath { allowed_access: rights, parent_fd: opened.as_raw_fd() };
                // SAFETY: the kernel reads `rule` and the two descriptors, all live for the call.
                let added = unsafe {
                    libc::syscall(SYS_ADD_RULE, ruleset.as_raw_fd(), RULE_PATH_BENEATH, &rule as *const PathBeneath, 0)
                };
                if added != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(Some(ruleset))
    }

    pub fn restrict_self(ruleset: &OwnedFd) -> io::Result<()> {
        // SAFETY: takes a ruleset descriptor and flags, nothing else.
        match unsafe { libc::syscall(SYS_RESTRICT_SELF, ruleset.as_raw_fd(), 0) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}
