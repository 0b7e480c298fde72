//! Looking for a card without risking the process. XRT 2.13 throws C++ exceptions through its C
//! API when its environment is wrong (`XILINX_XRT` unset, or pointing where its core library is
//! not), and an exception crossing a C frame aborts. So the first contact happens in a child
//! process, a fresh one (`hillside-xrt-probe`, installed beside the `hillside` binary; a fork
//! of this multithreaded process could deadlock in the loader or malloc before XRT even runs):
//! it loads the library, counts cards, loads the xclbin, opens the kernel, tries a P2P buffer,
//! and prints what it found. Whatever the child does — abort, crash, hang — the parent gets a
//! [`Probe`] that says so. Results are cached per library, xclbin and card; a server probes
//! once at start-up, not when the first sequence asks for the card.

use super::api::{file_version, Xrt};
use super::{XrtOptions, KERNEL_NAME};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The child's executable, looked for beside the running one (and, for test binaries in
/// cargo's `deps/`, one folder up); `HILLSIDE_XRT_PROBE` names another.
pub const PROBE_EXE: &str = "hillside-xrt-probe";

/// How long the child may take (a real card's first xclbin load takes seconds).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// Cards looked for beyond the first.
const MAX_CARDS: u32 = 16;

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub library: PathBuf,
    /// The library's description (XRT's version, or the emulator's name).
    pub version: Option<String>,
    /// Cards XRT opened.
    pub cards: u32,
    /// The xclbin loaded on the chosen card, with the scoring kernel in it.
    pub xclbin: Option<PathBuf>,
    /// Whether the card gave a peer-to-peer buffer (the SSD → FPGA path).
    pub p2p: bool,
    /// Why the XRT evaluator cannot run here; `None` when it can.
    pub problem: Option<String>,
}

impl Probe {
    fn failed(library: PathBuf, problem: String) -> Self {
        Self { library, version: None, cards: 0, xclbin: None, p2p: false, problem: Some(problem) }
    }
}

static CACHE: Mutex<Option<HashMap<XrtOptions, Probe>>> = Mutex::new(None);

/// Probes the card `options` name (cached).
pub fn probe(options: &XrtOptions) -> Probe {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache.get_or_insert_with(HashMap::new).entry(options.clone()).or_insert_with(|| probe_uncached(options)).clone()
}

fn probe_uncached(options: &XrtOptions) -> Probe {
    let library = options.library_path();
    let Some(exe) = probe_exe() else {
        return Probe::failed(
            library,
            format!(
                "cannot look for a card: {PROBE_EXE} is not installed beside this program (or set HILLSIDE_XRT_PROBE)"
            ),
        );
    };
    let mut command = Command::new(&exe);
    command.arg("--library").arg(&library).arg("--device").arg(options.device.to_string());
    if let Some(xclbin) = options.xclbin_path() {
        command.arg("--xclbin").arg(xclbin);
    }
    // XRT prints banners and errors on both streams: the child keeps its stdout for the report.
    let mut child = match command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(e) => return Probe::failed(library, format!("cannot start the XRT probe {}: {e}", exe.display())),
    };
    let stdout = child.stdout.take().map(OwnedFd::from).expect("piped stdout");
    let (report, finished) = read_report(stdout, child.id() as libc::pid_t);
    let status = child.wait().ok().map(|s| s.into_raw());
    match serde_json::from_slice::<Probe>(&report) {
        Ok(probe) => probe,
        Err(_) => Probe {
            version: library.exists().then(|| file_version(&library)),
            ..Probe::failed(library, explain_death(status.filter(|_| finished)))
        },
    }
}

fn probe_exe() -> Option<PathBuf> {
    if let Some(exe) = std::env::var_os("HILLSIDE_XRT_PROBE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(exe));
    }
    let current = std::env::current_exe().ok()?;
    current.ancestors().skip(1).take(2).map(|dir| dir.join(PROBE_EXE)).find(|p| p.is_file())
}

/// Reads the child's report until it closes the pipe or the timeout passes; whether it finished.
fn read_report(read_end: OwnedFd, pid: libc::pid_t) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut file = std::fs::File::from(read_end);
    let mut report = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&file), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready <= 0 {
            if ready < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return (report, false);
        }
        let mut buf = [0u8; 4096];
        match file.read(&mut buf) {
            Ok(0) => return (report, true),
            Ok(n) => report.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return (report, true),
        }
    }
}

fn explain_death(status: Option<i32>) -> String {
    let Some(status) = status else {
        return format!("XRT did not answer within {} s while looking for a card", PROBE_TIMEOUT.as_secs());
    };
    let how = if libc::WIFSIGNALED(status) {
        format!("XRT aborted while looking for a card (signal {})", libc::WTERMSIG(status))
    } else {
        format!("XRT's probe exited with status {} without a report", libc::WEXITSTATUS(status))
    };
    let hint = match std::env::var_os("XILINX_XRT") {
        None => "XILINX_XRT is not set (source /opt/xilinx/xrt/setup.sh)".to_string(),
        Some(dir) => {
            let core = PathBuf::from(&dir).join("lib/libxrt_core.so.2");
            if core.exists() {
                format!("XILINX_XRT={}", PathBuf::from(dir).display())
            } else {
                format!("XILINX_XRT={} has no {}", PathBuf::from(dir).display(), core.display())
            }
        }
    };
    format!("no device: {how}; {hint}")
}

/// The child's side (`hillside-xrt-probe --library L [--xclbin X] --device N`): look, print
/// the report on stdout, exit 0. XRT's own output goes to /dev/null.
pub fn child_main(args: impl Iterator<Item = OsString>) -> i32 {
    let mut options = XrtOptions::default();
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let value = args.next().map(PathBuf::from);
        match (flag.to_str(), value) {
            (Some("--library"), Some(v)) => options.library = Some(v),
            (Some("--xclbin"), Some(v)) => options.xclbin = Some(v),
            (Some("--device"), Some(v)) => match v.to_str().and_then(|d| d.parse().ok()) {
                Some(d) => options.device = d,
                None => return 2,
            },
            _ => {
                eprintln!("usage: {PROBE_EXE} --library LIBRARY [--xclbin XCLBIN] [--device N] (run by hillside)");
                return 2;
            }
        }
    }
    // SAFETY: duplicating and redirecting this process's own standard descriptors.
    let report_fd = unsafe {
        let report = libc::dup(1);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if report < 0 || null < 0 {
            return 1;
        }
        libc::dup2(null, 1);
        libc::dup2(null, 2);
        OwnedFd::from_raw_fd(report)
    };
    let report = serde_json::to_vec(&look(&options)).unwrap_or_default();
    match std::io::Write::write_all(&mut std::fs::File::from(report_fd), &report) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn look(options: &XrtOptions) -> Probe {
    let library = options.library_path();
    let xrt = match Xrt::load(&library) {
        Ok(xrt) => xrt,
        Err(e) => return Probe::failed(library, format!("no XRT: {e}")),
    };
    let mut probe = Probe { library, version: Some(xrt.version()), cards: 0, xclbin: None, p2p: false, problem: None };
    probe.cards = (0..MAX_CARDS).take_while(|&i| xrt.open_device(i).is_some()).count() as u32;
    let Some(device) = xrt.open_device(options.device) else {
        probe.problem = Some(match probe.cards {
            0 => "no device: XRT found no card".to_string(),
            n => format!("no device {} (XRT found {n})", options.device),
        });
        return probe;
    };
    let Some(xclbin) = options.xclbin_path() else {
        probe.problem = Some(
            "no xclbin: build the scoring kernel (fpga/README.md) and set kv.xrt_xclbin or HILLSIDE_XCLBIN".into(),
        );
        return probe;
    };
    let loaded = device.load_xclbin(&xclbin).and_then(|uuid| device.open_kernel(&uuid, KERNEL_NAME));
    let kernel = match loaded {
        Ok(kernel) => kernel,
        Err(e) => {
            probe.problem = Some(e.to_string());
            return probe;
        }
    };
    probe.xclbin = Some(xclbin);
    match kernel.group_id(0).and_then(|group| device.alloc(4096, group, true)) {
        Ok(_) => probe.p2p = true,
        Err(e) => probe.problem = Some(e.to_string()),
    }
    probe
}
