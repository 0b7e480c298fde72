//! What the benchmarks that talk to a server share: an in-process `hillside serve` on a free
//! loopback port, a streamed chat completion timed as a client sees it, and percentiles.

use anyhow::{Context, Result};
use hillside_common::serve::model_names;
use hillside_common::{load_engine, models, ModelArgs};
use hillside_engine::scheduler::SchedulerConfig;
use hillside_server::{App, DocumentsConfig, ServerConfig};
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One streamed request as a client saw it.
pub(crate) struct Timing {
    pub ttft: Duration,
    /// Gaps between content chunks.
    pub gaps: Vec<Duration>,
    pub tokens: usize,
}

/// An in-process server on a free loopback port, serving the bench's model.
pub(crate) struct BenchServer {
    pub base: String,
    pub model_id: String,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

impl BenchServer {
    /// Each request is a new conversation (nothing cached to reuse); up to `max_queued` wait.
    pub fn start(
        model: &ModelArgs,
        documents: Option<DocumentsConfig>,
        max_live: usize,
        max_queued: usize,
        shared_prefill_tokens: usize,
    ) -> Result<Self> {
        let path = models::resolve(model.model())?;
        let engine = Arc::new(load_engine(model)?);
        let (model_id, model_aliases) = model_names(model.model(), &path);
        let config = ServerConfig {
            model_id: model_id.clone(),
            model_aliases,
            installed_models: Vec::new(),
            api_key: None,
            allowed_hosts: Vec::new(),
            max_body_bytes: 1_000_000,
            cors_origins: Vec::new(),
            shutdown_grace_s: 0,
            scheduler: SchedulerConfig {
                max_live,
                max_queued,
                kv: model.kv_config(),
                context_tokens: model.context(),
                cached_sequences: 0,
                shared_prefill_tokens,
            },
            documents,
            chosen_paths: None,
            sampling: hillside_engine::SamplingParams::default(),
            default_max_tokens: None,
            settings_file: None,
        };
        let runtime = hillside_common::serve::runtime()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let base = format!("http://{}", listener.local_addr()?);
        let app = App::new(engine, config)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(hillside_server::serve(listener, app, async {
                stopped.await.ok();
            }))
        });
        Ok(Self { base, model_id, stop, thread })
    }

    pub fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.thread.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?.context("serving")
    }
}

/// One streamed chat completion, timed from sending to each content chunk.
pub(crate) fn stream_one(url: &str, model: &str, prompt: &str, max_tokens: usize, seed: u64) -> Result<Timing> {
    let body = serde_json::json!({
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "seed": seed, "stream": true, "stream_options": {"include_usage": true},
    });
    let sent = Instant::now();
    let response = ureq::post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .context("sending a request to the bench server")?;
    let (mut first, mut last, mut gaps, mut tokens) = (None, sent, Vec::new(), 0);
    for line in BufReader::new(response.into_body().into_reader()).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let chunk: serde_json::Value = serde_json::from_str(data)?;
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = n as usize;
        }
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            let now = Instant::now();
            match first {
                None => first = Some(now - sent),
                Some(_) => gaps.push(now - last),
            }
            last = now;
        }
    }
    Ok(Timing { ttft: first.context("the stream carried no text")?, gaps, tokens })
}

pub(crate) fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}
