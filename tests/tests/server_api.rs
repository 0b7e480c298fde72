//! `hillside serve`'s API over real HTTP on 127.0.0.1, on the real model: every route, streamed
//! and not, stop strings, usage rules, each error status, concurrency and cancellation.

mod common;

use common::server::{agent, config, Server, MODEL};

use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::scheduler::{Phase, SchedulerConfig};
use hillside_server::ServerConfig;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn shared() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| Server::start(config()))
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 24});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// The chunks' JSON (without `[DONE]`, which must come last) and the text they carry.
fn chunks(events: &[String]) -> (Vec<Value>, String) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
        .collect();
    (chunks, text)
}

/// Whether `condition` holds within `timeout`, polled: what the server does after a client
/// has its answer (retiring the sequence, removing its files) happens a moment later.
fn eventually(timeout: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn chat_reply_whole_and_streamed_agree() {
    let s = shared();
    let (status, whole) = s.post("/v1/chat/completions", &chat("Name three colors.", json!({})));
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], MODEL);
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let usage = &whole["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 10);
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + completion);
    let finish = whole["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || (finish == "length" && completion == 24), "{whole}");

    let events = s.stream("/v1/chat/completions", &chat("Name three colors.", json!({"stream": true})));
    let (chunks, streamed) = chunks(&events);
    assert_eq!(streamed, text, "streamed deltas (spaces included) join into the same reply");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "usage is only sent when asked for");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], finish);
}

#[test]
fn usage_is_streamed_only_when_asked_and_only_at_the_end() {
    let s = shared();
    let body = chat("Say hello.", json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 8}));
    let (chunks, _) = chunks(&s.stream("/v1/chat/completions", &body));
    let (last, rest) = chunks.split_last().unwrap();
    assert!(rest.iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()), "usage: null before the end");
    assert_eq!(last["choices"], json!([]));
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert!(last["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn stop_strings_end_the_reply_and_are_never_sent() {
    let s = shared();
    let prompt = "Write two sentences about the sea.";
    let (_, free) = s.post("/v1/chat/completions", &chat(prompt, json!({"max_tokens": 40})));
    let free = free["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // A stop string from the middle of the free reply.
    let words: Vec<&str> = free.split_whitespace().collect();
    assert!(words.len() > 4, "{free}");
    let stop = words[2];
    let cut = &free[..free.find(stop).unwrap()];
    for stream in [false, true] {
        let body = chat(prompt, json!({"max_tokens": 40, "stop": [stop, "unlikely-stop"], "stream": stream}));
        let (text, finish) = if stream {
            let (chunks, text) = chunks(&s.stream("/v1/chat/completions", &body));
            (text, chunks.last().unwrap()["choices"][0]["finish_reason"].clone())
        } else {
            let (_, r) = s.post("/v1/chat/completions", &body);
            (
                r["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
                r["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(text, cut, "stream={stream}: the reply ends right before the stop string");
        assert_eq!(finish, "stop");
    }
    // A single string works too.
    let (_, r) = s.post("/v1/chat/completions", &chat(prompt, json!({"max_tokens": 40, "stop": stop})));
    assert_eq!(r["choices"][0]["message"]["content"], cut);
}

#[test]
fn text_completions_with_logprobs() {
    let s = shared();
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "repeat_penalty": 1.0, "logprobs": 2});
    let (status, r) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let choice = &r["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap());
    assert_eq!(tokens.concat(), text);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        // Greedy: the chosen token is the most likely one.
        assert!(top.values().all(|v| v.as_f64().unwrap() <= chosen + 1e-6), "{top:?} vs {chosen}");
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (chunks, streamed) = chunks(&s.stream("/v1/completions", &streamed_body));
    assert_eq!(streamed, text);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], choice["finish_reason"]);

    // Chat log-probabilities: one entry per token, each with its alternatives.
    let (_, r) =
        s.post("/v1/chat/completions", &chat("Hi!", json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 5})));
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap());
    assert!(content
        .iter()
        .all(|t| t["top_logprobs"].as_array().unwrap().len() == 3 && t["logprob"].as_f64().unwrap() <= 0.0));
}

fn assert_error(status: u16, body: &Value, want_status: u16, want: &str) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(e["message"].as_str().unwrap().contains(want), "{body}");
    assert!(
        e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(),
        "OpenAI's error shape: {body}"
    );
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let s = shared();
    let (st, b) = s.post("/v1/chat/completions", &chat("hi", json!({"temperature": "hot"})));
    assert_error(st, &b, 400, "temperature");
    assert_eq!(b["error"]["param"], "temperature");
    let (st, b) = s.post_raw("/v1/chat/completions", "{\"messages\": [", &[]);
    assert_error(st, &b, 400, "not valid JSON");
    let (st, b) = s.post("/v1/chat/completions", &chat("hi", json!({"n": 2})));
    assert_error(st, &b, 400, "n = 2");
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": []}));
    assert_error(st, &b, 400, "at least one message");
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "tool", "content": "x"}]}));
    assert_error(st, &b, 400, "role 'tool'");
    let (st, b) = s.post("/v1/chat/completions", &chat("hi", json!({"model": "gpt-4o"})));
    assert_error(st, &b, 404, "gpt-4o");
    assert_eq!(b["error"]["code"], "model_not_found");
    let (st, b) = s.get("/v1/nothing-here");
    assert_error(st, &b, 404, "/v1/nothing-here");
    let (st, b) = s.get("/v1/chat/completions");
    assert_error(st, &b, 405, "does not take GET");
    // Unknown fields are ignored, and the model's file name works as its id.
    let (st, _) = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "user": "x", "max_tokens": 2})),
    );
    assert_eq!(st, 200);

    // Over the context (2048 here): a 400 that says so, not a crash or a silent cut.
    let long = "word ".repeat(3000);
    let (st, b) = s.post("/v1/chat/completions", &chat(&long, json!({})));
    assert_error(st, &b, 400, "maximum context length is 2048 tokens");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    let (st, b) = s.post("/v1/completions", &json!({"prompt": "word ".repeat(1500), "max_tokens": 1000}));
    assert_error(st, &b, 400, "1000 requested for the completion");
    // Nothing was left behind by the refused requests.
    let (_, seqs) = s.get("/v1/hillside/sequences");
    assert!(seqs["sequences"].as_array().unwrap().iter().all(|q| q["phase"] != "queued"), "{seqs}");
}

#[test]
fn body_limit_api_key_and_health() {
    let s = Server::start(ServerConfig { api_key: Some("sk-test-key".into()), max_body_bytes: 10_000, ..config() });
    let (st, b) = s.post("/v1/chat/completions", &chat("hi", json!({})));
    assert_error(st, &b, 401, "API key");
    let (st, b) = s.post_raw(
        "/v1/chat/completions",
        &chat("hi", json!({})).to_string(),
        &[("Authorization", "Bearer sk-wrong-key")],
    );
    assert_error(st, &b, 401, "API key");
    let auth = [("Authorization", "Bearer sk-test-key")];
    let (st, b) = s.post_raw("/v1/chat/completions", &chat("hi", json!({"max_tokens": 2})).to_string(), &auth);
    assert_eq!(st, 200, "{b}");
    let (st, b) = s.post_raw("/v1/chat/completions", &chat(&"a".repeat(20_000), json!({})).to_string(), &auth);
    assert_error(st, &b, 413, "10000 bytes");
    // Health needs no key; everything else does.
    let (st, h) = s.get("/health");
    assert_eq!((st, h["status"].as_str()), (200, Some("ok")));
    assert_eq!(s.get("/v1/models").0, 401);
    let (_, config) = {
        let mut r =
            agent().get(&s.url("/v1/hillside/config")).header("Authorization", "Bearer sk-test-key").call().unwrap();
        ((), serde_json::from_str::<Value>(&r.body_mut().read_to_string().unwrap()).unwrap())
    };
    assert_eq!(config["api_key_required"], true);
    assert!(!config.to_string().contains("sk-test-key"), "the key is never shown: {config}");
}

#[test]
fn requests_from_this_machine_must_be_addressed_to_it() {
    // DNS rebinding: a page on another site resolves its own name to 127.0.0.1, so the browser
    // connects over loopback with that name in Host. Sent over a raw socket, as a browser would.
    let s = shared();
    let addr = s.url("").trim_start_matches("http://").to_string();
    let request = |host: Option<&str>, path: &str| {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        let host = host.map_or(String::new(), |h| format!("Host: {h}\r\n"));
        write!(stream, "GET {path} HTTP/1.1\r\n{host}Connection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let port = addr.rsplit(':').next().unwrap();
    for host in ["evil.example", &format!("evil.example:{port}"), "localhost.evil.example"] {
        for path in ["/v1/models", "/", "/health"] {
            let response = request(Some(host), path);
            assert!(response.starts_with("HTTP/1.1 403"), "{host} {path}: {response}");
            assert!(response.contains("foreign_host") && response.contains("addressed to it"), "{response}");
        }
    }
    for host in
        [format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}"), "localhost".to_string()]
    {
        assert!(request(Some(&host), "/v1/models").starts_with("HTTP/1.1 200"), "{host}");
    }
}

#[test]
fn models_and_openapi_describe_the_server() {
    let s = shared();
    let (st, models) = s.get("/v1/models");
    assert_eq!(st, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(s.get(&format!("/v1/models/{MODEL}")).1["id"], MODEL);
    assert_eq!(s.get("/v1/models/gpt-4o").0, 404);
    let (_, doc) = s.get("/openapi.json");
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{id}",
        "/health",
        "/v1/hillside/sequences",
        "/v1/hillside/config",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing from the OpenAPI document");
    }
    assert!(doc["components"]["schemas"].get("ChatCompletionRequest").is_some());
}

#[test]
fn a_full_queue_is_a_429_with_retry_after() {
    let s = Server::start(ServerConfig {
        scheduler: SchedulerConfig { max_live: 1, max_queued: 0, ..config().scheduler },
        ..config()
    });
    // Hold the only slot with a long stream, read until it is generating.
    let r = agent()
        .post(&s.url("/v1/completions"))
        .header("Content-Type", "application/json")
        .send(json!({"prompt": "Once upon a time", "max_tokens": 1500, "stream": true}).to_string())
        .unwrap();
    let mut lines = BufReader::new(r.into_body().into_reader()).lines();
    while !lines.next().unwrap().unwrap().starts_with("data: ") {}
    let r = agent()
        .post(&s.url("/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(chat("hi", json!({})).to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    drop(lines);
}

#[test]
fn sixteen_concurrent_streams_get_their_own_answers() {
    let s = Server::start(config());
    let prompts =
        ["What is the capital of Germany?", "Name a fruit.", "What is 2 + 2?", "Say something about the sea."];
    // Alone first, then all at once: greedy decoding must give each the same text.
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| chunks(&s.stream("/v1/chat/completions", &chat(p, json!({"stream": true})))).1)
        .collect();
    let peak_live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (peak, watching, url) = (peak_live.clone(), watching.clone(), s.url("/v1/hillside/sequences"));
        std::thread::spawn(move || {
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let mut r = agent().get(&url).call().unwrap();
                let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
                let live = v["sequences"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|q| q["phase"] == "prefill" || q["phase"] == "decode")
                    .count();
                peak.fetch_max(live, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (url, body) = (s.url("/v1/chat/completions"), chat(prompts[i % 4], json!({"stream": true})));
            std::thread::spawn(move || {
                let r = agent().post(&url).header("Content-Type", "application/json").send(body.to_string()).unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let events: Vec<String> = BufReader::new(r.into_body().into_reader())
                    .lines()
                    .map(Result::unwrap)
                    .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
                    .collect();
                chunks(&events).1
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        assert_eq!(c.join().unwrap(), alone[i % 4], "client {i}");
    }
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    let peak = peak_live.load(std::sync::atomic::Ordering::Relaxed);
    assert!((1..=4).contains(&peak), "at most max_live sequences hold memory at once (saw {peak})");
    // The last stream's end can reach its client a moment before the scheduler retires it.
    let settled = || {
        let left = s.app.serving().scheduler().unwrap().stats();
        left.len() <= 2 && left.iter().all(|q| q.phase == Phase::Cached)
    };
    assert!(
        eventually(Duration::from_secs(5), settled),
        "only the prefix cache holds sequences afterwards: {:?}",
        s.app.serving().scheduler().unwrap().stats()
    );
}

#[test]
fn a_client_that_disconnects_frees_its_sequence_and_cold_files() {
    let cold_dir_scratch = tempfile::Builder::new().prefix("hillside-serve-test-").tempdir().unwrap();
    let cold_dir = cold_dir_scratch.path().to_path_buf();
    let kv = KvConfig { store: StoreKind::Tiered, cold_dir: cold_dir.clone(), ..KvConfig::default() };
    let s = Server::start(ServerConfig { scheduler: SchedulerConfig { kv, ..config().scheduler }, ..config() });
    let cold_files = || common::cold_files(&cold_dir);
    // A raw socket, so that dropping it really closes the connection.
    let addr = s.base.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 1800, "stream": true}).to_string();
    write!(socket, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("data: ").count() < 3 {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let (_, live) = s.get("/v1/hillside/sequences");
    let seq = &live["sequences"][0];
    assert_eq!(seq["phase"], "decode", "{live}");
    assert!(seq["kv"]["tier"]["hot_budget_bytes"].as_u64().unwrap() > 0, "a tiered store: {live}");
    assert_eq!(cold_files(), 1, "the sequence has its cold-pool file");
    drop(socket);
    let gone = || s.get("/v1/hillside/sequences").1["sequences"].as_array().unwrap().is_empty() && cold_files() == 0;
    assert!(eventually(Duration::from_secs(10), gone), "the sequence outlived its client");
}

#[test]
fn cors_answers_only_the_configured_origins() {
    let preflight = |s: &Server, origin: &str| {
        let r = agent()
            .options(&s.url("/v1/chat/completions"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header("Access-Control-Request-Headers", "authorization,content-type")
            .call()
            .unwrap();
        r.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(preflight(shared(), "http://localhost:3000"), None, "CORS is off by default");
    let s = Server::start(ServerConfig { cors_origins: vec!["http://localhost:3000".into()], ..config() });
    assert_eq!(preflight(&s, "http://localhost:3000").as_deref(), Some("http://localhost:3000"));
    assert_eq!(preflight(&s, "http://evil.example"), None);
}

#[test]
fn a_reply_without_max_tokens_ends_at_the_servers_default_or_the_context_with_length() {
    let s = Server::start(ServerConfig {
        scheduler: SchedulerConfig { context_tokens: Some(64), ..config().scheduler },
        ..config()
    });
    let body = json!({"prompt": "One, two, three, four,", "temperature": 0, "repeat_penalty": 1.0, "stop": []});
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    // Greedy counting goes on and on: the reply fills the context and says so.
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["total_tokens"], 64, "it ran to the end of the context: {r}");
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "word ".repeat(100)}));
    assert_error(st, &r, 400, "maximum context length is 64 tokens");

    // With a default (`hillside serve --max-tokens`), such a reply stops there instead; a request
    // that names its own bound still gets it.
    let s = Server::start(ServerConfig { default_max_tokens: Some(5), ..config() });
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        (r["choices"][0]["finish_reason"].as_str(), r["usage"]["completion_tokens"].as_u64()),
        (Some("length"), Some(5)),
        "{r}"
    );
    let mut bounded = body.clone();
    bounded["max_tokens"] = json!(9);
    let (_, r) = s.post("/v1/completions", &bounded);
    assert_eq!(r["usage"]["completion_tokens"], 9, "{r}");
}

#[test]
fn the_next_turn_reuses_the_conversation_so_far_without_changing_the_answer() {
    let document = common::shared_document("pride-and-prejudice.txt")[2000..5000].to_string();
    let turn1 = vec![json!({"role": "user", "content": format!("{document}\n\nWho is this passage about?")})];
    let ask = |s: &Server, messages: &Vec<Value>| {
        s.post("/v1/chat/completions", &json!({"messages": messages, "temperature": 0, "max_tokens": 20})).1
    };
    let cached = Server::start(config());
    let first = ask(&cached, &turn1);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{first}");
    let mut turn2 = turn1.clone();
    turn2.push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
    turn2.push(json!({"role": "user", "content": "And where does it take place?"}));
    let second = ask(&cached, &turn2);
    let reused = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(reused >= first["usage"]["prompt_tokens"].as_u64().unwrap(), "the whole first turn is reused: {second}");
    // A server that keeps nothing reads it all again, and answers the same.
    let uncached = Server::start(ServerConfig {
        scheduler: SchedulerConfig { cached_sequences: 0, ..config().scheduler },
        ..config()
    });
    let again = ask(&uncached, &turn2);
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(again["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]);
}

/// Needs the engine's fault injection, which only builds with debug assertions have.
#[cfg(debug_assertions)]
#[test]
fn a_panic_in_one_sequence_fails_only_that_one_and_the_server_keeps_serving() {
    use hillside_engine::kv::fault::{self, ColdFaults};
    let cold_dir_scratch = tempfile::Builder::new().prefix("hillside-serve-panic-").tempdir().unwrap();
    let cold_dir = cold_dir_scratch.path().to_path_buf();
    // The second cold pool created there panics on its first read (its first decode step), as
    // a bug in one sequence's store would.
    fault::inject(&cold_dir, ColdFaults { panicking_pool: Some(1), ..ColdFaults::default() });
    let kv = KvConfig { store: StoreKind::Offload, cold_dir: cold_dir.clone(), ..KvConfig::default() };
    let s = Server::start(ServerConfig {
        scheduler: SchedulerConfig { kv, cached_sequences: 0, ..config().scheduler },
        ..config()
    });
    let prompts =
        ["What is the capital of Germany?", "Name a fruit.", "What is 2 + 2?", "Say something about the sea."];
    let reply = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // The offload store gives the full cache's text exactly: the reference is the shared server.
    let want: Vec<String> =
        prompts.iter().map(|p| reply(&shared().post("/v1/chat/completions", &chat(p, json!({}))).1)).collect();
    let clients: Vec<_> = prompts[..3]
        .iter()
        .map(|p| {
            let (url, body) = (s.url("/v1/chat/completions"), chat(p, json!({})));
            std::thread::spawn(move || {
                let mut r =
                    agent().post(&url).header("Content-Type", "application/json").send(body.to_string()).unwrap();
                (r.status().as_u16(), serde_json::from_str::<Value>(&r.body_mut().read_to_string().unwrap()).unwrap())
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let failed: Vec<&(u16, Value)> = answers.iter().filter(|(st, _)| *st != 200).collect();
    assert_eq!(failed.len(), 1, "exactly the panicking sequence fails: {answers:?}");
    let (st, body) = failed[0];
    assert_error(*st, body, 500, "internal error");
    assert!(body["error"]["message"].as_str().unwrap().contains("injected fault"), "{body}");
    for (i, (st, body)) in answers.iter().enumerate().filter(|(_, (st, _))| *st == 200) {
        assert_eq!((*st, reply(body)), (200, want[i].clone()), "request {i}");
    }
    // The server still answers, with the same text as before.
    assert_eq!(s.get("/health").0, 200);
    let (st, body) = s.post("/v1/chat/completions", &chat(prompts[3], json!({})));
    assert_eq!((st, reply(&body)), (200, want[3].clone()));
    fault::clear(&cold_dir);
    drop(s);
    assert_eq!(common::cold_files(&cold_dir), 0, "the failed sequence's cold file is gone too");
}
