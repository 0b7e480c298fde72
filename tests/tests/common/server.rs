//! A real server for the HTTP tests: the real model, a free loopback port.

use hillside_engine::kv::KvConfig;
use hillside_engine::scheduler::SchedulerConfig;
use hillside_engine::Engine;
use hillside_server::{App, EngineChoice, ServerConfig};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub const MODEL: &str = "smollm2-135m-instruct";

pub fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE.get_or_init(|| Arc::new(Engine::load(&super::model_path()).unwrap())).clone()
}

pub fn config() -> ServerConfig {
    ServerConfig {
        model_id: MODEL.into(),
        model_aliases: vec!["SmolLM2-135M-Instruct.Q4_1.gguf".into()],
        installed_models: vec![MODEL.into()],
        api_key: None,
        allowed_hosts: Vec::new(),
        max_body_bytes: 1_000_000,
        cors_origins: Vec::new(),
        shutdown_grace_s: 1,
        scheduler: SchedulerConfig {
            max_live: 4,
            max_queued: 32,
            kv: KvConfig::default(),
            context_tokens: Some(2048),
            cached_sequences: 2,
            shared_prefill_tokens: hillside_engine::scheduler::SHARED_PREFILL_TOKENS,
        },
        documents: None,
        chosen_paths: None,
        sampling: hillside_engine::SamplingParams::default(),
        default_max_tokens: None,
        settings_file: None,
    }
}

/// A server on a free loopback port, stopped (gracefully) on drop.
pub struct Server {
    pub base: String,
    pub app: Arc<App>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(config: ServerConfig) -> Self {
        Self::start_on(engine(), config)
    }

    /// The same on `engine`: the local one, or a remote one.
    pub fn start_on(engine: impl Into<EngineChoice>, config: ServerConfig) -> Self {
        Self::start_at(engine, config, "127.0.0.1:0")
    }

    /// The same, listening on `address` (`0.0.0.0:0`: every interface, a free port); `base` is
    /// still the loopback address.
    pub fn start_at(engine: impl Into<EngineChoice>, config: ServerConfig, address: &str) -> Self {
        if config.documents.is_some() {
            ensure_reader();
        }
        let app = App::new(engine, config).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind(address)).unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = app.clone();
        let thread = std::thread::spawn(move || {
            runtime
                .block_on(hillside_server::serve(listener, served, async {
                    stopped.await.ok();
                }))
                .unwrap();
        });
        Self { base, app, stop: Some(stop), thread: Some(thread) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let mut r = agent().get(&self.url(path)).call().unwrap();
        (r.status().as_u16(), serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, &body.to_string(), &[])
    }

    pub fn post_raw(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut req = agent().post(&self.url(path)).header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut r = req.send(body).unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    /// Any method, with a JSON body or none, and this run's control secret (as the web UI
    /// opened from its printed link sends it): the status and the JSON answer (`Null` if empty).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.call_with(method, path, body, &[("X-Hillside-Control", self.app.control_secret())])
    }

    /// The same with only these headers.
    pub fn call_with(&self, method: &str, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("Content-Type", "application/json");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(body.map(Value::to_string).unwrap_or_default()).unwrap();
        let mut r = agent().run(request).unwrap();
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

    /// A streamed request: every `data:` payload, `[DONE]` included.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r =
            agent().post(&self.url(path)).header("Content-Type", "application/json").send(body.to_string()).unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let lines = BufReader::new(r.into_body().into_reader()).lines();
        lines.map(Result::unwrap).filter_map(|l| l.strip_prefix("data: ").map(str::to_string)).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

/// Uploads `bytes` as the document `name` to the server at `base` (multipart/form-data, as a
/// browser's form sends it), with these headers too: the status and the JSON answer.
pub fn upload(base: &str, name: &str, bytes: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
    let boundary = "hillside-test-boundary-7d1f";
    let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut request = agent()
        .post(&format!("{base}/v1/hillside/documents"))
        .header("Content-Type", &format!("multipart/form-data; boundary={boundary}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut r = request.send(&body[..]).unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// The document reader (`hillside-ingest`) the server runs for each file.
pub fn ensure_reader() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| super::ensure_bin("hillside-documents", "hillside-ingest"));
}

/// A client whose timeout only catches a hang: a long summary's stream on two slow cores runs
/// for minutes.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(900)))
        .build()
        .into()
}
