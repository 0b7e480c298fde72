//! `hillside bench recall`: how well smaller scoring copies of the keys rank tokens (after Loki:
//! keys that live in a low-dimensional subspace). For r of a head's dimensions, each copy's
//! DRAM per token and its recall of the exact top α (the tokens exact f32 q·k would pick), on
//! the real model's keys and decode queries.
//!
//! Two ways of keeping r dimensions, each fitted per (layer, KV head) on the prompt's first
//! `--fit-tokens` tokens: the principal components of the keys (PCA), and the r/2 rotary
//! frequency pairs that carry the most query × key energy (RoPE mixes the two dimensions of a
//! pair with the position, so a pair is kept or dropped whole). Each is scored in f32 and
//! quantized as the store's copies are (symmetric, one f32 scale per token and KV head), beside
//! today's full-rank INT8 and INT4 copies.

mod projection;

use crate::fidelity::{teacher_forced, ExactKeys, SelectionWatch, Watched};
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::{load_engine, ModelArgs};
use hillside_engine::kernels::rope::RopeLayout;
use hillside_engine::kv::{FullKvStore, Selection};
use hillside_engine::score::{KeyBits, ScoreBlock, ScoringKeys, TopK};
use hillside_engine::Sequence;
use projection::{pca, rope_pairs, Projection};
use rayon::prelude::*;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Args)]
pub struct RecallArgs {
    /// Model, and the tiered settings the recall is measured for (--alpha, --dense-layers,
    /// sinks and recent tokens).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text the context is cut from (default: the shared pride-and-prejudice.txt).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Tokens of context each query ranks.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Decode queries measured (teacher-forced steps after the context).
    #[arg(long, default_value_t = 8)]
    pub queries: usize,
    /// Leading prompt tokens whose keys and queries fit the projections.
    #[arg(long, default_value_t = 256)]
    pub fit_tokens: usize,
    /// Dimensions kept per head.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 16, 32, 64])]
    pub ranks: Vec<usize>,
    #[arg(long, default_value = "bench-recall.json")]
    pub json: PathBuf,
}

/// One scoring copy's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct CopyRecall {
    /// `pca`, `rope_pairs` or `full`.
    pub method: &'static str,
    pub rank: usize,
    /// DRAM per token of the copy over every sparse layer, INT8 and INT4 (a scale per KV head).
    pub bytes_per_token_int8: usize,
    pub bytes_per_token_int4: usize,
    /// Mean recall of the exact top α over sparse layers, KV heads and queries.
    pub recall_f32: f64,
    pub recall_int8: f64,
    pub recall_int4: f64,
    /// The lowest layer mean of the INT4 copy.
    pub worst_layer_recall_int4: f64,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    model: String,
    context_tokens: usize,
    queries: usize,
    fit_tokens: usize,
    alpha: f32,
    copies: Vec<CopyRecall>,
}

/// The prompt's first queries (for fitting) and every single-token query, per layer, as each KV
/// head's summed query group (what the store scores with).
/// Also every layer's keys as the last query saw them (`tokens × n_kv·head_dim`, RoPE applied).
#[derive(Default)]
struct Queries {
    fit: Vec<Vec<f32>>,
    decode: Vec<Vec<Vec<f32>>>,
    keys: Vec<Vec<f32>>,
}

struct Capture {
    queries: Arc<Mutex<Queries>>,
    fit_tokens: usize,
    n_kv: usize,
    head_dim: usize,
}

impl Capture {
    /// `q`'s rows (`n_heads·head_dim` each) as summed queries per KV head.
    fn summed(&self, q: &[f32], rows: usize) -> Vec<f32> {
        let row = q.len() / rows;
        let group = row / self.head_dim / self.n_kv;
        let mut out = vec![0f32; rows * self.n_kv * self.head_dim];
        for (r, dst) in q.chunks_exact(row).zip(out.chunks_exact_mut(self.n_kv * self.head_dim)) {
            for (qh, d) in r.chunks_exact(self.head_dim).enumerate() {
                dst[qh / group * self.head_dim..][..self.head_dim].iter_mut().zip(d).for_each(|(a, b)| *a += b);
            }
        }
        out
    }
}

impl SelectionWatch for Capture {
    fn select(
        &mut self,
        keys: &ExactKeys,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        selection: Selection,
    ) -> Selection {
        let summed = self.summed(q, q_positions.len());
        let mut queries = self.queries.lock().unwrap_or_else(|p| p.into_inner());
        if q_positions.len() == 1 {
            let step = queries.decode.iter().position(|s| s.len() == layer).unwrap_or(queries.decode.len());
            if step == queries.decode.len() {
                queries.decode.push(Vec::new());
            }
            queries.decode[step].push(summed);
            let n_layers = queries.keys.len().max(layer + 1);
            queries.keys.resize(n_layers, Vec::new());
            // The keys only grow (teacher forcing never rolls back): copy just the new rows,
            // not the whole layer each step.
            let (latest, now) = (&mut queries.keys[layer], keys.layer(layer));
            if latest.len() > now.len() {
                latest.clear();
            }
            latest.extend_from_slice(&now[latest.len()..]);
        } else {
            let kv_dim = self.n_kv * self.head_dim;
            let fit = queries.fit.len().max(layer + 1);
            queries.fit.resize(fit, Vec::new());
            for (&p, row) in q_positions.iter().zip(summed.chunks_exact(kv_dim)) {
                if p < self.fit_tokens {
                    queries.fit[layer].extend_from_slice(row);
                }
            }
        }
        selection
    }
}

pub fn recall(args: &RecallArgs) -> Result<()> {
    let engine = load_engine(&args.model)?;
    let config = engine.model().config.clone();
    let kv = args.model.kv_config();
    if args.ranks.iter().any(|&r| r == 0 || r > config.head_dim || r % 2 == 1) {
        bail!("--ranks must be even and at most the head's {} dimensions", config.head_dim);
    }
    let text_path = args.text.clone().unwrap_or_else(|| crate::report::shared_document("pride-and-prejudice.txt"));
    let text = std::fs::read_to_string(&text_path)
        .with_context(|| format!("reading {} (choose a text with --text)", text_path.display()))?;
    let need = args.tokens + args.queries;
    let tokens = engine.tokenizer().encode(&text[..text.floor_char_boundary(need.saturating_mul(8))])?;
    if tokens.len() < need || need > config.context_tokens {
        bail!(
            "{need} tokens needed: {} has {}, the model's context is {}",
            text_path.display(),
            tokens.len(),
            config.context_tokens
        );
    }
    if args.fit_tokens == 0 || args.fit_tokens > args.tokens {
        bail!("--fit-tokens must be between 1 and --tokens");
    }

    let queries = Arc::new(Mutex::new(Queries::default()));
    let capture = Capture {
        queries: queries.clone(),
        fit_tokens: args.fit_tokens,
        n_kv: config.n_kv_heads,
        head_dim: config.head_dim,
    };
    let store = Watched::new(Box::new(FullKvStore::new(engine.model().kv_shape(need))), capture);
    let mut seq = Sequence { kv: Box::new(store), tokens: Vec::new() };
    eprintln!("prefill of {} tokens, then {} queries ...", args.tokens, args.queries);
    let chunk = hillside_engine::GenerateParams::default().prefill_chunk_tokens;
    teacher_forced(&engine, &mut seq, &tokens[..need], args.tokens, chunk, |_| {})?;
    let queries = std::mem::take(&mut *queries.lock().unwrap_or_else(|p| p.into_inner()));

    let shape = Shape { n_kv: config.n_kv_heads, head_dim: config.head_dim, layout: config.rope_layout };
    let setup = Setup { alpha: kv.alpha, sinks: kv.sink_tokens, recent: kv.recent_tokens, fit_tokens: args.fit_tokens };
    let sparse: Vec<usize> = (kv.dense_layers.min(config.n_layers)..config.n_layers).collect();
    let layers: Vec<LayerData> = sparse
        .iter()
        .map(|&l| LayerData {
            keys: &queries.keys[l],
            fit_queries: &queries.fit[l],
            queries: queries.decode.iter().map(|s| &s[l][..]).collect(),
        })
        .collect();
    let copies = measure(shape, setup, &layers, &args.ranks);

    let model = args.model.model().map_or_else(|| hillside_common::models::registry().default, str::to_string);
    println!(
        "hillside bench recall · {model} · {} tokens · recall of the exact top {:.0}% over {} queries",
        args.tokens,
        kv.alpha * 100.0,
        queries.decode.len()
    );
    println!(
        "{:<11} {:>4} {:>11} {:>11} {:>8} {:>8} {:>8} {:>12}",
        "copy", "r", "INT8 B/tok", "INT4 B/tok", "f32", "INT8", "INT4", "INT4 worst"
    );
    for c in &copies {
        println!(
            "{:<11} {:>4} {:>11} {:>11} {:>8.3} {:>8.3} {:>8.3} {:>12.3}",
            c.method,
            c.rank,
            c.bytes_per_token_int8,
            c.bytes_per_token_int4,
            c.recall_f32,
            c.recall_int8,
            c.recall_int4,
            c.worst_layer_recall_int4
        );
    }
    let report = Report {
        date: crate::report::utc_now(),
        cpu: crate::report::cpu_name(),
        model,
        context_tokens: args.tokens,
        queries: queries.decode.len(),
        fit_tokens: args.fit_tokens,
        alpha: kv.alpha,
        copies,
    };
    crate::report::write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    n_kv: usize,
    head_dim: usize,
    layout: RopeLayout,
}

/// What a tiered store ranks: the top `alpha` of the tokens between the sinks and the recent
/// window; and how many leading tokens fit the projections.
#[derive(Debug, Clone, Copy)]
struct Setup {
    alpha: f32,
    sinks: usize,
    recent: usize,
    fit_tokens: usize,
}

/// One sparse layer: its keys (`tokens × n_kv·head_dim`), the prompt's first queries and the
/// decode queries (each `n_kv·head_dim`, summed per KV head). Decode query `s` of `Q` ranks the
/// tokens before the last `Q − 1 − s`.
struct LayerData<'a> {
    keys: &'a [f32],
    fit_queries: &'a [f32],
    queries: Vec<&'a [f32]>,
}

/// `row` rounded as the store's copies are: symmetric, one scale for the row, `max_level` steps.
fn quantized(row: &mut [f32], max_level: f32) {
    let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax > 0.0 {
        let scale = amax / max_level;
        row.iter_mut().for_each(|x| *x = (*x / scale).round().clamp(-max_level, max_level) * scale);
    }
}

fn top(tokens: &[u32], scores: &[f32], k: usize) -> Vec<u32> {
    let mut t = TopK::new(k);
    t.merge(tokens, scores);
    let mut out = t.into_tokens();
    out.sort_unstable();
    out
}

fn overlap(want: &[u32], got: &[u32]) -> f64 {
    got.iter().filter(|t| want.binary_search(t).is_ok()).count() as f64 / want.len().max(1) as f64
}

/// Recall of each query's exact top α, per precision (f32, INT8, INT4), for one layer and way
/// of scoring: `project(head)` gives the head's projection, or `None` for the store's own
/// full-rank copies.
struct LayerRecall {
    f32: f64,
    int8: f64,
    int4: f64,
}

fn layer_recall(
    shape: Shape,
    setup: Setup,
    data: &LayerData,
    project: &dyn Fn(usize) -> Option<Projection>,
) -> LayerRecall {
    let (n_kv, hd) = (shape.n_kv, shape.head_dim);
    let kv_dim = n_kv * hd;
    let total = data.keys.len() / kv_dim;
    let key = |t: usize, h: usize| &data.keys[(t * n_kv + h) * hd..][..hd];
    let mut sums = [0f64; 3];
    let mut count = 0usize;
    let full_copies = [KeyBits::Int8, KeyBits::Int4].map(|bits| {
        let mut copy = ScoringKeys::new(bits, n_kv, hd);
        copy.push(data.keys);
        copy
    });
    for h in 0..n_kv {
        let projection = project(h);
        // Each token's projected key at each precision, computed once for every query.
        let mut buf = Vec::new();
        let projected: Option<[Vec<f32>; 3]> = projection.as_ref().map(|p| {
            let r = p.rank(hd);
            let mut out = [Vec::with_capacity(total * r), Vec::with_capacity(total * r), Vec::with_capacity(total * r)];
            for t in 0..total {
                p.apply(key(t, h), true, &mut buf);
                out[0].extend_from_slice(&buf);
                for (copy, level) in [(1, 127.0), (2, 7.0)] {
                    let at = out[copy].len();
                    out[copy].extend_from_slice(&buf);
                    quantized(&mut out[copy][at..], level);
                }
            }
            out
        });
        for (s, q) in data.queries.iter().enumerate() {
            let n = total - (data.queries.len() - 1 - s);
            if n <= setup.sinks + setup.recent {
                continue;
            }
            let candidates: Vec<u32> = (setup.sinks as u32..(n - setup.recent) as u32).collect();
            let k = ((setup.alpha * n as f32).ceil() as usize).min(candidates.len());
            let qh = &q[h * hd..][..hd];
            let exact: Vec<f32> =
                candidates.iter().map(|&t| key(t as usize, h).iter().zip(qh).map(|(a, b)| a * b).sum()).collect();
            let want = top(&candidates, &exact, k);
            let recalls: [f64; 3] = match (&projection, &projected) {
                (Some(p), Some(copies)) => {
                    p.apply(qh, false, &mut buf);
                    let r = buf.len();
                    copies.each_ref().map(|copy| {
                        let scores: Vec<f32> = candidates
                            .iter()
                            .map(|&t| copy[t as usize * r..][..r].iter().zip(&buf).map(|(a, b)| a * b).sum())
                            .collect();
                        overlap(&want, &top(&candidates, &scores, k))
                    })
                }
                _ => {
                    let mut query = vec![0f32; kv_dim];
                    query[h * hd..][..hd].copy_from_slice(qh);
                    let by_copy = full_copies.each_ref().map(|copy| {
                        let mut block = ScoreBlock::new(candidates.clone(), n_kv);
                        copy.score(&query, &candidates, &mut block.scores);
                        overlap(&want, &top(&candidates, block.head(h), k))
                    });
                    [1.0, by_copy[0], by_copy[1]]
                }
            };
            sums.iter_mut().zip(recalls).for_each(|(a, r)| *a += r);
            count += 1;
        }
    }
    let mean = |i: usize| sums[i] / count.max(1) as f64;
    LayerRecall { f32: mean(0), int8: mean(1), int4: mean(2) }
}

/// Every copy's recall and DRAM: the store's full-rank copies, then PCA and RoPE pairs at each
/// rank.
fn measure(shape: Shape, setup: Setup, layers: &[LayerData], ranks: &[usize]) -> Vec<CopyRecall> {
    let (n_kv, hd) = (shape.n_kv, shape.head_dim);
    let head_rows = |rows: &'_ [f32], h: usize, limit: usize| -> Vec<Vec<f32>> {
        rows.chunks_exact(n_kv * hd).take(limit).map(|r| r[h * hd..][..hd].to_vec()).collect()
    };
    let bytes = |row_bytes: usize| layers.len() * n_kv * (row_bytes + 4);
    let run = |method: &'static str,
               rank: usize,
               project: &(dyn Fn(&LayerData, usize) -> Option<Projection> + Sync)| {
        let per_layer: Vec<LayerRecall> =
            layers.par_iter().map(|d| layer_recall(shape, setup, d, &|h| project(d, h))).collect();
        let mean = |f: fn(&LayerRecall) -> f64| per_layer.iter().map(f).sum::<f64>() / per_layer.len().max(1) as f64;
        CopyRecall {
            method,
            rank,
            bytes_per_token_int8: bytes(rank),
            bytes_per_token_int4: bytes(rank.div_ceil(2)),
            recall_f32: mean(|r| r.f32),
            recall_int8: mean(|r| r.int8),
            recall_int4: mean(|r| r.int4),
            worst_layer_recall_int4: per_layer.iter().map(|r| r.int4).fold(1.0, f64::min),
        }
    };
    let mut copies = vec![run("full", hd, &|_, _| None)];
    for &rank in ranks {
        copies.push(run("pca", rank, &|d, h| {
            let keys = head_rows(d.keys, h, setup.fit_tokens);
            Some(pca(hd, &keys.iter().map(Vec::as_slice).collect::<Vec<_>>(), rank))
        }));
        copies.push(run("rope_pairs", rank, &|d, h| {
            let (keys, queries) = (head_rows(d.keys, h, setup.fit_tokens), head_rows(d.fit_queries, h, usize::MAX));
            let (keys, queries): (Vec<&[f32]>, Vec<&[f32]>) =
                (keys.iter().map(Vec::as_slice).collect(), queries.iter().map(Vec::as_slice).collect());
            Some(rope_pairs(shape.layout, hd, &keys, &queries, rank))
        }));
    }
    copies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeping_every_dimension_ranks_exactly_and_pairs_follow_the_layout() {
        let pairs = |layout| match rope_pairs(layout, 8, &[&[0., 0., 9., 9., 0., 0., 0., 0.]], &[&[1.; 8]], 2) {
            Projection::Dims(d) => d,
            Projection::Basis { .. } => unreachable!(),
        };
        assert_eq!(pairs(RopeLayout::Interleaved), vec![2, 3]);
        assert_eq!(pairs(RopeLayout::Halves), vec![2, 6]);
        // Full rank, f32: the exact ranking, whichever way the coordinates are taken.
        let (n_kv, hd, tokens) = (1, 8, 300);
        // Keys without ties in their scores (a rotation's rounding would reorder tied tokens).
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let keys: Vec<f32> = (0..tokens * hd)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        let query: Vec<f32> = (0..hd).map(|i| i as f32 - 3.5).collect();
        let data = LayerData { keys: &keys, fit_queries: &query, queries: vec![&query] };
        let shape = Shape { n_kv, head_dim: hd, layout: RopeLayout::Interleaved };
        let setup = Setup { alpha: 0.2, sinks: 4, recent: 16, fit_tokens: 100 };
        let copies = measure(shape, setup, &[data], &[hd]);
        assert!(copies.iter().all(|c| c.recall_f32 > 0.999), "{copies:?}");
    }
}
