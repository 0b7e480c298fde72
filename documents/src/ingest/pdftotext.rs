//! Poppler's `pdftotext`, where it is installed: the fallback for PDFs, or pages, the built-in
//! reader cannot read. It runs in a process of its own (a bad file can only fail that
//! process) with a time limit, on a private copy of the bytes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How long one file may take (a hang, not a big file: poppler reads hundreds of pages a second).
const TIME_LIMIT: Duration = Duration::from_secs(300);

/// Each page's text, or `None` when pdftotext is not installed or fails on the file.
pub fn pages(bytes: &[u8]) -> Option<Vec<String>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!("hillside-pdftotext-{}-{}.pdf", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, bytes).ok()?;
    let text = run(&path);
    let _ = std::fs::remove_file(&path);
    let text = text?;
    // Pages end with a form feed.
    let mut pages: Vec<String> = text.split('\u{c}').map(str::to_string).collect();
    if pages.last().is_some_and(|p| p.trim().is_empty()) {
        pages.pop();
    }
    Some(pages)
}

fn run(path: &std::path::Path) -> Option<String> {
    let spawned = Command::new("pdftotext").args(["-q", "-enc", "UTF-8", "-eol", "unix"]).arg(path).arg("-").stdout(Stdio::piped()).stderr(Stdio::null()).spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            tracing::debug!(error = %e, "pdftotext is not available");
            return None;
        }
    };
    let mut stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = tx.send(stdout.read_to_end(&mut out).map(|_| out));
    });
    let out = match rx.recv_timeout(TIME_LIMIT) {
        Ok(read) => read.ok(),
        Err(_) => {
            tracing::warn!("pdftotext took over {} s; stopped", TIME_LIMIT.as_secs());
            let _ = child.kill();
            None
        }
    };
    let status = child.wait().ok()?;
    if !status.success() {
        tracing::info!(%status, "pdftotext could not read the file");
        return None;
    }
    String::from_utf8(out?).ok()
}
