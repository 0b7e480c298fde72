//! The documents API over real HTTP on the real model: upload, summary as server-sent events,
//! questions through `/v1/chat/completions` that reuse the document's K/V (also after a
//! restart), deletion; bad files refused with the reason and nothing stored; a server killed
//! with SIGKILL mid-summary leaves the library whole and no stray K/V files.

mod common;

use common::server::{agent, config, Server};
use common::Scratch;
use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::scheduler::SchedulerConfig;
use hillside_server::{DocumentsConfig, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const CHILD: &str = "HILLSIDE_TEST_DOCUMENTS_SERVER";

fn with_documents(dir: &Path) -> ServerConfig {
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 200_000,
        model_key: "smollm2-test".into(),
    };
    ServerConfig { documents: Some(documents), ..config() }
}

fn upload_to(base: &str, name: &str, bytes: &[u8]) -> (u16, Value) {
    common::server::upload(base, name, bytes, &[])
}

fn upload(s: &Server, name: &str, bytes: &[u8]) -> (u16, Value) {
    upload_to(&s.base, name, bytes)
}

fn ask(s: &Server, id: &str, question: &str) -> Value {
    let body = json!({"messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 24, "hillside": {"documents": [id]}});
    let (status, reply) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_or(Vec::new(), |d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect());
    names.sort();
    names
}

/// Runs the test `name` of this binary in a child process, which serves documents in `dir`
/// (it sees [`CHILD`]) until it is killed: the child and its server's base URL.
fn child_server(name: &str, dir: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture"])
        .env(CHILD, dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
    let base = lines.by_ref().find(|l| l.starts_with("http://")).expect("the child serves");
    // The pipe stays read: libtest's "running for over 60 seconds" notice into a closed pipe
    // would end the child on its own, before the kill this test is about.
    std::thread::spawn(move || lines.for_each(drop));
    (child, base)
}

fn gpl_start() -> String {
    common::shared_document("gpl-3.0.txt")[..6000].to_string()
}

#[test]
fn a_document_is_uploaded_summarized_asked_about_after_a_restart_and_deleted() {
    let dir = Scratch::new("docs-http-flow");
    let gpl = gpl_start();
    let id;
    let (answer, cached) = {
        let s = Server::start(with_documents(&dir));
        let (status, doc) = upload(&s, "gpl-start.txt", gpl.as_bytes());
        assert_eq!(status, 201, "{doc}");
        id = doc["id"].as_str().unwrap().to_string();
        assert_eq!((doc["format"].as_str(), doc["mode"].as_str()), (Some("text"), Some("whole")), "{doc}");
        assert!(doc["tokens"].as_u64().unwrap() > 1000 && doc["summary"].is_null(), "{doc}");
        let (again, same) = upload(&s, "renamed.txt", gpl.as_bytes());
        assert_eq!((again, same["id"].as_str()), (200, Some(id.as_str())), "the same bytes are the same document");

        // The summary: the plan (mode and tokens) first, prefill progress, then the points.
        let events: Vec<Value> = s
            .stream(&format!("/v1/hillside/documents/{id}/summary"), &json!({}))
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let first = &events[0];
        assert_eq!(
            (first["object"].as_str(), first["stage"].as_str(), first["mode"].as_str()),
            (Some("hillside.summary.progress"), Some("planned"), Some("whole")),
            "{first}"
        );
        assert_eq!(first["tokens"], doc["tokens"]);
        assert!(events.iter().any(|e| e["stage"] == "prefill"), "{events:?}");
        assert!(
            events.iter().any(|e| e["stage"] == "writing" && e["text"].is_string()),
            "the summary's text streams: {events:?}"
        );
        let summary = events.last().unwrap();
        assert_eq!(summary["object"], "hillside.summary", "{summary}");
        let points = summary["points"].as_array().unwrap();
        assert!(!points.is_empty() && points.iter().any(|p| !p["sources"].as_array().unwrap().is_empty()), "{summary}");
        let (_, listed) = s.get("/v1/hillside/documents");
        assert_eq!(
            listed["data"][0]["summary"].as_array().map(Vec::len),
            Some(points.len()),
            "the summary is kept: {listed}"
        );

        // A question prefills only itself: the document's K/V is the summary's.
        let reply = ask(&s, &id, "Who may copy this license document?");
        let usage = &reply["usage"];
        let (prompt, cached) = (
            usage["prompt_tokens"].as_u64().unwrap(),
            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        );
        assert!(prompt - cached < 40, "{usage}");
        assert_eq!(reply["hillside"]["documents"][0]["id"], id.as_str());
        assert!(reply["hillside"]["documents"][0]["chunk"].is_null(), "the whole text: {reply}");
        let (status, unknown) = s.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "hillside": {"documents": ["0000"]}}),
        );
        assert_eq!((status, unknown["error"]["param"].as_str()), (400, Some("hillside.documents[0]")), "{unknown}");
        (reply["choices"][0]["message"]["content"].as_str().unwrap().to_string(), cached)
    };

    // After a restart: the same library, the K/V from its file, the same answer.
    let s = Server::start(with_documents(&dir));
    let reply = ask(&s, &id, "Who may copy this license document?");
    let usage = &reply["usage"];
    let (prompt, reused) =
        (usage["prompt_tokens"].as_u64().unwrap(), usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
    // The kept prefix ends where the document does; the sequence the summary left in memory
    // may share a template token or two beyond it.
    assert!(prompt - reused < 40 && reused + 4 > cached, "{usage}, {cached} reused before the restart");
    assert_eq!(reply["choices"][0]["message"]["content"].as_str(), Some(answer.as_str()));

    let (status, deleted) = agent()
        .delete(&s.url(&format!("/v1/hillside/documents/{id}")))
        .call()
        .map(|mut r| (r.status().as_u16(), r.body_mut().read_to_string().unwrap()))
        .unwrap();
    assert_eq!(status, 200, "{deleted}");
    assert!(serde_json::from_str::<Value>(&deleted).unwrap()["kv_files_removed"].as_u64().unwrap() >= 1);
    assert_eq!(s.get(&format!("/v1/hillside/documents/{id}")).0, 404);
    assert!(files_in(&dir.join("kv")).is_empty(), "{:?}", files_in(&dir.join("kv")));
    drop(s);
}

#[test]
fn bad_files_are_refused_with_the_reason_and_nothing_is_stored() {
    let dir = Scratch::new("docs-http-bad");
    let s = Server::start(with_documents(&dir));
    let binary: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut docx = Vec::new();
    {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(&mut docx));
        zip.start_file("word/document.xml", zip::write::SimpleFileOptions::default()).unwrap();
        std::io::Write::write_all(
            &mut zip,
            "<w:document><w:body><w:p><w:r><w:t>Hello there</w:t></w:r></w:p></w:body></w:document>"
                .repeat(50)
                .as_bytes(),
        )
        .unwrap();
        zip.finish().unwrap();
    }
    let cases: [(&str, Vec<u8>, u16, &str); 4] = [
        ("empty.txt", Vec::new(), 400, "empty_document"),
        ("data.bin", binary, 400, "unsupported_document"),
        ("cut.docx", docx[..docx.len() / 2].to_vec(), 400, "damaged_document"),
        ("big.txt", "word ".repeat(50_000).into_bytes(), 413, "document_too_large"),
    ];
    for (name, bytes, status, code) in cases {
        let (got, body) = upload(&s, name, &bytes);
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{name}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(name.split('.').next().unwrap()), "{body}");
    }
    let (status, body) = s.post("/v1/hillside/documents", &json!({"path": "/etc/passwd"}));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("local_paths_off")),
        "a client cannot make the server read a file it names"
    );
    assert_eq!(s.get("/v1/hillside/documents").1["data"], json!([]), "nothing stored");
    drop(s);
}

/// The tiered store for the kill test, with its cold pool in `dir`.
fn tiered(dir: &Path) -> ServerConfig {
    let kv = KvConfig { store: StoreKind::Tiered, cold_dir: dir.join("cold"), ..KvConfig::default() };
    let base = with_documents(dir);
    ServerConfig { scheduler: SchedulerConfig { kv, cached_sequences: 0, ..base.scheduler.clone() }, ..base }
}

#[test]
fn a_server_killed_mid_summary_leaves_the_library_whole_and_the_next_one_summarizes_with_the_tiered_store() {
    if let Some(dir) = std::env::var_os(CHILD) {
        // The child: serve until killed.
        let s = Server::start(tiered(Path::new(&dir)));
        println!("{}", s.base);
        std::thread::park();
    }
    let dir = Scratch::new("docs-http-kill");
    let (mut child, base) = child_server(
        "a_server_killed_mid_summary_leaves_the_library_whole_and_the_next_one_summarizes_with_the_tiered_store",
        &dir,
    );
    let gpl = gpl_start();
    let (_, doc) = upload_to(&base, "gpl-start.txt", gpl.as_bytes());
    let id = doc["id"].as_str().unwrap().to_string();
    // Kill it once the summary is reading the document.
    let r = agent().post(&format!("{base}/v1/hillside/documents/{id}/summary")).send("").unwrap();
    let prefilling =
        BufReader::new(r.into_body().into_reader()).lines().map_while(Result::ok).any(|l| l.contains("\"prefill\""));
    assert!(prefilling, "the summary started");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let cold_files = || files_in(&dir.join("cold")).into_iter().filter(|f| f.ends_with(".cold")).count();
    assert!(cold_files() > 0, "the killed server left its cold pool: the case worth testing");

    // The next server: the document is there, unsummarized; stray files are swept; its summary
    // runs with the tiered store and is kept.
    let s = Server::start(tiered(&dir));
    let (_, doc) = s.get(&format!("/v1/hillside/documents/{id}"));
    assert_eq!((doc["name"].as_str(), doc["summary"].is_null()), (Some("gpl-start.txt"), true), "{doc}");
    let events = s.stream(&format!("/v1/hillside/documents/{id}/summary"), &json!({}));
    let summary: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(summary["object"], "hillside.summary", "{summary}");
    assert_eq!(cold_files(), 0, "no cold file outlives its sequence, nor the killed server");
    let kv = files_in(&dir.join("kv"));
    assert!(kv.len() == 1 && kv[0].ends_with(".kv"), "{kv:?}");
    drop(s);
}

/// A two-slot server with room for two waiting requests, at a 2,048-token context.
fn small_queue(dir: &Path) -> ServerConfig {
    let base = with_documents(dir);
    ServerConfig {
        scheduler: SchedulerConfig { max_live: 2, max_queued: 2, context_tokens: Some(2048), ..base.scheduler.clone() },
        ..base
    }
}

/// About 4,800 tokens of Pride and Prejudice: five chunks at 2,048, more requests than the small
/// queue's slots and waiting places hold.
fn long_text() -> String {
    let text = common::shared_document("pride-and-prejudice.txt");
    let start = text.find("It is a truth universally acknowledged").unwrap();
    text[start..start + 21_000].to_string()
}

/// Reads a summary's events from `reader` until `stop` says so or the stream ends.
fn events_until(reader: &mut impl BufRead, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
    let mut events = Vec::new();
    for line in reader.lines() {
        let line = line.unwrap_or_else(|e| panic!("the stream broke after {events:?}: {e}"));
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data).unwrap();
        let done = stop(&event);
        events.push(event);
        if done {
            break;
        }
    }
    events
}

fn summary_stream(base: &str, id: &str) -> BufReader<impl std::io::Read> {
    let r = agent().post(&format!("{base}/v1/hillside/documents/{id}/summary")).send("").unwrap();
    assert_eq!(r.status().as_u16(), 200);
    BufReader::new(r.into_body().into_reader())
}

fn points_of(events: &[Value]) -> Vec<String> {
    let summary = events.last().unwrap();
    assert_eq!(summary["object"], "hillside.summary", "{summary}");
    summary["points"].as_array().unwrap().iter().map(|p| p["text"].as_str().unwrap().to_string()).collect()
}

/// A summary of more chunks than the server's slots and queue hold runs as one request, beside
/// which a chat is answered; killed with SIGKILL halfway, it resumes after the restart from the
/// chunks it kept, and ends with the summary a run without the kill writes.
#[test]
fn a_long_summary_is_one_request_and_resumes_after_a_kill_with_the_same_result() {
    if let Some(dir) = std::env::var_os(CHILD) {
        let s = Server::start(small_queue(Path::new(&dir)));
        println!("{}", s.base);
        std::thread::park();
    }
    let text = long_text();
    // The server that is killed once two chunks are summarized.
    let dir = Scratch::new("docs-http-resume");
    let (mut child, base) =
        child_server("a_long_summary_is_one_request_and_resumes_after_a_kill_with_the_same_result", &dir);
    let (status, doc) = upload_to(&base, "pride.txt", text.as_bytes());
    assert_eq!((status, doc["mode"].as_str()), (201, Some("hierarchical")), "{doc}");
    let id = doc["id"].as_str().unwrap().to_string();
    let before = events_until(&mut summary_stream(&base, &id), |e| e["stage"] == "chunk_summarized" && e["done"] == 2);
    assert_eq!(before.last().map(|e| e["done"] == 2), Some(true), "the stream ended before two chunks: {before:?}");
    let planned = &before[0];
    let chunks = planned["chunks"].as_array().unwrap().len();
    assert!(chunks > 4, "more chunks than 2 slots and 2 waiting places: {planned}");
    assert!(before.iter().all(|e| e["object"] == "hillside.summary.progress"), "no refusal: {before:?}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // After the restart: the document says how far its summary came, which resumes from there,
    // and a chat beside it is answered before it ends.
    let s = Server::start(small_queue(&dir));
    let (_, doc) = s.get(&format!("/v1/hillside/documents/{id}"));
    let unfinished = &doc["unfinished_summary"];
    assert!(unfinished["chunks_done"].as_u64().unwrap() >= 2 && unfinished["chunks"] == chunks, "{doc}");
    let mut stream = summary_stream(&s.base, &id);
    let started = events_until(&mut stream, |e| e["stage"] == "chunk_summarized");
    let resumed = started.iter().find(|e| e["stage"] == "resumed").expect("a resumed summary says so");
    assert!(resumed["chunks_done"].as_u64().unwrap() >= 2, "{resumed}");
    assert!(started.last().unwrap()["done"].as_u64().unwrap() > 2, "the kept chunks count as done: {started:?}");
    let chat = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let (status, reply) = s.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{reply}");
    let rest = events_until(&mut stream, |_| false);
    assert!(
        rest.iter().any(|e| e["stage"] == "chunk_summarized"),
        "the chat came back while chunks were still being summarized: {rest:?}"
    );
    let last_chunk = rest.iter().rev().find(|e| e["stage"] == "chunk_summarized").unwrap();
    assert_eq!(
        (last_chunk["done"].as_u64(), last_chunk["tokens_read"].as_u64()),
        (Some(chunks as u64), doc["tokens"].as_u64()),
        "{last_chunk}"
    );
    assert!(last_chunk["elapsed_s"].as_f64().unwrap() > 0.0 && last_chunk["eta_s"].as_f64().is_some(), "{last_chunk}");
    let resumed_points = points_of(&rest);
    let (_, doc) = s.get(&format!("/v1/hillside/documents/{id}"));
    assert!(
        doc["unfinished_summary"].is_null() && doc["summary"].as_array().is_some(),
        "a finished summary leaves no checkpoint: {doc}"
    );
    drop(s);

    // The same document summarized without a kill, on a server of its own.
    let fresh = Scratch::new("docs-http-resume-reference");
    let s = Server::start(small_queue(&fresh));
    upload(&s, "pride.txt", text.as_bytes());
    let events = events_until(&mut summary_stream(&s.base, &id), |_| false);
    assert!(!events.iter().any(|e| e["stage"] == "resumed"), "{events:?}");
    assert_eq!(resumed_points, points_of(&events), "the resumed summary is the uninterrupted one");
    drop(s);
}

/// A document whose summary would need more merge levels than allowed is refused at upload,
/// with the reason, and nothing is stored.
#[test]
fn a_document_too_long_to_summarize_is_refused_at_upload() {
    let dir = Scratch::new("docs-http-too-long");
    let base = small_queue(&dir);
    let documents = DocumentsConfig { max_file_bytes: 2_000_000, ..base.documents.clone().unwrap() };
    let s = Server::start(ServerConfig { documents: Some(documents), ..base });
    let text = common::shared_document("pride-and-prejudice.txt");
    let (status, refused) = upload(&s, "pride.txt", text.as_bytes());
    assert_eq!((status, refused["error"]["code"].as_str()), (413, Some("document_too_long")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("levels of merges"), "{refused}");
    assert_eq!(s.get("/v1/hillside/documents").1["data"], json!([]), "nothing stored");
    drop(s);
}

/// Gemma 3 270M, whose layers attend within 512 tokens but for every sixth, in the app with the
/// tiered store: a summary with sources and a question about the document, in Gemma's turns.
/// The windowed layers keep their window in memory, so the cold pool holds the global layers
/// alone; the question goes back to the document's end from past the summary, through the
/// window the rings kept aside there, and reads only itself.
#[test]
fn gemma_summarizes_with_sources_and_answers_without_reading_the_document_again() {
    let dir = Scratch::new("docs-http-gemma");
    let engine = std::sync::Arc::new(hillside_engine::Engine::load(&common::gemma_model_path()).unwrap());
    let base = tiered(&dir);
    let documents = DocumentsConfig { model_key: "gemma-test".into(), ..base.documents.clone().unwrap() };
    let scheduler = SchedulerConfig { cached_sequences: 2, ..base.scheduler.clone() };
    let s = Server::start_on(engine, ServerConfig { documents: Some(documents), scheduler, ..base });
    let (status, doc) = upload(&s, "gpl-start.txt", gpl_start().as_bytes());
    assert_eq!(status, 201, "{doc}");
    let id = doc["id"].as_str().unwrap().to_string();
    let tokens = doc["tokens"].as_u64().unwrap();
    assert!(tokens > 1000, "{doc}: past the window");

    let events = s.stream(&format!("/v1/hillside/documents/{id}/summary"), &json!({}));
    let summary: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(summary["object"], "hillside.summary", "{summary}");
    let points = summary["points"].as_array().unwrap();
    assert!(points.iter().any(|p| !p["sources"].as_array().unwrap().is_empty()), "{summary}");

    let (_, tiers) = s.get("/v1/hillside/tiers");
    let windowed: Vec<u64> = (0..18).filter(|l| l % 6 != 5).collect();
    assert_eq!(tiers["windowed_layers"], json!(windowed), "{tiers}");
    assert_eq!(tiers["window_tokens"], 512, "{tiers}");
    let (held, cold, window) = (
        tiers["tokens"].as_u64().unwrap(),
        tiers["cold_bytes"].as_u64().unwrap(),
        tiers["window_bytes"].as_u64().unwrap(),
    );
    // One KV head of 256 dimensions: 1,024 bytes of f16 K and V per token and layer.
    assert!(held > tokens && cold > 0 && cold < 4 * 1024 * held, "the cold pool holds three layers: {tiers}");
    // Each ring: its window, a prefill chunk (256), the slack (64), and the window kept aside
    // at the document's end; however long the document.
    assert!(
        window > 0 && window <= 15 * 1024 * (2 * 512 + 256 + 64 + 16),
        "the rings hold their windows alone: {tiers}"
    );

    let reply = ask(&s, &id, "Who may copy this license document?");
    let usage = &reply["usage"];
    let (prompt, cached) =
        (usage["prompt_tokens"].as_u64().unwrap(), usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
    assert!(prompt - cached < 40, "{usage}");
    assert!(!reply["choices"][0]["message"]["content"].as_str().unwrap().trim().is_empty(), "{reply}");
    drop(s);
}
