//! Poppler's `pdftotext`, where it is installed: the fallback for PDFs, or pages, the built-in
//! reader cannot read. It runs in a process of its own (a bad file can only fail that
//! process) with a time limit, on a private copy of the bytes.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long one file may take (a hang, not a big file: poppler reads hundreds of pages a second).
const TIME_LIMIT: Duration = Duration::from_secs(300);

/// Each page's text (at most `max_text_bytes` of it in all), or `None` when pdftotext is not
/// installed or fails on the file.
pub fn pages(bytes: &[u8], max_text_bytes: usize) -> Option<Vec<String>> {
    let copy = private_copy(bytes).ok()?;
    let text = run(copy.path(), max_text_bytes)?;
    // Pages end with a form feed.
    let mut pages: Vec<String> = text.split('\u{c}').map(str::to_string).collect();
    if pages.last().is_some_and(|p| p.trim().is_empty()) {
        pages.pop();
    }
    Some(pages)
}

/// The bytes in a file only this user can read, made with O_EXCL under a random name (no other
/// process can put a link there first), removed when it drops, whichever way the caller returns.
fn private_copy(bytes: &[u8]) -> std::io::Result<tempfile::NamedTempFile> {
    let mut copy = tempfile::Builder::new().prefix("hillside-pdftotext-").suffix(".pdf").tempfile()?;
    copy.write_all(bytes)?;
    copy.flush()?;
    Ok(copy)
}

fn run(path: &std::path::Path, max_text_bytes: usize) -> Option<String> {
    let spawned = Command::new("pdftotext")
        .args(["-q", "-enc", "UTF-8", "-eol", "unix"])
        .arg(path)
        .arg("-")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            tracing::debug!(error = %e, "pdftotext is not available");
            return None;
        }
    };
    let stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = tx.send(stdout.take(max_text_bytes as u64).read_to_end(&mut out).map(|_| out));
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
    // Cut at the limit, perhaps inside a character.
    Some(String::from_utf8_lossy(&out?).into_owned())
}

#[cfg(test)]
mod tests {
    use super::private_copy;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_copy_is_private_and_goes_away() {
        let copy = private_copy(b"%PDF-1.4 not really").unwrap();
        let path = copy.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"%PDF-1.4 not really");
        drop(copy);
        assert!(!path.exists());
    }
}
