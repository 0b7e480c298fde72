//! Q4_K, Q5_K and Q6_K matrices kept as the file lays them out, and activations quantized a
//! super-block at a time for their products.
//!
//! A super-block holds 256 values: an f16 `d` and `dmin`, twelve bytes packing a 6-bit scale
//! `sc` and min `m` for each of its eight 32-value sub-blocks, (Q5_K) 32 bytes of fifth bits,
//! then 128 bytes of nibbles (sub-blocks 2j and 2j+1 share 32 bytes: low nibbles, then high).
//! A value is `d·sc·q − dmin·m`. The products take the activations with one scale per 256
//! values (as ggml's Q8_K), so `sc` and `m` apply in integers: a super-block's products are one
//! exact i32 sum, and its mins another against the activations' sums per sub-block; each goes
//! into the token's f32 total by one fused multiply-add. Every kernel follows that order, so all
//! SIMD levels, and a token alone or in any tile, give the same bits. The matrix takes the
//! file's bytes in memory and no more.
//!
//! Q6_K's super-block holds 128 bytes of low nibbles, 64 of high bit pairs, sixteen i8 scales
//! (one per 16 values) and an f16 `d`; a value is `d·sc·(q − 32)` with `q` in 0–63. Its
//! products take `q` unsigned, and the −32 from the activations' sums over each 16 values:
//! `Σ sc·(Σ q·x − 32·Σ x)`, again one exact i32 a super-block.

use super::huge_pages::concat_in_huge_pages;
use super::parallel::{task_count, DisjointWriter};
use super::spin_pool::pool;
use half::f16;

/// Values in a super-block.
pub const SUPER_BLOCK: usize = 256;
/// 32-value sub-blocks in a super-block, each with its own scale and min.
pub const SUB_BLOCKS: usize = 8;
/// Values each of the activations' sums covers ([`SuperBlockActivations::sums`]): a sub-block.
pub const SUM_SPAN: usize = 32;
/// Values each Q6_K scale covers, and each of [`SuperBlockActivations::sixteen_sums`].
pub const Q6K_SPAN: usize = 16;

/// The K-quant formats kept as the file has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuantFormat {
    Q4K,
    Q5K,
    Q6K,
}

impl KQuantFormat {
    /// Bytes one super-block takes.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// Where a Q4_K or Q5_K super-block's nibbles start (after d, dmin, the packed scales and
    /// Q5_K's fifth bits).
    pub fn nibbles_at(self) -> usize {
        match self {
            Self::Q4K => 16,
            Self::Q5K => 48,
            Self::Q6K => unreachable!("Q6_K starts with its nibbles (see q6k_ints)"),
        }
    }
}

/// A row-major `rows × cols` matrix of K-quant super-blocks, as the file has them.
#[derive(Debug, Clone)]
pub struct KQuantMatrix {
    pub rows: usize,
    pub cols: usize,
    pub format: KQuantFormat,
    /// rows × cols / 256 super-blocks of `format.block_bytes()` bytes
    pub raw: Vec<u8>,
}

/// The 6-bit scales and mins of a super-block's eight sub-blocks from its twelve packed bytes,
/// a byte each, little-endian in a u64: the first four whole in the low six bits of bytes 0–3
/// (scales) and 4–7 (mins), the last four with their low four bits in bytes 8–11 (scale low
/// nibble, min high nibble) and their top two in the spare top bits of bytes 0–7.
#[inline(always)]
pub fn scales_and_mins(packed: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let six_bits = 0x3f3f_3f3f;
    let nibbles = 0x0f0f_0f0f;
    let top_pairs = 0x0303_0303;
    let scales_hi = (c & nibbles) | ((a >> 6) & top_pairs) << 4;
    let mins_hi = ((c >> 4) & nibbles) | ((b >> 6) & top_pairs) << 4;
    (u64::from(a & six_bits) | u64::from(scales_hi) << 32, u64::from(b & six_bits) | u64::from(mins_hi) << 32)
}

impl KQuantMatrix {
    /// The matrix of raw super-blocks, which it keeps; `None` if the rows are not whole
    /// super-blocks or the bytes are not the shape's.
    pub fn from_gguf(format: KQuantFormat, raw: Vec<u8>, rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(SUPER_BLOCK)
            || raw.len() != rows.checked_mul(cols)? / SUPER_BLOCK * format.block_bytes()
        {
            return None;
        }
        Some(Self { rows, cols, format, raw })
    }

    pub fn super_blocks_per_row(&self) -> usize {
        self.cols / SUPER_BLOCK
    }

    pub fn row_bytes(&self) -> usize {
        self.super_blocks_per_row() * self.format.block_bytes()
    }

    /// Super-block `sb` of row `row`.
    #[inline(always)]
    pub fn super_block(&self, row: usize, sb: usize) -> &[u8] {
        let bytes = self.format.block_bytes();
        &self.raw[(row * self.super_blocks_per_row() + sb) * bytes..][..bytes]
    }

    /// The unsigned ints (0–15, Q5_K 0–31) of sub-block `sub` of a Q4_K or Q5_K super-block, in
    /// value order.
    #[inline(always)]
    pub fn sub_block_ints(&self, block: &[u8], sub: usize) -> [u8; 32] {
        let pair = &block[self.format.nibbles_at() + sub / 2 * 32..][..32];
        std::array::from_fn(|l| {
            let q = (pair[l] >> (4 * (sub % 2))) & 0x0f;
            match self.format {
                KQuantFormat::Q4K => q,
                KQuantFormat::Q5K => q | ((block[16 + l] >> sub) & 1) << 4,
                KQuantFormat::Q6K => unreachable!("see q6k_ints"),
            }
        })
    }

    /// Writes row `row`, dequantized, into `out` (`cols` values), as ggml computes each value:
    /// `(d·sc)·q − dmin·m`, Q6_K's `(d·sc)·(q − 32)`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        for (sb, dst) in out[..self.cols].chunks_exact_mut(SUPER_BLOCK).enumerate() {
            let block = self.super_block(row, sb);
            if self.format == KQuantFormat::Q6K {
                let (ints, scales, d) = (q6k_ints(block), q6k_scales(block), q6k_d(block));
                for (i, v) in dst.iter_mut().enumerate() {
                    *v = d * f32::from(scales[i / Q6K_SPAN]) * f32::from(ints[i] as i8 - 32);
                }
                continue;
            }
            let (d, dmin) = d_and_dmin(block);
            let (scales, mins) = scales_and_mins(&block[4..16]);
            for (sub, dst) in dst.chunks_exact_mut(32).enumerate() {
                let (scale, min) = (d * (scales >> (8 * sub)) as u8 as f32, dmin * (mins >> (8 * sub)) as u8 as f32);
                for (v, q) in dst.iter_mut().zip(self.sub_block_ints(block, sub)) {
                    *v = scale * f32::from(q) - min;
                }
            }
        }
    }

    /// Row `row` times token `t`'s activations: the reference the SIMD kernels match to the bit,
    /// and the product where there are none.
    pub fn dot_portable(&self, row: usize, x: &SuperBlockActivations, t: usize) -> f32 {
        let n_sb = self.super_blocks_per_row();
        let mut acc = 0f32;
        if self.format == KQuantFormat::Q6K {
            for sb in 0..n_sb {
                let block = self.super_block(row, sb);
                let (ints, scales) = (q6k_ints(block), q6k_scales(block));
                let at = t * n_sb + sb;
                let xq = &x.qs[at * SUPER_BLOCK..][..SUPER_BLOCK];
                let sums = &x.sixteen_sums[at * SUPER_BLOCK / Q6K_SPAN..][..SUPER_BLOCK / Q6K_SPAN];
                let mut isum = 0i32;
                for (j, &scale) in scales.iter().enumerate() {
                    let span = j * Q6K_SPAN..(j + 1) * Q6K_SPAN;
                    let products: i32 =
                        ints[span.clone()].iter().zip(&xq[span]).map(|(&q, &v)| i32::from(q) * i32::from(v)).sum();
                    isum += i32::from(scale) * (products - 32 * i32::from(sums[j]));
                }
                acc = (isum as f32).mul_add(q6k_d(block) * x.d[at], acc);
            }
            return acc;
        }
        for sb in 0..n_sb {
            let block = self.super_block(row, sb);
            let (d, dmin) = d_and_dmin(block);
            let (scales, mins) = scales_and_mins(&block[4..16]);
            let at = t * n_sb + sb;
            let xq = &x.qs[at * SUPER_BLOCK..][..SUPER_BLOCK];
            let sums = &x.sums[at * SUPER_BLOCK / SUM_SPAN..][..SUPER_BLOCK / SUM_SPAN];
            let (mut products, mut min_products) = (0i32, 0i32);
            for sub in 0..SUB_BLOCKS {
                let ints = self.sub_block_ints(block, sub);
                let xs = &xq[32 * sub..][..32];
                let isum: i32 = ints.iter().zip(xs).map(|(&q, &v)| i32::from(q) * i32::from(v)).sum();
                products += i32::from((scales >> (8 * sub)) as u8) * isum;
                min_products += i32::from((mins >> (8 * sub)) as u8) * i32::from(sums[sub]);
            }
            let dx = x.d[at];
            acc = (products as f32).mul_add(d * dx, acc);
            acc = (min_products as f32).mul_add(-dmin * dx, acc);
        }
        acc
    }

    /// The matrix of `parts`' rows in turn; `None` unless they share a format and a width.
    pub fn stack(parts: &[&KQuantMatrix]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.format != first.format || p.cols != first.cols) {
            return None;
        }
        Some(Self {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            format: first.format,
            raw: concat_in_huge_pages(&parts.iter().map(|p| p.raw.as_slice()).collect::<Vec<_>>()),
        })
    }
}

/// A Q6_K super-block's 256 unsigned ints (0–63), in value order: value `128h + 32k + l` takes
/// nibble `k / 2` of low byte `64h + 32(k % 2) + l` and bit pair `k` of high byte `32h + l`.
pub fn q6k_ints(block: &[u8]) -> [u8; SUPER_BLOCK] {
    let (low, high) = (&block[..128], &block[128..192]);
    std::array::from_fn(|i| {
        let (h, k, l) = (i / 128, i % 128 / 32, i % 32);
        let nibble = (low[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
        nibble | ((high[32 * h + l] >> (2 * k)) & 3) << 4
    })
}

/// A Q6_K super-block's sixteen scales, one per 16 values.
pub fn q6k_scales(block: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| block[192 + j] as i8)
}

/// A Q6_K super-block's `d`.
pub fn q6k_d(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[208], block[209]]).to_f32()
}

/// A super-block's `d` and `dmin`.
#[inline(always)]
pub fn d_and_dmin(block: &[u8]) -> (f32, f32) {
    (f16::from_le_bytes([block[0], block[1]]).to_f32(), f16::from_le_bytes([block[2], block[3]]).to_f32())
}

/// `n` activation vectors of `cols` values, each 256-value super-block quantized to int8 with
/// one f32 scale (as ggml's Q8_K), and the ints' sums over each 32 values.
#[derive(Debug, Default, Clone)]
pub struct SuperBlockActivations {
    pub n: usize,
    pub cols: usize,
    /// n × cols int8 values, in [−127, 127]
    pub qs: Vec<i8>,
    /// n × cols / 256 scales
    pub d: Vec<f32>,
    /// n × cols / 32 sums of 32 ints each
    pub sums: Vec<i16>,
    /// n × cols / 16 sums of 16 ints each (for Q6_K's scales)
    pub sixteen_sums: Vec<i16>,
    /// The same, four tokens to a group (for more than one token).
    pub groups: TokenGroups,
}

/// Bytes after which addresses fall in the same L1 sets again (64 sets of 64-byte lines).
const L1_SET_SPAN: usize = 4096;

/// Tokens a group of [`TokenGroups`] holds.
pub const GROUP: usize = 4;

/// Tokens a K-quant product takes together: eight groups (AVX-512's Q4_K product takes them in
/// one pass, so that each row's unpacked weights serve 32 tokens; the others, four groups at a
/// time).
pub const TILE_TOKENS: usize = 32;

/// Activations four tokens to a group, for the products of a tile of tokens, which multiply 8
/// values of each of four tokens by the same 8 weights in one vector. Per group and
/// super-block: the 1,024 values as 32 runs of 32 bytes (run 4·sub + j: the eight values from
/// 32·sub + 8j of each token in turn), the 4 × 8 sub-block sums (each token's eight in turn),
/// and the four scales. Tokens past the last are zeros.
#[derive(Debug, Default, Clone)]
pub struct TokenGroups {
    /// Each group's values, [`group_stride`](Self::group_stride) apart.
    pub values: Vec<i8>,
    /// Values from one group's to the next: its `cols · GROUP`, and half a page more where that
    /// is whole pages, so that a tile's groups do not fall in the same L1 sets (eight groups of
    /// 5,120-wide rows did, and thrashed its eight ways).
    pub group_stride: usize,
    pub sums: Vec<i16>,
    /// Per group and super-block, the 4 × 16 sums over 16 values (each token's sixteen in turn).
    pub sixteen_sums: Vec<i16>,
    pub scales: Vec<f32>,
    /// Where the CPU has AVX-512 with VNNI (empty elsewhere), the same values two groups to a
    /// pair, for products eight tokens to a 512-bit vector: per pair and super-block, 32 runs
    /// of 64 bytes (run r: the eight values from 8r of each of the pair's tokens in turn),
    /// [`pair_stride`](Self::pair_stride) apart. Zeros for a group past the last.
    pub pair_values: Vec<i8>,
    /// Values from one pair's to the next: as `group_stride`, for two groups.
    pub pair_stride: usize,
    /// With `pair_values`, per 16 tokens (two pairs) and super-block, in
    /// [`eight_token_lane`]'s lanes: the sums of sub-blocks 2k and 2k + 1 as an i16 pair, as
    /// four vectors of 16 (k = 0..4).
    pub half_sum_pairs: Vec<i32>,
    /// The same tokens' scales, a vector of 16 per super-block.
    pub half_scales: Vec<f32>,
}

/// Tokens a vector of [`TokenGroups::pair_values`] holds.
pub const PAIR_TOKENS: usize = 2 * GROUP;

/// Where token `t` of 16 (two pairs) lies in the lanes of the pair products: lane 4L + 2j + v
/// holds token 8j + 2L + v, as `packs` of two pairs' sums and then `dpwssd` leave them.
pub fn eight_token_lane(t: usize) -> usize {
    let (j, l, v) = (t / PAIR_TOKENS, t % PAIR_TOKENS / 2, t % 2);
    4 * l + 2 * j + v
}

impl SuperBlockActivations {
    /// Quantizes `x` (`n × cols`, row-major; `cols` whole super-blocks), reusing the buffers.
    pub fn quantize_into(&mut self, x: &[f32], n: usize, cols: usize) {
        debug_assert_eq!(x.len(), n * cols);
        debug_assert_eq!(cols % SUPER_BLOCK, 0);
        self.n = n;
        self.cols = cols;
        self.qs.resize(n * cols, 0);
        self.d.resize(n * cols / SUPER_BLOCK, 0.0);
        self.sums.resize(n * cols / SUM_SPAN, 0);
        self.sixteen_sums.resize(n * cols / Q6K_SPAN, 0);
        let grouped = if n > 1 { n.div_ceil(GROUP) * GROUP } else { 0 };
        // Cleared, so that the tokens past the last are zeros.
        let groups = &mut self.groups;
        groups.group_stride =
            GROUP * cols + if (GROUP * cols).is_multiple_of(L1_SET_SPAN) { L1_SET_SPAN / 2 } else { 0 };
        groups.values.clear();
        groups.values.resize(grouped / GROUP * groups.group_stride, 0);
        groups.sums.clear();
        groups.sums.resize(grouped * cols / SUM_SPAN, 0);
        groups.sixteen_sums.clear();
        groups.sixteen_sums.resize(grouped * cols / Q6K_SPAN, 0);
        groups.scales.clear();
        groups.scales.resize(grouped * cols / SUPER_BLOCK, 0.0);
        // Whole groups a task, so that each regroups its own tokens.
        let tasks = task_count(n, 8);
        let tokens_per_task = n.div_ceil(tasks).next_multiple_of(GROUP).max(GROUP);
        let group_stride = groups.group_stride;
        let tokens_out = PartWriters::new(&mut self.qs, &mut self.d, &mut self.sums, &mut self.sixteen_sums);
        let groups_out =
            PartWriters::new(&mut groups.values, &mut groups.scales, &mut groups.sums, &mut groups.sixteen_sums);
        pool().run(n.div_ceil(tokens_per_task), &|task| {
            let tokens = task * tokens_per_task..((task + 1) * tokens_per_task).min(n);
            let values = tokens.start * cols..tokens.end * cols;
            // SAFETY: each task owns its tokens' values, scales and sums, and their groups'.
            let part = unsafe { tokens_out.part(values.clone()) };
            quantize_super_blocks(&x[values.clone()], part.values, part.d, part.sixteen_sums);
            for (sum, pair) in part.sums.iter_mut().zip(part.sixteen_sums.chunks_exact(2)) {
                *sum = pair[0] + pair[1];
            }
            if grouped == 0 {
                return;
            }
            let padded = tokens.start * cols..tokens.start * cols + tokens.len().next_multiple_of(GROUP) * cols;
            // SAFETY: as above; the task's tokens are whole groups.
            regroup(cols, group_stride, &part, unsafe { groups_out.group_part(padded, cols, group_stride) });
        });
        groups.pair_values.clear();
        if grouped > 0 && super::SimdLevel::Avx512Vnni.is_supported() {
            pair_groups(groups, cols);
        }
    }
}

/// [`TokenGroups::pair_values`], `half_sum_pairs` and `half_scales` from the groups', 16
/// tokens a task.
fn pair_groups(groups: &mut TokenGroups, cols: usize) {
    let n_sb = cols / SUPER_BLOCK;
    let subs = SUPER_BLOCK / SUM_SPAN;
    let pair_cols = PAIR_TOKENS * cols;
    groups.pair_stride = pair_cols + if pair_cols.is_multiple_of(L1_SET_SPAN) { L1_SET_SPAN / 2 } else { 0 };
    let n_groups = groups.values.len() / groups.group_stride;
    let halves = n_groups.div_ceil(4);
    groups.pair_values.resize(2 * halves * groups.pair_stride, 0);
    groups.half_sum_pairs.clear();
    groups.half_sum_pairs.resize(halves * n_sb * 4 * 16, 0);
    groups.half_scales.clear();
    groups.half_scales.resize(halves * n_sb * 16, 0.0);
    let (values, group_stride, pair_stride) = (&groups.values, groups.group_stride, groups.pair_stride);
    let (sums, scales) = (&groups.sums, &groups.scales);
    let values_out = DisjointWriter::new(&mut groups.pair_values);
    let sums_out = DisjointWriter::new(&mut groups.half_sum_pairs);
    let scales_out = DisjointWriter::new(&mut groups.half_scales);
    pool().run(halves, &|half| {
        // SAFETY: each task writes its own two pairs' values and its half's sums and scales.
        let (pairs_out, half_sums, half_scales) = unsafe {
            (
                values_out.slice(2 * half * pair_stride, 2 * pair_stride),
                sums_out.slice(half * n_sb * 64, n_sb * 64),
                scales_out.slice(half * n_sb * 16, n_sb * 16),
            )
        };
        for g in 4 * half..(4 * half + 4).min(n_groups) {
            let (j, in_pair) = (g / 2 % 2, g % 2);
            let group = &values[g * group_stride..][..GROUP * cols];
            let pair_out = &mut pairs_out[j * pair_stride..][..pair_cols];
            for (run, four_tokens) in group.chunks_exact(8 * GROUP).enumerate() {
                pair_out[run * 8 * PAIR_TOKENS + in_pair * 8 * GROUP..][..8 * GROUP].copy_from_slice(four_tokens);
            }
            for sb in 0..n_sb {
                for t in 0..GROUP {
                    let at = (g * n_sb + sb) * GROUP + t;
                    let lane = eight_token_lane(GROUP * (g % 4) + t);
                    half_scales[sb * 16 + lane] = scales[at];
                    let token_sums = &sums[at * subs..][..subs];
                    for k in 0..subs / 2 {
                        let pair = u32::from(token_sums[2 * k] as u16) | u32::from(token_sums[2 * k + 1] as u16) << 16;
                        half_sums[(sb * 4 + k) * 16 + lane] = pair as i32;
                    }
                }
            }
        }
    });
}

/// Writers into the activations' values, scales and sums (the tokens' or their groups'), which
/// tasks take [`Part`]s of.
struct PartWriters<'a> {
    values: DisjointWriter<'a, i8>,
    d: DisjointWriter<'a, f32>,
    sums: DisjointWriter<'a, i16>,
    sixteen_sums: DisjointWriter<'a, i16>,
}

impl<'a> PartWriters<'a> {
    fn new(values: &'a mut [i8], d: &'a mut [f32], sums: &'a mut [i16], sixteen_sums: &'a mut [i16]) -> Self {
        Self {
            values: DisjointWriter::new(values),
            d: DisjointWriter::new(d),
            sums: DisjointWriter::new(sums),
            sixteen_sums: DisjointWriter::new(sixteen_sums),
        }
    }

    /// The values `range` (whole super-blocks) and their scales and sums.
    ///
    /// # Safety
    /// No other task may touch this part while it is alive.
    unsafe fn part(&self, range: std::ops::Range<usize>) -> Part<'_> {
        // SAFETY: exclusive per the caller's contract.
        unsafe { self.part_with_values(range.clone(), range) }
    }

    /// [`part`](Self::part) of [`TokenGroups`]: the tokens' values `range` (whole groups of
    /// `cols` a token), each group `group_stride` values on from the last.
    ///
    /// # Safety
    /// No other task may touch this part while it is alive.
    unsafe fn group_part(&self, range: std::ops::Range<usize>, cols: usize, group_stride: usize) -> Part<'_> {
        let groups = range.start / (GROUP * cols)..range.end / (GROUP * cols);
        // SAFETY: exclusive per the caller's contract.
        unsafe { self.part_with_values(range, groups.start * group_stride..groups.end * group_stride) }
    }

    /// # Safety
    /// As [`part`](Self::part): `range` gives the scales and sums, `values` the values.
    unsafe fn part_with_values(&self, range: std::ops::Range<usize>, values: std::ops::Range<usize>) -> Part<'_> {
        let (start, len) = (range.start, range.len());
        // SAFETY: exclusive per the caller's contract.
        unsafe {
            Part {
                values: self.values.slice(values.start, values.len()),
                d: self.d.slice(start / SUPER_BLOCK, len / SUPER_BLOCK),
                sums: self.sums.slice(start / SUM_SPAN, len / SUM_SPAN),
                sixteen_sums: self.sixteen_sums.slice(start / Q6K_SPAN, len / Q6K_SPAN),
            }
        }
    }
}

/// One task's share of the activations: its tokens' values, scales and sums.
struct Part<'a> {
    values: &'a mut [i8],
    d: &'a mut [f32],
    sums: &'a mut [i16],
    sixteen_sums: &'a mut [i16],
}

/// Tokens' values, scales and sums (row-major, `cols` a token) into [`TokenGroups`]' layout,
/// the first token starting a group.
fn regroup(cols: usize, group_stride: usize, tokens: &Part, groups: Part) {
    let n_sb = cols / SUPER_BLOCK;
    let (subs, sixteens) = (SUPER_BLOCK / SUM_SPAN, SUPER_BLOCK / Q6K_SPAN);
    for (i, token) in tokens.values.chunks_exact(cols).enumerate() {
        let (g, t) = (i / GROUP, i % GROUP);
        for (sb, block) in token.chunks_exact(SUPER_BLOCK).enumerate() {
            let at = g * n_sb + sb;
            let out = &mut groups.values[g * group_stride + sb * GROUP * SUPER_BLOCK..][..GROUP * SUPER_BLOCK];
            for (run, eight) in block.chunks_exact(8).enumerate() {
                out[run * 8 * GROUP + 8 * t..][..8].copy_from_slice(eight);
            }
            let from = i * n_sb + sb;
            groups.sums[(at * GROUP + t) * subs..][..subs].copy_from_slice(&tokens.sums[from * subs..][..subs]);
            groups.sixteen_sums[(at * GROUP + t) * sixteens..][..sixteens]
                .copy_from_slice(&tokens.sixteen_sums[from * sixteens..][..sixteens]);
            groups.d[at * GROUP + t] = tokens.d[from];
        }
    }
}

super::ops::multiversioned! {
    /// Each 256 values of `x` to int8 with one scale, as ggml's Q8_K quantizes them (so products
    /// of K-quant files are llama.cpp's), and the sums of each 16 ints.
    fn quantize_super_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i16]) {
        for (((src, dst), scale), sums) in x
            .chunks_exact(SUPER_BLOCK)
            .zip(qs.chunks_exact_mut(SUPER_BLOCK))
            .zip(d.iter_mut())
            .zip(sums.chunks_exact_mut(SUPER_BLOCK / Q6K_SPAN))
        {
            // As ggml's Q8_K: the value of largest magnitude becomes −127 (its scale takes the
            // opposite sign), the rest round half to even.
            let amax = super::ops::abs_max(src);
            let largest = src.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
            let inv = if amax > 0.0 { -127.0 / largest } else { 0.0 };
            *scale = if amax > 0.0 { 1.0 / inv } else { 0.0 };
            for (q, &v) in dst.iter_mut().zip(src) {
                *q = (v * inv).round_ties_even().min(127.0) as i8;
            }
            for (sum, span) in sums.iter_mut().zip(dst.chunks_exact(Q6K_SPAN)) {
                *sum = span.iter().map(|&q| i16::from(q)).sum();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_scales_and_mins_unpack_as_the_format_defines_them() {
        // Sub-block j's scale and min, 6 bits each, packed by the format's definition.
        let scales: [u8; 8] = [1, 63, 17, 40, 33, 2, 62, 45];
        let mins: [u8; 8] = [60, 5, 31, 32, 7, 58, 16, 49];
        let mut packed = [0u8; 12];
        for j in 0..4 {
            packed[j] = scales[j] | (scales[j + 4] >> 4) << 6;
            packed[j + 4] = mins[j] | (mins[j + 4] >> 4) << 6;
            packed[j + 8] = (scales[j + 4] & 0x0f) | (mins[j + 4] & 0x0f) << 4;
        }
        let (s, m) = scales_and_mins(&packed);
        assert_eq!(s.to_le_bytes(), scales);
        assert_eq!(m.to_le_bytes(), mins);
    }

    #[test]
    fn super_block_activations_keep_the_largest_value_and_their_sums() {
        let x: Vec<f32> = (0..2 * SUPER_BLOCK).map(|i| ((i * 7919) % 509) as f32 / 100.0 - 2.5).collect();
        let mut a = SuperBlockActivations::default();
        a.quantize_into(&x, 1, 2 * SUPER_BLOCK);
        for (sb, src) in x.chunks_exact(SUPER_BLOCK).enumerate() {
            let q = &a.qs[sb * SUPER_BLOCK..][..SUPER_BLOCK];
            assert_eq!(q.iter().map(|q| q.unsigned_abs()).max(), Some(127));
            for (v, &q) in src.iter().zip(q) {
                assert!((v - a.d[sb] * f32::from(q)).abs() <= a.d[sb].abs() / 2.0 * 1.0001);
            }
            for (s, span) in a.sums[sb * 8..][..8].iter().zip(q.chunks_exact(SUM_SPAN)) {
                assert_eq!(*s, span.iter().map(|&q| i16::from(q)).sum::<i16>());
            }
        }
        // All zeros: a zero scale, zero ints.
        a.quantize_into(&[0.0; SUPER_BLOCK], 1, SUPER_BLOCK);
        assert_eq!((a.d[0], a.qs.iter().all(|&q| q == 0)), (0.0, true));
    }
}
