//! Reading an untrusted file in a process of its own, so that nothing a file does to a parser —
//! present or future, ours or a library's — can take the app down. The child
//! (`hillside-ingest`, installed beside the program that reads documents) gets a line of JSON
//! that says what to do, then the file, on stdin; it reads the file with the same
//! [`read_bytes`] under an address-space limit, a CPU-time limit and a fixed stack, and answers
//! in JSON on stdout: the document, or why not. An abort, a stack overflow, an allocation it
//! cannot have or a hang ends only the child, and the caller gets an [`IngestError`] that says
//! which.

use super::{read_bytes, Bound, Document, IngestError, Limits};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The child's executable, looked for beside the running one (and, for test binaries in
/// cargo's `deps/`, one folder up); `HILLSIDE_INGEST` names another.
pub const READER_EXE: &str = "hillside-ingest";

/// Set in the child's environment, makes it fail on purpose (`abort`, `allocate`, `overflow`,
/// `spin` or `sleep`): how the tests show that each failure costs one refused file.
pub const FAULT_VARIABLE: &str = "HILLSIDE_INGEST_FAULT";

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
    limits: Limits,
    memory_bytes: u64,
    cpu_s: u64,
    stack_bytes: usize,
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

    /// [`read_bytes`] in a child process.
    pub fn read(&self, name: &str, bytes: &[u8], limits: &Limits) -> Result<Document, IngestError> {
        let _turn = self.wait_for_turn();
        let process = &self.process;
        let job = Job {
            name: name.into(),
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
            // Fails only if the child died first.
            scope.spawn(move || {
                stdin
                    .write_all(job.as_bytes())
                    .and_then(|()| stdin.write_all(b"\n"))
                    .and_then(|()| stdin.write_all(bytes))
            });
            let mut stderr = child.stderr.take().expect("piped");
            let said = scope.spawn(move || last_bytes(&mut stderr, 4096));
            let mut stdout = child.stdout.take().expect("piped");
            let (tx, rx) = mpsc::channel();
            scope.spawn(move || {
                let mut out = Vec::new();
                let _ = tx.send(stdout.by_ref().take(answer_limit).read_to_end(&mut out).map(|_| out));
            });
            let answer = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok().and_then(Result::ok);
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

/// The child's side (`hillside-ingest`, the job and then the file on stdin): limits first, then
/// the file, then one answer on stdout.
pub fn child_main() -> std::process::ExitCode {
    let mut stdin = std::io::BufReader::new(std::io::stdin().lock());
    let mut line = Vec::new();
    let read = (&mut stdin).take(MAX_JOB_BYTES).read_until(b'\n', &mut line);
    let Some(job) = read.ok().and_then(|_| serde_json::from_slice::<Job>(&line).ok()) else {
        eprintln!("{READER_EXE} is started by Hillside to read one document; it is not a command to run");
        return std::process::ExitCode::from(2);
    };
    set_limit(libc::RLIMIT_CPU, job.cpu_s);
    set_limit(libc::RLIMIT_AS, job.memory_bytes);
    let mut bytes = Vec::new();
    if let Err(e) = stdin.take(job.limits.max_file_bytes + 1).read_to_end(&mut bytes) {
        eprintln!("cannot read the file from stdin: {e}");
        return std::process::ExitCode::from(1);
    }
    let Job { name, limits, stack_bytes, .. } = job;
    let reading = std::thread::Builder::new().stack_size(stack_bytes).spawn(move || {
        inject_fault();
        read_bytes(&name, &bytes, &limits).map_err(|e| match e {
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
    match serde_json::to_writer(&mut stdout, &reply).map_err(std::io::Error::from).and_then(|()| stdout.flush()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot send the answer: {e}");
            std::process::ExitCode::from(1)
        }
    }
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

/// The failures [`FAULT_VARIABLE`] asks for.
fn inject_fault() {
    match std::env::var(FAULT_VARIABLE).as_deref() {
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
}
