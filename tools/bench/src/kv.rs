//! `hillside bench kv`: decode speed of every KV store at several contexts, each store and
//! context in its own process (so peak RSS is that one conversation's), with cold-pool traffic
//! and hot-pool hit rates.
//! Prints a table, writes JSON and an SVG plot of tok/s against context.

use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::ModelArgs;
use hillside_engine::headroom::MemoryCap;
use hillside_engine::kv::stores::tiered::planner::{self, Profile};
use hillside_engine::kv::{KvConfig, StoreKind};
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
    /// Text the prompts are cut from (default: the shared pride-and-prejudice.txt).
    #[arg(long)]
    pub text: Option<PathBuf>,
    #[arg(long, default_value = "bench-kv.json")]
    pub json: PathBuf,
    #[arg(long, default_value = "bench-kv.svg")]
    pub plot: PathBuf,
    /// Also run the tiered store at the largest context with hot pools sized for 0.25×…4× the
    /// planner's β, to see where the real optimum sits.
    #[arg(long)]
    pub beta_sweep: bool,
    /// Keeps each context's prompt K/V in this folder and replays it into every store after the
    /// first (see `bench decode --prompt-cache`): one prefill per context instead of one per
    /// store, for long contexts.
    #[arg(long)]
    pub prompt_cache: Option<PathBuf>,
    /// Runs each store's process in a memory cgroup of this many MB (made here, removed after;
    /// needs root), to see the cold pool's reads go direct when the page cache has no room.
    #[arg(long)]
    pub memory_cap_mb: Option<u64>,
}

/// Multiples of the predicted β the sweep tries.
const BETA_SWEEP: [f64; 5] = [0.25, 0.5, 1.0, 2.0, 4.0];

/// Runs `decode` for one store in a child process of this program and returns its report.
fn run_store(args: &KvArgs, store: StoreKind, contexts: &[usize], hot_budget_mb: Option<usize>) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("hillside-bench-kv-{}-{}.json", std::process::id(), store));
    let contexts: Vec<String> = contexts.iter().map(usize::to_string).collect();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["decode", "--kv", &store.to_string(), "--prefill-tokens", "16"])
        .args(["--contexts", &contexts.join(","), "--decode-tokens", &args.decode_tokens.to_string()])
        .args(
            args.model.to_flags().into_iter().filter(|f| hot_budget_mb.is_none() || !f.starts_with("--hot-budget-mb")),
        )
        .arg("--json")
        .arg(&out);
    if let Some(mb) = hot_budget_mb {
        cmd.arg(format!("--hot-budget-mb={mb}"));
    }
    if let Some(text) = &args.text {
        cmd.arg("--text").arg(text);
    }
    if let Some(dir) = &args.prompt_cache {
        cmd.arg("--prompt-cache").arg(dir);
    }
    eprintln!("{store}: decoding at {} ...", contexts.join(", "));
    let cap = args
        .memory_cap_mb
        .map(|mb| MemoryCap::create("hillside-bench-kv", mb << 20))
        .transpose()
        .context("making the memory cgroup for --memory-cap-mb")?;
    let mut child = cmd.spawn().context("starting the benchmark child process")?;
    if let Some(cap) = &cap {
        cap.add(child.id()).context("moving the benchmark child into its memory cgroup")?;
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("benchmark of the {} store failed", store);
    }
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let _ = std::fs::remove_file(&out);
    Ok(report)
}

/// Memory a budgeted store's process may hold beyond its weights and hot budget (issue 3).
const RSS_ALLOWANCE_MB: f64 = 64.0;

pub fn kv(args: &KvArgs) -> Result<()> {
    let mut reports = Vec::new();
    for &store in &args.stores {
        let runs = args
            .contexts
            .iter()
            .map(|&context| run_store(args, store, &[context], None))
            .collect::<Result<Vec<_>>>()?;
        let report = merge_contexts(runs);
        reports.push((store, report));
    }
    let sweep = if args.beta_sweep { Some(beta_sweep(args)?) } else { None };
    println!(
        "hillside bench kv · α {} · decode tok/s ({} tokens at each context)",
        args.model.kv_config().alpha,
        args.decode_tokens
    );
    println!(
        "{:<12} {:>8} {:>9} {:>14} {:>10} {:>15} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>12} {:>14} {:>6}",
        "store", "context", "tok/s", "cold MB/token", "reads/tok", "to host MB/tok", "cached", "hot hit", "pages/sel", "promo/step", "demo/step", "block wait", "scan/step", "read wait", "DRAM/budget", "peak RSS", "spare"
    );
    for (store, report) in &reports {
        for d in report["decode"].as_array().into_iter().flatten() {
            let opt = |key: &str, scale: f64, unit: &str| {
                d[key].as_f64().map_or("-".to_string(), |v| format!("{:.1}{unit}", v * scale))
            };
            let dram = match (d["hot_bytes"].as_f64(), d["hot_budget_bytes"].as_f64()) {
                (Some(used), Some(budget)) => format!("{:.0}/{:.0}MB", used / 1e6, budget / 1e6),
                _ => "-".to_string(),
            };
            // Beside a budgeted store's peak, the bound: weights + hot budget + 64 MB
            // (not for a store that kept a spare copy: it used memory because it was free).
            let rss = d["peak_rss_mb"].as_f64().unwrap_or(0.0);
            let held_spare_copy = d["spare_copy_share"].as_f64().is_some_and(|s| s > 0.0);
            let rss = match (d["hot_budget_bytes"].as_f64(), report["weight_bytes"].as_f64()) {
                (Some(budget), Some(weights)) if !held_spare_copy => {
                    format!("{rss:.0}MB (≤{:.0})", (weights + budget) / 1e6 + RSS_ALLOWANCE_MB)
                }
                _ => format!("{rss:.0}MB"),
            };
            println!(
                "{:<12} {:>8} {:>9.1} {:>14.2} {:>10.0} {:>15.3} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>12} {:>14} {:>6}",
                store.to_string(),
                d["context_tokens"],
                d["tokens_per_s"].as_f64().unwrap_or(0.0),
                d["cold_bytes_read_per_token"].as_f64().unwrap_or(0.0) / 1e6,
                d["cold_reads_per_token"].as_f64().unwrap_or(0.0),
                d["to_host_bytes_per_token"].as_f64().unwrap_or(0.0) / 1e6,
                opt("cold_read_cached_share", 100.0, "%"),
                opt("hot_hit_rate", 100.0, "%"),
                opt("groups_per_selection_share", 100.0, "%"),
                opt("promotions_per_step", 1.0, ""),
                opt("demotions_per_step", 1.0, ""),
                opt("score_block_wait_us", 1.0, "µs"),
                opt("cold_scan_ms_per_step", 1.0, "ms"),
                opt("cold_read_wait_ms_per_step", 1.0, "ms"),
                dram,
                rss,
                opt("spare_copy_share", 100.0, "%"),
            );
        }
    }
    let mut json: serde_json::Map<String, Value> = reports.iter().map(|(s, r)| (s.to_string(), r.clone())).collect();
    if let Some(sweep) = sweep {
        print_sweep(&sweep);
        json.insert("beta_sweep".into(), serde_json::to_value(&sweep)?);
    }
    crate::report::write_json(&args.json, &json)?;
    std::fs::write(&args.plot, plot(&reports)).with_context(|| format!("writing {}", args.plot.display()))?;
    eprintln!("wrote {} and {}", args.json.display(), args.plot.display());
    Ok(())
}

/// One report from the single-context runs of a store: their decode entries, each with the
/// peak RSS of its own process.
fn merge_contexts(runs: Vec<Value>) -> Value {
    let mut decode = Vec::new();
    let mut merged = Value::Null;
    for mut run in runs {
        let rss = run["peak_rss_mb"].take();
        for mut d in run["decode"].take().as_array().cloned().unwrap_or_default() {
            d["peak_rss_mb"] = rss.clone();
            decode.push(d);
        }
        if merged.is_null() {
            merged = run;
        }
    }
    if let Some(m) = merged.as_object_mut() {
        m.remove("peak_rss_mb");
        m.insert("decode".into(), Value::Array(decode));
    }
    merged
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
        svg +=
            &format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n", path.join(" "));
        for &(x, y) in points {
            svg += &format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n", px(x), py(y));
        }
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>\n",
            w - right + 10.0,
            top + 20.0 + 18.0 * i as f64
        );
    }
    svg + "</svg>\n"
}

#[derive(serde::Serialize)]
struct SweepPoint {
    beta: f64,
    multiple_of_predicted: f64,
    hot_budget_bytes: usize,
    hot_share_of_kv: f64,
    tokens_per_s: f64,
    hot_hit_rate: Option<f64>,
    cold_bytes_read_per_token: f64,
}

#[derive(serde::Serialize)]
struct Sweep {
    context_tokens: usize,
    profile: Profile,
    predicted_beta: f64,
    /// The β the planner uses: the prediction capped by the DRAM budget.
    planned_beta: f64,
    points: Vec<SweepPoint>,
}

/// Tiered decode at the largest context for hot pools sized by multiples of the predicted β.
fn beta_sweep(args: &KvArgs) -> Result<Sweep> {
    let context = *args.contexts.iter().max().context("no contexts")?;
    let engine = hillside_common::load_engine(&args.model)?;
    let shape = engine.model().kv_shape(context);
    let config = KvConfig { store: StoreKind::Tiered, ..args.model.kv_config() };
    let profile = planner::profile(&config.cold_dir, config.key_bits.bits_for(shape.head_dim))?;
    let predicted = profile.beta(f64::from(config.alpha));
    let kv_bytes = shape.max_tokens * shape.bytes_per_token();
    let planned_budget = config.tiered_settings(shape).hot_budget_bytes;
    let fixed = config.budget_for_beta(shape, 0.0);
    let planned_share = (planned_budget.saturating_sub(fixed)) as f64 / kv_bytes as f64;
    let mut points = Vec::new();
    for multiple in BETA_SWEEP {
        let beta = predicted * multiple;
        let budget = config.budget_for_beta(shape, beta);
        eprintln!("β sweep: β = {beta:.2} ({multiple}× predicted), hot budget {} MB", budget / 1_000_000);
        let report = run_store(args, StoreKind::Tiered, &[context], Some(budget.div_ceil(1_000_000)))?;
        let d = &report["decode"][0];
        points.push(SweepPoint {
            beta,
            multiple_of_predicted: multiple,
            hot_budget_bytes: budget,
            hot_share_of_kv: beta / (1.0 + beta),
            tokens_per_s: d["tokens_per_s"].as_f64().unwrap_or(0.0),
            hot_hit_rate: d["hot_hit_rate"].as_f64(),
            cold_bytes_read_per_token: d["cold_bytes_read_per_token"].as_f64().unwrap_or(0.0),
        });
    }
    Ok(Sweep {
        context_tokens: context,
        profile,
        predicted_beta: predicted,
        planned_beta: planned_share / (1.0 - planned_share),
        points,
    })
}

fn print_sweep(s: &Sweep) {
    let p = &s.profile;
    println!(
        "\nβ sweep at {} tokens · f_c {:.1} GB/s, f_s {:.1} GB/s, B_c {:.1} GB/s, B_s {:.2} GB/s · predicted β {:.2} (planned, under the DRAM cap: {:.2})",
        s.context_tokens,
        p.host_score_bytes_per_s / 1e9,
        p.storage_score_bytes_per_s / 1e9,
        p.hot_fetch_bytes_per_s / 1e9,
        p.cold_read_bytes_per_s / 1e9,
        s.predicted_beta,
        s.planned_beta
    );
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>14}",
        "×β", "β", "hot share", "budget", "tok/s", "hot hit", "cold MB/token"
    );
    let best = s.points.iter().map(|p| p.tokens_per_s).fold(0.0, f64::max);
    for pt in &s.points {
        println!(
            "{:>8} {:>8.2} {:>9.0}% {:>8}MB {:>9.1} {:>9} {:>14.2}{}",
            pt.multiple_of_predicted,
            pt.beta,
            100.0 * pt.hot_share_of_kv,
            pt.hot_budget_bytes / 1_000_000,
            pt.tokens_per_s,
            pt.hot_hit_rate.map_or("-".into(), |h| format!("{:.1}%", 100.0 * h)),
            pt.cold_bytes_read_per_token / 1e6,
            if pt.tokens_per_s == best { "  ← best" } else { "" }
        );
    }
}
