//! `hillside bench kv`: decode speed of every KV store at several contexts, each store in its
//! own process (so peak RSS is that store's), with cold-pool traffic and hot-pool hit rates.
//! Prints a table, writes JSON and an SVG plot of tok/s against context.

use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_engine::kv::StoreKind;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

#[derive(Args)]
pub struct KvArgs {
    /// Model and the tiered store's settings (--kv is ignored: see --stores).
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, value_delimiter = ',', default_values = ["full", "offload", "drop", "tiered"])]
    pub stores: Vec<StoreKind>,
    #[arg(long, value_delimiter = ',', default_values_t = [2048, 4096, 8192])]
    pub contexts: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    /// Text the prompts are cut from (default: ../shared/data/pride-and-prejudice.txt).
    #[arg(long)]
    pub text: Option<PathBuf>,
    #[arg(long, default_value = "bench-kv.json")]
    pub json: PathBuf,
    #[arg(long, default_value = "bench-kv.svg")]
    pub plot: PathBuf,
}

/// Runs `hillside bench decode` for one store in a child process and returns its report.
fn run_store(args: &KvArgs, store: StoreKind) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("hillside-bench-kv-{}-{}.json", std::process::id(), store));
    let contexts: Vec<String> = args.contexts.iter().map(usize::to_string).collect();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["bench", "decode", "--kv", &store.to_string(), "--prefill-tokens", "16"])
        .args(["--contexts", &contexts.join(","), "--decode-tokens", &args.decode_tokens.to_string()])
        .args(args.model.to_flags())
        .arg("--json")
        .arg(&out);
    if let Some(text) = &args.text {
        cmd.arg("--text").arg(text);
    }
    eprintln!("{store}: decoding at {} ...", contexts.join(", "));
    let status = cmd.status().context("starting the benchmark child process")?;
    if !status.success() {
        bail!("benchmark of the {} store failed", store);
    }
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let _ = std::fs::remove_file(&out);
    Ok(report)
}

pub fn kv(args: &KvArgs) -> Result<()> {
    let mut reports = Vec::new();
    for &store in &args.stores {
        reports.push((store, run_store(args, store)?));
    }
    println!("hillside bench kv · α {} · decode tok/s ({} tokens at each context)", args.model.kv_config().alpha, args.decode_tokens);
    println!("{:<9} {:>8} {:>9} {:>14} {:>9} {:>10} {:>10} {:>10}", "store", "context", "tok/s", "cold MB/token", "hot hit", "promo/step", "demo/step", "peak RSS");
    for (store, report) in &reports {
        for d in report["decode"].as_array().into_iter().flatten() {
            let opt = |key: &str, scale: f64, unit: &str| d[key].as_f64().map_or("-".to_string(), |v| format!("{:.1}{unit}", v * scale));
            println!(
                "{:<9} {:>8} {:>9.1} {:>14.2} {:>9} {:>10} {:>10} {:>8.0}MB",
                store.to_string(),
                d["context_tokens"],
                d["tokens_per_s"].as_f64().unwrap_or(0.0),
                d["cold_bytes_read_per_token"].as_f64().unwrap_or(0.0) / 1e6,
                opt("hot_hit_rate", 100.0, "%"),
                opt("promotions_per_step", 1.0, ""),
                opt("demotions_per_step", 1.0, ""),
                report["peak_rss_mb"].as_f64().unwrap_or(0.0),
            );
        }
    }
    let json: serde_json::Map<String, Value> = reports.iter().map(|(s, r)| (s.to_string(), r.clone())).collect();
    std::fs::write(&args.json, serde_json::to_string_pretty(&json)? + "\n").with_context(|| format!("writing {}", args.json.display()))?;
    std::fs::write(&args.plot, plot(&reports)).with_context(|| format!("writing {}", args.plot.display()))?;
    eprintln!("wrote {} and {}", args.json.display(), args.plot.display());
    Ok(())
}

/// A line per store: decode tok/s (log scale) against context.
fn plot(reports: &[(StoreKind, Value)]) -> String {
    let (w, h, left, bottom, top, right) = (640.0, 400.0, 60.0, 50.0, 30.0, 120.0);
    let series: Vec<(String, Vec<(f64, f64)>)> = reports
        .iter()
        .map(|(s, r)| {
            let points = r["decode"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| Some((d["context_tokens"].as_f64()?, d["tokens_per_s"].as_f64()?)))
                .collect();
            (s.to_string(), points)
        })
        .collect();
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let (x_max, y_max) = all.iter().fold((1.0f64, 1.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let y_min = all.iter().map(|p| p.1).fold(y_max, f64::min).max(0.1);
    let (ly0, ly1) = (y_min.log10().floor(), y_max.log10().ceil().max(y_min.log10().floor() + 1.0));
    let px = |x: f64| left + x / x_max * (w - left - right);
    let py = |y: f64| h - bottom - (y.log10() - ly0) / (ly1 - ly0) * (h - top - bottom);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Decode speed by KV store</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">context (tokens)</text>\n\
         <text x=\"15\" y=\"{}\" transform=\"rotate(-90 15 {})\" text-anchor=\"middle\">tokens/s (log)</text>\n",
        w / 2.0, h - bottom, w - right, h - bottom, h - bottom, (left + w - right) / 2.0, h - 12.0, h / 2.0, h / 2.0
    );
    for e in ly0 as i32..=ly1 as i32 {
        let y = py(10f64.powi(e));
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 6.0, y + 4.0, 10f64.powi(e));
        svg += &format!("<line x1=\"{left}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/>\n", w - right);
    }
    for &(x, _) in series.first().map(|s| s.1.as_slice()).unwrap_or(&[]) {
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(x), h - bottom + 16.0, x);
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        svg += &format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n", path.join(" "));
        for &(x, y) in points {
            svg += &format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n", px(x), py(y));
        }
        svg += &format!("<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>\n", w - right + 10.0, top + 20.0 + 18.0 * i as f64);
    }
    svg + "</svg>\n"
}
