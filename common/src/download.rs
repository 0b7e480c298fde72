//! Fetching a model file over HTTP(S) so that nothing partial is ever taken for a model: the
//! bytes go to `<file>.part` beside the final name, an interrupted download (a dropped
//! connection, the app closed, `kill -9`) continues from that file's end with a Range request,
//! and only a file whose SHA-256 is the expected one is renamed into place. The disk's free space
//! is checked before the first byte, and progress is reported as the bytes arrive.

use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bytes read and written at a time.
const CHUNK_BYTES: usize = 1 << 20;
/// Tries of one download when its connection breaks, before the error reaches the user (the
/// part stays, and the next pull resumes from it).
const MAX_TRIES: u32 = 5;
/// Room left on the disk beyond the file itself, so that a download never fills it to the last
/// byte.
const DISK_MARGIN_BYTES: u64 = 64 << 20;
/// How often progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// One file to fetch.
pub struct Download {
    pub url: String,
    /// Where the file goes once it is whole and checked.
    pub dest: PathBuf,
    /// The SHA-256 it must have (hex); without one the server's own (Hugging Face's
    /// `X-Linked-Etag`) is used, and with neither nothing is fetched.
    pub sha256: Option<String>,
}

/// How far a download is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub done_bytes: u64,
    pub total_bytes: Option<u64>,
    /// Over this session of the download (bytes resumed from the part do not count).
    pub bytes_per_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("cannot reach {host}: this machine seems to be offline, or the address is wrong ({why})")]
    Offline { host: String, why: String },
    #[error("{url} does not exist (HTTP 404): check the repository and file name")]
    NotFound { url: String },
    #[error("{url} answered HTTP {status}")]
    Refused { url: String, status: u16 },
    #[error("no SHA-256 to check {file} against: the server gave none; pass the file's SHA-256 with --sha256")]
    NoHash { file: String },
    #[error("{file} is not the file expected: its SHA-256 is {got}, not {want}. Nothing was installed, and the bytes fetched were deleted")]
    HashMismatch { file: String, got: String, want: String },
    #[error("not enough disk space for {file}: it needs {need_mb} MB more and {free_mb} MB are free in {dir}; nothing was fetched")]
    NoSpace { file: String, need_mb: u64, free_mb: u64, dir: String },
    #[error("the disk filled up while fetching {file}: free some space and pull again, and it goes on from the {done_mb} MB already fetched")]
    DiskFull { file: String, done_mb: u64 },
    #[error("{file} is being fetched by another Hillside already")]
    Busy { file: String },
    #[error("cancelled: the {done_mb} MB of {file} fetched so far are kept, and the next pull goes on from there")]
    Cancelled { file: String, done_mb: u64 },
    #[error("the connection to {host} broke {tries} times ({why}): the {done_mb} MB of {file} fetched so far are kept, and the next pull goes on from there")]
    Interrupted { host: String, file: String, tries: u32, done_mb: u64, why: String },
    #[error("{file}: {source}")]
    Io { file: String, source: io::Error },
}

/// What the server says about the file before it is fetched.
struct Head {
    size: Option<u64>,
    sha256: Option<String>,
}

impl Download {
    /// Fetches the file (or finishes fetching it) and returns its path once it is in place.
    /// `cancel` stops it between chunks, keeping the part; `progress` hears how far it is.
    pub fn run(&self, cancel: &AtomicBool, mut progress: impl FnMut(&Progress)) -> Result<PathBuf, DownloadError> {
        let file = self.file_name();
        let agent = agent();
        let head = self.head(&agent)?;
        let want = self.sha256.clone().or(head.sha256).ok_or_else(|| DownloadError::NoHash { file: file.clone() })?;
        let want = want.to_ascii_lowercase();
        let dir = self.dest.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| io_error(&file, e))?;

        let part_path = part_path(&self.dest);
        let file_handle = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            // A link planted where the part goes is refused, never written through.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&part_path)
            .map_err(|e| io_error(&file, e))?;
        lock(&file_handle).map_err(|_| DownloadError::Busy { file: file.clone() })?;
        let mut part = Part::open(file_handle, head.size).map_err(|e| io_error(&file, e))?;
        if let Some(size) = head.size {
            let free = free_bytes(dir).map_err(|e| io_error(&file, e))?;
            let need = size - part.done;
            if free < need + DISK_MARGIN_BYTES {
                let empty = part.done == 0;
                drop(part);
                if empty {
                    let _ = std::fs::remove_file(&part_path);
                }
                return Err(DownloadError::NoSpace {
                    file,
                    need_mb: (need + DISK_MARGIN_BYTES).div_ceil(1_000_000),
                    free_mb: free / 1_000_000,
                    dir: dir.display().to_string(),
                });
            }
        }

        // Tries count the breaks in a row without progress: a long download over a flaky link
        // goes on for as long as each connection brings bytes.
        let mut tries = 0;
        let mut done_at_last_break = part.done;
        loop {
            match self.fetch_from(&agent, &mut part, head.size, cancel, &mut progress) {
                Ok(()) => break,
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::Broken(why)) => {
                    tries = if part.done > done_at_last_break { 1 } else { tries + 1 };
                    done_at_last_break = part.done;
                    if tries >= MAX_TRIES {
                        return Err(DownloadError::Interrupted {
                            host: host_of(&self.url),
                            file,
                            tries,
                            done_mb: part.done / 1_000_000,
                            why,
                        });
                    }
                    tracing::info!(file, done_bytes = part.done, why, "the connection broke: resuming");
                    std::thread::sleep(Duration::from_millis(500 << tries));
                }
            }
        }
        part.file.sync_all().map_err(|e| io_error(&file, e))?;
        let got = hex(&part.hasher.finalize());
        if got != want {
            let _ = std::fs::remove_file(&part_path);
            return Err(DownloadError::HashMismatch { file, got, want });
        }
        std::fs::rename(&part_path, &self.dest).map_err(|e| io_error(&file, e))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(&file, e))?;
        Ok(self.dest.clone())
    }

    fn file_name(&self) -> String {
        self.dest.file_name().map_or_else(|| self.url.clone(), |n| n.to_string_lossy().into_owned())
    }

    /// The size and SHA-256 the server gives, from a HEAD that does not follow redirects: the
    /// Hugging Face hub gives both on its redirect (`X-Linked-Size`, `X-Linked-Etag`), and a
    /// plain server its `Content-Length`. A server that refuses HEAD leaves both unknown.
    fn head(&self, agent: &ureq::Agent) -> Result<Head, DownloadError> {
        let response = agent
            .head(&self.url)
            .config()
            .max_redirects(0)
            .max_redirects_will_error(false)
            .build()
            .call()
            .map_err(|e| self.failed_to_connect(e))?;
        let status = response.status().as_u16();
        match status {
            404 | 401 => return Err(DownloadError::NotFound { url: self.url.clone() }),
            200..=399 => {}
            _ => return Ok(Head { size: None, sha256: None }),
        }
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let size = header("x-linked-size")
            .or_else(|| (status == 200).then(|| header("content-length")).flatten())
            .and_then(|s| s.trim().parse().ok());
        let sha256 = header("x-linked-etag")
            .map(|e| e.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase())
            .filter(|e| e.len() == 64 && e.bytes().all(|b| b.is_ascii_hexdigit()));
        Ok(Head { size, sha256 })
    }

    /// One request for the bytes past the part's end, appended to it as they arrive.
    fn fetch_from(
        &self,
        agent: &ureq::Agent,
        part: &mut Part,
        size: Option<u64>,
        cancel: &AtomicBool,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<(), Failure> {
        let file = self.file_name();
        let io_failure = |e| Failure::Final(io_error(&file, e));
        let mut request = agent.get(&self.url);
        if part.done > 0 {
            request = request.header("Range", format!("bytes={}-", part.done));
        }
        let response = request.call().map_err(|e| match self.failed_to_connect(e) {
            DownloadError::Offline { why, .. } if part.done > 0 => Failure::Broken(why),
            e => Failure::Final(e),
        })?;
        match response.status().as_u16() {
            206 => {
                let start = response
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes ")?.split('-').next()?.parse::<u64>().ok());
                if start != Some(part.done) {
                    // Bytes from elsewhere in the file: the next request starts it over.
                    part.restart().map_err(io_failure)?;
                    return Err(Failure::Broken(format!("the server resumed at byte {start:?}")));
                }
            }
            // The server sent the whole file: start again from its first byte.
            200 => part.restart().map_err(io_failure)?,
            // Nothing past the end: the part is the whole file.
            416 if size == Some(part.done) => return Ok(()),
            404 | 401 => return Err(Failure::Final(DownloadError::NotFound { url: self.url.clone() })),
            500..=599 => return Err(Failure::Broken(format!("HTTP {}", response.status().as_u16()))),
            status => return Err(Failure::Final(DownloadError::Refused { url: self.url.clone(), status })),
        }
        let mut body = response.into_body().into_reader();
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(Failure::Final(DownloadError::Cancelled { file, done_mb: part.done / 1_000_000 }));
            }
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Broken(e.to_string())),
            };
            part.append(&buffer[..n]).map_err(|e| {
                Failure::Final(if e.raw_os_error() == Some(libc::ENOSPC) {
                    DownloadError::DiskFull { file: file.clone(), done_mb: part.done / 1_000_000 }
                } else {
                    io_error(&file, e)
                })
            })?;
            if let Some(p) = part.meter.tick(part.done) {
                progress(&p);
            }
        }
        progress(&part.meter.now(part.done));
        match size {
            Some(size) if part.done < size => {
                Err(Failure::Broken(format!("the body ended at byte {} of {size}", part.done)))
            }
            _ => Ok(()),
        }
    }

    fn failed_to_connect(&self, e: ureq::Error) -> DownloadError {
        DownloadError::Offline { host: host_of(&self.url), why: e.to_string() }
    }
}

/// Why one request stopped: for good, or a broken connection worth another try.
enum Failure {
    Final(DownloadError),
    Broken(String),
}

/// The file the bytes gather in: how many it holds, their SHA-256 so far, and the rate.
struct Part {
    file: File,
    done: u64,
    hasher: Sha256,
    meter: Meter,
}

impl Part {
    /// The part as an earlier pull left it, its bytes hashed (so that the hash covers the whole
    /// file); emptied if it is longer than the file can be.
    fn open(mut file: File, size: Option<u64>) -> io::Result<Self> {
        let mut done = file.metadata()?.len();
        if size.is_some_and(|size| done > size) {
            file.set_len(0)?;
            done = 0;
        }
        let mut hasher = Sha256::new();
        file.seek(SeekFrom::Start(0))?;
        let hashed = io::copy(&mut (&file).take(done), &mut HashWriter(&mut hasher))?;
        if hashed != done {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the partial file shrank while it was read"));
        }
        Ok(Self { file, done, hasher, meter: Meter::new(done, size) })
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.hasher.update(bytes);
        self.done += bytes.len() as u64;
        Ok(())
    }

    fn restart(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.done = 0;
        self.hasher = Sha256::new();
        self.meter.restart();
        Ok(())
    }
}

/// Progress at most every [`PROGRESS_EVERY`], with the rate over this session of the download.
struct Meter {
    started: Instant,
    from_bytes: u64,
    total_bytes: Option<u64>,
    last: Instant,
}

impl Meter {
    fn new(from_bytes: u64, total_bytes: Option<u64>) -> Self {
        let now = Instant::now();
        Self { started: now, from_bytes, total_bytes, last: now }
    }

    fn restart(&mut self) {
        *self = Self::new(0, self.total_bytes);
    }

    fn tick(&mut self, done: u64) -> Option<Progress> {
        (self.last.elapsed() >= PROGRESS_EVERY).then(|| {
            self.last = Instant::now();
            self.now(done)
        })
    }

    fn now(&self, done: u64) -> Progress {
        let seconds = self.started.elapsed().as_secs_f64();
        let bytes_per_s = if seconds > 0.0 { done.saturating_sub(self.from_bytes) as f64 / seconds } else { 0.0 };
        Progress { done_bytes: done, total_bytes: self.total_bytes, bytes_per_s }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(15)))
        // Only catches a server that went silent: a slow link still makes progress.
        .timeout_recv_body(Some(Duration::from_secs(60)))
        .user_agent(concat!("hillside/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// Where the bytes of `dest` gather until they are whole: `<file>.part` beside it.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An exclusive lock on the part for as long as the file is open, so that two pulls of one
/// model (the CLI's and the app's) never write it together.
fn lock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this File owns; the lock goes when it closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes an unprivileged process may still write on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: an all-zero statvfs is a valid value for the call to fill.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call writes.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stats.f_bavail * stats.f_frsize)
}

fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

fn io_error(file: &str, source: io::Error) -> DownloadError {
    DownloadError::Io { file: file.to_string(), source }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
