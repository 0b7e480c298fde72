//! Low-precision copies of the keys, used only to rank tokens: symmetric INT8 or INT4 with one
//! f32 scale per (token, KV head). The full-precision K/V are what attention uses.
//!
//! Each KV head's keys are stored less a center, the mean key of the first tokens pushed. That
//! shifts every token's score by the same q·center, so rankings and softmaxes over scores from
//! one copy are unchanged; but a row's scale then spans how keys differ rather than what they
//! share. Models with a K bias (qwen2) give every key a large common offset, and an INT4 row
//! scaled to it had a few levels left for the rest (Qwen2.5-Coder-0.5B, top-20% recall at 4K:
//! 0.80 uncentered; `hillside bench recall`).

use crate::kernels::SimdLevel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyBits {
    Int8,
    Int4,
}

named_choices!(KeyBits, "key precision", { Int8 => "int8", Int4 => "int4" });

/// The precision a user asks for: one of [`KeyBits`], or `auto`, which picks per model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPrecision {
    #[default]
    Auto,
    Int8,
    Int4,
}

named_choices!(KeyPrecision, "key precision", { Auto => "auto", Int8 => "int8", Int4 => "int4" });

/// Widest KV head that `auto` scores from INT4 rows.
const WIDEST_INT4_HEAD_DIM: usize = 128;

impl KeyPrecision {
    /// The precision for KV heads of `head_dim` dimensions. `auto` gives INT8 to heads wider
    /// than 128: a row's one scale follows its largest value, and the more values a row has,
    /// the further that largest one stands above the rest, so INT4 leaves the typical value
    /// fewer levels (Gemma 3's 256-wide heads rank well enough only in INT8: BENCHMARKS.md).
    pub fn bits_for(self, head_dim: usize) -> KeyBits {
        match self {
            Self::Int8 => KeyBits::Int8,
            Self::Int4 => KeyBits::Int4,
            Self::Auto if head_dim > WIDEST_INT4_HEAD_DIM => KeyBits::Int8,
            Self::Auto => KeyBits::Int4,
        }
    }

    /// Every precision this choice may resolve to, for a model not yet known.
    pub fn candidates(self) -> &'static [KeyBits] {
        match self {
            Self::Int8 => &[KeyBits::Int8],
            Self::Int4 => &[KeyBits::Int4],
            Self::Auto => &[KeyBits::Int4, KeyBits::Int8],
        }
    }
}

impl KeyBits {
    fn max_level(self) -> f32 {
        match self {
            Self::Int8 => 127.0,
            Self::Int4 => 7.0,
        }
    }

    fn bytes_per_row(self, head_dim: usize) -> usize {
        match self {
            Self::Int8 => head_dim,
            Self::Int4 => head_dim.div_ceil(2),
        }
    }

    /// DRAM one token's scoring copy takes (all KV heads, with scales).
    pub fn bytes_per_token(self, n_kv_heads: usize, head_dim: usize) -> usize {
        n_kv_heads * (self.bytes_per_row(head_dim) + 4)
    }
}

/// One layer's scoring copy: `[token][kv_head]` quantized rows and their scales.
pub struct ScoringKeys {
    bits: KeyBits,
    n_kv_heads: usize,
    head_dim: usize,
    row_bytes: usize,
    data: Vec<u8>,
    scales: Vec<f32>,
    /// `[kv_head][dim]`: subtracted from every key before rounding; the mean of the first push
    /// (empty until then).
    center: Vec<f32>,
}

impl ScoringKeys {
    pub fn new(bits: KeyBits, n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            bits,
            n_kv_heads,
            head_dim,
            row_bytes: bits.bytes_per_row(head_dim),
            data: Vec::new(),
            scales: Vec::new(),
            center: Vec::new(),
        }
    }

    /// What the copy subtracts from each KV head's keys (`n_kv_heads × head_dim`; empty before
    /// the first push): a score is q·(k − center), up to rounding.
    pub fn center(&self) -> &[f32] {
        &self.center
    }

    pub fn len(&self) -> usize {
        self.scales.len() / self.n_kv_heads
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    pub fn bits(&self) -> KeyBits {
        self.bits
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Copies head `head`'s rows of tokens `first .. first + n` densely into `rows` and their
    /// scales (little-endian f32) into `scales`: the device's per-head layout.
    pub fn copy_head_rows(&self, head: usize, first: usize, n: usize, rows: &mut [u8], scales: &mut [u8]) {
        let rb = self.row_bytes;
        for (i, t) in (first..first + n).enumerate() {
            let row = t * self.n_kv_heads + head;
            rows[i * rb..][..rb].copy_from_slice(&self.data[row * rb..][..rb]);
            scales[i * 4..][..4].copy_from_slice(&self.scales[row].to_le_bytes());
        }
    }

    /// DRAM this copy occupies.
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.center.len())
    }

    /// Appends the keys of `n` tokens (`n × n_kv_heads·head_dim` f32, RoPE applied).
    pub fn push(&mut self, k: &[f32]) {
        let kv_dim = self.n_kv_heads * self.head_dim;
        if self.center.is_empty() && k.len() >= kv_dim {
            let n = (k.len() / kv_dim) as f32;
            self.center = vec![0f32; kv_dim];
            for row in k.chunks_exact(kv_dim) {
                self.center.iter_mut().zip(row).for_each(|(c, x)| *c += x / n);
            }
        }
        let max_level = self.bits.max_level();
        let mut centered = vec![0f32; self.head_dim];
        for (i, key) in k.chunks_exact(self.head_dim).enumerate() {
            let center = &self.center[i % self.n_kv_heads * self.head_dim..][..self.head_dim];
            centered.iter_mut().zip(key.iter().zip(center)).for_each(|(c, (x, m))| *c = x - m);
            let row = &centered[..];
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = amax / max_level;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let q = |x: f32| (x * inv).round().clamp(-max_level, max_level) as i8;
            match self.bits {
                KeyBits::Int8 => self.data.extend(row.iter().map(|&x| q(x) as u8)),
                // Two signed nibbles per byte: even dimension low, odd dimension high.
                KeyBits::Int4 => self.data.extend(row.chunks(2).map(|p| {
                    let lo = (q(p[0]) as u8) & 0x0f;
                    let hi = (q(p.get(1).copied().unwrap_or(0.0)) as u8) & 0x0f;
                    lo | (hi << 4)
                })),
            }
            self.scales.push(scale);
        }
    }

    pub fn truncate(&mut self, n_tokens: usize) {
        self.data.truncate(n_tokens * self.n_kv_heads * self.row_bytes);
        self.scales.truncate(n_tokens * self.n_kv_heads);
    }

    /// `out[h][i] = query[h] · k[tokens[i]][h]`: each token's raw inner product with each
    /// per-KV-head query (the sum of that head's query group); `out` is `n_kv_heads × tokens`.
    pub fn score(&self, query: &[f32], tokens: &[u32], out: &mut [f32]) {
        self.score_at(crate::kernels::simd_level(), query, tokens, out)
    }

    fn score_at(&self, level: SimdLevel, query: &[f32], tokens: &[u32], out: &mut [f32]) {
        let (data, scales, n_kv, hd, int4) =
            (&self.data, &self.scales, self.n_kv_heads, self.head_dim, self.bits == KeyBits::Int4);
        #[cfg(target_arch = "x86_64")]
        if hd.is_multiple_of(32) {
            use crate::kernels::x86::{avx2, avx512};
            // SAFETY: the level guarantees the CPU features; the kernels assert the bounds they read.
            match level {
                SimdLevel::Avx512Vnni => {
                    return unsafe { avx512::score_keys_lowp(data, scales, n_kv, hd, int4, query, tokens, out) }
                }
                SimdLevel::AvxVnni | SimdLevel::Avx2 => {
                    return unsafe { avx2::score_keys_lowp(data, scales, n_kv, hd, int4, query, tokens, out) }
                }
                SimdLevel::Portable => {}
            }
        }
        let _ = (data, scales, n_kv, hd, int4, level);
        self.score_portable(query, tokens, out);
    }

    /// [`Self::score`] for a query of integers (one INT8 row per KV head): `out[h][i]` is
    /// `dot as f32 × scale`, exactly, whichever kernel runs.
    pub fn score_int(&self, query: &[i8], tokens: &[u32], out: &mut [f32]) {
        self.score_int_at(crate::kernels::simd_level(), query, tokens, out)
    }

    fn score_int_at(&self, level: SimdLevel, query: &[i8], tokens: &[u32], out: &mut [f32]) {
        let (data, scales, n_kv, hd, int4) =
            (&self.data, &self.scales, self.n_kv_heads, self.head_dim, self.bits == KeyBits::Int4);
        #[cfg(target_arch = "x86_64")]
        if hd.is_multiple_of(64) {
            use crate::kernels::x86::{avx2, avx512};
            // SAFETY: the level guarantees the CPU features; the kernels assert the bounds they read.
            match level {
                SimdLevel::Avx512Vnni => {
                    return unsafe { avx512::score_keys_int(data, scales, n_kv, hd, int4, query, tokens, out) }
                }
                SimdLevel::AvxVnni => {
                    return unsafe { avx2::score_keys_int_vnni(data, scales, n_kv, hd, int4, query, tokens, out) }
                }
                SimdLevel::Avx2 => {
                    return unsafe { avx2::score_keys_int(data, scales, n_kv, hd, int4, query, tokens, out) }
                }
                SimdLevel::Portable => {}
            }
        }
        let _ = (data, scales, n_kv, hd, int4);
        // Every partial sum of integer products below 2²⁴ is exact in f32: the same numbers.
        let values: Vec<f32> = query.iter().map(|&q| f32::from(q)).collect();
        self.score_at(SimdLevel::Portable, &values, tokens, out);
    }

    fn score_portable(&self, query: &[f32], tokens: &[u32], out: &mut [f32]) {
        let (hd, rb) = (self.head_dim, self.row_bytes);
        debug_assert_eq!(query.len(), self.n_kv_heads * hd);
        let n = tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            for h in 0..self.n_kv_heads {
                let row = t as usize * self.n_kv_heads + h;
                let data = &self.data[row * rb..][..rb];
                let q = &query[h * hd..][..hd];
                let dot: f32 = match self.bits {
                    KeyBits::Int8 => data.iter().zip(q).map(|(&k, &q)| f32::from(k as i8) * q).sum(),
                    KeyBits::Int4 => data
                        .iter()
                        .zip(q.chunks(2))
                        .map(|(&b, qp)| {
                            let lo = f32::from(((b << 4) as i8) >> 4);
                            let hi = f32::from((b as i8) >> 4);
                            lo * qp[0] + qp.get(1).map_or(0.0, |q1| hi * q1)
                        })
                        .sum(),
                };
                out[h * n + i] = dot * self.scales[row];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_track_exact_inner_products() {
        let (heads, hd, n) = (3, 64, 50);
        let k: Vec<f32> = (0..n * heads * hd).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 3.0).collect();
        let q: Vec<f32> = (0..heads * hd).map(|i| (i % 13) as f32 / 6.0 - 1.0).collect();
        for (bits, tolerance) in [(KeyBits::Int8, 0.01), (KeyBits::Int4, 0.15)] {
            let mut keys = ScoringKeys::new(bits, heads, hd);
            keys.push(&k);
            // Scores are inner products with the keys less their center (the mean key here).
            let center = keys.center();
            let mean = |i: usize| (0..n).map(|t| k[t * heads * hd + i]).sum::<f32>() / n as f32;
            assert!((0..heads * hd).all(|i| (center[i] - mean(i)).abs() < 1e-5));
            let exact: Vec<f32> = (0..heads)
                .flat_map(|h| (0..n).map(move |t| (h, t)))
                .map(|(h, t)| (h * hd..(h + 1) * hd).map(|i| q[i] * (k[t * heads * hd + i] - center[i])).sum())
                .collect();
            assert_eq!(keys.len(), n);
            let mut out = vec![0f32; heads * n];
            keys.score(&q, &(0..n as u32).collect::<Vec<_>>(), &mut out);
            let norm = exact.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in out.iter().zip(&exact) {
                assert!((a - b).abs() <= tolerance * norm, "{bits:?}: {a} vs {b}");
            }
            // Any order of tokens, in blocks of sixteen or not, scores each the same.
            let reversed: Vec<u32> = (0..n as u32).rev().collect();
            let mut out_reversed = vec![0f32; heads * n];
            keys.score(&q, &reversed, &mut out_reversed);
            for (h, i) in (0..heads).flat_map(|h| (0..n).map(move |i| (h, i))) {
                assert_eq!(
                    out_reversed[h * n + i].to_bits(),
                    out[h * n + n - 1 - i].to_bits(),
                    "{bits:?} head {h} token {i}"
                );
            }
            let mut portable = vec![0f32; heads * n];
            keys.score_portable(&q, &(0..n as u32).collect::<Vec<_>>(), &mut portable);
            for level in SimdLevel::supported() {
                keys.score_at(level, &q, &(0..n as u32).collect::<Vec<_>>(), &mut out);
                for (a, b) in out.iter().zip(&portable) {
                    assert!((a - b).abs() <= 1e-4 * norm, "{bits:?} {level:?}: kernel {a} vs portable {b}");
                }
            }
            keys.truncate(10);
            assert_eq!(keys.len(), 10);
        }
    }

    #[test]
    fn a_shared_offset_in_the_keys_costs_an_int4_copy_no_ranking() {
        // Keys that differ a little around a large common offset (a K bias, as in qwen2): the
        // centered INT4 copy ranks them as the exact scores do, and later pushes keep the center.
        let (heads, hd, n) = (1, 64, 200);
        let offset = |i: usize| if i.is_multiple_of(9) { 40.0 } else { 0.0 };
        let k: Vec<f32> = (0..n * hd).map(|i| offset(i % hd) + ((i * 7919 % 1000) as f32 / 500.0 - 1.0)).collect();
        let q: Vec<f32> = (0..hd).map(|i| (i * 31 % 17) as f32 / 8.0 - 1.0).collect();
        let mut keys = ScoringKeys::new(KeyBits::Int4, heads, hd);
        keys.push(&k[..100 * hd]);
        keys.push(&k[100 * hd..]);
        let tokens: Vec<u32> = (0..n as u32).collect();
        let mut scores = vec![0f32; n];
        keys.score(&q, &tokens, &mut scores);
        let exact: Vec<f32> = (0..n).map(|t| k[t * hd..][..hd].iter().zip(&q).map(|(a, b)| a * b).sum()).collect();
        let top = |s: &[f32]| {
            let mut t = tokens.clone();
            t.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]));
            t.truncate(n / 5);
            t.sort_unstable();
            t
        };
        let (want, got) = (top(&exact), top(&scores));
        let recall = got.iter().filter(|t| want.binary_search(t).is_ok()).count() as f64 / want.len() as f64;
        // INT4 keeps ~0.8 of random 64-dim keys' top 20%; scaled to the offset (uncentered) it kept 0.13.
        assert!(recall >= 0.7, "recall {recall}");
    }

    #[test]
    fn integer_scores_are_the_same_numbers_at_every_level() {
        let (heads, hd, n) = (2, 128, 37);
        let k: Vec<f32> = (0..n * heads * hd).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 3.0).collect();
        // The extremes of a byte, −128 among them, and everything between.
        let query: Vec<i8> = (0..heads * hd).map(|i| (i * 37 % 256) as u8 as i8).collect();
        let tokens: Vec<u32> = (0..n as u32).rev().collect();
        for bits in [KeyBits::Int8, KeyBits::Int4] {
            let mut keys = ScoringKeys::new(bits, heads, hd);
            keys.push(&k);
            let mut want = vec![0f32; heads * n];
            keys.score_int_at(SimdLevel::Portable, &query, &tokens, &mut want);
            for level in SimdLevel::supported() {
                let mut got = vec![0f32; heads * n];
                keys.score_int_at(level, &query, &tokens, &mut got);
                for (a, b) in got.iter().zip(&want) {
                    assert_eq!(a.to_bits(), b.to_bits(), "{bits:?} {level:?}: {a} vs {b}");
                }
            }
        }
    }
}
