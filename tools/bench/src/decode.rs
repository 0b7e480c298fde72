//! `hillside bench decode`: prefill and decode speed with the whole cache in memory, next to
//! this machine's memory read bandwidth, so each figure can be read against its roofline.

use crate::prompt_cache::feed_prompt;
use crate::report::{cpu_name, peak_rss_mb, shared_document, utc_now, write_json};
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::{load_engine, ModelArgs};
use hillside_engine::kv::cold::GROUP_TOKENS;
use hillside_engine::sampling::argmax;
use hillside_engine::trace;
use hillside_engine::{Engine, Logits};
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text the prompts are cut from (default: the shared Pride and Prejudice).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Prompt length for the prefill figure (timed after one untimed run, as llama-bench times it).
    #[arg(long, default_value_t = 512)]
    pub prefill_tokens: usize,
    /// Contexts (tokens) at which decode speed is measured.
    #[arg(long, value_delimiter = ',', default_values_t = [512, 2048, 4096, 8192])]
    pub contexts: Vec<usize>,
    /// Tokens decoded at each context.
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-decode.json")]
    pub json: PathBuf,
    /// Keeps each context's prompt K/V in this folder (a snapshot file per model and prompt)
    /// and, once one is there, replays it instead of computing the prompt, all but its last
    /// prefill chunk, which is computed as usual (so the first logits, and the store's
    /// prompt-time bookkeeping for that chunk, are real). For long contexts, whose prefill
    /// takes minutes per store.
    #[arg(long)]
    pub prompt_cache: Option<PathBuf>,
    /// Times each phase of the prefills and decode steps (as `HILLSIDE_TRACE=step` does) and
    /// reports where their time goes.
    #[arg(long)]
    pub trace: bool,
}

/// One phase's share of a decode step (see `hillside_engine::trace`).
#[derive(Serialize)]
struct PhaseResult {
    phase: &'static str,
    /// The phase it runs inside (`None` for the whole pass).
    within: Option<&'static str>,
    ms_per_step: f64,
    share_of_step: f64,
}

#[derive(Serialize)]
struct PrefillResult {
    tokens: usize,
    ms: f64,
    tokens_per_s: f64,
    /// Leading tokens replayed from `--prompt-cache` rather than computed (counted in `ms`).
    replayed_tokens: usize,
    /// With `--trace`: where the prefill's time went, per token.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    phases: Vec<PhaseResult>,
}

#[derive(Serialize)]
struct DecodeResult {
    context_tokens: usize,
    prompt: PrefillResult,
    decode_tokens: usize,
    ms_per_token: f64,
    tokens_per_s: f64,
    /// Weights plus the K/V the step reads (average over the decoded tokens).
    bytes_read_per_token: usize,
    /// bytes_read_per_token / (step time × measured bandwidth).
    roofline_efficiency: f64,
    /// Cold-pool bytes read per decoded token (offload and tiered stores), and the read
    /// requests they took.
    cold_bytes_read_per_token: f64,
    cold_reads_per_token: f64,
    /// The share of `cold_bytes_read_per_token` each cold-pool directory served (one entry per
    /// directory; with one per SSD, each device's part of the traffic).
    cold_read_share_per_dir: Vec<f64>,
    /// Bytes per decoded token that cross from the storage side to the host: the cold reads,
    /// except for near-storage attention, where only its partial outputs would leave a
    /// computational drive.
    to_host_bytes_per_token: f64,
    /// The share of them read through the page cache (the dual path), and the (layer, KV
    /// head) regions it served at the end, of all.
    cold_read_cached_share: Option<f64>,
    cold_lanes_cached: Option<(usize, usize)>,
    /// Tiered: share of the selected tokens found in the hot pool while decoding.
    hot_hit_rate: Option<f64>,
    /// Tiered: promotions and demotions per decode step (all layers).
    promotions_per_step: Option<f64>,
    demotions_per_step: Option<f64>,
    /// Tiered: cold-token score blocks per step, how long each waited between the storage
    /// evaluator finishing it and the host merging it, and the cold scan time per step (from
    /// handing the cold tokens over to merging the last block, summed over layers).
    score_blocks_per_step: Option<f64>,
    score_block_wait_us: Option<f64>,
    cold_scan_ms_per_step: Option<f64>,
    /// Tiered: how long a decode step waited for cold-pool reads (read ahead and its own).
    cold_read_wait_ms_per_step: Option<f64>,
    /// Tiered: share of the cold groups read ahead of their layer's turn that it then needed.
    read_ahead_used_share: Option<f64>,
    /// Tiered: cold-pool groups one (layer, KV head)'s selection touches, hot or not, and that
    /// as a share of the groups in the cold pool (how well the placement packs the selection).
    groups_per_selection: Option<f64>,
    groups_per_selection_share: Option<f64>,
    /// Tiered: of those groups, the ones holding a selected token that was not hot (read).
    cold_groups_per_selection: Option<f64>,
    /// Tiered, placement `hits`: cold-pool blocks re-placed while decoding, the time that took
    /// (included in the decode time), and the bytes it read per decoded token (included in
    /// `cold_bytes_read_per_token`; the rest is what the steps' selections read).
    relaid_blocks: Option<u64>,
    relayout_ms: Option<f64>,
    relayout_bytes_read_per_token: Option<f64>,
    /// Tiered: DRAM counted against the hot budget at the end, and the budget.
    hot_bytes: Option<usize>,
    hot_budget_bytes: Option<usize>,
    /// Tiered: share of the decode steps that attended through the dense copy kept while
    /// memory is spare (the rest ranked and read from the tiers).
    spare_copy_share: Option<f64>,
    /// With `--trace`: where a decode step's time went.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    phases: Vec<PhaseResult>,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    threads: usize,
    simd: &'static str,
    model: String,
    kv_store: hillside_engine::kv::StoreKind,
    weight_bytes: usize,
    kv_bytes_per_token: usize,
    memory_read_gb_per_s: f64,
    prefill: PrefillResult,
    decode: Vec<DecodeResult>,
    peak_rss_mb: f64,
}

fn memory_read_gb_per_s() -> f64 {
    // 512 MiB, far past any cache, or half the room left where a memory cgroup caps this
    // process (bench kv --memory-cap-mb): still past the last-level cache.
    let room = hillside_engine::headroom::Headroom::measure().bytes as usize;
    let words = (512usize << 20).min(room / 2).max(64 << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let sum = buf
            .par_chunks(1 << 16)
            .map(|c| {
                // Eight independent lanes so the compiler vectorizes the loads.
                let lanes = c.chunks_exact(8).fold([0u64; 8], |mut acc, w| {
                    acc.iter_mut().zip(w).for_each(|(a, &x)| *a = a.wrapping_add(x));
                    acc
                });
                lanes.iter().fold(0u64, |s, &x| s.wrapping_add(x))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn prefill(
    engine: &Engine,
    model: &ModelArgs,
    tokens: &[u32],
    chunk: usize,
    cache: Option<&Path>,
) -> Result<(hillside_engine::Sequence, Vec<f32>, PrefillResult)> {
    trace::take();
    let start = Instant::now();
    let (seq, logits, replayed_tokens) =
        feed_prompt(engine, model, || model.new_sequence(engine), tokens, chunk, cache)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let phases = phase_results(trace::take(), tokens.len(), ms / 1e3 / tokens.len() as f64);
    Ok((
        seq,
        logits,
        PrefillResult {
            tokens: tokens.len(),
            ms,
            tokens_per_s: tokens.len() as f64 / (ms / 1e3),
            replayed_tokens,
            phases,
        },
    ))
}

pub fn decode(args: &DecodeArgs) -> Result<()> {
    if args.trace {
        trace::set_enabled(true);
    }
    let engine = load_engine(&args.model)?;
    let text_path = args.text.clone().unwrap_or_else(|| shared_document("pride-and-prejudice.txt"));
    let text = std::fs::read_to_string(&text_path)
        .with_context(|| format!("reading {} (choose a text with --text)", text_path.display()))?;
    let config = &engine.model().config;
    let longest = args.contexts.iter().copied().max().unwrap_or(0).max(args.prefill_tokens);
    // Encoding a whole book would set the process's peak memory itself: a prefix of ~8 bytes
    // per token needed is plenty for English prose (the whole text if it is not).
    let prefix = &text[..text.floor_char_boundary(longest.saturating_mul(8))];
    let mut tokens = engine.tokenizer().encode(prefix)?;
    if tokens.len() < longest && prefix.len() < text.len() {
        tokens = engine.tokenizer().encode(&text)?;
    }
    if longest > config.context_tokens {
        bail!("context {longest} is past the model's {}", config.context_tokens);
    }
    if tokens.len() < longest {
        bail!("{} has only {} tokens; {longest} needed", text_path.display(), tokens.len());
    }

    let chunk = hillside_engine::GenerateParams::default().prefill_chunk_tokens;
    eprintln!("prefill of {} tokens (a warm-up, then the timed run) ...", args.prefill_tokens);
    // One untimed run first, as llama-bench does, so that the figure is the engine's rate and
    // not the first touch of its scratch buffers' pages.
    prefill(&engine, &args.model, &tokens[..args.prefill_tokens], chunk, None)?;
    let (_, _, prefill_result) = prefill(&engine, &args.model, &tokens[..args.prefill_tokens], chunk, None)?;

    let weight_bytes = engine.model().weight_bytes();
    let kv_per_token = config.kv_bytes_per_token();
    let mut decode_results = Vec::new();
    for &context in &args.contexts {
        let n = args.decode_tokens.min(context - 1);
        eprintln!("context {context}: prefill {} tokens, then decode {n} ...", context - n);
        let (mut seq, mut logits, prompt) =
            prefill(&engine, &args.model, &tokens[..context - n], chunk, args.prompt_cache.as_deref())?;
        let before = seq.kv.stats();
        let start = Instant::now();
        for _ in 0..n {
            let next = argmax(&logits);
            logits = engine.model().forward(&[next], seq.kv.as_mut(), Logits::Last)?;
        }
        let s_per_token = start.elapsed().as_secs_f64() / n as f64;
        let phases = phase_results(trace::take(), n, s_per_token);
        let after = seq.kv.stats();
        let tier = before.tier.as_ref().zip(after.tier.as_ref());
        let per_step =
            |f: fn(&hillside_engine::kv::TierStats) -> u64| tier.map(|(b, a)| (f(a) - f(b)) as f64 / n as f64);
        let per_selection = |f: fn(&hillside_engine::kv::TierStats) -> u64| {
            per_step(f).zip(per_step(|t| t.selections)).map(|(x, s)| x / s.max(1e-9))
        };
        let hot_hits = per_step(|t| t.hot_hits);
        let cold_hits = per_step(|t| t.cold_hits);
        let blocks = per_step(|t| t.score_blocks);
        decode_results.push(DecodeResult {
            hot_hit_rate: hot_hits.zip(cold_hits).map(|(h, c)| h / (h + c).max(1e-9)),
            promotions_per_step: per_step(|t| t.promotions),
            demotions_per_step: per_step(|t| t.demotions),
            score_blocks_per_step: blocks,
            score_block_wait_us: per_step(|t| t.score_block_wait_ns).zip(blocks).map(|(ns, b)| ns / b.max(1e-9) / 1e3),
            cold_scan_ms_per_step: per_step(|t| t.cold_scan_ns).map(|ns| ns / 1e6),
            cold_read_wait_ms_per_step: per_step(|t| t.cold_read_wait_ns).map(|ns| ns / 1e6),
            read_ahead_used_share: per_step(|t| t.read_ahead_used)
                .zip(per_step(|t| t.read_ahead_groups))
                .map(|(u, g)| u / g.max(1e-9)),
            relaid_blocks: tier.map(|(b, a)| a.relaid_blocks - b.relaid_blocks),
            relayout_ms: tier.map(|(b, a)| (a.relayout_ns - b.relayout_ns) as f64 / 1e6),
            relayout_bytes_read_per_token: per_step(|t| t.relayout_bytes_read),
            groups_per_selection: per_selection(|t| t.selected_groups),
            cold_groups_per_selection: per_selection(|t| t.selected_cold_groups),
            groups_per_selection_share: per_selection(|t| t.selected_groups).map(|g| {
                // The pool's bytes over a token's there (f16, or fewer in 8 bits).
                let values = 2 * GROUP_TOKENS * config.head_dim;
                let cold_type = args.model.kv_config().cold_type;
                let kv_per_token_there =
                    kv_per_token as f64 * cold_type.bytes(values, config.head_dim) as f64 / (2 * values) as f64;
                let cold_groups = after.cold_bytes as f64 / kv_per_token_there / GROUP_TOKENS as f64;
                g / cold_groups.max(1.0)
            }),
            hot_bytes: after.tier.as_ref().map(|t| t.hot_bytes),
            hot_budget_bytes: after.tier.as_ref().map(|t| t.hot_budget_bytes),
            spare_copy_share: per_step(|t| t.spare_copy_steps),
            cold_bytes_read_per_token: (after.cold_bytes_read - before.cold_bytes_read) as f64 / n as f64,
            cold_reads_per_token: (after.cold_reads - before.cold_reads) as f64 / n as f64,
            cold_read_share_per_dir: {
                let read = |i: usize| {
                    after.cold_bytes_read_per_dir[i] - before.cold_bytes_read_per_dir.get(i).copied().unwrap_or(0)
                };
                let total = (after.cold_bytes_read - before.cold_bytes_read).max(1) as f64;
                (0..after.cold_bytes_read_per_dir.len()).map(|i| read(i) as f64 / total).collect()
            },
            to_host_bytes_per_token: (after.bytes_to_host - before.bytes_to_host) as f64 / n as f64,
            cold_read_cached_share: (after.cold_lanes > 0).then(|| {
                (after.cold_bytes_read_cached - before.cold_bytes_read_cached) as f64
                    / ((after.cold_bytes_read - before.cold_bytes_read) as f64).max(1.0)
            }),
            cold_lanes_cached: (after.cold_lanes > 0).then_some((after.cold_lanes_cached, after.cold_lanes)),
            context_tokens: context,
            prompt,
            decode_tokens: n,
            ms_per_token: s_per_token * 1e3,
            tokens_per_s: 1.0 / s_per_token,
            bytes_read_per_token: weight_bytes + (context - n / 2) * kv_per_token,
            roofline_efficiency: 0.0,
            phases,
        });
    }
    // Peak RSS is read before the bandwidth probe, whose 512 MiB buffer is not the engine's.
    let peak_rss_mb = peak_rss_mb();
    eprintln!("measuring memory bandwidth ...");
    let bandwidth = memory_read_gb_per_s();
    for d in &mut decode_results {
        d.roofline_efficiency = d.bytes_read_per_token as f64 / (d.ms_per_token / 1e3 * bandwidth * 1e9);
    }

    let report = Report {
        date: utc_now(),
        cpu: cpu_name(),
        threads: rayon::current_num_threads(),
        simd: hillside_engine::kernels::simd_level().name(),
        model: args.model.model().map_or_else(|| hillside_common::models::registry().default, str::to_string),
        kv_store: args.model.kv_config().store,
        weight_bytes,
        kv_bytes_per_token: kv_per_token,
        memory_read_gb_per_s: bandwidth,
        prefill: prefill_result,
        decode: decode_results,
        peak_rss_mb,
    };
    print_table(&report);
    write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// The traced phases of `steps` steps (decode steps, or a prefill's tokens) of `s_per_step` each.
fn phase_results(totals: Vec<trace::PhaseTotal>, steps: usize, s_per_step: f64) -> Vec<PhaseResult> {
    totals
        .into_iter()
        .map(|t| {
            let ms = t.ns as f64 / 1e6 / steps as f64;
            PhaseResult {
                phase: t.phase.name(),
                within: t.phase.parent().map(trace::Phase::name),
                ms_per_step: ms,
                share_of_step: ms / (s_per_step * 1e3),
            }
        })
        .collect()
}

fn print_table(r: &Report) {
    println!("hillside bench decode · {} · {} threads · {} · {}", r.cpu, r.threads, r.simd, r.model);
    println!(
        "memory read bandwidth {:.1} GB/s · weights {:.1} MB · KV {} B/token",
        r.memory_read_gb_per_s,
        r.weight_bytes as f64 / 1e6,
        r.kv_bytes_per_token
    );
    println!();
    println!("{:<28} {:>10} {:>12} {:>10}", "figure", "tok/s", "ms/token", "roofline");
    println!(
        "{:<28} {:>10.1} {:>12.2} {:>10}",
        format!("prefill {} tokens", r.prefill.tokens),
        r.prefill.tokens_per_s,
        r.prefill.ms / r.prefill.tokens as f64,
        "-"
    );
    print_phases(&r.prefill.phases);
    for d in &r.decode {
        let figure = match d.prompt.replayed_tokens {
            0 => format!("prefill {} tokens", d.prompt.tokens),
            replayed => format!("prefill {} ({replayed} replayed)", d.prompt.tokens),
        };
        println!(
            "{:<28} {:>10.1} {:>12.2} {:>10}",
            figure,
            d.prompt.tokens_per_s,
            d.prompt.ms / d.prompt.tokens as f64,
            "-"
        );
        print_phases(&d.prompt.phases);
        println!(
            "{:<28} {:>10.1} {:>12.2} {:>9.0}%",
            format!("decode at {} context", d.context_tokens),
            d.tokens_per_s,
            d.ms_per_token,
            100.0 * d.roofline_efficiency
        );
        if let Some(share) = d.spare_copy_share.filter(|&s| s > 0.0) {
            println!("  {:.0}% of its steps attended through the spare copy", 100.0 * share);
        }
        print_phases(&d.phases);
    }
    println!("\npeak RSS {:.0} MB", r.peak_rss_mb);
}

/// Traced phases under the figure they divide, each indented below the one it runs inside.
fn print_phases(phases: &[PhaseResult]) {
    for p in phases {
        let depth =
            std::iter::successors(p.within, |w| phases.iter().find(|q| q.phase == *w).and_then(|q| q.within)).count();
        println!(
            "{:<28} {:>10} {:>12.3} {:>9.0}%",
            format!("  {}{}", "  ".repeat(depth), p.phase),
            "",
            p.ms_per_step,
            100.0 * p.share_of_step
        );
    }
}
