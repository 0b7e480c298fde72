//! `hillside bench ui`: what the UI waits on, over HTTP on loopback — the page's files (the
//! server's part of the first paint), and a chat's time to first token alone and while a
//! document is summarized in the background (does the chat stay responsive?).

use crate::bench::{cpu_name, peak_rss_mb};
use crate::bench_serve::{percentile, stream_one, BenchServer};
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_server::DocumentsConfig;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct UiBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The document summarized in the background (default: ../shared/data/gpl-3.0.txt).
    #[arg(long)]
    pub document: Option<PathBuf>,
    /// Chat requests timed alone, then during the summary.
    #[arg(long, default_value_t = 8)]
    pub requests: usize,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-ui.json")]
    pub json: PathBuf,
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
    summary_s: f64,
    ttft_alone_ms_p50: f64,
    ttft_alone_ms_p99: f64,
    /// Chat requests that started and got their first token while the summary ran.
    requests_during_summary: usize,
    ttft_during_summary_ms_p50: f64,
    ttft_during_summary_ms_p99: f64,
    peak_rss_mb: f64,
}

const QUESTION: &str = "Name three fruits that are red.";

pub fn ui(args: &UiBenchArgs) -> Result<()> {
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let document = args.document.clone().unwrap_or_else(|| PathBuf::from("../shared/data/gpl-3.0.txt"));
    let bytes = std::fs::read(&document).with_context(|| format!("reading {}", document.display()))?;
    let dir = std::env::temp_dir().join(format!("hillside-bench-ui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let documents = DocumentsConfig { dir: dir.clone(), kv_quota_bytes: 1 << 30, max_file_bytes: 64 << 20, model_key: "bench-ui".into(), chosen_paths: None };
    let server = BenchServer::start(&args.model, Some(documents), 4, 64)?;
    let (base, model_id) = (server.base.clone(), server.model_id.clone());

    let page = time_page(&base)?;
    let chat_url = format!("{base}/v1/chat/completions");
    // One short request first, so that nothing timed pays for warming up.
    stream_one(&chat_url, &model_id, QUESTION, 4, 0)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut alone: Vec<f64> = (0..args.requests).map(|i| stream_one(&chat_url, &model_id, QUESTION, 8, i as u64).map(|t| ms(t.ttft))).collect::<Result<_>>()?;

    let name = document.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "document".into());
    let added = upload(&base, &name, &bytes)?;
    let id = added["id"].as_str().context("the upload's id")?.to_string();
    let document_tokens = added["tokens"].as_u64().unwrap_or(0) as usize;
    eprintln!("summarizing {name} ({document_tokens} tokens) in the background");
    let (events, summary_events) = mpsc::channel::<String>();
    let summary = {
        let url = format!("{base}/v1/hillside/documents/{id}/summary");
        std::thread::spawn(move || -> Result<Duration> {
            let started = Instant::now();
            let response = ureq::post(&url).send_empty().context("starting the summary")?;
            for line in BufReader::new(response.into_body().into_reader()).lines() {
                let line = line?;
                if let Some(data) = line.strip_prefix("data: ") {
                    let _ = events.send(data.to_string());
                }
            }
            Ok(started.elapsed())
        })
    };
    // The chat starts once the summary is reading the document.
    loop {
        let event = summary_events.recv_timeout(Duration::from_secs(600)).context("waiting for the summary to start")?;
        if event.contains("\"prefill\"") {
            break;
        }
    }
    let mut during = Vec::new();
    for i in 0..args.requests {
        let timing = stream_one(&chat_url, &model_id, QUESTION, 8, i as u64)?;
        let summary_done = summary_events.try_iter().any(|e| e.contains("\"hillside.summary\"") || e == "[DONE]");
        if summary_done || summary.is_finished() {
            break;
        }
        during.push(ms(timing.ttft));
    }
    let summary_s = summary.join().map_err(|_| anyhow::anyhow!("the summary thread panicked"))??.as_secs_f64();
    server.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    if during.is_empty() {
        bail!("the summary ended before a chat request could be timed during it; use a longer --document");
    }

    let report = Report {
        date: crate::bench::utc_now(),
        cpu: cpu_name(),
        model: model_id,
        page_ms_p50: page.0,
        page_bytes: page.1,
        document: name,
        document_tokens,
        summary_s,
        ttft_alone_ms_p50: percentile(&mut alone, 0.5),
        ttft_alone_ms_p99: percentile(&mut alone, 0.99),
        requests_during_summary: during.len(),
        ttft_during_summary_ms_p50: percentile(&mut during, 0.5),
        ttft_during_summary_ms_p99: percentile(&mut during, 0.99),
        peak_rss_mb: peak_rss_mb(),
    };
    println!("{} on {}", report.model, report.cpu);
    println!("{:<44} {:>10}", "what", "time");
    println!("{:<44} {:>8.1}ms ({} kB)", "the page and its files (p50 of 5)", report.page_ms_p50, report.page_bytes / 1000);
    println!("{:<44} {:>8.0}ms / {:.0}ms", "chat TTFT alone (p50 / p99)", report.ttft_alone_ms_p50, report.ttft_alone_ms_p99);
    println!(
        "{:<44} {:>8.0}ms / {:.0}ms",
        format!("chat TTFT during the summary, {} req (p50 / p99)", report.requests_during_summary),
        report.ttft_during_summary_ms_p50,
        report.ttft_during_summary_ms_p99
    );
    println!("{:<44} {:>9.1}s", format!("summary of {} ({} tokens)", report.document, report.document_tokens), report.summary_s);
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// `GET /` and the scripts and styles it names, five times: the median time and the bytes.
fn time_page(base: &str) -> Result<(f64, usize)> {
    let get = |path: &str| -> Result<String> { Ok(ureq::get(&format!("{base}{path}")).call()?.body_mut().read_to_string()?) };
    let index = get("/").context("the web UI is not built into this binary (make ui)")?;
    let assets: Vec<String> = index.split(['"', '\'']).filter(|s| s.starts_with("/assets/")).map(str::to_string).collect();
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
