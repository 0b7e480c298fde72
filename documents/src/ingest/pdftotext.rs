//! Poppler's `pdftotext`, where it is installed: the fallback for PDFs, or pages, the built-in
//! reader cannot read. It runs behind the sandbox's walls ([`super::sandbox`]: no network, no
//! new processes, nothing to read but its input and the system's libraries), with time, CPU and
//! memory limits, on a private copy of the bytes in a folder this process owns; the copy is
//! removed on every path, a hang killed at its limit included.

use super::sandbox::{self, Access, Confinee, Walls};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

/// How long one file may take (a hang, not a big file: poppler reads hundreds of pages a second).
pub const TIME_LIMIT: Duration = Duration::from_secs(300);
/// Its CPU time and address space.
const CPU_S: u64 = 300;
const MEMORY_BYTES: u64 = 2 << 30;

/// What `pdftotext` loads besides its input: the dynamic loader and libraries (which it may
/// run), then data it reads (the loader's cache, fonts, poppler's encodings).
const SYSTEM: &[(&str, Access)] = &[
    ("/lib", Access::ReadAndRun),
    ("/lib64", Access::ReadAndRun),
    ("/usr/lib", Access::ReadAndRun),
    ("/usr/lib64", Access::ReadAndRun),
    ("/usr/local/lib", Access::ReadAndRun),
    ("/usr/share", Access::Read),
    ("/etc/ld.so.cache", Access::Read),
    ("/etc/fonts", Access::Read),
    ("/etc/poppler", Access::Read),
];

/// Each page's text (at most `max_text_bytes` of it in all), or `None` when pdftotext is not
/// installed, fails on the file or takes longer than `time_limit`.
pub fn pages(bytes: &[u8], max_text_bytes: usize, time_limit: Duration) -> Option<Vec<String>> {
    let scratch = scratch_dir().inspect_err(|e| tracing::warn!(error = %e, "no scratch folder for pdftotext")).ok()?;
    pages_in(scratch, bytes, max_text_bytes, time_limit)
}

/// [`pages`], with the copy in `scratch`.
fn pages_in(scratch: &Path, bytes: &[u8], max_text_bytes: usize, time_limit: Duration) -> Option<Vec<String>> {
    let exe = installed()?;
    let copy = private_copy(scratch, bytes)
        .inspect_err(|e| tracing::warn!(error = %e, "no scratch copy for pdftotext"))
        .ok()?;
    let text = run(exe, copy.path(), max_text_bytes, time_limit)?;
    // Pages end with a form feed.
    let mut pages: Vec<String> = text.split('\u{c}').map(str::to_string).collect();
    if pages.last().is_some_and(|p| p.trim().is_empty()) {
        pages.pop();
    }
    Some(pages)
}

/// Where `pdftotext` is, found once on `PATH`.
fn installed() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path).map(|dir| dir.join("pdftotext")).find(|p| p.is_file())
        })
        .as_deref()
}

/// This process's scratch folder (0700, under the temporary folder, made once); folders that
/// processes no longer running left behind are removed when it is made.
pub fn scratch_dir() -> std::io::Result<&'static Path> {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.path());
    }
    sweep_scratch(&std::env::temp_dir());
    use std::os::unix::fs::PermissionsExt;
    let made = tempfile::Builder::new()
        .prefix(&format!("hillside-scratch-{}-", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    Ok(DIR.get_or_init(|| made).path())
}

/// Removes `hillside-scratch-<pid>-…` folders in `tmp` whose process is gone and that this
/// user owns.
fn sweep_scratch(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix("hillside-scratch-")?.split('-').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The bytes in a file only this user can read, made with O_EXCL under a random name in
/// `scratch`, removed when it drops, whichever way the caller returns.
fn private_copy(scratch: &Path, bytes: &[u8]) -> std::io::Result<tempfile::NamedTempFile> {
    let mut copy = tempfile::Builder::new().prefix("pdftotext-").suffix(".pdf").tempfile_in(scratch)?;
    copy.write_all(bytes)?;
    copy.flush()?;
    Ok(copy)
}

fn run(exe: &Path, input: &Path, max_text_bytes: usize, time_limit: Duration) -> Option<String> {
    let mut readable: Vec<(&Path, Access)> = vec![(input, Access::Read), (exe, Access::ReadAndRun)];
    readable.extend(SYSTEM.iter().map(|&(p, a)| (Path::new(p), a)));
    let walls = Walls::new(Confinee::Poppler, None, &readable)
        .inspect_err(|e| tracing::warn!(error = %e, "cannot build pdftotext's sandbox"))
        .ok()?;
    let mut command = Command::new(exe);
    command.args(["-q", "-enc", "UTF-8", "-eol", "unix"]).arg(input).arg("-");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: `enter` and `limit` make system calls only, on what was built before the fork.
    unsafe {
        command.pre_exec(move || {
            limit(libc::RLIMIT_CPU, CPU_S)?;
            limit(libc::RLIMIT_AS, MEMORY_BYTES)?;
            walls.enter()?;
            sandbox::no_more_processes()
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!(error = %e, "pdftotext did not start");
            return None;
        }
    };
    let stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = tx.send(stdout.take(max_text_bytes as u64).read_to_end(&mut out).map(|_| out));
    });
    let out = match rx.recv_timeout(time_limit) {
        Ok(read) => read.ok(),
        Err(_) => {
            tracing::warn!("pdftotext took over {} s; stopped", time_limit.as_secs());
            let _ = child.kill();
            None
        }
    };
    let status = child.wait().ok()?;
    if !status.success() {
        tracing::info!(%status, "pdftotext could not read the file");
        return None;
    }
    // Cut at the limit, perhaps inside a character.
    Some(String::from_utf8_lossy(&out?).into_owned())
}

fn limit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads the one struct it is given.
    match unsafe { libc::setrlimit(resource, &limit) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_copy_is_private_and_goes_away() {
        let copy = private_copy(scratch_dir().unwrap(), b"%PDF-1.4 not really").unwrap();
        let path = copy.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read(&path).unwrap(), b"%PDF-1.4 not really");
        drop(copy);
        assert!(!path.exists());
    }

    #[test]
    fn a_hang_killed_at_its_limit_leaves_no_copy() {
        let scratch = tempfile::tempdir().unwrap();
        // Killed at once: the limit is over before it has read a byte.
        assert_eq!(pages_in(scratch.path(), b"%PDF-1.4 not really", 1 << 20, Duration::ZERO), None);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0, "the copy went with it");
    }

    #[test]
    fn scratch_folders_of_processes_that_are_gone_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        // No process has pid 2^31 - 1; this one is running.
        let gone = tmp.path().join("hillside-scratch-2147483647-abc");
        let running = tmp.path().join(format!("hillside-scratch-{}-abc", std::process::id()));
        for dir in [&gone, &running] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("pdftotext-x.pdf"), b"%PDF").unwrap();
        }
        sweep_scratch(tmp.path());
        assert!(!gone.exists() && running.exists());
    }
}
