//! The server's models, end to end: a real `hillside serve` (the real default model) with a
//! models folder of its own and a hub on 127.0.0.1 — switching models while a reply streams,
//! a switch to a broken file, downloads followed as server-sent events (resumed after a cut,
//! checked, cancelled, still there for a page that reconnects), and imports.

mod hub;

use hub::{hub, model_bytes, sha256_hex, Answer};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Only catches a hang.
const HANG: Duration = Duration::from_secs(300);

/// The default model's file, where `make` put it.
fn default_model() -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_hillside")).args(["models", "path"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `hillside serve` on a free port with `models` as its models folder and `hub` (a port) as
/// its model hub; killed on drop.
struct Serve {
    child: Child,
    base: String,
    /// This run's control secret, from the web UI's link in the banner.
    secret: String,
    _scratch: tempfile::TempDir,
}

impl Serve {
    fn start(models: &Path, hub: Option<u16>) -> Self {
        let scratch = tempfile::Builder::new().prefix("hillside-serve-models-").tempdir().unwrap();
        std::fs::write(scratch.path().join("config.toml"), "").unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_hillside"));
        command
            .args(["serve", "--port", "0", "--context", "1024", "--shutdown-grace-s", "1", "--model"])
            .arg(default_model())
            .arg("--config")
            .arg(scratch.path().join("config.toml"))
            .arg("--documents-dir")
            .arg(scratch.path().join("documents"))
            .arg("--cold-dir")
            .arg(scratch.path().join("cold"))
            .env("HILLSIDE_MODELS_DIR", models)
            .env("HF_HOME", scratch.path().join("no-hf-cache"))
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.unwrap_or(9)))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = command.spawn().unwrap();
        let (mut banner, mut link) = (String::new(), String::new());
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut banner).unwrap();
        stdout.read_line(&mut link).unwrap();
        let addr =
            banner.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_else(|| panic!("{banner:?}"));
        let secret = link.split("#secret=").nth(1).unwrap_or_else(|| panic!("{link:?}")).trim().to_string();
        Self { child, base: format!("http://{addr}"), secret, _scratch: scratch }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .header("X-Hillside-Control", &self.secret)
            .body(body.map(|b| b.to_string()).unwrap_or_default())
            .unwrap();
        let mut reply = agent().run(request).unwrap();
        let status = reply.status().as_u16();
        let text = reply.body_mut().read_to_string().unwrap();
        (
            status,
            if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
            },
        )
    }

    fn chat(&self, model: Option<&str>) -> (u16, Value) {
        let mut body =
            json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0});
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        self.call("POST", "/v1/chat/completions", Some(body))
    }

    /// The `data:` payloads of a server-sent stream, as they arrive, on a thread of its own.
    fn events(&self, method: &str, path: &str, body: Option<Value>) -> mpsc::Receiver<String> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .header("Accept", "text/event-stream")
            .body(body.map(|b| b.to_string()).unwrap_or_default())
            .unwrap();
        let reply = agent().run(request).unwrap();
        assert_eq!(reply.status().as_u16(), 200);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reply.into_body().into_reader()).lines() {
                let Ok(line) = line else { return };
                if let Some(data) = line.strip_prefix("data: ") {
                    if tx.send(data.to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }

    /// The download `name` as the events show it, once `done` says it is far enough.
    fn follow(&self, name: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let events = self.events("GET", "/v1/hillside/downloads", None);
        let mut seen = Vec::new();
        loop {
            let list: Value = serde_json::from_str(&events.recv_timeout(HANG).expect("a downloads event")).unwrap();
            if let Some(download) = list.as_array().unwrap().iter().find(|d| d["name"] == name) {
                seen.push(download.clone());
                if done(download) {
                    return seen;
                }
            }
        }
    }

    fn models(&self) -> Value {
        let (status, models) = self.call("GET", "/v1/hillside/models", None);
        assert_eq!(status, 200, "{models}");
        models
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(HANG)).build().into()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn installed(models: &Value) -> Vec<String> {
    models["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["installed"] == true)
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_switch_lets_the_reply_under_way_finish_on_the_old_model_and_a_broken_file_keeps_it_serving() {
    let models = tempfile::tempdir().unwrap();
    std::fs::copy(default_model(), models.path().join("other.gguf")).unwrap();
    // A model file cut short, as an interrupted copy leaves it.
    let bytes = std::fs::read(default_model()).unwrap();
    std::fs::write(models.path().join("broken.gguf"), &bytes[..bytes.len() / 3]).unwrap();
    let s = Serve::start(models.path(), None);
    let (_, list) = s.call("GET", "/v1/models", None);
    let first = list["data"][0]["id"].as_str().unwrap().to_string();
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str(), "broken", "other"], "the loaded model first, then the installed ones");

    // A greedy reply long enough to be under way during the switch.
    let stream = s.events(
        "POST",
        "/v1/completions",
        Some(json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true})),
    );
    let mut chunks = vec![stream.recv_timeout(HANG).unwrap()];
    let (status, loaded) = s.call("POST", "/v1/hillside/models/other/load", None);
    assert_eq!((status, loaded["loaded"].as_str()), (200, Some("other")), "{loaded}");
    chunks.extend(stream.iter());
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let payloads: Vec<Value> = chunks[..chunks.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
    assert!(payloads.iter().all(|p| p["model"] == first.as_str()), "every piece from the model it started on");
    let finish = payloads.iter().find_map(|p| p["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("length"), "it ran to its max_tokens, not cut by the switch");

    let (status, reply) = s.chat(None);
    assert_eq!((status, reply["model"].as_str()), (200, Some("other")), "{reply}");
    let (status, refused) = s.chat(Some("broken"));
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("model_not_loaded")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("/v1/hillside/models/broken/load"), "{refused}");

    // The broken file does not load, and the model before it goes on serving.
    let (status, failed) = s.call("POST", "/v1/hillside/models/broken/load", None);
    assert_eq!((status, failed["error"]["code"].as_str()), (400, Some("model_load_failed")), "{failed}");
    assert!(failed["error"]["message"].as_str().unwrap().contains("broken.gguf"), "{failed}");
    let listed = s.models();
    assert_eq!(listed["loaded"], "other");
    assert_eq!(listed["switch"]["last_error"], failed["error"]["message"], "the page can say why");
    let (status, reply) = s.chat(None);
    assert_eq!((status, reply["model"].as_str()), (200, Some("other")), "{reply}");

    // The loaded model is not deleted; another is, from the folder.
    let (status, refused) = s.call("DELETE", "/v1/hillside/models/other", None);
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("model_in_use")), "{refused}");
    assert_eq!(s.call("DELETE", "/v1/hillside/models/broken", None).0, 204);
    assert_eq!(files_in(models.path()), ["other.gguf"]);
    assert_eq!(s.call("DELETE", "/v1/hillside/models/broken", None).0, 404);
    // Unknown names are not fetched, loaded or deleted, and a path is not a name.
    assert_eq!(s.call("POST", "/v1/hillside/models/nothing-here/load", None).0, 404);
    let path = models.path().join("other.gguf").display().to_string().replace('/', "%2F");
    let (status, refused) = s.call("POST", &format!("/v1/hillside/models/{path}/load"), None);
    assert_eq!(status, 404, "{refused}");
}

#[test]
fn a_download_on_the_server_is_followed_as_events_resumes_after_a_cut_and_is_checked() {
    let body = model_bytes(3 << 20);
    let hub = hub(body.clone(), sha256_hex(&body), vec![Answer::CutHalfway, Answer::Trickle], true);
    let models = tempfile::tempdir().unwrap();
    let s = Serve::start(models.path(), Some(hub.port));
    let before = s.models();
    assert!(!installed(&before).contains(&"tiny".to_string()));
    let available = before["models"].as_array().unwrap().iter().find(|m| m["name"] == "qwen3-30b-a3b").unwrap();
    assert_eq!(available["installed"], false);
    assert!(available["fit"]["sentence"].as_str().is_some_and(|s| s.contains("fit")), "{available}");

    let (status, started) =
        s.call("POST", "/v1/hillside/models/pull", Some(json!({"model": "someone/tiny-model", "file": "tiny.gguf"})));
    assert_eq!((status, started["state"].as_str()), (202, Some("running")), "{started}");
    let seen = s.follow("tiny", |d| d["state"] != "running");
    let last = seen.last().unwrap();
    assert_eq!(last["state"], "done", "{last}");
    assert_eq!(last["done_bytes"], body.len());
    assert!(
        seen.iter()
            .any(|d| d["state"] == "running" && d["total_bytes"] == body.len() && d["done_bytes"].as_u64() > Some(0)),
        "progress was shown on the way: {seen:?}"
    );
    let gets: Vec<Option<String>> =
        hub.seen.lock().unwrap().iter().filter(|(m, _)| m == "GET").map(|(_, r)| r.clone()).collect();
    assert_eq!(gets, [None, Some(format!("bytes={}-", body.len() / 2))], "the rest was asked for after the cut");
    assert_eq!(files_in(models.path()), ["tiny.gguf"]);
    assert!(std::fs::read(models.path().join("tiny.gguf")).unwrap() == body);
    assert!(installed(&s.models()).contains(&"tiny".to_string()));
    let (status, again) =
        s.call("POST", "/v1/hillside/models/pull", Some(json!({"model": "someone/tiny-model", "file": "tiny.gguf"})));
    assert_eq!(status, 202, "{again}");
    assert_eq!(
        s.follow("tiny", |d| d["state"] != "running").last().unwrap()["state"],
        "done",
        "installed is installed"
    );
}

#[test]
fn a_wrong_hash_installs_nothing_and_a_cancelled_download_keeps_its_part() {
    let body = model_bytes(1 << 20);
    let wrong = hub(body.clone(), sha256_hex(b"another file"), vec![Answer::Serve], true);
    let models = tempfile::tempdir().unwrap();
    let s = Serve::start(models.path(), Some(wrong.port));
    s.call("POST", "/v1/hillside/models/pull", Some(json!({"model": "someone/model", "file": "wrong.gguf"})));
    let last = s.follow("wrong", |d| d["state"] != "running").pop().unwrap();
    assert_eq!(last["state"], "failed");
    assert!(last["error"].as_str().unwrap().contains("SHA-256"), "{last}");
    assert_eq!(files_in(models.path()), Vec::<String>::new());
    drop(s);

    // Slow enough to be cancelled midway (20 MB at about 1.3 MB/s).
    let body = model_bytes(20 << 20);
    let slow = hub(body.clone(), sha256_hex(&body), vec![Answer::Trickle], true);
    let s = Serve::start(models.path(), Some(slow.port));
    s.call("POST", "/v1/hillside/models/pull", Some(json!({"model": "someone/model", "file": "slow.gguf"})));
    s.follow("slow", |d| d["done_bytes"].as_u64() > Some(0));
    // A page opened (or reloaded) now finds it still going, with its progress.
    let reloaded: Value =
        serde_json::from_str(&s.events("GET", "/v1/hillside/downloads", None).recv_timeout(HANG).unwrap()).unwrap();
    assert_eq!(reloaded[0]["name"], "slow");
    assert_eq!(reloaded[0]["state"], "running");
    let (status, busy) =
        s.call("POST", "/v1/hillside/models/pull", Some(json!({"model": "someone/model", "file": "slow.gguf"})));
    assert_eq!((status, busy["error"]["code"].as_str()), (409, Some("download_running")), "{busy}");
    assert_eq!(s.call("DELETE", "/v1/hillside/downloads/slow", None).0, 202);
    let last = s.follow("slow", |d| d["state"] != "running").pop().unwrap();
    assert_eq!(last["state"], "cancelled", "{last}");
    assert_eq!(
        files_in(models.path()),
        ["slow.gguf.part"],
        "the part is kept for the next pull, and nothing is installed"
    );
    assert!(!installed(&s.models()).iter().any(|m| m.starts_with("slow")));
    assert_eq!(s.call("DELETE", "/v1/hillside/downloads/slow", None).0, 404);
}

#[test]
fn an_uploaded_model_file_is_imported_and_anything_else_refused_with_nothing_left() {
    let models = tempfile::tempdir().unwrap();
    let s = Serve::start(models.path(), None);
    let upload = |name: &str, bytes: Vec<u8>| {
        let mut reply = agent()
            .post(format!("{}/v1/hillside/models/import?name={name}", s.base))
            .header("Content-Type", "application/octet-stream")
            .header("X-Hillside-Control", &s.secret)
            .send(&bytes[..])
            .unwrap();
        let status = reply.status().as_u16();
        (status, serde_json::from_str::<Value>(&reply.body_mut().read_to_string().unwrap()).unwrap())
    };
    let (status, refused) = upload("notes.gguf", b"these are not a model's bytes".to_vec());
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("not a model file"), "{refused}");
    assert_eq!(files_in(models.path()), Vec::<String>::new(), "nothing staged is left");
    let (status, refused) = upload("..%2Fescape.gguf", b"x".to_vec());
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("name")), "{refused}");
    let (status, refused) = upload("SmolLM2-135M-Instruct.Q4_1.gguf", std::fs::read(default_model()).unwrap());
    assert_eq!(status, 400, "a catalogue model's file name is installed only by a checked pull: {refused}");

    let (status, imported) = upload("mine.gguf", std::fs::read(default_model()).unwrap());
    assert_eq!((status, imported["name"].as_str()), (201, Some("mine")), "{imported}");
    assert_eq!(files_in(models.path()), ["mine.gguf"]);
    let listed = s.models();
    let mine = listed["models"].as_array().unwrap().iter().find(|m| m["name"] == "mine").unwrap();
    assert_eq!(
        (mine["installed"].as_bool(), mine["family"].as_str(), mine["source"].as_str()),
        (Some(true), Some("llama"), Some("file"))
    );
    let mut mode = 0;
    if let Ok(meta) = std::fs::metadata(models.path().join("mine.gguf")) {
        use std::os::unix::fs::PermissionsExt;
        mode = meta.permissions().mode() & 0o777;
    }
    assert_eq!(mode, 0o600, "created private");
    let (status, _) = upload("mine.gguf", std::fs::read(default_model()).unwrap());
    assert_eq!(status, 400, "installed already");
}
