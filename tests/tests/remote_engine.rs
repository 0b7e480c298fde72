//! Hillside on a remote OpenAI-compatible engine: llama.cpp's own `llama-server` (built from the
//! PyPI sdist by scripts/llama-cpp-build.sh, cached outside the clone) serving the default model
//! on 127.0.0.1. A chat, a hierarchical summary with sources and a follow-up question that the
//! remote's prefix cache serves; the remote killed mid-summary; 429s and garbage from a proxy;
//! `hillside serve` on the remote: the API, the documents routes, the tier view refused.

mod common;

use common::llama_server::LlamaServer;
use common::server::Server;
use hillside_server::{DocumentsConfig, ServerConfig};
use serde_json::{json, Value};

use hillside_documents::chunks::Mode;
use hillside_documents::questions::question;
use hillside_documents::summarize::{summarize, Checkpoints, Progress, Request, Runner, SummaryError};
use hillside_documents::{read_bytes, Limits};
use hillside_engine::{CancelFlag, ChatMessage, FinishReason, GenerateParams, SamplingParams};
use hillside_front::{EngineFront, RemotePrompt};
use hillside_remote::{RemoteConfig, RemoteEngine, RemoteError};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Each of llama-server's slots gets this context (its `-c` is shared by its slots).
const SLOT_CONTEXT: usize = 2048;
const SLOTS: usize = 4;

/// llama-server with the default model and four slots.
fn start_llama_server() -> LlamaServer {
    let context = (SLOT_CONTEXT * SLOTS).to_string();
    LlamaServer::start(&common::model_path(), &["--alias", "smollm2", "-c", &context, "-np", &SLOTS.to_string()])
}

fn connect(url: &str) -> Arc<RemoteEngine> {
    Arc::new(
        RemoteEngine::connect(&RemoteConfig { url: url.into(), concurrency: SLOTS, ..RemoteConfig::default() })
            .unwrap(),
    )
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, sampling: SamplingParams::greedy(), ..GenerateParams::default() }
}

fn runner(front: &EngineFront) -> Runner<'_> {
    Runner::new(front, None, None)
}

/// Keeps every finished step's note in memory.
#[derive(Default, Clone)]
struct Kept(Arc<Mutex<BTreeMap<String, String>>>);

impl Checkpoints for Kept {
    fn resume(&mut self, _: &str) -> BTreeMap<String, String> {
        self.0.lock().unwrap().clone()
    }
    fn keep(&mut self, _: &str, _: usize, step: &str, note: &str) {
        self.0.lock().unwrap().insert(step.to_string(), note.to_string());
    }
}

#[test]
fn a_chat_a_summary_with_sources_and_a_follow_up_run_on_llama_server() {
    let server = start_llama_server();
    let remote = connect(&server.url());
    assert_eq!(remote.model(), "smollm2");
    assert_eq!(remote.models().iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["smollm2"]);
    assert_eq!(remote.context_tokens(), SLOT_CONTEXT, "the slot's context, from /props");
    assert_eq!(remote.count_tokens("Hello world, this is a test."), 8, "counted by the remote's tokenizer");

    // A chat: the streamed pieces make the reply the remote gives whole, with its counts.
    let mut text = String::new();
    let asked = [ChatMessage::new("user", "What is the capital of France?")];
    let done = remote
        .chat(&asked, &greedy(24), &mut |t: &str| {
            text.push_str(t);
            true
        })
        .unwrap();
    let whole: serde_json::Value = ureq::post(&format!("{}/v1/chat/completions", server.url()))
        .send_json(serde_json::json!({"model": "smollm2", "messages": asked, "max_tokens": 24, "temperature": 0.0, "top_p": 1.0}))
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(
        (done.prompt_tokens, done.completion_tokens),
        (
            whole["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            whole["usage"]["completion_tokens"].as_u64().unwrap() as usize
        )
    );

    // A hierarchical summary of the GPL's sections up to 8 (about 4,600 tokens): chunk notes and
    // merges on the remote, sources local.
    let doc = read_bytes("gpl-3.0.txt", common::gpl_before_section(8).as_bytes(), &Limits::default()).unwrap();
    let mut progress = Vec::new();
    let front = EngineFront::Remote(remote.clone());
    let summary = summarize(&runner(&front), &doc, "gpl", &mut Kept::default(), &CancelFlag::default(), &mut |p| {
        progress.push(p)
    })
    .unwrap();
    let Mode::Hierarchical { chunks, .. } = &summary.plan.mode else {
        panic!("the GPL is longer than a slot: {:?}", summary.plan)
    };
    assert!(chunks.len() >= 4, "{chunks:?}");
    assert_eq!(progress.iter().filter(|p| matches!(p, Progress::ChunkSummarized { .. })).count(), chunks.len());
    // How many points the merge writes varies from run to run: llama-server batches the chunks'
    // concurrent requests as they arrive, and its sums change with the batch.
    assert!(!summary.points.is_empty(), "{summary:?}");
    assert!(
        summary.points.iter().any(|p| !p.sources.is_empty()),
        "points come with their sources: {:?}",
        summary.points
    );
    for source in summary.points.iter().flat_map(|p| &p.sources) {
        assert!(source.bytes.end <= doc.text.len() && source.bytes.start < source.bytes.end);
    }

    // A follow-up question: the document's chunk first, so a second question on it finds the
    // remote's prefix cache warm.
    let ask = |q: &str| {
        let asked = question(&runner(&front), &[("gpl".into(), doc.clone())], &[ChatMessage::new("user", q)]).unwrap();
        assert!(
            matches!(asked.request, Request::Remote(RemotePrompt::Chat(_))),
            "a remote runner's request is messages"
        );
        front.generate(asked.request, greedy(16), &CancelFlag::default(), &mut |_| {}).unwrap()
    };
    ask("What does the license say about patents?");
    let again = ask("What does the license say about patent licenses?");
    assert!(again.reused_tokens * 10 > again.prompt_tokens * 8, "the document prefix is reused: {again:?}");
}

#[test]
fn a_remote_killed_mid_summary_gives_a_clear_error_and_keeps_only_finished_steps() {
    let mut server = start_llama_server();
    let remote = Arc::new(
        RemoteEngine::connect(&RemoteConfig { url: server.url(), concurrency: 1, ..RemoteConfig::default() }).unwrap(),
    );
    let text = common::shared_document("pride-and-prejudice.txt");
    let doc = read_bytes("pride.txt", &text.as_bytes()[..60_000], &Limits::default()).unwrap();
    let kept = Kept::default();
    let mut checkpoints = kept.clone();
    let mut killed = false;
    let front = EngineFront::Remote(remote.clone());
    let result = summarize(&runner(&front), &doc, "pride", &mut checkpoints, &CancelFlag::default(), &mut |p| {
        if matches!(p, Progress::ChunkSummarized { done: 1, .. }) && !killed {
            killed = true;
            server.child.kill().unwrap();
            server.child.wait().unwrap();
        }
    });
    assert!(killed, "the summary never finished a chunk");
    let e = result.unwrap_err();
    assert!(matches!(e, SummaryError::Remote(RemoteError::Unreachable { .. } | RemoteError::Garbage { .. })), "{e:?}");
    assert!(e.to_string().contains(&server.url()), "the error names the remote: {e}");
    // The chunk that finished is kept whole (a resume starts after it); no half-written note.
    let kept = kept.0.lock().unwrap().clone();
    assert!(!kept.is_empty() && kept.keys().all(|k| k.starts_with("chunk ")), "{kept:?}");
    assert!(kept.values().all(|note| !note.is_empty()));
}

/// A proxy in front of `upstream` that answers the first `busy` chat completions 429 (with
/// `Retry-After`) and, with `garbage`, every one after with a page of HTML; the rest pass.
fn proxy(upstream: u16, busy: usize, garbage: bool) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = Arc::new(AtomicUsize::new(0));
    let count = refused.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(client.try_clone().unwrap());
                let mut head = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if !line.to_ascii_lowercase().starts_with("connection:") {
                        head.push_str(&line);
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let mut client = client;
                if head.contains("/chat/completions") {
                    if count.fetch_add(1, Ordering::SeqCst) < busy {
                        let _ = client.write_all(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0.2\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                        return;
                    }
                    if garbage {
                        let page = "<html><body>502 Bad Gateway</body></html>";
                        let _ = write!(client, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\ndata: {page}\n\n", page.len() + 8);
                        return;
                    }
                }
                let mut up = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                up.write_all(head.as_bytes()).unwrap();
                up.write_all(b"Connection: close\r\n\r\n").unwrap();
                up.write_all(&body).unwrap();
                let _ = std::io::copy(&mut up, &mut client);
            });
        }
    });
    (port, refused)
}

#[test]
fn busy_answers_are_retried_as_the_remote_asks_and_garbage_is_a_clear_error() {
    let server = start_llama_server();
    let (port, seen) = proxy(server.port, 3, false);
    let remote = connect(&format!("http://127.0.0.1:{port}/v1"));
    let mut text = String::new();
    let done = remote
        .chat(&[ChatMessage::new("user", "Say hello.")], &greedy(8), &mut |t: &str| {
            text.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 4, "three 429s, then the answer");
    assert!(!text.is_empty() && done.finish_reason != FinishReason::Cancelled, "{done:?}");

    // Busy for good: the retries end, and the error says so.
    let (port, _) = proxy(server.port, usize::MAX, false);
    let e = connect(&format!("http://127.0.0.1:{port}"))
        .chat(&[ChatMessage::new("user", "Hi")], &greedy(4), &mut |_: &str| true)
        .unwrap_err();
    assert!(matches!(e, RemoteError::Busy { status: 429, .. }), "{e:?}");

    let (port, _) = proxy(server.port, 0, true);
    let e = connect(&format!("http://127.0.0.1:{port}"))
        .chat(&[ChatMessage::new("user", "Hi")], &greedy(4), &mut |_: &str| true)
        .unwrap_err();
    assert!(matches!(&e, RemoteError::Garbage { why, .. } if why.contains("502 Bad Gateway")), "{e:?}");
}

#[test]
fn the_server_on_a_remote_engine_serves_the_api_and_documents_and_refuses_the_tier_view() {
    let mut llama = start_llama_server();
    let remote = connect(&llama.url());
    let dir = common::Scratch::new("remote-server");
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 200_000,
        model_key: "remote-test".into(),
    };
    let config = ServerConfig {
        model_id: remote.model().into(),
        model_aliases: Vec::new(),
        installed_models: vec![remote.model().into()],
        documents: Some(documents),
        ..common::server::config()
    };
    let s = Server::start_on(remote.clone(), config);

    assert_eq!(s.get("/v1/models").1["data"][0]["id"], "smollm2");
    let (status, health) = s.get("/health");
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")), "{health}");
    let config = s.get("/v1/hillside/config").1;
    assert_eq!(
        (config["engine"].as_str(), config["context_tokens"].as_u64()),
        (Some(format!("openai:{}/v1", llama.url()).as_str()), Some(SLOT_CONTEXT as u64)),
        "{config}"
    );
    for path in ["/v1/hillside/tiers", "/v1/hillside/sequences"] {
        let (status, refused) = s.get(path);
        assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("engine_is_remote")), "{path}: {refused}");
    }

    // Log-probabilities and token ids belong to Hillside's own engine: both endpoints say so,
    // naming the field.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logprobs": true});
    let completion = json!({"prompt": "Hi", "max_tokens": 4, "logprobs": 2});
    for (path, body) in [("/v1/chat/completions", &chat), ("/v1/completions", &completion)] {
        let (status, refused) = s.post(path, body);
        assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("logprobs")), "{path}: {refused}");
    }
    let (status, refused) = s.post("/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 4}));
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("prompt")), "{refused}");

    // Chat, whole and streamed, is the remote's own reply.
    // Greedy, and no repeat penalty: the server's own default sampling would otherwise apply.
    let asked = json!({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12, "temperature": 0, "repeat_penalty": 1.0});
    let (status, whole) = s.post("/v1/chat/completions", &asked);
    assert_eq!(status, 200, "{whole}");
    let direct: Value = ureq::post(&format!("{}/v1/chat/completions", llama.url()))
        .send_json(&asked)
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(whole["choices"][0]["message"]["content"], direct["choices"][0]["message"]["content"]);
    assert_eq!(whole["usage"]["completion_tokens"], direct["usage"]["completion_tokens"]);
    let streamed: String = s
        .stream("/v1/chat/completions", &json!({"stream": true, "messages": asked["messages"], "max_tokens": 12, "temperature": 0, "repeat_penalty": 1.0}))
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, whole["choices"][0]["message"]["content"].as_str().unwrap());
    let (status, completion) =
        s.post("/v1/completions", &json!({"prompt": "The sky is", "max_tokens": 4, "temperature": 0}));
    assert_eq!(status, 200, "{completion}");
    assert!(!completion["choices"][0]["text"].as_str().unwrap().is_empty(), "{completion}");
    let (status, refused) = s.post("/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 4}));
    assert_eq!(
        (status, refused["error"]["param"].as_str()),
        (400, Some("prompt")),
        "token ids need the local vocabulary: {refused}"
    );

    // A document: added (tokens counted by the remote), summarized there, asked about. The GPL's
    // preamble and definitions, which a slot holds whole.
    let gpl = common::gpl_before_section(1);
    let (status, added) = common::server::upload(&s.base, "gpl.txt", gpl.as_bytes(), &[]);
    assert_eq!(status, 201, "{added}");
    let id = added["id"].as_str().unwrap().to_string();
    let (tokens, counted) = (added["tokens"].as_u64().unwrap() as f64, remote.count_tokens(&gpl) as f64);
    assert!(
        (tokens - counted).abs() < counted * 0.02,
        "the remote's tokenizer counted the document: {tokens} against {counted}"
    );
    let events: Vec<Value> = s
        .stream(&format!("/v1/hillside/documents/{id}/summary"), &json!({}))
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let summary = events.last().unwrap();
    assert_eq!(summary["object"], "hillside.summary", "{summary}");
    assert!(summary["points"].as_array().is_some_and(|p| !p.is_empty()), "{summary}");
    let ask = |q: &str| {
        s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": q}], "max_tokens": 8, "temperature": 0, "hillside": {"documents": [id]}}))
    };
    assert_eq!(ask("What does it say about patents?").0, 200);
    let (status, again) = ask("What does it say about patent licenses?");
    assert_eq!(status, 200, "{again}");
    let (prompt, cached) = (
        again["usage"]["prompt_tokens"].as_u64().unwrap(),
        again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    );
    assert!(cached * 10 > prompt * 8, "the remote's prefix cache served the document: {again}");

    // The remote gone: health and chat say so, and the server stays up.
    llama.child.kill().unwrap();
    llama.child.wait().unwrap();
    let (status, down) = s.get("/health");
    assert_eq!((status, down["error"]["code"].as_str()), (502, Some("remote_engine_failed")), "{down}");
    let (status, failed) = s.post("/v1/chat/completions", &asked);
    assert_eq!(status, 502, "{failed}");
    assert!(failed["error"]["message"].as_str().unwrap().contains(&llama.url()), "{failed}");
    assert_eq!(s.get("/v1/models").0, 200);
}
