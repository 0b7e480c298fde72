//! `hillside bench ui`: what the UI waits on, over HTTP on loopback — the page's files (the
//! server's part of the first paint), and a chat's time to first token and inter-token latency
//! alone and while a document is summarized in the background, split by the summary's phase
//! (reading the document, writing the summary), with and without the scheduler's shorter
//! prefill chunks while a chat waits (`SchedulerConfig::shared_prefill_tokens`).

use crate::harness::{percentile, stream_one, BenchServer, Timing};
use crate::report::{cpu_name, peak_rss_mb};
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::ModelArgs;
use hillside_engine::scheduler::SHARED_PREFILL_TOKENS;
use hillside_server::DocumentsConfig;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct UiBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The document summarized in the background (default: the shared gpl-3.0.txt).
    #[arg(long)]
    pub document: Option<PathBuf>,
    /// Chat requests timed alone.
    #[arg(long, default_value_t = 8)]
    pub requests: usize,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-ui.json")]
    pub json: PathBuf,
}

/// Chats during one phase of the summary.
#[derive(Serialize, Default)]
struct Chats {
    requests: usize,
    ttft_ms_p50: f64,
    ttft_ms_p99: f64,
    inter_token_ms_p50: f64,
}

impl Chats {
    fn of(timings: &[Timing]) -> Self {
        let mut ttft: Vec<f64> = timings.iter().map(|t| t.ttft.as_secs_f64() * 1e3).collect();
        let mut gaps: Vec<f64> = timings.iter().flat_map(|t| t.gaps.iter().map(|g| g.as_secs_f64() * 1e3)).collect();
        Self {
            requests: timings.len(),
            ttft_ms_p50: percentile(&mut ttft, 0.5),
            ttft_ms_p99: percentile(&mut ttft, 0.99),
            inter_token_ms_p50: percentile(&mut gaps, 0.5),
        }
    }
}

/// A summary in the background and chats sent during it, at one setting of the scheduler.
#[derive(Serialize)]
struct Background {
    shared_prefill_tokens: usize,
    summary_s: f64,
    /// Chats sent while the summary read the document (its prefill).
    while_reading: Chats,
    /// Chats sent while it wrote the summary (its decode).
    while_writing: Chats,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    model: String,
    /// `GET /` and every file it names, one after another: the server's share of the first paint.
    page_ms_p50: f64,
    page_bytes: usize,
    document: String,
    document_tokens: usize,
    alone: Chats,
    background: Vec<Background>,
    peak_rss_mb: f64,
}

const QUESTION: &str = "Name three fruits that are red.";
/// Tokens each timed chat asks for.
const CHAT_TOKENS: usize = 8;

pub fn ui(args: &UiBenchArgs) -> Result<()> {
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let document = args.document.clone().unwrap_or_else(|| crate::report::shared_document("gpl-3.0.txt"));
    let bytes = std::fs::read(&document).with_context(|| format!("reading {}", document.display()))?;
    let name = document.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "document".into());

    let dir = std::env::temp_dir().join(format!("hillside-bench-ui-{}", std::process::id()));
    let server = start(args, &dir, SHARED_PREFILL_TOKENS)?;
    let (base, model_id) = (server.base.clone(), server.model_id.clone());
    let page = time_page(&base)?;
    let chat_url = format!("{base}/v1/chat/completions");
    // One short request first, so that nothing timed pays for warming up.
    stream_one(&chat_url, &model_id, QUESTION, 4, 0)?;
    let alone: Vec<Timing> = (0..args.requests)
        .map(|i| stream_one(&chat_url, &model_id, QUESTION, CHAT_TOKENS, i as u64))
        .collect::<Result<_>>()?;
    server.stop()?;

    let mut background = Vec::new();
    let mut document_tokens = 0;
    for shared_prefill_tokens in [0, SHARED_PREFILL_TOKENS] {
        let server = start(args, &dir, shared_prefill_tokens)?;
        let (run, tokens) = chats_during_summary(&server, &name, &bytes, shared_prefill_tokens)?;
        server.stop()?;
        document_tokens = tokens;
        background.push(run);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let report = Report {
        date: crate::report::utc_now(),
        cpu: cpu_name(),
        model: model_id,
        page_ms_p50: page.0,
        page_bytes: page.1,
        document: name,
        document_tokens,
        alone: Chats::of(&alone),
        background,
        peak_rss_mb: peak_rss_mb(),
    };
    print_table(&report);
    crate::report::write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// A server with a fresh documents folder in `dir`.
fn start(args: &UiBenchArgs, dir: &Path, shared_prefill_tokens: usize) -> Result<BenchServer> {
    let _ = std::fs::remove_dir_all(dir);
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 64 << 20,
        model_key: "bench-ui".into(),
    };
    BenchServer::start(&args.model, Some(documents), 4, 64, shared_prefill_tokens)
}

/// Uploads the document, summarizes it in the background, and sends chats one after another
/// (each after a different pause, so they meet the summary's rounds at different points) until
/// it is done; each is filed under the phase the summary was in when it was sent.
fn chats_during_summary(
    server: &BenchServer,
    name: &str,
    bytes: &[u8],
    shared_prefill_tokens: usize,
) -> Result<(Background, usize)> {
    let base = &server.base;
    let chat_url = format!("{base}/v1/chat/completions");
    let added = upload(base, name, bytes)?;
    let id = added["id"].as_str().context("the upload's id")?.to_string();
    let tokens = added["tokens"].as_u64().unwrap_or(0) as usize;
    eprintln!("summarizing {name} ({tokens} tokens) in the background, shared prefill chunks of {shared_prefill_tokens} tokens");
    let (events, summary_events) = mpsc::channel::<String>();
    let summary = {
        let url = format!("{base}/v1/hillside/documents/{id}/summary");
        std::thread::spawn(move || -> Result<Duration> {
            let started = Instant::now();
            let response = ureq::post(&url).send_empty().context("starting the summary")?;
            for line in BufReader::new(response.into_body().into_reader()).lines() {
                if let Some(data) = line?.strip_prefix("data: ") {
                    let _ = events.send(data.to_string());
                }
            }
            Ok(started.elapsed())
        })
    };
    let (mut reading, mut writing, mut writing_started, mut done) = (Vec::new(), Vec::new(), false, false);
    while !summary.is_finished() {
        for event in summary_events.try_iter() {
            writing_started |= event.contains("\"writing\"");
            done |= event.contains("\"hillside.summary\"");
        }
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(((reading.len() + writing.len()) as u64 * 379) % 1000));
        let phase_writing = writing_started;
        let timing = stream_one(&chat_url, &server.model_id, QUESTION, CHAT_TOKENS, 1)?;
        if phase_writing { &mut writing } else { &mut reading }.push(timing);
    }
    let summary_s = summary.join().map_err(|_| anyhow::anyhow!("the summary thread panicked"))??.as_secs_f64();
    if reading.is_empty() {
        bail!("no chat was sent while the summary read the document; use a longer --document");
    }
    Ok((
        Background {
            shared_prefill_tokens,
            summary_s,
            while_reading: Chats::of(&reading),
            while_writing: Chats::of(&writing),
        },
        tokens,
    ))
}

fn print_table(r: &Report) {
    println!("{} on {}; {} ({} tokens) summarized in the background", r.model, r.cpu, r.document, r.document_tokens);
    println!("the page and its files: {:.1} ms ({} kB), p50 of 5", r.page_ms_p50, r.page_bytes / 1000);
    println!(
        "{:<36} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "chats", "requests", "TTFT p50", "TTFT p99", "ITL p50", "summary"
    );
    let row = |label: String, c: &Chats, summary: String| {
        println!(
            "{:<36} {:>9} {:>8.0}ms {:>8.0}ms {:>8.1}ms {:>10}",
            label, c.requests, c.ttft_ms_p50, c.ttft_ms_p99, c.inter_token_ms_p50, summary
        )
    };
    row("alone".into(), &r.alone, String::new());
    for b in &r.background {
        let setting = if b.shared_prefill_tokens == 0 {
            "whole chunks".to_string()
        } else {
            format!("{}-token chunks", b.shared_prefill_tokens)
        };
        row(format!("while it reads ({setting})"), &b.while_reading, format!("{:.1}s", b.summary_s));
        row(format!("while it writes ({setting})"), &b.while_writing, String::new());
    }
}

/// `GET /` and the scripts and styles it names, five times: the median time and the bytes.
fn time_page(base: &str) -> Result<(f64, usize)> {
    let get =
        |path: &str| -> Result<String> { Ok(ureq::get(&format!("{base}{path}")).call()?.body_mut().read_to_string()?) };
    let index = get("/").context("the web UI is not built into this binary (make ui)")?;
    let assets: Vec<String> =
        index.split(['"', '\'']).filter(|s| s.starts_with("/assets/")).map(str::to_string).collect();
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..5 {
        let started = Instant::now();
        bytes = get("/")?.len();
        for asset in &assets {
            bytes += get(asset)?.len();
        }
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok((percentile(&mut times, 0.5), bytes))
}

/// Uploads `bytes` as `name`: the added document's JSON.
fn upload(base: &str, name: &str, bytes: &[u8]) -> Result<serde_json::Value> {
    let boundary = "hillside-bench-7d1f";
    let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut response = ureq::post(&format!("{base}/v1/hillside/documents"))
        .header("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
        .send(&body[..])
        .context("uploading the document")?;
    Ok(serde_json::from_str(&response.body_mut().read_to_string()?)?)
}
