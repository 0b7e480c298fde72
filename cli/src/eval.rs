//! `hillside eval`: how faithful each KV store is to the full cache, teacher-forced over a real
//! text. Prints a table and writes JSON.

use crate::{load_engine, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_engine::eval::{teacher_forced, TeacherForced};
use hillside_engine::kv::{KvStats, StoreKind};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct EvalArgs {
    /// Model and the sparse stores' settings (--kv is ignored: see --stores).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Stores to compare with `full` (which always runs first, as the reference).
    #[arg(long, value_delimiter = ',', default_values = ["tiered"])]
    pub stores: Vec<StoreKind>,
    /// Text to evaluate on (default: ../shared/data/pride-and-prejudice.txt).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Tokens in the window.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Leading tokens of the window read as a prompt (not scored).
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,
    /// Tokens of the text skipped before the window (front matter).
    #[arg(long, default_value_t = 1000)]
    pub skip_tokens: usize,
    #[arg(long, default_value = "eval.json")]
    pub json: PathBuf,
}

#[derive(Serialize)]
struct StoreResult {
    store: StoreKind,
    perplexity: f64,
    perplexity_change_pct: f64,
    top1_agreement: f64,
    tokens_per_s: f64,
    stats: KvStats,
}

#[derive(Serialize)]
struct Report {
    text: String,
    window_tokens: usize,
    scored_tokens: usize,
    alpha: f32,
    results: Vec<StoreResult>,
}

pub fn eval(args: &EvalArgs) -> Result<()> {
    let engine = load_engine(&args.model)?;
    let text_path = args.text.clone().unwrap_or_else(|| PathBuf::from("../shared/data/pride-and-prejudice.txt"));
    let text = std::fs::read_to_string(&text_path).with_context(|| format!("reading {} (choose a text with --text)", text_path.display()))?;
    let all = engine.tokenizer().encode(&text)?;
    if all.len() < args.skip_tokens + args.tokens || args.prompt_tokens >= args.tokens {
        bail!("{} has {} tokens; the window needs {} after skipping {}", text_path.display(), all.len(), args.tokens, args.skip_tokens);
    }
    let window = &all[args.skip_tokens..args.skip_tokens + args.tokens];

    let mut stores = vec![StoreKind::Full];
    stores.extend(args.stores.iter().copied().filter(|s| *s != StoreKind::Full));
    let mut reference: Option<TeacherForced> = None;
    let mut results = Vec::new();
    for store in stores {
        let config = hillside_engine::kv::KvConfig { store, ..args.model.kv_config() };
        let mut seq = engine.new_sequence_with(&config, Some(args.tokens))?;
        eprintln!("{store:?}: {} teacher-forced tokens ...", args.tokens - args.prompt_tokens);
        let start = Instant::now();
        let run = teacher_forced(&engine, &mut seq, window, args.prompt_tokens, 256, |_| {})?;
        let seconds = start.elapsed().as_secs_f64();
        let base = reference.get_or_insert_with(|| run.clone());
        results.push(StoreResult {
            store,
            perplexity: run.perplexity(),
            perplexity_change_pct: 100.0 * (run.perplexity() / base.perplexity() - 1.0),
            top1_agreement: run.top1_agreement(base),
            tokens_per_s: run.nll.len() as f64 / seconds,
            stats: seq.kv.stats(),
        });
    }
    let report = Report {
        text: text_path.display().to_string(),
        window_tokens: args.tokens,
        scored_tokens: args.tokens - args.prompt_tokens,
        alpha: args.model.alpha,
        results,
    };
    println!("hillside eval · {} tokens of {} · α {}", report.window_tokens, report.text, report.alpha);
    println!("{:<10} {:>11} {:>9} {:>8} {:>9} {:>9} {:>12}", "store", "perplexity", "Δ", "top-1", "tok/s", "hot hit", "cold read");
    for r in &report.results {
        let hit = r.stats.tier.as_ref().map_or("-".to_string(), |t| {
            format!("{:.1}%", 100.0 * t.hot_hits as f64 / (t.hot_hits + t.cold_hits).max(1) as f64)
        });
        println!(
            "{:<10} {:>11.3} {:>8.2}% {:>7.1}% {:>9.1} {:>9} {:>9} MB",
            format!("{:?}", r.store).to_lowercase(),
            r.perplexity,
            r.perplexity_change_pct,
            100.0 * r.top1_agreement,
            r.tokens_per_s,
            hit,
            r.stats.cold_bytes_read / 1_000_000
        );
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)? + "\n").with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}
