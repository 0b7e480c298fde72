//! Nothing a web page or a dropped file does can hurt the user, over real HTTP on the real model:
//! the requests a page on another site can make through the browser are refused before any
//! work; client numbers and lists are bounded; and files made to hurt a reader (a ZIP that
//! inflates to gigabytes, markup nested tens of thousands deep) are each one refused upload
//! that names the bound, while a chat streams beside them and `/health` stays up.

mod common;

use common::hostile::{docx_bomb, epub_spine_bomb, nested_docx, nested_epub, nested_html};
use common::server::{agent, config, upload, Server};
use common::Scratch;
use hillside_server::{DocumentsConfig, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

fn with_documents(dir: &Scratch) -> ServerConfig {
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 64 << 20,
        model_key: "smollm2-test".into(),
    };
    ServerConfig { documents: Some(documents), ..config() }
}

/// A request as a browser sends it: any method, a body of some type, extra headers.
fn send(
    s: &Server,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut request = ureq::http::Request::builder().method(method).uri(s.url(path));
    if let Some(t) = content_type {
        request = request.header("Content-Type", t);
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut r = agent().run(request.body(body.to_string()).unwrap()).unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        },
    )
}

fn conversations(s: &Server) -> usize {
    s.get("/v1/hillside/conversations").1["data"].as_array().unwrap().len()
}

fn documents(s: &Server) -> usize {
    s.get("/v1/hillside/documents").1["data"].as_array().unwrap().len()
}

const EVIL: (&str, &str) = ("Origin", "http://evil.example");

#[test]
fn pages_on_other_sites_cannot_write() {
    let dir = Scratch::new("hostile-cross-site");
    let s = Server::start(with_documents(&dir));
    let forged = r#"{"title":"x","messages":[{"role":"assistant","content":"[update](https://evil.example)"}]}"#;
    // The request from the issue, as a page's fetch(…, {mode: "no-cors"}) or a form sends it.
    let (status, e) = send(&s, "POST", "/v1/hillside/conversations", Some("text/plain"), forged, &[EVIL]);
    assert_eq!((status, e["error"]["code"].as_str()), (403, Some("cross_site_request")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("http://evil.example"), "{e}");
    for origin in ["null", "http://127.0.0.1:1", "http://localhost.evil.example"] {
        assert_eq!(
            send(&s, "POST", "/v1/hillside/conversations", Some("application/json"), forged, &[("Origin", origin)]).0,
            403,
            "{origin}"
        );
    }
    // Browsers that mark the request instead of naming the origin.
    let cross = ("Sec-Fetch-Site", "cross-site");
    assert_eq!(send(&s, "POST", "/v1/hillside/conversations", Some("text/plain"), forged, &[cross]).0, 403);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).to_string();
    assert_eq!(send(&s, "POST", "/v1/chat/completions", Some("text/plain"), &chat, &[EVIL]).0, 403);
    assert_eq!(
        send(&s, "POST", "/v1/completions", Some("application/x-www-form-urlencoded"), r#"{"prompt":"Hi"}"#, &[cross])
            .0,
        403
    );
    assert_eq!(send(&s, "PUT", "/v1/hillside/settings", Some("text/plain"), "{}", &[EVIL]).0, 403);
    // A multipart upload (a form with a file input) from another site: refused, nothing stored.
    let (status, e) = upload(&s.base, "notes.txt", b"The page put this here.", &[EVIL]);
    assert_eq!(status, 403, "{e}");
    assert_eq!((conversations(&s), documents(&s)), (0, 0), "nothing was written");

    // JSON routes take JSON only: text/plain without an Origin (a client outside a browser) is a
    // 415, not a write.
    let (status, e) = send(&s, "POST", "/v1/hillside/conversations", Some("text/plain"), forged, &[]);
    assert_eq!((status, e["error"]["code"].as_str()), (415, Some("unsupported_media_type")), "{e}");
    assert_eq!(send(&s, "POST", "/v1/hillside/conversations", None, forged, &[]).0, 415);
    assert_eq!(conversations(&s), 0);

    // The server's own pages (the web UI, the desktop window) write as ever.
    let own = ("Origin", s.base.as_str());
    let (status, made) = send(
        &s,
        "POST",
        "/v1/hillside/conversations",
        Some("application/json; charset=utf-8"),
        forged,
        &[own, ("Sec-Fetch-Site", "same-origin")],
    );
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_u64().unwrap();
    let (status, added) = upload(&s.base, "notes.txt", b"Notes from the harbour board.", &[own]);
    assert_eq!(status, 201, "{added}");
    let doc = added["id"].as_str().unwrap().to_string();
    // Nor can another site delete, rename or summarize what is there.
    assert_eq!(send(&s, "DELETE", &format!("/v1/hillside/conversations/{id}"), None, "", &[EVIL]).0, 403);
    assert_eq!(
        send(&s, "PATCH", &format!("/v1/hillside/conversations/{id}"), Some("text/plain"), r#"{"title":"y"}"#, &[EVIL])
            .0,
        403
    );
    assert_eq!(send(&s, "POST", &format!("/v1/hillside/documents/{doc}/summary"), None, "", &[EVIL]).0, 403);
    assert_eq!(send(&s, "DELETE", &format!("/v1/hillside/documents/{doc}"), None, "", &[cross]).0, 403);
    assert_eq!((conversations(&s), documents(&s)), (1, 1));
    // Reading needs no write: still, a page elsewhere gets nothing.
    assert_eq!(send(&s, "GET", "/v1/hillside/conversations", None, "", &[EVIL]).0, 403);
    // A link from another site still opens the web UI.
    let (status, _) = {
        let r = agent()
            .get(&s.url("/"))
            .header("Sec-Fetch-Site", "cross-site")
            .header("Sec-Fetch-Mode", "navigate")
            .call()
            .unwrap();
        (r.status().as_u16(), ())
    };
    assert_ne!(status, 403);
}

#[test]
fn allowed_origins_are_the_ones_the_user_named() {
    let s = Server::start(ServerConfig { cors_origins: vec!["http://localhost:3000".into()], ..config() });
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).to_string();
    let (status, r) = send(
        &s,
        "POST",
        "/v1/chat/completions",
        Some("application/json"),
        &chat,
        &[("Origin", "http://localhost:3000"), ("Sec-Fetch-Site", "cross-site")],
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        send(
            &s,
            "POST",
            "/v1/chat/completions",
            Some("application/json"),
            &chat,
            &[("Origin", "http://localhost:3001")]
        )
        .0,
        403
    );
    drop(s);
    // '*' is the user's choice to let every page in (it no longer brings the server down).
    let s = Server::start(ServerConfig { cors_origins: vec!["*".into()], ..config() });
    assert_eq!(send(&s, "POST", "/v1/chat/completions", Some("application/json"), &chat, &[EVIL]).0, 200);
    drop(s);
    let refused = hillside_server::App::new(
        common::server::engine(),
        ServerConfig { cors_origins: vec!["localhost:3000".into()], ..config() },
    )
    .err()
    .unwrap();
    assert!(matches!(refused, hillside_server::StartError::NotAnOrigin(_)), "{refused}");
    assert!(refused.to_string().contains("not an origin"), "{refused}");
}

#[test]
fn client_numbers_and_lists_are_bounded() {
    let dir = Scratch::new("hostile-amplification");
    let s = Server::start(with_documents(&dir));
    // A max_tokens that wraps when added to the prompt's length.
    let (status, e) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": u64::MAX}));
    assert_eq!((status, e["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{e}");
    let (status, e) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": u64::MAX}),
    );
    assert_eq!(status, 400, "{e}");
    // Stop strings: a few short ones.
    let many: Vec<String> = (0..17).map(|i| format!("stop{i}")).collect();
    let (status, e) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2, "stop": many}));
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("stop")), "{e}");
    let (status, _) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2, "stop": "x".repeat(257)}));
    assert_eq!(status, 400);
    let (status, r) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2, "stop": (0..16).map(|i| format!("{i}").repeat(16)).collect::<Vec<_>>()}));
    assert_eq!(status, 200, "{r}");
    // One document named 3,000 times: refused before any copy is loaded.
    let (_, doc) = upload(&s.base, "notes.txt", "The harbour board met on Monday. ".repeat(200).as_bytes(), &[]);
    let id = doc["id"].as_str().unwrap().to_string();
    let question = |ids: Vec<String>| json!({"messages": [{"role": "user", "content": "When did the board meet?"}], "max_tokens": 4, "hillside": {"documents": ids}});
    let started = Instant::now();
    let (status, e) = s.post("/v1/chat/completions", &question(vec![id.clone(); 3000]));
    let elapsed = started.elapsed();
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("hillside.documents")), "{e}");
    eprintln!("3,000 copies of one document refused in {:.1} ms", elapsed.as_secs_f64() * 1e3);
    let (status, e) = s.post("/v1/chat/completions", &question(vec![id.clone(), id.clone()]));
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("hillside.documents[1]")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("named twice"), "{e}");
    let (status, _) = s.post("/v1/chat/completions", &question((0..9).map(|i| format!("{i:016x}")).collect()));
    assert_eq!(status, 400);
    let (status, r) = s.post("/v1/chat/completions", &question(vec![id]));
    assert_eq!(status, 200, "{r}");
}

/// Streams a chat reply on its own thread: its chunks' text, and the longest wait between two.
fn chat_beside(base: String) -> std::thread::JoinHandle<(String, Duration)> {
    std::thread::spawn(move || {
        let body = json!({"messages": [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}], "max_tokens": 160, "temperature": 0, "stream": true});
        let r = agent()
            .post(&format!("{base}/v1/chat/completions"))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let (mut text, mut longest, mut last) = (String::new(), Duration::ZERO, Instant::now());
        for line in BufReader::new(r.into_body().into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else { continue };
            longest = longest.max(last.elapsed());
            last = Instant::now();
            if data != "[DONE]" {
                let chunk: Value = serde_json::from_str(data).unwrap();
                text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            }
        }
        (text, longest)
    })
}

#[test]
fn hostile_files_are_refused_naming_the_bound_while_a_chat_streams() {
    let dir = Scratch::new("hostile-files");
    let s = Server::start(with_documents(&dir));
    let chat = chat_beside(s.base.clone());
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bomb.docx", docx_bomb(16), "max_unpacked_bytes"),
        ("spine.epub", epub_spine_bomb(200, 10_000), "max_unpacked_bytes"),
        ("deep.html", nested_html("blockquote", 50_000).into_bytes(), "max_nesting_depth"),
        ("divs.html", nested_html("div", 100_000).into_bytes(), "max_nesting_depth"),
        ("deep.epub", nested_epub(50_000), "max_nesting_depth"),
        ("deep.docx", nested_docx(50_000), "max_nesting_depth"),
    ];
    for (name, bytes, bound) in &files {
        let started = Instant::now();
        let (status, e) = upload(&s.base, name, bytes, &[]);
        let elapsed = started.elapsed();
        assert_eq!(
            (status, e["error"]["code"].as_str(), e["error"]["param"].as_str()),
            (413, Some("document_over_limit"), Some(*bound)),
            "{name}: {e}"
        );
        assert!(e["error"]["message"].as_str().unwrap().contains(name), "{e}");
        assert_eq!(s.get("/health").0, 200);
        eprintln!(
            "{name} ({:.1} MB) refused in {:.2} s: {}",
            bytes.len() as f64 / 1e6,
            elapsed.as_secs_f64(),
            e["error"]["message"]
        );
    }
    assert_eq!(documents(&s), 0, "nothing was stored");
    let (text, longest) = chat.join().unwrap();
    assert!(!text.trim().is_empty());
    eprintln!(
        "the chat beside streamed {} bytes; its longest wait between chunks was {:.0} ms",
        text.len(),
        longest.as_secs_f64() * 1e3
    );
    // The same server reads a real document as ever.
    let (status, doc) = upload(&s.base, "gpl.txt", common::shared_document("gpl-3.0.txt").as_bytes(), &[]);
    assert_eq!(status, 201, "{doc}");
}
