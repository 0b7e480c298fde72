//! Uploads are bounded in memory: each waits for a reader's turn before its bytes are taken in,
//! so eight parallel 200 MB uploads raise `hillside serve`'s peak resident memory by about two
//! files' worth, not eight.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const FILE_BYTES: usize = 200_000_000;

fn agent() -> ureq::Agent {
    // Only catches a hang.
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(900)))
        .build()
        .into()
}

/// A process's resident memory now and at its peak, in bytes.
fn resident(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    (kb("VmRSS:").unwrap() * 1024, kb("VmHWM:").unwrap() * 1024)
}

#[test]
fn parallel_uploads_hold_two_files_at_most() {
    let scratch = tempfile::Builder::new().prefix("hillside-uploads-").tempdir().unwrap();
    std::fs::write(scratch.path().join("config.toml"), "").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hillside"))
        .args(["serve", "--port", "0", "--context", "1024", "--shutdown-grace-s", "1", "--documents-dir"])
        .arg(scratch.path().join("data"))
        .arg("--config")
        .arg(scratch.path().join("config.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    let base = format!("http://{}", banner.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap());
    let (before, _) = resident(child.id());

    // The JSON branch (a path) is the desktop app's: here it is refused before the body is read.
    let huge = format!("{{\"path\": \"{}\"}}", "a".repeat(100_000));
    let reply =
        agent().post(format!("{base}/v1/hillside/documents")).header("Content-Type", "application/json").send(huge);
    assert_eq!(reply.unwrap().status().as_u16(), 403);

    // Not a document (binary), so each is read and refused: what is measured is holding it.
    let file = Arc::new(vec![0u8; FILE_BYTES]);
    let uploads: Vec<_> = (0..8)
        .map(|i| {
            let (file, base) = (file.clone(), base.clone());
            std::thread::spawn(move || {
                let boundary = "hillside-upload-boundary";
                let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob{i}.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
                body.extend_from_slice(&file);
                body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
                let mut reply = agent()
                    .post(format!("{base}/v1/hillside/documents"))
                    .header("Content-Type", format!("multipart/form-data; boundary={boundary}"))
                    .send(&body[..])
                    .unwrap();
                (reply.status().as_u16(), reply.body_mut().read_to_string().unwrap_or_default())
            })
        })
        .collect();
    for upload in uploads {
        let (status, said) = upload.join().unwrap();
        assert_eq!(status, 400, "refused as not a document: {said}");
    }
    let (_, peak) = resident(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let grew = peak.saturating_sub(before);
    // Two reader slots' files, and room for buffers: under three files, where eight held at once
    // would be 1.6 GB.
    let bound = 3 * FILE_BYTES as u64;
    assert!(grew < bound, "peak resident memory grew {} MB (bound {} MB)", grew >> 20, bound >> 20);
    eprintln!("peak resident memory grew {} MB over {} MB at start", grew >> 20, before >> 20);
}
