//! A model hub on 127.0.0.1 for the download tests (set as `HF_ENDPOINT`, as a mirror would
//! be): it serves one file at any path, saying its size and SHA-256 on a HEAD's redirect as
//! huggingface.co does, and can cut the connection halfway or stall there.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the hub does with each GET, in turn (the last repeats).
#[derive(Clone, Copy, PartialEq)]
pub enum Answer {
    /// The bytes asked for, whole.
    Serve,
    /// The first half of the file, then the connection closes.
    CutHalfway,
    /// The first half of the file, then nothing until the test ends.
    StallHalfway,
    /// The bytes asked for, 64 KiB every 50 ms, so that a test sees the download under way.
    Trickle,
}

/// A request's method and Range header.
pub type Seen = (String, Option<String>);

pub struct Hub {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

/// A hub serving `body` at any path, saying its size and `sha256` in a HEAD's redirect as
/// huggingface.co does (or, with `sized` false, neither size nor hash, and the body close-delimited).
pub fn hub(body: Vec<u8>, sha256: String, answers: Vec<Answer>, sized: bool) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut gets = 0;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (method, range) = read_request(&stream);
            log.lock().unwrap().push((method.clone(), range.clone()));
            let answer = if method == "GET" {
                gets += 1;
                answers[(gets - 1).min(answers.len() - 1)]
            } else {
                Answer::Serve
            };
            let (body, sha256) = (body.clone(), sha256.clone());
            std::thread::spawn(move || respond(stream, &method, range, &body, &sha256, answer, sized));
        }
    });
    Hub { port, seen }
}

pub fn read_request(stream: &TcpStream) -> (String, Option<String>) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let method = line.split_whitespace().next().unwrap_or_default().to_string();
    let mut range = None;
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    (method, range)
}

fn respond(
    mut stream: TcpStream,
    method: &str,
    range: Option<String>,
    body: &[u8],
    sha256: &str,
    answer: Answer,
    sized: bool,
) {
    if method == "HEAD" {
        let head = if sized {
            format!(
                "HTTP/1.1 302 Found\r\nLocation: /cdn/file\r\nX-Linked-Size: {}\r\nX-Linked-Etag: \"{sha256}\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                body.len()
            )
        } else {
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
        };
        let _ = stream.write_all(head.as_bytes());
        return;
    }
    let from: usize =
        range.as_deref().and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()).unwrap_or(0);
    let head = match (range.is_some(), sized) {
        (true, _) => format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len() - 1,
            body.len(),
            body.len() - from
        ),
        (false, true) => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()),
        (false, false) => "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string(),
    };
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let rest = &body[from..];
    match answer {
        Answer::Serve => {
            let _ = stream.write_all(rest);
        }
        Answer::CutHalfway => {
            let _ = stream.write_all(&rest[..body.len() / 2 - from]);
        }
        Answer::Trickle => {
            for piece in rest.chunks(64 << 10) {
                if stream.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Answer::StallHalfway => {
            let _ = stream.write_all(&rest[..body.len() / 2 - from]);
            let _ = stream.flush();
            std::thread::sleep(Duration::from_secs(600));
        }
    }
}

/// A model-sized-enough file of bytes no compression shortens.
pub fn model_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let out =
        Command::new("sha256sum").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn();
    let mut child = out.unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}
