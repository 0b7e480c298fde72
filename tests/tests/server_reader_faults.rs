//! A reader that dies on a file, or that tries to reach past its sandbox, costs one refused
//! upload: the isolated reader is made to abort, to allocate without end, and to open a file
//! outside its input, a socket and a process (through its environment, which every child of
//! this process inherits, so this binary holds this one test alone), while a chat streams beside
//! it and `/health` stays up; then the next file reads as ever.

mod common;

use common::server::{agent, config, upload, Server};
use common::Scratch;
use hillside_documents::ingest::isolated::{FAULT_PATH_VARIABLE, FAULT_VARIABLE};
use hillside_server::{DocumentsConfig, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};

#[test]
fn a_reader_that_aborts_or_hoards_memory_costs_one_refused_file() {
    let dir = Scratch::new("reader-faults");
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 1 << 20,
        model_key: "smollm2-test".into(),
    };
    let s = Server::start(ServerConfig { documents: Some(documents), ..config() });
    let base = s.base.clone();
    let chat = std::thread::spawn(move || {
        let body = json!({"messages": [{"role": "user", "content": "Describe a harbour at dawn."}], "max_tokens": 96, "temperature": 0, "stream": true});
        let r = agent()
            .post(&format!("{base}/v1/chat/completions"))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let lines: Vec<String> = BufReader::new(r.into_body().into_reader()).lines().map(Result::unwrap).collect();
        assert_eq!(lines.iter().rev().find(|l| l.starts_with("data: ")).map(String::as_str), Some("data: [DONE]"));
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .inspect(|d| assert!(serde_json::from_str::<Value>(d).is_ok(), "an event that is not JSON: {d}"))
            .count()
    });
    let notes = b"Minutes of the harbour board, read by a reader that is made to fail.";
    // A file of the user's that the reader must not see.
    let private = dir.join("private-notes.txt");
    std::fs::write(&private, "the user's own words").unwrap();
    std::env::set_var(FAULT_PATH_VARIABLE, &private);
    for (fault, status, code, says) in [
        ("abort", 400, "unreadable_document", "crashed"),
        ("allocate", 413, "document_over_limit", "memory"),
        (
            "open",
            400,
            "unreadable_document",
            "tried to open a file outside its input, which the reader's sandbox refuses",
        ),
        (
            "socket",
            400,
            "unreadable_document",
            "tried to open a network connection, which the reader's sandbox refuses",
        ),
        ("fork", 400, "unreadable_document", "tried to start a process, which the reader's sandbox refuses"),
    ] {
        std::env::set_var(FAULT_VARIABLE, fault);
        let (got, e) = upload(&s.base, "minutes.txt", notes, &[]);
        std::env::remove_var(FAULT_VARIABLE);
        assert_eq!((got, e["error"]["code"].as_str()), (status, Some(code)), "{fault}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains("minutes.txt") && message.contains(says), "{fault}: {message}");
        assert!(!e.to_string().contains("the user's own words"), "{e}");
        assert_eq!(s.get("/health").0, 200);
        assert_eq!(s.get("/v1/hillside/documents").1["data"], json!([]), "nothing stored");
    }
    assert!(chat.join().unwrap() > 1, "the chat beside streamed to its end");
    let (status, doc) = upload(&s.base, "minutes.txt", notes, &[]);
    assert_eq!(status, 201, "{doc}");
}
