//! `hillside bench serve`: the endpoint under load on loopback — requests/s, tokens/s, time to
//! first token and inter-token latency at several numbers of concurrent streaming clients.

use crate::harness::{percentile, stream_one, BenchServer, Timing};
use crate::report::{cpu_name, peak_rss_mb};
use anyhow::{bail, Result};
use clap::Args;
use hillside_common::ModelArgs;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ServeBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Concurrent streaming clients, one run each.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16])]
    pub clients: Vec<usize>,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 3)]
    pub requests_per_client: usize,
    /// Tokens asked for per request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sequences the server generates at once (as `serve --max-live`).
    #[arg(long, default_value_t = 4)]
    pub max_live: usize,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-serve.json")]
    pub json: PathBuf,
}

#[derive(Serialize)]
struct LevelResult {
    clients: usize,
    requests: usize,
    wall_s: f64,
    requests_per_s: f64,
    /// Generated tokens per second, all clients together.
    tokens_per_s: f64,
    ttft_ms_p50: f64,
    ttft_ms_p99: f64,
    inter_token_ms_p50: f64,
    inter_token_ms_p99: f64,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    model: String,
    kv_store: hillside_engine::kv::StoreKind,
    max_live: usize,
    max_tokens: usize,
    levels: Vec<LevelResult>,
    peak_rss_mb: f64,
}

const PROMPTS: [&str; 6] = [
    "Write a story about a lighthouse keeper.",
    "Explain how a steam engine works.",
    "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about a trip to the sea.",
    "Explain why the sky is blue.",
    "Tell me about the history of bread.",
];

pub fn serve(args: &ServeBenchArgs) -> Result<()> {
    if args.clients.is_empty() || args.clients.contains(&0) || args.requests_per_client == 0 {
        bail!("--clients needs positive counts and --requests-per-client at least 1");
    }
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let server = BenchServer::start(
        &args.model,
        None,
        args.max_live,
        max_clients,
        hillside_engine::scheduler::SHARED_PREFILL_TOKENS,
    )?;
    let (url, model_id) = (format!("{}/v1/chat/completions", server.base), server.model_id.clone());

    // One short request first, so that no level pays for warming up.
    stream_one(&url, &model_id, PROMPTS[0], 4, 0)?;
    let mut levels = Vec::new();
    for &clients in &args.clients {
        eprintln!("{clients} client(s) × {} requests", args.requests_per_client);
        let started = Instant::now();
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let (url, model, n, max_tokens) =
                    (url.clone(), model_id.clone(), args.requests_per_client, args.max_tokens);
                std::thread::spawn(move || -> Result<Vec<Timing>> {
                    (0..n)
                        .map(|i| {
                            stream_one(&url, &model, PROMPTS[(c + i) % PROMPTS.len()], max_tokens, (c * n + i) as u64)
                        })
                        .collect()
                })
            })
            .collect();
        let mut timings = Vec::new();
        for w in workers {
            timings.extend(w.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??);
        }
        let wall_s = started.elapsed().as_secs_f64();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let mut ttft: Vec<f64> = timings.iter().map(|t| ms(&t.ttft)).collect();
        let mut gaps: Vec<f64> = timings.iter().flat_map(|t| t.gaps.iter().map(ms)).collect();
        let tokens: usize = timings.iter().map(|t| t.tokens).sum();
        levels.push(LevelResult {
            clients,
            requests: timings.len(),
            wall_s,
            requests_per_s: timings.len() as f64 / wall_s,
            tokens_per_s: tokens as f64 / wall_s,
            ttft_ms_p50: percentile(&mut ttft, 0.50),
            ttft_ms_p99: percentile(&mut ttft, 0.99),
            inter_token_ms_p50: percentile(&mut gaps, 0.50),
            inter_token_ms_p99: percentile(&mut gaps, 0.99),
        });
    }
    server.stop()?;

    let report = Report {
        date: crate::report::utc_now(),
        cpu: cpu_name(),
        model: model_id,
        kv_store: args.model.kv_config().store,
        max_live: args.max_live,
        max_tokens: args.max_tokens,
        levels,
        peak_rss_mb: peak_rss_mb(),
    };
    print_table(&report);
    crate::report::write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

fn print_table(r: &Report) {
    println!(
        "{} on {}, {} store, {} live sequences at most, {} tokens per request",
        r.model,
        r.cpu,
        serde_json::to_value(r.kv_store).unwrap_or_default().as_str().unwrap_or("?"),
        r.max_live,
        r.max_tokens
    );
    println!(
        "{:>8} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "clients", "requests", "req/s", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"
    );
    for l in &r.levels {
        println!(
            "{:>8} {:>9} {:>8.2} {:>9.1} {:>8.0}ms {:>8.0}ms {:>8.1}ms {:>8.1}ms",
            l.clients,
            l.requests,
            l.requests_per_s,
            l.tokens_per_s,
            l.ttft_ms_p50,
            l.ttft_ms_p99,
            l.inter_token_ms_p50,
            l.inter_token_ms_p99
        );
    }
    println!("peak RSS {:.0} MB", r.peak_rss_mb);
}
