//! `hillside bench docs --engine openai:URL`: time to a summary on Hillside's own engine against
//! the remote one (llama.cpp's llama-server on the same machine and model, say), the same
//! documents with the same context and requests in flight, one engine after the other.

use crate::report::{cpu_name, utc_now, write_json};
use anyhow::{Context, Result};
use hillside_common::{load_engine, models, ModelArgs};
use hillside_documents::chunks::Mode;
use hillside_documents::summarize::{summarize, NoCheckpoints, Runner};
use hillside_documents::Document;
use hillside_engine::kv::KvConfig;
use hillside_engine::scheduler::SchedulerConfig;
use hillside_engine::CancelFlag;
use hillside_front::EngineFront;
use hillside_remote::RemoteEngine;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize)]
struct EngineRun {
    document: String,
    tokens: usize,
    mode: &'static str,
    chunks: usize,
    local_s: f64,
    remote_s: f64,
    /// Local time over remote time: above 1, the remote summarized faster.
    remote_speedup: f64,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    local_model: String,
    remote: String,
    remote_model: String,
    context: usize,
    requests_in_flight: usize,
    runs: Vec<EngineRun>,
}

/// Summarizes each of `docs` on the local engine (`model`) and on `remote`, prints the table
/// and writes the report to `json`.
pub fn compare(model: &ModelArgs, remote: &Arc<RemoteEngine>, docs: &[Document], json: &Path) -> Result<()> {
    let engine = Arc::new(load_engine(model)?);
    let context = remote.context_tokens();
    let in_flight = remote.concurrency();
    let config = SchedulerConfig::own_work(KvConfig::default(), Some(context), in_flight);
    let local_front = EngineFront::start_local(engine, config);
    let local = Runner::new(&local_front, Some(context), None);
    let remote_front = EngineFront::Remote(remote.clone());
    let remote_runner = Runner::new(&remote_front, None, None);
    let time = |runner: &Runner<'_>, doc: &Document| -> Result<(f64, Mode, usize)> {
        let start = Instant::now();
        let summary = summarize(runner, doc, "bench", &mut NoCheckpoints, &CancelFlag::default(), &mut |_| {})
            .with_context(|| doc.name.clone())?;
        Ok((start.elapsed().as_secs_f64(), summary.plan.mode, summary.plan.tokens))
    };
    let mut runs = Vec::new();
    for doc in docs {
        eprintln!("summarizing {} locally, then on {} …", doc.name, remote.url());
        let (local_s, mode, tokens) = time(&local, doc)?;
        let (remote_s, _, _) = time(&remote_runner, doc)?;
        let chunks = match &mode {
            Mode::Whole => 1,
            Mode::Hierarchical { chunks, .. } => chunks.len(),
        };
        runs.push(EngineRun {
            document: doc.name.clone(),
            tokens,
            mode: mode.name(),
            chunks,
            local_s,
            remote_s,
            remote_speedup: local_s / remote_s,
        });
    }
    let report = Report {
        date: utc_now(),
        cpu: cpu_name(),
        local_model: models::resolve(model.model())?
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        remote: remote.url().to_string(),
        remote_model: remote.model().to_string(),
        context,
        requests_in_flight: in_flight,
        runs,
    };
    println!("time to summary · context {context} · {in_flight} requests in flight · {}", report.cpu);
    println!("{:<32} {:>7} {:>17} {:>9} {:>9} {:>8}", "document", "tokens", "mode", "local s", "remote s", "ratio");
    for r in &report.runs {
        println!(
            "{:<32} {:>7} {:>17} {:>9.1} {:>9.1} {:>7.2}×",
            r.document,
            r.tokens,
            format!("{} ({})", r.mode, r.chunks),
            r.local_s,
            r.remote_s,
            r.remote_speedup
        );
    }
    write_json(json, &report)
}
