//! Reading an untrusted file in a process of its own, so that nothing a file does to a parser —
//! present or future, ours or a library's — can take the app down or reach past the file. The
//! child (`hillside-ingest`, installed beside the program that reads documents) gets a line of
//! JSON that says what to do, then the file, on stdin; it goes behind the sandbox's walls
//! ([`super::sandbox`]: no files, no network, no processes), reads the file with the same
//! [`read_bytes_with`] under an address-space limit, a CPU-time limit and a fixed stack, and
//! answers in one line of JSON on stdout: the document, or why not. A PDF the built-in reader
//! cannot read is asked of poppler's `pdftotext`, which the child may not run: it asks the
//! caller (a line `{"pdftotext": …}`), who runs it behind walls of its own and sends the pages
//! back on stdin. An abort, a stack overflow, an allocation it cannot have, a hang or a refused
//! system call ends only the child, and the caller gets an [`IngestError`] that says which.

use super::sandbox::{self, Confinee, Walls};
use super::{pdftotext, read_bytes_with, Bound, Document, IngestError, Limits};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The child's executable, looked for beside the running one (and, for test binaries in
/// cargo's `deps/`, one folder up); `HILLSIDE_INGEST` names another.
pub const READER_EXE: &str = "hillside-ingest";

/// Set in the child's environment, makes it fail on purpose (`abort`, `allocate`, `overflow`,
/// `spin` or `sleep`) or try to reach past its walls (`open`, a file outside its input;
/// `socket`; `fork`): how the tests show that each costs one refused file.
pub const FAULT_VARIABLE: &str = "HILLSIDE_INGEST_FAULT";

/// The file the `open` fault tries to read.
pub const FAULT_PATH_VARIABLE: &str = "HILLSIDE_INGEST_FAULT_PATH";

/// What one reading process may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLimits {
    /// Address space, besides four times the file's size (its copies while it is read).
    pub memory_bytes: u64,
    /// CPU time, the child's and its own children's (pdftotext) each.
    pub cpu_s: u64,
    /// The reading thread's stack.
    pub stack_bytes: usize,
    /// How long the caller waits for an answer (a child that sleeps uses no CPU time).
    pub wall_s: u64,
    /// Files read at once; more wait their turn, so that uploads cannot add up the memory
    /// limits past the machine's.
    pub concurrent: usize,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        Self { memory_bytes: 1 << 30, cpu_s: 60, stack_bytes: 64 << 20, wall_s: 120, concurrent: 2 }
    }
}

/// What the caller sends the child first on stdin, as one line of JSON; the file's bytes follow.
#[derive(Serialize, Deserialize)]
struct Job {
    name: String,
    /// The file's size: its bytes follow the line.
    file_bytes: u64,
    limits: Limits,
    memory_bytes: u64,
    cpu_s: u64,
    stack_bytes: usize,
}

/// The child's request for poppler's pages, a line on stdout; the answer, a JSON
/// `Option<Vec<String>>`, comes back as a line on stdin.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AskPoppler {
    pdftotext_max_text_bytes: usize,
}

/// Reads files through child processes.
pub struct IsolatedReader {
    exe: PathBuf,
    process: ProcessLimits,
    running: Mutex<usize>,
    finished: Condvar,
}

/// Why there is no reader to run: documents cannot be added until there is.
#[derive(Debug, thiserror::Error)]
pub enum ReaderMissing {
    #[error("cannot find this program's folder: {0}")]
    NoProgramFolder(std::io::Error),
    #[error("the document reader {} is not installed beside {} (or set HILLSIDE_INGEST)", READER_EXE, .0.display())]
    NotBeside(PathBuf),
}

impl IsolatedReader {
    /// The reader installed beside this program; `Err` says where it was looked for.
    pub fn locate(process: ProcessLimits) -> Result<Self, ReaderMissing> {
        if let Some(exe) = std::env::var_os("HILLSIDE_INGEST").filter(|v| !v.is_empty()) {
            return Ok(Self::new(PathBuf::from(exe), process));
        }
        let current = std::env::current_exe().map_err(ReaderMissing::NoProgramFolder)?;
        current
            .ancestors()
            .skip(1)
            .take(2)
            .map(|dir| dir.join(READER_EXE))
            .find(|p| p.is_file())
            .map(|exe| Self::new(exe, process))
            .ok_or(ReaderMissing::NotBeside(current))
    }

    pub fn new(exe: PathBuf, process: ProcessLimits) -> Self {
        Self { exe, process, running: Mutex::new(0), finished: Condvar::new() }
    }

    /// [`read_bytes_with`] in a child process.
    pub fn read(&self, name: &str, bytes: &[u8], limits: &Limits) -> Result<Document, IngestError> {
        let _turn = self.wait_for_turn();
        let process = &self.process;
        let job = Job {
            name: name.into(),
            file_bytes: bytes.len() as u64,
            limits: *limits,
            memory_bytes: process.memory_bytes.saturating_add(4 * bytes.len() as u64),
            cpu_s: process.cpu_s,
            stack_bytes: process.stack_bytes,
        };
        let failed = |why: String| IngestError::ReaderFailed { name: name.into(), why };
        let job = serde_json::to_string(&job).map_err(|e| failed(e.to_string()))?;
        let mut child = Command::new(&self.exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that a hang is ended with whatever it started.
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("the document reader {} cannot start ({e})", self.exe.display())))?;
        let deadline = Instant::now() + Duration::from_secs(process.wall_s);
        // Most of an answer is the text, which JSON may escape to six times its length.
        let answer_limit = 6 * limits.max_text_bytes as u64 + (1 << 20);
        let answer = std::thread::scope(|scope| {
            let mut stdin = child.stdin.take().expect("piped");
            // Fails only if the child died first; hands stdin back for poppler's pages.
            let sent = scope.spawn(move || -> Option<ChildStdin> {
                stdin.write_all(job.as_bytes()).ok()?;
                stdin.write_all(b"\n").ok()?;
                stdin.write_all(bytes).ok()?;
                Some(stdin)
            });
            let mut stderr = child.stderr.take().expect("piped");
            let said = scope.spawn(move || last_bytes(&mut stderr, 4096));
            let stdout = child.stdout.take().expect("piped");
            let (tx, rx) = mpsc::channel();
            scope.spawn(move || {
                let mut lines = std::io::BufReader::new(stdout.take(answer_limit));
                loop {
                    let mut line = Vec::new();
                    match lines.read_until(b'\n', &mut line) {
                        Ok(1..) if tx.send(line).is_ok() => {}
                        _ => return,
                    }
                }
            });
            let (mut sent, mut stdin) = (Some(sent), None);
            let answer = loop {
                let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else { break None };
                let Ok(ask) = serde_json::from_slice::<AskPoppler>(&line) else { break Some(line) };
                // The child asks once it has the whole file, so the bytes are sent by now.
                if let Some(sent) = sent.take() {
                    stdin = sent.join().ok().flatten();
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let pages = pdftotext::pages(bytes, ask.pdftotext_max_text_bytes, left);
                let reply = serde_json::to_vec(&pages).unwrap_or_else(|_| b"null".to_vec());
                if let Some(stdin) = stdin.as_mut() {
                    let _ = stdin.write_all(&reply).and_then(|()| stdin.write_all(b"\n")).and_then(|()| stdin.flush());
                }
            };
            drop(stdin);
            let status = wait_until(&mut child, deadline);
            (answer, status, said.join().unwrap_or_default())
        });
        let (answer, status, said) = answer;
        if let Some(reply) =
            answer.as_deref().and_then(|a| serde_json::from_slice::<Result<Document, IngestError>>(a).ok())
        {
            return reply;
        }
        let said = String::from_utf8_lossy(&said);
        tracing::warn!(name, ?status, stderr = %said.trim(), "the document reader stopped without an answer");
        Err(explain(name, status, &said, process))
    }

    fn wait_for_turn(&self) -> Turn<'_> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        while *running >= self.process.concurrent.max(1) {
            running = self.finished.wait(running).unwrap_or_else(|p| p.into_inner());
        }
        *running += 1;
        Turn(self)
    }
}

/// A reading slot, given back on drop.
struct Turn<'a>(&'a IsolatedReader);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.finished.notify_one();
    }
}

/// The child's exit, or `None` when it was still running at `deadline` (then it is killed, with
/// whatever it started).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet,
                // so its process group's id is still its own.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The last `keep` bytes of what `from` writes until it closes.
fn last_bytes(from: &mut impl Read, keep: usize) -> Vec<u8> {
    let (mut tail, mut buf) = (Vec::new(), [0u8; 4096]);
    while let Ok(n @ 1..) = from.read(&mut buf) {
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 2 * keep {
            tail.drain(..tail.len() - keep);
        }
    }
    let start = tail.len().saturating_sub(keep);
    tail.split_off(start)
}

/// Why a child ended without an answer, from how it ended and its last words.
fn explain(name: &str, status: Option<ExitStatus>, said: &str, process: &ProcessLimits) -> IngestError {
    let over = |bound, what: String| IngestError::OverLimit { name: name.into(), bound, what };
    let Some(status) = status else {
        return over(Bound::Time, format!("reading it took over {} s", process.wall_s));
    };
    if status.signal() == Some(libc::SIGXCPU) {
        return over(Bound::Time, format!("reading it took over {} s of CPU time", process.cpu_s));
    }
    if said.contains("memory allocation of") {
        return over(Bound::Memory, format!("reading it needed more than {} MB of memory", process.memory_bytes >> 20));
    }
    if said.contains("overflowed its stack") {
        return over(Bound::NestingDepth, "reading it ran out of stack (it nests too deeply)".into());
    }
    if let Some(what) = said.split(SANDBOX_REFUSED).nth(1) {
        let what = what.lines().next().unwrap_or("").split(": ").next().unwrap_or("").trim();
        return IngestError::ReaderFailed {
            name: name.into(),
            why: format!(
                "reading it tried {what}, which the reader's sandbox refuses; the file was made to break readers"
            ),
        };
    }
    let how = match (status.signal(), status.code()) {
        (Some(signal), _) => format!("signal {signal}"),
        (None, Some(code)) => format!("exit status {code}"),
        (None, None) => "no status".into(),
    };
    IngestError::ReaderFailed {
        name: name.into(),
        why: format!("the document reader crashed on it ({how}); the file is damaged or was made to break readers"),
    }
}

/// The longest job line the child reads (a file name is most of it).
const MAX_JOB_BYTES: u64 = 1 << 20;

/// How the child says on stderr that its walls stopped something it tried.
const SANDBOX_REFUSED: &str = "the sandbox refused ";

/// The child's side (`hillside-ingest`, the job and then the file on stdin): limits and walls
/// first, then the file, then one answer on stdout.
pub fn child_main() -> std::process::ExitCode {
    let mut stdin = std::io::BufReader::new(std::io::stdin());
    let mut line = Vec::new();
    let read = (&mut stdin).take(MAX_JOB_BYTES).read_until(b'\n', &mut line);
    let Some(job) = read.ok().and_then(|_| serde_json::from_slice::<Job>(&line).ok()) else {
        eprintln!("{READER_EXE} is started by Hillside to read one document; it is not a command to run");
        return std::process::ExitCode::from(2);
    };
    set_limit(libc::RLIMIT_CPU, job.cpu_s);
    set_limit(libc::RLIMIT_AS, job.memory_bytes);
    let walls = Walls::new(Confinee::Reader, Some(std::process::id()), &[]).and_then(|walls| walls.enter());
    if let Err(e) = walls {
        // A reader without its walls reads nothing.
        eprintln!("cannot put up the reader's sandbox: {e}");
        return std::process::ExitCode::from(1);
    }
    let mut bytes = Vec::new();
    if let Err(e) = (&mut stdin).take(job.file_bytes.min(job.limits.max_file_bytes + 1)).read_to_end(&mut bytes) {
        eprintln!("cannot read the file from stdin: {e}");
        return std::process::ExitCode::from(1);
    }
    let Job { name, limits, stack_bytes, .. } = job;
    let reading = std::thread::Builder::new().stack_size(stack_bytes).spawn(move || {
        // Its threads are started: no more processes of any kind.
        if let Err(e) = sandbox::no_more_processes() {
            eprintln!("cannot limit processes: {e}");
        }
        if let Some(escaped) = inject_fault() {
            return Ok(Document { name, format: super::Format::Text, text: escaped, parts: Vec::new() });
        }
        // The caller has the file; the reader asks only for the pages.
        let stdin = std::cell::RefCell::new(stdin);
        let poppler = |_pdf: &[u8], max_text_bytes: usize| ask_for_poppler(&mut *stdin.borrow_mut(), max_text_bytes);
        read_bytes_with(&name, &bytes, &limits, &poppler).map_err(|e| match e {
            IngestError::Io { name, source } => IngestError::Damaged { name, reason: source.to_string() },
            other => other,
        })
    });
    let reply = match reading.map(|thread| thread.join()) {
        Ok(Ok(reply)) => reply,
        Ok(Err(_panic)) => return std::process::ExitCode::from(101), // the panic said why on stderr
        Err(e) => {
            eprintln!("cannot start the reading thread: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let sent = serde_json::to_writer(&mut stdout, &reply)
        .map_err(std::io::Error::from)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    match sent {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot send the answer: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Poppler's pages, from the caller: a request line on stdout, the answer's line on stdin.
fn ask_for_poppler(stdin: &mut impl BufRead, max_text_bytes: usize) -> Option<Vec<String>> {
    let ask = serde_json::to_vec(&AskPoppler { pdftotext_max_text_bytes: max_text_bytes }).ok()?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&ask).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush()).ok()?;
    drop(stdout);
    let mut line = Vec::new();
    stdin.take(6 * max_text_bytes as u64 + (1 << 20)).read_until(b'\n', &mut line).ok()?;
    serde_json::from_slice(&line).ok().flatten()
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) {
    // The hard limit a little above the soft one: past the soft CPU limit the kernel sends
    // SIGXCPU, which says "time" apart from any other death.
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value.saturating_add(value / 8 + 1) };
    // SAFETY: setrlimit reads the one struct it is given.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        eprintln!("cannot set resource limit {resource}: {}", std::io::Error::last_os_error());
    }
}

/// The failures [`FAULT_VARIABLE`] asks for. A try to reach past the walls that the walls
/// refuse ends the child with [`SANDBOX_REFUSED`]; one that got through is returned, to be
/// answered as the document's text (which a test then sees).
fn inject_fault() -> Option<String> {
    let refused = |what: &str, e: std::io::Error| -> ! { panic!("{SANDBOX_REFUSED}{what}: {e}") };
    match std::env::var(FAULT_VARIABLE).as_deref() {
        Ok("open") => {
            let path = std::env::var(FAULT_PATH_VARIABLE).unwrap_or_else(|_| "/etc/hostname".into());
            match std::fs::read_to_string(&path) {
                Ok(text) => return Some(format!("read {path}: {text}")),
                Err(e) => refused("to open a file outside its input", e),
            }
        }
        Ok("socket") => match std::net::TcpStream::connect(("127.0.0.1", 9)) {
            Ok(_) => return Some("connected".into()),
            // Refused by the filter before any packet, or by nobody listening: which one?
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => refused("to open a network connection", e),
            Err(e) => return Some(format!("made a socket (the connection then failed: {e})")),
        },
        Ok("fork") => {
            // SAFETY: the child of a fork exits at once, touching nothing.
            match unsafe { libc::fork() } {
                0 => unsafe { libc::_exit(0) },
                -1 => refused("to start a process", std::io::Error::last_os_error()),
                _ => return Some("forked".into()),
            }
        }
        Ok("abort") => std::process::abort(),
        Ok("allocate") => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 64 << 20]);
            }
        }
        Ok("overflow") => {
            #[allow(unconditional_recursion)]
            fn deeper(n: u64) -> u64 {
                let frame = [n; 512];
                std::hint::black_box(&frame);
                deeper(n + 1) + frame[0]
            }
            std::hint::black_box(deeper(0));
        }
        Ok("spin") => loop {
            std::hint::spin_loop();
        },
        Ok("sleep") => std::thread::sleep(Duration::from_secs(3600)),
        _ => {}
    }
    None
}
