//! Fused attention over an f16 KV cache: exact softmax over the tokens a [`KvView`] exposes.
//!
//! K is stored in tiles of [`KV_TILE`] tokens, dimension-major inside a tile, so the scores of a
//! whole tile for many query rows come from one pass of broadcast-multiply-adds with no
//! horizontal sums. V is token-major. A task takes one KV head, a block of query tokens and a
//! range of keys: its query rows — every query head of the KV group for every token of the block
//! — share each K and V value it loads, so a prompt's attention runs at the speed of the
//! multiply-adds rather than of the f16 loads (as a matrix product would). Key ranges of one
//! block are merged by log-sum-exp (flash-decoding), so a single decoding token still uses every
//! core.

use super::parallel::DisjointWriter;
use super::spin_pool::pool;
use super::SimdLevel;
use half::f16;

/// Tokens per K tile.
pub const KV_TILE: usize = 16;
/// Keys scored at once inside a task (bounds the score buffer).
const KEY_CHUNK: usize = 256;
/// Query rows (tokens × heads of a KV group) a task aims for: enough for each loaded key and
/// value to feed several multiply-adds, few enough that a prompt still makes many tasks.
const TASK_ROWS: usize = 16;

/// Index of element `dim` of token `token` in one head's tiled K.
#[inline]
pub fn k_tile_index(token: usize, dim: usize, head_dim: usize) -> usize {
    (token / KV_TILE * head_dim + dim) * KV_TILE + token % KV_TILE
}

/// Writes the K rows (f16 bits, `head_dim` long) of the tokens `lanes` marks into one K tile
/// (`tile`: `head_dim` rows of [`KV_TILE`] lanes, see [`k_tile_index`]): bit `l` of `lanes`
/// marks lane `l`, whose row is `rows[l]`; unmarked lanes keep what they hold and their rows
/// are not read. Stores that assemble a view row by row write K this way, a tile at a time: a
/// row written value by value into its lane costs `head_dim` scattered stores.
pub fn write_k_tile(tile: &mut [u16], rows: &[&[u16]; KV_TILE], lanes: u16) {
    let hd = tile.len() / KV_TILE;
    #[cfg(target_arch = "x86_64")]
    if lanes.count_ones() > 1 && hd.is_multiple_of(16) && super::simd_level() != SimdLevel::Portable {
        // SAFETY: every level but Portable has avx2, checked when chosen.
        return unsafe { super::x86::avx2::write_k_tile(tile, rows, lanes) };
    }
    for (lane, row) in rows.iter().enumerate().filter(|&(lane, _)| lanes >> lane & 1 == 1) {
        for (d, &x) in row[..hd].iter().enumerate() {
            tile[d * KV_TILE + lane] = x;
        }
    }
}

/// The keys and values one attention call may read, for every KV head of one layer.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    pub n_tokens: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Token slots between consecutive heads (a multiple of [`KV_TILE`]).
    pub head_stride_tokens: usize,
    /// `[kv_head][tile][dim][lane]`
    pub k: &'a [f16],
    /// `[kv_head][token][dim]`
    pub v: &'a [f16],
    /// Position of each token slot, `[kv_head][token]` (heads may hold different tokens);
    /// `None` means token j sits at position j in every head.
    pub positions: Option<&'a [u32]>,
    /// A sliding-window layer's window: the query at position p sees keys at positions
    /// `p + 1 - window ..= p` only. `None`: every earlier key.
    pub window_tokens: Option<usize>,
}

impl KvView<'_> {
    /// The same view, seen through a sliding window (or none).
    pub fn windowed(self, window_tokens: Option<usize>) -> Self {
        Self { window_tokens, ..self }
    }

    /// Keys `0..n` the query at `position` may attend to (later ones are masked, if any).
    fn key_limit(&self, position: usize) -> usize {
        match self.positions {
            None => self.n_tokens.min(position + 1),
            Some(_) => self.n_tokens,
        }
    }

    /// The first key the query at `position` may attend to where keys sit at their index (a
    /// window's start); 0 where any key may be visible.
    fn key_start(&self, position: usize) -> usize {
        match (self.positions, self.window_tokens) {
            (None, Some(window)) => (position + 1).saturating_sub(window),
            _ => 0,
        }
    }

    /// Whether a key at `key` is outside the window of the query at `position`.
    pub(crate) fn before_window(&self, key: usize, position: usize) -> bool {
        self.window_tokens.is_some_and(|window| key + window <= position)
    }
}

/// One task's online softmax for each of its query rows: running max, sum, weighted V.
struct Running<'a> {
    max: &'a mut [f32],
    sum: &'a mut [f32],
    acc: &'a mut [f32],
}

/// Attention output `out` (`n × n_heads·head_dim`) for queries `q` (same shape, RoPE applied) at
/// `q_positions`.
pub fn attend(q: &[f32], q_positions: &[usize], n_heads: usize, view: &KvView<'_>, out: &mut [f32]) {
    attend_at(super::simd_level(), q, q_positions, n_heads, view, out, None)
}

/// Attention over part of a cache, as a [`Partial`]: [`attend`]'s output over the tokens of
/// `view` into `out`, and each row's softmax statistics into `max` and `sum` (`n × n_heads`),
/// so that partials over disjoint sets of tokens merge exactly ([`RunningPartials`]).
pub fn attend_partial(
    q: &[f32],
    q_positions: &[usize],
    n_heads: usize,
    view: &KvView<'_>,
    out: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    assert!(max.len() == q_positions.len() * n_heads && sum.len() == max.len(), "softmax statistics shape");
    attend_at(super::simd_level(), q, q_positions, n_heads, view, out, Some(SoftmaxStats { max, sum }))
}

/// One part of an attention split by tokens: per query row (`n × n_heads`), the output over the
/// part's tokens (`head_dim` values), the largest scaled score, and the sum of `exp(score − max)`
/// over the part (0 where it saw no key). The statistics travel as (max, sum) rather than as
/// their log-sum-exp: `max + ln(sum)` rounds to the score's magnitude, and scores reach the
/// hundreds.
pub struct Partial<'a> {
    pub out: &'a [f32],
    pub max: &'a [f32],
    pub sum: &'a [f32],
}

impl Partial<'_> {
    /// What the partial takes to send: its output and statistics, as f32.
    pub fn bytes(&self) -> u64 {
        4 * (self.out.len() + self.max.len() + self.sum.len()) as u64
    }
}

/// Attention over the union of disjoint token sets, from each set's [`attend_partial`], merged
/// as they come, one after another: each part weighs by the share of the softmax mass its
/// tokens hold, so a long cache is attended to in spans without ever being gathered whole.
pub struct RunningPartials {
    head_dim: usize,
    /// Per row: the largest score seen, and the softmax mass relative to it.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// Per row: the parts' outputs, each weighed by its mass relative to `max`.
    acc: Vec<f32>,
}

impl RunningPartials {
    pub fn new(rows: usize, head_dim: usize) -> Self {
        Self { head_dim, max: vec![f32::NEG_INFINITY; rows], sum: vec![0.0; rows], acc: vec![0.0; rows * head_dim] }
    }

    pub fn add(&mut self, part: &Partial<'_>) {
        let hd = self.head_dim;
        for (row, acc) in self.acc.chunks_exact_mut(hd).enumerate() {
            if part.sum[row] <= 0.0 {
                continue; // the part held no key this row may see
            }
            let max = self.max[row].max(part.max[row]);
            // exp(−∞) = 0: a row's first part starts it afresh.
            let (kept, added) = ((self.max[row] - max).exp(), (part.max[row] - max).exp() * part.sum[row]);
            for (a, x) in acc.iter_mut().zip(&part.out[row * hd..][..hd]) {
                *a = *a * kept + added * x;
            }
            self.sum[row] = self.sum[row] * kept + added;
            self.max[row] = max;
        }
    }

    /// Each head's sink logit (`sinks`, one per head) in the softmax of its rows, which go a
    /// query's heads in turn.
    pub fn add_sinks(&mut self, sinks: &[f32]) {
        for row in 0..self.sum.len() {
            self.add_sink(row, sinks[row % sinks.len()]);
        }
    }

    /// A sink logit in `row`'s softmax: a key with no value, which takes its share of the
    /// attention mass and gives nothing back (gpt-oss's per-head sinks).
    fn add_sink(&mut self, row: usize, logit: f32) {
        let max = self.max[row].max(logit);
        let (kept, added) = ((self.max[row] - max).exp(), (logit - max).exp());
        self.acc[row * self.head_dim..][..self.head_dim].iter_mut().for_each(|a| *a *= kept);
        self.sum[row] = self.sum[row] * kept + added;
        self.max[row] = max;
    }

    /// The merged attention output (0 for a row that no part had a key for).
    pub fn finish(&self, out: &mut [f32]) {
        for ((dst, acc), &sum) in
            out.chunks_exact_mut(self.head_dim).zip(self.acc.chunks_exact(self.head_dim)).zip(&self.sum)
        {
            let scale = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            dst.iter_mut().zip(acc).for_each(|(d, a)| *d = a * scale);
        }
    }
}

/// Where [`attend_at`] writes each row's softmax statistics.
pub(crate) struct SoftmaxStats<'a> {
    max: &'a mut [f32],
    sum: &'a mut [f32],
}

/// [`attend`] with the kernels of `level`, and each row's softmax statistics if asked.
pub(crate) fn attend_at(
    level: SimdLevel,
    q: &[f32],
    q_positions: &[usize],
    n_heads: usize,
    view: &KvView<'_>,
    out: &mut [f32],
    mut stats: Option<SoftmaxStats<'_>>,
) {
    let (hd, n_kv) = (view.head_dim, view.n_kv_heads);
    let group = n_heads / n_kv;
    let n = q_positions.len();
    assert_eq!(q.len(), n * n_heads * hd, "attention query shape");
    assert_eq!(out.len(), q.len(), "attention output shape");

    let block_tokens = TASK_ROWS.div_ceil(group).min(n).max(1);
    let blocks = n.div_ceil(block_tokens);
    let rows = block_tokens * group;
    let max_keys = q_positions.iter().map(|&p| view.key_limit(p)).max().unwrap_or(0);
    // Keys before every query's window are never read (a tile-aligned start, as the kernels need).
    let first_key = q_positions.iter().map(|&p| view.key_start(p)).min().unwrap_or(0) / KV_TILE * KV_TILE;
    let span_keys = max_keys.saturating_sub(first_key);
    let threads = pool().threads();
    let splits = (4 * threads).div_ceil(n_kv * blocks).min(span_keys.div_ceil(4 * KEY_CHUNK)).max(1);
    let split_tokens = span_keys.div_ceil(splits).div_ceil(KV_TILE) * KV_TILE;
    let tasks = n_kv * blocks * splits;
    let stride = rows * (hd + 2);
    let mut partials = vec![0f32; tasks * stride];
    let scale = 1.0 / (hd as f32).sqrt();
    let writer = DisjointWriter::new(&mut partials);
    pool().run(tasks, &|task| {
        // SAFETY: task `task` owns its `stride` partials.
        let part = unsafe { writer.slice(task * stride, stride) };
        let (h, rest) = (task / (blocks * splits), task % (blocks * splits));
        let (block, split) = (rest / splits, rest % splits);
        let tokens = block * block_tokens..((block + 1) * block_tokens).min(n);
        let positions = &q_positions[tokens.clone()];
        let mut scratch = Scratch::new(positions.len() * group, hd);
        for (t, dst) in tokens.zip(scratch.q.chunks_exact_mut(group * hd)) {
            let src = &q[(t * n_heads + h * group) * hd..][..group * hd];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = s * scale;
            }
        }
        let limit = positions.iter().map(|&p| view.key_limit(p)).max().unwrap_or(0);
        let start = (first_key + split * split_tokens).min(limit);
        let end = (start + split_tokens).min(limit);
        let (max, rest) = part.split_at_mut(rows);
        let (sum, acc) = rest.split_at_mut(rows);
        let mut partial = Running { max, sum, acc };
        attend_range(view, h, group, positions, start, end, &mut scratch, &mut partial, level);
    });

    // Merge the key-range partials of each (head, token) by log-sum-exp.
    for t in 0..n {
        let (block, row_base) = (t / block_tokens, t % block_tokens * group);
        for h in 0..n_kv {
            for gi in 0..group {
                let r = row_base + gi;
                let dst = &mut out[(t * n_heads + h * group + gi) * hd..][..hd];
                let parts = (0..splits).map(|s| &partials[((h * blocks + block) * splits + s) * stride..][..stride]);
                let global_max = parts.clone().map(|p| p[r]).fold(f32::NEG_INFINITY, f32::max);
                dst.fill(0.0);
                let mut total = 0f32;
                for p in parts {
                    if p[r] == f32::NEG_INFINITY {
                        continue;
                    }
                    let w = (p[r] - global_max).exp();
                    total += w * p[rows + r];
                    let acc = &p[2 * rows + r * hd..][..hd];
                    for (d, a) in dst.iter_mut().zip(acc) {
                        *d += w * a;
                    }
                }
                if total > 0.0 {
                    dst.iter_mut().for_each(|d| *d /= total);
                }
                if let Some(stats) = stats.as_mut() {
                    stats.max[t * n_heads + h * group + gi] = global_max;
                    stats.sum[t * n_heads + h * group + gi] = total;
                }
            }
        }
    }
}

struct Scratch {
    /// rows × head_dim, pre-scaled by 1/√d
    q: Vec<f32>,
    /// rows × KEY_CHUNK
    scores: Vec<f32>,
}

impl Scratch {
    fn new(rows: usize, hd: usize) -> Self {
        Self { q: vec![0.0; rows * hd], scores: vec![0.0; rows * KEY_CHUNK] }
    }
}

/// Online softmax over keys `start..end` of KV head `h` for the query rows of a block of tokens
/// at `positions` (row r is head r % group of token r / group).
#[allow(clippy::too_many_arguments)]
fn attend_range(
    view: &KvView<'_>,
    h: usize,
    group: usize,
    positions: &[usize],
    start: usize,
    end: usize,
    scratch: &mut Scratch,
    partial: &mut Running<'_>,
    level: SimdLevel,
) {
    let hd = view.head_dim;
    let rows = positions.len() * group;
    let head_k = &view.k[h * view.head_stride_tokens * hd..][..view.head_stride_tokens * hd];
    let head_v = &view.v[h * view.head_stride_tokens * hd..][..view.head_stride_tokens * hd];
    partial.max.fill(f32::NEG_INFINITY);
    partial.sum.fill(0.0);
    partial.acc.fill(0.0);
    // One token's few rows take too few multiply-adds a key to hide the memory's latency:
    // its keys and values are asked for ahead.
    let prefetch = (positions.len() == 1).then_some(head_v);
    let mut c0 = start;
    while c0 < end {
        let len = KEY_CHUNK.min(end - c0);
        let scores = &mut scratch.scores[..rows * len];
        score_keys(head_k, prefetch, hd, &scratch.q, rows, c0, len, scores, level);
        if let Some(key_positions) = view.positions {
            mask_unseen_keys(view, &key_positions[h * view.n_tokens + c0..][..len], positions, group, scores);
        }
        for r in 0..rows {
            // Where keys sit at their index, those past the row's token are a tail that counts
            // for exactly nothing: the softmax runs over the rest alone, so a token's sums are
            // the ones it gets in a block of its own, whichever tokens share its block (a prompt
            // prefilled in chunks gives the logits of one pass).
            let visible = match view.positions {
                None => (positions[r / group] + 1).saturating_sub(c0).min(len),
                Some(_) => len,
            };
            let (row, future) = scores[r * len..][..len].split_at_mut(visible);
            future.fill(0.0);
            if view.positions.is_none() {
                // Keys before the row's window, where keys sit at their index.
                let before = view.key_start(positions[r / group]).saturating_sub(c0).min(row.len());
                row[..before].fill(f32::NEG_INFINITY);
            }
            let chunk_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if chunk_max == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            let new_max = partial.max[r].max(chunk_max);
            let rescale = (partial.max[r] - new_max).exp();
            partial.max[r] = new_max;
            partial.sum[r] = partial.sum[r] * rescale + exp_shifted(row, new_max, level);
            partial.acc[r * hd..][..hd].iter_mut().for_each(|a| *a *= rescale);
        }
        accumulate_values(head_v, hd, scores, rows, c0, len, partial.acc, level);
        c0 += len;
    }
}

/// Sets to −∞ the scores (`rows × len`) of keys whose positions (`key_positions`, one per
/// score column) come after their row's token, or before its window.
fn mask_unseen_keys(view: &KvView<'_>, key_positions: &[u32], positions: &[usize], group: usize, scores: &mut [f32]) {
    let len = key_positions.len();
    for (token_rows, &position) in scores.chunks_exact_mut(group * len).zip(positions) {
        for row in token_rows.chunks_exact_mut(len) {
            for (s, &p) in row.iter_mut().zip(key_positions) {
                if p as usize > position || view.before_window(p as usize, position) {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// `scores[r][j] = q[r] · k[c0 + j]` for j in 0..len; `c0` is a multiple of [`KV_TILE`].
#[allow(clippy::too_many_arguments)]
fn score_keys(
    k: &[f16],
    prefetch: Option<&[f16]>,
    hd: usize,
    q: &[f32],
    rows: usize,
    c0: usize,
    len: usize,
    scores: &mut [f32],
    level: SimdLevel,
) {
    debug_assert_eq!(c0 % KV_TILE, 0);
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) {
        // SAFETY: the level guarantees the CPU features; the slices cover every tile touched.
        match level {
            SimdLevel::Avx512Vnni => {
                return unsafe { super::x86::avx512::score_keys(k, prefetch, hd, q, rows, c0, len, scores) }
            }
            SimdLevel::AvxVnni | SimdLevel::Avx2 => {
                return unsafe { super::x86::avx2::score_keys(k, prefetch, hd, q, rows, c0, len, scores) }
            }
            SimdLevel::Portable => {}
        }
    }
    for j in 0..len {
        let token = c0 + j;
        for r in 0..rows {
            let qr = &q[r * hd..][..hd];
            let mut s = 0f32;
            for (d, &qd) in qr.iter().enumerate() {
                s += qd * k[k_tile_index(token, d, hd)].to_f32();
            }
            scores[r * len + j] = s;
        }
    }
}

/// Replaces each score with exp(score − max) and returns their sum.
fn exp_shifted(row: &mut [f32], max: f32, level: SimdLevel) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level == SimdLevel::Avx512Vnni {
        // SAFETY: the level guarantees the CPU features.
        return unsafe { super::x86::avx512::exp_shifted(row, max) };
    }
    let _ = level;
    super::ops::exp_shifted(row, max)
}

/// `acc[r] += Σ_j p[r][j] · v[c0 + j]`.
#[allow(clippy::too_many_arguments)]
fn accumulate_values(
    v: &[f16],
    hd: usize,
    p: &[f32],
    rows: usize,
    c0: usize,
    len: usize,
    acc: &mut [f32],
    level: SimdLevel,
) {
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) {
        // SAFETY: the level guarantees the CPU features; the slices cover every row touched.
        match level {
            SimdLevel::Avx512Vnni => {
                return unsafe { super::x86::avx512::accumulate_values(v, hd, p, rows, c0, len, acc) }
            }
            SimdLevel::AvxVnni | SimdLevel::Avx2 => {
                return unsafe { super::x86::avx2::accumulate_values(v, hd, p, rows, c0, len, acc) }
            }
            SimdLevel::Portable => {}
        }
    }
    for j in 0..len {
        let row = &v[(c0 + j) * hd..][..hd];
        for r in 0..rows {
            let w = p[r * len + j];
            for (a, x) in acc[r * hd..][..hd].iter_mut().zip(row) {
                *a += w * x.to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain softmax attention over f32 copies, the reference the kernels must match.
    fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], limit: usize) -> Vec<f32> {
        let hd = q.len();
        let scores: Vec<f32> = k[..limit]
            .iter()
            .map(|kj| kj.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt())
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let z: f32 = e.iter().sum();
        (0..hd).map(|d| e.iter().zip(v).map(|(w, vj)| w * vj[d]).sum::<f32>() / z).collect()
    }

    /// A cache element: head h, token t, dimension d (`salt` 1 for K, 2 for V).
    fn val(h: usize, t: usize, d: usize, salt: usize) -> f32 {
        (((h * 31 + t * 17 + d * 7 + salt) % 97) as f32 / 48.0 - 1.0) * 0.8
    }

    /// K (tiled) and V of `n_tokens` tokens in `n_kv` heads, and the token slots a head takes.
    fn cache(hd: usize, n_kv: usize, n_tokens: usize) -> (Vec<f16>, Vec<f16>, usize) {
        cache_of(hd, n_kv, 0..n_tokens)
    }

    /// The same for the tokens at `positions`, slot j holding position `positions.start + j`.
    fn cache_of(hd: usize, n_kv: usize, positions: std::ops::Range<usize>) -> (Vec<f16>, Vec<f16>, usize) {
        let stride = positions.len().div_ceil(KV_TILE) * KV_TILE;
        let mut k = vec![f16::ZERO; n_kv * stride * hd];
        let mut v = vec![f16::ZERO; n_kv * stride * hd];
        for h in 0..n_kv {
            for (slot, t) in positions.clone().enumerate() {
                for d in 0..hd {
                    k[h * stride * hd + k_tile_index(slot, d, hd)] = f16::from_f32(val(h, t, d, 1));
                    v[(h * stride + slot) * hd + d] = f16::from_f32(val(h, t, d, 2));
                }
            }
        }
        (k, v, stride)
    }

    /// Checks every level's attention for queries at `positions` against [`reference`], over a
    /// cache of `n_tokens` tokens at their own positions.
    fn check_against_reference(hd: usize, n_heads: usize, n_kv: usize, n_tokens: usize, positions: &[usize]) {
        check_windowed(hd, n_heads, n_kv, n_tokens, positions, None)
    }

    /// [`check_against_reference`] through a sliding window, if any.
    fn check_windowed(
        hd: usize,
        n_heads: usize,
        n_kv: usize,
        n_tokens: usize,
        positions: &[usize],
        window_tokens: Option<usize>,
    ) {
        let (k, v, stride) = cache(hd, n_kv, n_tokens);
        let as_f32 = |h: usize, salt: usize| -> Vec<Vec<f32>> {
            (0..n_tokens).map(|j| (0..hd).map(|d| f16::from_f32(val(h, j, d, salt)).to_f32()).collect()).collect()
        };
        let (kk, vv): (Vec<_>, Vec<_>) = (0..n_kv).map(|h| (as_f32(h, 1), as_f32(h, 2))).unzip();
        let view = KvView {
            n_tokens,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: stride,
            k: &k,
            v: &v,
            positions: None,
            window_tokens,
        };
        let q: Vec<f32> = (0..positions.len() * n_heads * hd).map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0).collect();
        for level in SimdLevel::supported() {
            let mut out = vec![0f32; q.len()];
            attend_at(level, &q, positions, n_heads, &view, &mut out, None);
            for (t, &pos) in positions.iter().enumerate() {
                for head in 0..n_heads {
                    let h = head / (n_heads / n_kv);
                    let first = window_tokens.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let want = reference(
                        &q[(t * n_heads + head) * hd..][..hd],
                        &kk[h][first..],
                        &vv[h][first..],
                        pos + 1 - first,
                    );
                    let got = &out[(t * n_heads + head) * hd..][..hd];
                    for (a, b) in got.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-4,
                            "{level:?} hd {hd} heads {n_heads}/{n_kv} tokens {n_tokens} pos {pos} window {window_tokens:?}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_sliding_window_sees_only_its_last_keys() {
        // A prompt whose early queries see every key and later ones a window (which starts
        // inside a tile and past whole key chunks), and one decoding token far along.
        let prompt: Vec<usize> = (0..300).collect();
        for (window, positions) in [(24, &prompt[..]), (100, &prompt[250..]), (512, &[1499][..]), (7, &[1499][..])] {
            let n_tokens = positions.last().unwrap() + 1;
            check_windowed(64, 8, 2, n_tokens, positions, Some(window));
        }
    }

    #[test]
    fn k_tiles_written_at_once_hold_what_value_by_value_writes_would() {
        for hd in [16, 64, 128] {
            let rows: Vec<Vec<u16>> = (0..KV_TILE).map(|l| (0..hd).map(|d| (l * 1000 + d) as u16).collect()).collect();
            let rows: [&[u16]; KV_TILE] = std::array::from_fn(|l| &rows[l][..]);
            for lanes in [u16::MAX, 1, 0x8001, 0x5555, 0x0ff0, 0x7fff, 0xfffe] {
                let mut want: Vec<u16> = (0..hd * KV_TILE).map(|i| 60_000 + i as u16).collect();
                for l in (0..KV_TILE).filter(|l| lanes >> l & 1 == 1) {
                    for d in 0..hd {
                        want[k_tile_index(l, d, hd)] = rows[l][d];
                    }
                }
                let mut tile: Vec<u16> = (0..hd * KV_TILE).map(|i| 60_000 + i as u16).collect();
                write_k_tile(&mut tile, &rows, lanes);
                assert_eq!(tile, want, "head_dim {hd}, lanes {lanes:#06x}");
                #[cfg(target_arch = "x86_64")]
                if SimdLevel::Avx2.is_supported() {
                    let mut tile: Vec<u16> = (0..hd * KV_TILE).map(|i| 60_000 + i as u16).collect();
                    // SAFETY: avx2 was checked.
                    unsafe { crate::kernels::x86::avx2::write_k_tile(&mut tile, &rows, lanes) };
                    assert_eq!(tile, want, "avx2, head_dim {hd}, lanes {lanes:#06x}");
                }
            }
        }
    }

    #[test]
    fn matches_plain_softmax_for_every_group_size_and_length() {
        for (n_heads, n_kv) in [(9, 3), (4, 4), (8, 1), (14, 2)] {
            for n_tokens in [1usize, 15, 16, 17, 300, 2100] {
                // Decoding-like: the last position, then one in the middle (causal mask).
                check_against_reference(64, n_heads, n_kv, n_tokens, &[n_tokens - 1, n_tokens / 2]);
            }
        }
    }

    #[test]
    fn partials_over_disjoint_tokens_merge_into_attention_over_all() {
        // Near-storage attention: one part attends to the older tokens, another to the recent
        // ones (and masks causally among the queries), and the merge is the whole.
        let (hd, n_heads, n_kv, n_tokens, split) = (64, 9, 3, 300, 211);
        let (k, v, stride) = cache(hd, n_kv, n_tokens);
        let whole = KvView {
            n_tokens,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: stride,
            k: &k,
            v: &v,
            positions: None,
            window_tokens: None,
        };
        let (old_k, old_v, old_stride) = cache(hd, n_kv, split);
        let old = KvView {
            n_tokens: split,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: old_stride,
            k: &old_k,
            v: &old_v,
            positions: None,
            window_tokens: None,
        };
        // The recent tokens, slot j holding position split + j.
        let (recent_k, recent_v, recent_stride) = cache_of(hd, n_kv, split..n_tokens);
        let recent_tokens = n_tokens - split;
        let recent_positions: Vec<u32> = (0..n_kv).flat_map(|_| (split..n_tokens).map(|p| p as u32)).collect();
        let recent = KvView {
            n_tokens: recent_tokens,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: recent_stride,
            k: &recent_k,
            v: &recent_v,
            positions: Some(&recent_positions),
            window_tokens: None,
        };
        // A decoding query, and a chunk of prompt queries; one whose position sees no recent token.
        for positions in [vec![n_tokens - 1], (250..260).collect(), vec![split - 1, n_tokens - 1]] {
            let q: Vec<f32> =
                (0..positions.len() * n_heads * hd).map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0).collect();
            let mut want = vec![0f32; q.len()];
            attend(&q, &positions, n_heads, &whole, &mut want);
            let rows = positions.len() * n_heads;
            let (mut old_out, mut old_max, mut old_sum) = (vec![0f32; q.len()], vec![0f32; rows], vec![0f32; rows]);
            let (mut recent_out, mut recent_max, mut recent_sum) =
                (vec![0f32; q.len()], vec![0f32; rows], vec![0f32; rows]);
            attend_partial(&q, &positions, n_heads, &old, &mut old_out, &mut old_max, &mut old_sum);
            attend_partial(&q, &positions, n_heads, &recent, &mut recent_out, &mut recent_max, &mut recent_sum);
            let mut merged = vec![0f32; q.len()];
            let mut running = RunningPartials::new(rows, hd);
            running.add(&Partial { out: &old_out, max: &old_max, sum: &old_sum });
            running.add(&Partial { out: &recent_out, max: &recent_max, sum: &recent_sum });
            running.finish(&mut merged);
            for (a, b) in merged.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "positions {positions:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn spans_merged_as_they_come_give_attention_over_all() {
        // A long cache in spans, one after another (a tiered store's prompt chunk): the first
        // at its own positions, the later ones with theirs named; the chunk's first queries
        // see nothing of the last span.
        let (hd, n_heads, n_kv, n_tokens, span) = (64, 14, 2, 700, 256);
        let (k, v, stride) = cache(hd, n_kv, n_tokens);
        let whole = KvView {
            n_tokens,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: stride,
            k: &k,
            v: &v,
            positions: None,
            window_tokens: None,
        };
        let positions: Vec<usize> = (480..n_tokens).step_by(7).collect();
        let q: Vec<f32> = (0..positions.len() * n_heads * hd).map(|i| ((i * 11) % 31) as f32 / 15.0 - 1.0).collect();
        let mut want = vec![0f32; q.len()];
        attend(&q, &positions, n_heads, &whole, &mut want);
        let rows = positions.len() * n_heads;
        let mut merged = RunningPartials::new(rows, hd);
        for start in (0..n_tokens).step_by(span) {
            let tokens = start..(start + span).min(n_tokens);
            let (k, v, stride) = cache_of(hd, n_kv, tokens.clone());
            let named: Vec<u32> = (0..n_kv).flat_map(|_| tokens.clone().map(|p| p as u32)).collect();
            let positions_of = (start > 0).then_some(&named[..]);
            let view = KvView {
                n_tokens: tokens.len(),
                n_kv_heads: n_kv,
                head_dim: hd,
                head_stride_tokens: stride,
                k: &k,
                v: &v,
                positions: positions_of,
                window_tokens: None,
            };
            let (mut out, mut max, mut sum) = (vec![0f32; q.len()], vec![0f32; rows], vec![0f32; rows]);
            attend_partial(&q, &positions, n_heads, &view, &mut out, &mut max, &mut sum);
            merged.add(&Partial { out: &out, max: &max, sum: &sum });
        }
        let mut got = vec![0f32; q.len()];
        merged.finish(&mut got);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn a_prompt_attends_causally_in_blocks_of_query_tokens() {
        // Every token of a prompt at once, as prefill runs: blocks of several query tokens share
        // each key, and keys past a token's own position are masked inside its block. Head
        // sizes 80 and 48 leave the column and tile loops a remainder.
        for hd in [64, 80, 48] {
            for (n_heads, n_kv) in [(9, 3), (14, 2), (4, 4), (8, 1)] {
                for n_tokens in [1usize, 7, 40, 333] {
                    check_against_reference(hd, n_heads, n_kv, n_tokens, &(0..n_tokens).collect::<Vec<_>>());
                }
                // A later chunk of a prompt: its queries see the earlier chunks' keys too.
                check_against_reference(hd, n_heads, n_kv, 128, &(64..128).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn a_token_gets_the_same_bits_whichever_tokens_share_its_call() {
        // Chunked prefill must give the logits of one pass: the model amplifies a last-bit
        // difference in attention (through the int8 roundings of later layers) to whole tenths
        // of a logit over a long prompt.
        let (hd, n_tokens) = (64, 300);
        for (n_heads, n_kv) in [(9, 3), (14, 2)] {
            let (k, v, stride) = cache(hd, n_kv, n_tokens);
            let view = KvView {
                n_tokens,
                n_kv_heads: n_kv,
                head_dim: hd,
                head_stride_tokens: stride,
                k: &k,
                v: &v,
                positions: None,
                window_tokens: None,
            };
            let width = n_heads * hd;
            let q: Vec<f32> = (0..n_tokens * width).map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0).collect();
            let positions: Vec<usize> = (0..n_tokens).collect();
            for level in SimdLevel::supported() {
                let mut one_pass = vec![0f32; q.len()];
                attend_at(level, &q, &positions, n_heads, &view, &mut one_pass, None);
                for chunk in [1, 7, 64] {
                    let mut chunked = vec![0f32; q.len()];
                    for (i, tokens) in positions.chunks(chunk).enumerate() {
                        let rows = i * chunk * width..(i * chunk + tokens.len()) * width;
                        attend_at(level, &q[rows.clone()], tokens, n_heads, &view, &mut chunked[rows], None);
                    }
                    let same = one_pass.iter().zip(&chunked).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{level:?} heads {n_heads}/{n_kv}: chunks of {chunk} differ from one pass");
                }
            }
        }
    }

    #[test]
    fn each_head_attends_to_its_own_tokens_with_its_own_positions() {
        let (hd, n_kv, n_heads, slots) = (64, 2, 6, 20usize);
        let stride = slots.div_ceil(KV_TILE) * KV_TILE;
        // Head 0 holds even positions, head 1 odd ones: slot j is position 2j (+1).
        let position = |h: usize, j: usize| (2 * j + h) as u32;
        let mut k = vec![f16::ZERO; n_kv * stride * hd];
        let mut v = vec![f16::ZERO; n_kv * stride * hd];
        for h in 0..n_kv {
            for j in 0..slots {
                let p = position(h, j) as usize;
                for d in 0..hd {
                    k[h * stride * hd + k_tile_index(j, d, hd)] = f16::from_f32(val(h, p, d, 1));
                    v[(h * stride + j) * hd + d] = f16::from_f32(val(h, p, d, 2));
                }
            }
        }
        let positions: Vec<u32> = (0..n_kv).flat_map(|h| (0..slots).map(move |j| position(h, j))).collect();
        let view = KvView {
            n_tokens: slots,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: stride,
            k: &k,
            v: &v,
            positions: Some(&positions),
            window_tokens: None,
        };
        let query_position = 24; // masks head 0's positions past 24 and head 1's past 23
        let q: Vec<f32> = (0..n_heads * hd).map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0).collect();
        for level in SimdLevel::supported() {
            let mut out = vec![0f32; q.len()];
            attend_at(level, &q, &[query_position], n_heads, &view, &mut out, None);
            for head in 0..n_heads {
                let h = head / (n_heads / n_kv);
                let visible: Vec<usize> =
                    (0..slots).map(|j| position(h, j) as usize).filter(|&p| p <= query_position).collect();
                let kk: Vec<Vec<f32>> = visible
                    .iter()
                    .map(|&p| (0..hd).map(|d| f16::from_f32(val(h, p, d, 1)).to_f32()).collect())
                    .collect();
                let vv: Vec<Vec<f32>> = visible
                    .iter()
                    .map(|&p| (0..hd).map(|d| f16::from_f32(val(h, p, d, 2)).to_f32()).collect())
                    .collect();
                let want = reference(&q[head * hd..][..hd], &kk, &vv, visible.len());
                for (a, b) in out[head * hd..][..hd].iter().zip(&want) {
                    assert!((a - b).abs() < 1e-4, "{level:?} head {head}: {a} vs {b}");
                }
            }
        }
    }
}
