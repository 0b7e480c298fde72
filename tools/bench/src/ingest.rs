//! `hillside bench ingest`: what reading a document in a process of its own costs. Each file is
//! read in this process and through the isolated reader (`hillside-ingest`, as the server and
//! the app read every upload), alternating, and the medians are compared; a one-line text file
//! gives the bare cost of a child.

use crate::report::{cpu_name, write_json};
use anyhow::{Context, Result};
use clap::Args;
use hillside_documents::ingest::isolated::{IsolatedReader, ProcessLimits};
use hillside_documents::{read_bytes, Limits};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct IngestBenchArgs {
    /// Files to read [default: the shared gpl-3.0.txt and pride-and-prejudice.txt].
    #[arg(value_delimiter = ',')]
    pub files: Vec<PathBuf>,
    /// Reads of each file each way.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-ingest.json")]
    pub json: PathBuf,
}

#[derive(Serialize)]
struct Row {
    name: String,
    size_bytes: usize,
    text_bytes: usize,
    in_process_ms: f64,
    isolated_ms: f64,
    overhead_ms: f64,
}

#[derive(Serialize)]
struct Report {
    cpu: String,
    rounds: usize,
    rows: Vec<Row>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn ingest(args: &IngestBenchArgs) -> Result<()> {
    let reader = IsolatedReader::locate(ProcessLimits::default()).map_err(anyhow::Error::msg)?;
    let limits = Limits::default();
    let files = if args.files.is_empty() {
        vec![crate::report::shared_document("gpl-3.0.txt"), crate::report::shared_document("pride-and-prejudice.txt")]
    } else {
        args.files.clone()
    };
    let mut inputs = vec![("one line.txt".to_string(), b"One line of text.\n".to_vec())];
    for path in &files {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        inputs.push((name, std::fs::read(path).with_context(|| format!("reading {}", path.display()))?));
    }
    let rounds = args.rounds.max(1);
    let mut rows = Vec::new();
    for (name, bytes) in &inputs {
        let (mut here, mut isolated, mut text_bytes) = (Vec::new(), Vec::new(), 0);
        for _ in 0..rounds {
            let started = Instant::now();
            text_bytes = read_bytes(name, bytes, &limits).with_context(|| format!("reading {name}"))?.text.len();
            here.push(started.elapsed().as_secs_f64() * 1e3);
            let started = Instant::now();
            reader.read(name, bytes, &limits).with_context(|| format!("reading {name} in a child"))?;
            isolated.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let (in_process_ms, isolated_ms) = (median(here), median(isolated));
        rows.push(Row {
            name: name.clone(),
            size_bytes: bytes.len(),
            text_bytes,
            in_process_ms,
            isolated_ms,
            overhead_ms: isolated_ms - in_process_ms,
        });
    }
    let report = Report { cpu: cpu_name(), rounds, rows };
    println!("hillside bench ingest · {} · median of {} reads each way", report.cpu, report.rounds);
    println!();
    println!("| file | size | in this process | in a child | cost of the child |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for r in &report.rows {
        println!(
            "| {} | {:.1} KB | {:.2} ms | {:.2} ms | {:+.2} ms |",
            r.name,
            r.size_bytes as f64 / 1e3,
            r.in_process_ms,
            r.isolated_ms,
            r.overhead_ms
        );
    }
    write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}
