//! The K-quant products at x86-64-v3 (AVX2, FMA, F16C), which every x86 level runs, and a
//! tile's products at AVX-512 with VNNI. Each sub-block's 6-bit scale multiplies its `maddubs`
//! pairs in `madd`, so a super-block's products add up exactly in i32 lanes; its mins meet the
//! activations' sums in one more `madd`.
//!
//! One token (decode) takes four rows a pass ([`decode`]); Q5_K's, and the rows a pass leaves,
//! take [`one_token`], a row at a time. A tile of tokens
//! goes four at a time ([`token_groups`]): a vector holds 8 values of each of four tokens and the
//! row's 8 values broadcast against them, so the four `maddubs` of a sub-block add in i16 (at
//! most 8·31·127 < 2¹⁵) before one `madd` applies its scale, where a vector a sub-block needs a
//! `madd` for each. At AVX-512 a tile takes two rows at a time ([`row_pairs`]): one load of the
//! activations serves both, and VNNI's `dpbusd` sums in i32 before the scale applies. Alone,
//! VNNI is no faster (its scale multiply costs what it saves); with the shared loads it is.
//! Q4_K's tile takes eight tokens to a 512-bit vector ([`q4k_eight_token_pairs`], from the
//! activations' [`pair_values`](super::super::k_quant::TokenGroups::pair_values)): a sub-block's
//! sums fit in i16, so two pairs' pack into one vector that `dpwssd` scales, and all 32 tokens
//! of a tile go in one pass, each unpacked weight serving 32 tokens; the other kernels take a
//! tile four groups at a time.
//!
//! Q6_K ([`q6k_token_groups`]) takes its unsigned ints against the same
//! activations, a `madd` per 16-value span for its i8 scale, and the −32 of every value from the
//! activations' sums over each span, at every level; at AVX-512 its tiles take two rows at a
//! time as Q4_K's do ([`q6k_row_pairs`]). There each pair of rows reduces a super-block's
//! totals two groups at a time, in 512-bit lanes ([`QUAD_LANES`]), with the f32 operations of
//! the other levels.

use super::super::k_quant::{
    eight_token_lane, scales_and_mins, KQuantFormat, KQuantMatrix, SuperBlockActivations, TokenGroups, GROUP,
    PAIR_TOKENS, Q6K_SPAN, SUM_SPAN, SUPER_BLOCK, TILE_TOKENS,
};
use super::avx2::{hsum_i32, hsum_i32_128};
use super::{f16_value, prefetch_ahead};
use decode::{Lanes256, Lanes512};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

mod decode;

/// Sub-blocks in a super-block.
const SUBS: usize = SUPER_BLOCK / SUM_SPAN;

// A tile's first token starts a group.
const _: () = assert!(TILE_TOKENS.is_multiple_of(GROUP));

/// Bytes of a tile's activations its rows take at a time: a panel of super-blocks that stays
/// in L1 (32 KiB or more) while the rows pass, where a whole row of a wide matrix (an MLP's
/// down projection, 8,960–17,920 values) would not.
const PANEL_BYTES: usize = 16 * 1024;

/// Products of weight rows `rows` with tokens `t0..t0+nt` (nt ≤ TILE_TOKENS), into
/// `out[(row - rows.start) · TILE_TOKENS + t]`, to the bit those of
/// [`KQuantMatrix::dot_portable`].
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_rows(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: the features per this function's contract.
    unsafe { dot_rows_inlined(w, rows, x, t0, nt, out) }
}

/// [`dot_rows`] at AVX-512 with VNNI. One token takes the 512-bit passes of [`decode`], or for
/// Q5_K [`dot_rows`]' loop, EVEX-encoded (32 vector registers); a tile takes two rows at a time
/// ([`row_pairs`], [`q6k_row_pairs`]).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn dot_rows_avx512(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    if nt == 1 {
        // SAFETY: the features per this function's contract.
        return unsafe {
            match w.format {
                KQuantFormat::Q4K => decode::q4k_rows::<Lanes512>(w, rows, x, t0, out),
                KQuantFormat::Q6K => decode::q6k_rows(w, rows, x, t0, out),
                _ => dot_rows_inlined(w, rows, x, t0, nt, out),
            }
        };
    }
    assert!(rows.end <= w.rows && t0 + nt <= x.n && x.cols == w.cols && nt <= TILE_TOKENS);
    assert!(out.len() >= rows.len() * TILE_TOKENS && w.raw.len() >= w.rows * w.row_bytes());
    // An odd row left over takes the one-row loop.
    let paired = rows.start..rows.start + rows.len() / 2 * 2;
    // SAFETY (every arm): features per this function's contract; bounds asserted above.
    unsafe {
        match (w.format, nt) {
            (KQuantFormat::Q4K, 2..=8) => q4k_eight_token_pairs::<1>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q4K, 9..=16) => q4k_eight_token_pairs::<2>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q4K, 17..=24) => q4k_eight_token_pairs::<3>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q4K, _) => q4k_eight_token_pairs::<4>(w, paired.clone(), x, t0, nt, out),
            // Q5_K's pairs hold a product a sub-block and group in a register of their own,
            // which 32 tokens would spill: four groups at a time.
            (KQuantFormat::Q5K, _) => {
                for (half, t) in (0..nt).step_by(HALF_TILE).enumerate() {
                    let (t0, nt, out) = (t0 + t, HALF_TILE.min(nt - t), &mut out[half * HALF_TILE..]);
                    match nt {
                        1 => one_token::<true>(w, paired.clone(), x, t0, out),
                        2..=4 => row_pairs::<1>(w, paired.clone(), x, t0, nt, out),
                        5..=8 => row_pairs::<2>(w, paired.clone(), x, t0, nt, out),
                        9..=12 => row_pairs::<3>(w, paired.clone(), x, t0, nt, out),
                        _ => row_pairs::<4>(w, paired.clone(), x, t0, nt, out),
                    }
                }
            }
            (KQuantFormat::Q6K, 2..=4) => q6k_row_pairs::<1>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 5..=8) => q6k_row_pairs::<2>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 9..=12) => q6k_row_pairs::<3>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 13..=16) => q6k_row_pairs::<4>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 17..=20) => q6k_row_pairs::<5>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 21..=24) => q6k_row_pairs::<6>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, 25..=28) => q6k_row_pairs::<7>(w, paired.clone(), x, t0, nt, out),
            (KQuantFormat::Q6K, _) => q6k_row_pairs::<8>(w, paired.clone(), x, t0, nt, out),
        }
        if paired.end < rows.end {
            let offset = paired.len() * TILE_TOKENS;
            dot_rows_inlined(w, paired.end..rows.end, x, t0, nt, &mut out[offset..]);
        }
    }
}

/// Tokens the products that keep a register a group take at a time: a tile's first or second half.
const HALF_TILE: usize = TILE_TOKENS / 2;

/// Whether `out` holds the products of `rows` rows with `nt` tokens, a row every
/// [`TILE_TOKENS`] values (a half tile's `out` starts inside the first row's).
fn out_holds(out: &[f32], rows: usize, nt: usize) -> bool {
    rows == 0 || out.len() >= (rows - 1) * TILE_TOKENS + nt
}

/// The body of [`dot_rows`], compiled with each caller's features.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[inline(always)]
unsafe fn dot_rows_inlined(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    assert!(rows.end <= w.rows && t0 + nt <= x.n && x.cols == w.cols && (1..=TILE_TOKENS).contains(&nt));
    assert!(out.len() >= rows.len() * TILE_TOKENS && w.raw.len() >= w.rows * w.row_bytes());
    assert!(
        x.qs.len() >= x.n * x.cols
            && x.d.len() * SUPER_BLOCK >= x.qs.len()
            && x.sums.len() * SUM_SPAN >= x.qs.len()
            && x.sixteen_sums.len() * Q6K_SPAN >= x.qs.len()
    );
    // Four groups at a time (16 vector registers hold no more): each half's products land in
    // its tokens' places in `out`.
    for (half, t) in (0..nt).step_by(HALF_TILE).enumerate() {
        let nt = HALF_TILE.min(nt - t);
        // SAFETY: per this function's contract, and the bounds asserted above.
        unsafe { half_tile(w, rows.clone(), x, t0 + t, nt, &mut out[half * HALF_TILE..]) };
    }
}

/// [`dot_rows_inlined`] of at most [`HALF_TILE`] tokens.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; the bounds are those [`dot_rows_inlined`] asserts.
#[inline(always)]
unsafe fn half_tile(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY (every arm): features per this function's contract, and its bounds.
    unsafe {
        match (w.format, nt) {
            (KQuantFormat::Q4K, 1) => decode::q4k_rows::<Lanes256>(w, rows, x, t0, out),
            (KQuantFormat::Q5K, 1) => one_token::<true>(w, rows, x, t0, out),
            (KQuantFormat::Q4K, 2..=4) => token_groups::<1, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 2..=4) => token_groups::<1, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, 5..=8) => token_groups::<2, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 5..=8) => token_groups::<2, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, 9..=12) => token_groups::<3, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 9..=12) => token_groups::<3, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, _) => token_groups::<4, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, _) => token_groups::<4, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q6K, 1) => decode::q6k_one_row(w, rows, x, t0, out),
            (KQuantFormat::Q6K, 2..=4) => q6k_token_groups::<1>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q6K, 5..=8) => q6k_token_groups::<2>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q6K, 9..=12) => q6k_token_groups::<3>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q6K, _) => q6k_token_groups::<4>(w, rows, x, t0, nt, out),
        }
    }
}

/// A super-block's `d`, `dmin`, and its sub-blocks' packed scales and mins.
///
/// # Safety
/// `block` points at a whole super-block; the CPU has f16c.
#[inline(always)]
unsafe fn header(block: *const u8) -> (f32, f32, u64, u64) {
    // SAFETY: the reads lie in the super-block's first 16 bytes per the contract.
    unsafe {
        let d = f16_value(f16::from_bits((block as *const u16).read_unaligned()));
        let dmin = f16_value(f16::from_bits((block.add(2) as *const u16).read_unaligned()));
        let (scales, mins) = scales_and_mins(std::slice::from_raw_parts(block.add(4), 12));
        (d, dmin, scales, mins)
    }
}

/// One token's products, a row at a time.
#[inline(always)]
unsafe fn one_token<const FIVE: bool>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    let xq = x.qs[t * w.cols..][..w.cols].as_ptr();
    let xd = &x.d[t * n_sb..][..n_sb];
    let xs = x.sums[t * n_sb * SUBS..][..n_sb * SUBS].as_ptr();
    // SAFETY: the caller has avx2, fma and f16c; every pointer stays inside the row's
    // super-blocks and the token's values and sums (asserted by the caller).
    unsafe {
        let low_nibbles = _mm256_set1_epi8(0x0f);
        for row in rows.clone() {
            let row_ptr = w.raw[row * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr();
            let mut acc = 0f32;
            for (sb, &dx) in xd.iter().enumerate() {
                let block = row_ptr.add(sb * block_bytes);
                prefetch_ahead(row_ptr, sb * block_bytes, block_bytes);
                let (d, dmin, scales, mins) = header(block);
                // Sub-block b's scale in every i16 lane of its own vector.
                let scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)));
                let nibbles = block.add(w.format.nibbles_at());
                let mut fifth_bits =
                    if FIVE { _mm256_loadu_si256(block.add(16).cast()) } else { _mm256_setzero_si256() };
                let xb = xq.add(sb * SUPER_BLOCK);
                let mut products = _mm256_setzero_si256();
                for b in 0..SUBS {
                    let pair = _mm256_loadu_si256(nibbles.add(b / 2 * 32).cast());
                    let mut ints = if b.is_multiple_of(2) {
                        _mm256_and_si256(pair, low_nibbles)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(pair), low_nibbles)
                    };
                    if FIVE {
                        // Bit b of each byte, moved to bit 4 (bit 0 of the bytes after b shifts).
                        let bit = _mm256_and_si256(_mm256_slli_epi16::<4>(fifth_bits), _mm256_set1_epi8(0x10));
                        ints = _mm256_or_si256(ints, bit);
                        fifth_bits = _mm256_srli_epi16::<1>(fifth_bits);
                    }
                    let scale = _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(0x0100 + 0x0202 * b as i16));
                    let pairs = _mm256_maddubs_epi16(ints, _mm256_loadu_si256(xb.add(32 * b).cast()));
                    products = _mm256_add_epi32(products, _mm256_madd_epi16(pairs, scale));
                }
                let mins16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64));
                let min_products = _mm_madd_epi16(mins16, _mm_loadu_si128(xs.add(sb * SUBS).cast()));
                acc = (hsum_i32(products) as f32).mul_add(d * dx, acc);
                acc = (hsum_i32_128(min_products) as f32).mul_add(-dmin * dx, acc);
            }
            out[(row - rows.start) * TILE_TOKENS] = acc;
        }
    }
}

/// Tokens `t0..t0+nt` (t0 a multiple of four, 2 ≤ nt ≤ 4·GROUPS) from their
/// [`TokenGroups`](super::super::k_quant::TokenGroups).
#[inline(always)]
unsafe fn token_groups<const GROUPS: usize, const FIVE: bool>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    let TileGroups { values, stride, sums, scales } = TileGroups::new(x, w.cols, t0, GROUPS, &x.groups.sums, SUM_SPAN);
    // Each row's four totals a group, kept between panels.
    let mut totals = vec![[0f32; GROUP]; rows.len() * GROUPS];
    // SAFETY: the caller has avx2, fma and f16c; every pointer stays inside the row's
    // super-blocks and the groups' values, sums and scales (asserted by `TileGroups::new` and
    // by the caller).
    unsafe {
        let panel_super_blocks = (PANEL_BYTES / (GROUPS * GROUP * SUPER_BLOCK)).max(1);
        for first_sb in (0..n_sb).step_by(panel_super_blocks) {
            let panel = first_sb..(first_sb + panel_super_blocks).min(n_sb);
            for row in rows.clone() {
                let row_ptr = w.raw[row * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr();
                let row_totals = &mut totals[(row - rows.start) * GROUPS..][..GROUPS];
                let mut acc: [__m128; GROUPS] = std::array::from_fn(|g| _mm_loadu_ps(row_totals[g].as_ptr()));
                for sb in panel.clone() {
                    let block = row_ptr.add(sb * block_bytes);
                    let (d, dmin, sub_scales, mins) = header(block);
                    // Group g's values of this super-block.
                    let xv: [*const i8; GROUPS] =
                        std::array::from_fn(|g| values.add(g * stride + sb * GROUP * SUPER_BLOCK));
                    let mut products = [_mm256_setzero_si256(); GROUPS];
                    macro_rules! sub_blocks {
                        ($($sub:literal)*) => {$(
                            sub_block::<GROUPS, FIVE, $sub>(block, w.format.nibbles_at(), sub_scales, &xv, &mut products);
                        )*};
                    }
                    sub_blocks!(0 1 2 3 4 5 6 7);
                    let mins16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)));
                    for g in 0..GROUPS {
                        let at = g * n_sb + sb;
                        // products: [t0 t0 t1 t1 | t2 t2 t3 t3] → [t0 t1 t2 t3]
                        let halves = _mm256_hadd_epi32(products[g], products[g]);
                        let p =
                            _mm_unpacklo_epi64(_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves));
                        // The sums of tokens 0–1 and 2–3 (eight a token) times the mins, then
                        // [t0 t0 t2 t2 | t1 t1 t3 t3], [t0 t2 .. | t1 t3 ..], and [t0 t1 t2 t3].
                        let group_sums = sums.add(at * GROUP * SUBS);
                        let m01 = _mm256_madd_epi16(_mm256_loadu_si256(group_sums.cast()), mins16);
                        let m23 = _mm256_madd_epi16(_mm256_loadu_si256(group_sums.add(16).cast()), mins16);
                        let quarters = _mm256_hadd_epi32(m01, m23);
                        let pairs = _mm256_hadd_epi32(quarters, quarters);
                        let m = _mm_unpacklo_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256::<1>(pairs));
                        let dx = _mm_loadu_ps(scales.add(at * GROUP));
                        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(p), _mm_mul_ps(_mm_set1_ps(d), dx), acc[g]);
                        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(_mm_set1_ps(-dmin), dx), acc[g]);
                    }
                }
                for g in 0..GROUPS {
                    _mm_storeu_ps(row_totals[g].as_mut_ptr(), acc[g]);
                }
            }
        }
    }
    write_totals::<GROUPS>(&totals, nt, out);
}

/// Each row's totals of a tile's groups (`GROUPS` of them a row, four tokens each) into
/// `out[row · TILE_TOKENS + t]`, for its first `nt` tokens.
fn write_totals<const GROUPS: usize>(totals: &[[f32; GROUP]], nt: usize, out: &mut [f32]) {
    for (row, row_totals) in totals.chunks_exact(GROUPS).enumerate() {
        for t in 0..nt {
            out[row * TILE_TOKENS + t] = row_totals[t / GROUP][t % GROUP];
        }
    }
}

/// Where a tile's groups `t0 / GROUP ..` (`groups` of them) start in [`TokenGroups`]: their
/// values, their sums (`sums`, each over `span` values) and their scales.
///
/// [`TokenGroups`]: super::super::k_quant::TokenGroups
struct TileGroups {
    values: *const i8,
    stride: usize,
    sums: *const i16,
    scales: *const f32,
}

impl TileGroups {
    /// Checks that the groups lie inside `x`'s, for rows of `cols` values.
    fn new(x: &SuperBlockActivations, cols: usize, t0: usize, groups: usize, sums: &[i16], span: usize) -> Self {
        let (first, stride, scales) = (t0 / GROUP, x.groups.group_stride, &x.groups.scales);
        assert!(
            t0.is_multiple_of(GROUP) && stride >= GROUP * cols && (first + groups) * stride <= x.groups.values.len()
        );
        assert!(
            sums.len() * span == scales.len() * SUPER_BLOCK
                && scales.len() * SUPER_BLOCK >= (first + groups) * GROUP * cols
        );
        Self {
            values: x.groups.values[first * stride..].as_ptr(),
            stride,
            sums: sums[first * GROUP * cols / span..].as_ptr(),
            scales: scales[first * GROUP * cols / SUPER_BLOCK..].as_ptr(),
        }
    }
}

/// Adds sub-block `SUB`'s products, times its scale, to each group's `products`: the sub-block's
/// 32 weights as four vectors of 8 (each broadcast to the four tokens' quarters), against the
/// group's four runs of the sub-block.
///
/// # Safety
/// `block` points at a whole super-block whose nibbles start `nibbles_at` bytes in; each of
/// `xv` at a group's 1,024 values of it; the CPU has avx2.
#[inline(always)]
unsafe fn sub_block<const GROUPS: usize, const FIVE: bool, const SUB: usize>(
    block: *const u8,
    nibbles_at: usize,
    sub_scales: u64,
    xv: &[*const i8; GROUPS],
    products: &mut [__m256i; GROUPS],
) {
    // SAFETY: per the contract.
    unsafe {
        let low_nibbles = _mm256_set1_epi8(0x0f);
        let ints: [__m256i; 4] = std::array::from_fn(|j| {
            let eight = block.add(nibbles_at + SUB / 2 * 32 + 8 * j) as *const i64;
            let raw = _mm256_set1_epi64x(eight.read_unaligned());
            let q =
                _mm256_and_si256(if SUB.is_multiple_of(2) { raw } else { _mm256_srli_epi16::<4>(raw) }, low_nibbles);
            if FIVE {
                // Bit SUB of each byte of the fifth bits, to bit 4.
                let high = _mm256_set1_epi64x((block.add(16 + 8 * j) as *const i64).read_unaligned());
                let bit = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(SUB as i32)), _mm256_set1_epi8(1));
                _mm256_or_si256(q, _mm256_slli_epi16::<4>(bit))
            } else {
                q
            }
        });
        let scale = _mm256_set1_epi16(i16::from((sub_scales >> (8 * SUB)) as u8));
        for g in 0..GROUPS {
            let runs = xv[g].add(SUB * 4 * 32);
            let pairs = |j: usize| _mm256_maddubs_epi16(ints[j], _mm256_loadu_si256(runs.add(32 * j).cast()));
            let sum16 = _mm256_add_epi16(_mm256_add_epi16(pairs(0), pairs(1)), _mm256_add_epi16(pairs(2), pairs(3)));
            products[g] = _mm256_add_epi32(products[g], _mm256_madd_epi16(sum16, scale));
        }
    }
}

/// [`token_groups`] two rows at a time, with VNNI: each load of a group's activations serves
/// both rows, and a sub-block's four `dpbusd` sum its products in i32 lanes before its scale
/// applies (both halve the instructions a product takes, which bound this loop on Zen 4: two
/// vector loads and four vector operations a cycle). The two rows' super-block totals reduce
/// together, in the same integer sums and f32 operations as [`token_groups`]. Q5_K's, up to
/// four groups ([`sub_block_pairs`]); Q4_K's take eight tokens to a vector instead
/// ([`q4k_eight_token_pairs`]).
///
/// # Safety
/// The CPU has avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni; `rows` is an even
/// number of rows within the matrix, and `out` holds their products with `nt` tokens (see
/// [`out_holds`]).
#[inline(always)]
unsafe fn row_pairs<const GROUPS: usize>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    assert!(rows.len().is_multiple_of(2) && rows.end <= w.rows && out_holds(out, rows.len(), nt));
    let TileGroups { values, stride, sums, scales } = TileGroups::new(x, w.cols, t0, GROUPS, &x.groups.sums, SUM_SPAN);
    // Each pair of rows' totals a pair of groups, in quad lanes, kept between panels.
    let quads = GROUPS.div_ceil(2);
    let mut totals = vec![[0f32; QUAD_LANES]; rows.len() / 2 * quads];
    // SAFETY: per the contract; every pointer stays inside the rows' super-blocks and the
    // groups' values, sums and scales (asserted above and by `TileGroups::new`).
    unsafe {
        let panel_super_blocks = (PANEL_BYTES / (GROUPS * GROUP * SUPER_BLOCK)).max(1);
        for first_sb in (0..n_sb).step_by(panel_super_blocks) {
            let panel = first_sb..(first_sb + panel_super_blocks).min(n_sb);
            for (pair, row) in rows.clone().step_by(2).enumerate() {
                let row_ptrs = [0, 1].map(|r| w.raw[(row + r) * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr());
                let pair_totals = &mut totals[pair * quads..][..quads];
                let mut acc = [_mm512_setzero_ps(); QUADS];
                for q in 0..quads {
                    acc[q] = _mm512_loadu_ps(pair_totals[q].as_ptr());
                }
                for sb in panel.clone() {
                    let blocks = [row_ptrs[0].add(sb * block_bytes), row_ptrs[1].add(sb * block_bytes)];
                    let (d0, dmin0, sub_scales0, mins0) = header(blocks[0]);
                    let (d1, dmin1, sub_scales1, mins1) = header(blocks[1]);
                    let mut xv = [values; GROUPS];
                    for (g, xv) in xv.iter_mut().enumerate() {
                        *xv = values.add(g * stride + sb * GROUP * SUPER_BLOCK);
                    }
                    let mut products = [[_mm256_setzero_si256(); GROUPS]; 2];
                    for half in 0..SUBS / 2 {
                        sub_block_pairs::<GROUPS>(
                            half,
                            blocks,
                            w.format.nibbles_at(),
                            [sub_scales0, sub_scales1],
                            &xv,
                            &mut products,
                        );
                    }
                    // Each group's products, [r0t0 r0t1 r1t0 r1t1 | r0t2 r0t3 r1t2 r1t3].
                    let mut paired = [_mm256_setzero_si256(); GROUPS];
                    for g in 0..GROUPS {
                        paired[g] = _mm256_hadd_epi32(products[0][g], products[1][g]);
                    }
                    // Each row's eight mins against each token's eight sums, then the f32
                    // operations of token_groups, two groups at a time.
                    let mins16 = [
                        _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins0 as i64))),
                        _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins1 as i64))),
                    ];
                    let (d, neg_dmin) = (quad_rows(d0, d1), quad_rows(-dmin0, -dmin1));
                    for (q, acc) in acc.iter_mut().enumerate().take(quads) {
                        let (g, second) = (2 * q, 2 * q + 1 < GROUPS);
                        let first_sums = _mm512_loadu_si512(sums.add((g * n_sb + sb) * GROUP * SUBS).cast());
                        let second_sums = if second {
                            _mm512_loadu_si512(sums.add(((g + 1) * n_sb + sb) * GROUP * SUBS).cast())
                        } else {
                            _mm512_setzero_si512()
                        };
                        let m = quad_sums([
                            _mm512_madd_epi16(first_sums, mins16[0]),
                            _mm512_madd_epi16(first_sums, mins16[1]),
                            _mm512_madd_epi16(second_sums, mins16[0]),
                            _mm512_madd_epi16(second_sums, mins16[1]),
                        ]);
                        let p = quad_products(paired[g], if second { paired[g + 1] } else { _mm256_setzero_si256() });
                        let dx = quad_scales(scales, n_sb, sb, g, second);
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d, dx), *acc);
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(neg_dmin, dx), *acc);
                    }
                }
                for q in 0..quads {
                    _mm512_storeu_ps(pair_totals[q].as_mut_ptr(), acc[q]);
                }
            }
        }
    }
    write_pair_totals::<GROUPS>(&totals, nt, out);
}

/// Pairs of sub-blocks a super-block has.
const SUB_PAIRS: usize = SUBS / 2;

/// Q4_K's tile two rows at a time at AVX-512, eight tokens to a vector
/// ([`TokenGroups::pair_values`]): a vector holds 8 values of each of eight tokens against the
/// row's 8 weights broadcast, so a sub-block's four runs chain four `dpbusd` into the same
/// lanes (16 products of at most 15·127, within i16) and two pairs' sums pack into one
/// `dpwssd` that applies the scale and leaves one total a token: half the `packs` and `dpwssd`
/// of four tokens to a vector (as [`q6k_super_block_pairs`] takes them), whose lanes hold 8
/// products. On Zen 4 `dpwssd` shares the two multiply pipes that bound this loop with
/// `dpbusd`, and `packs` takes half a slot there. Totals, mins and the f32 operations are
/// [`row_pairs`]' (the same bits), in lanes of one row each.
///
/// # Safety
/// As for [`row_pairs`]; `x` has its [`TokenGroups::pair_values`].
#[inline(always)]
unsafe fn q4k_eight_token_pairs<const PAIRS: usize>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    let halves = PAIRS.div_ceil(2);
    assert!(rows.len().is_multiple_of(2) && rows.end <= w.rows && out_holds(out, rows.len(), nt));
    assert!(nt <= PAIRS * PAIR_TOKENS && t0.is_multiple_of(2 * PAIR_TOKENS));
    let TokenGroups { pair_values, pair_stride, half_sum_pairs, half_scales, .. } = &x.groups;
    let (first_pair, first_half) = (t0 / PAIR_TOKENS, t0 / (2 * PAIR_TOKENS));
    assert!(*pair_stride >= PAIR_TOKENS * w.cols && (first_pair + PAIRS) * pair_stride <= pair_values.len());
    assert!((first_half + halves) * n_sb * 16 <= half_scales.len() && half_sum_pairs.len() == 4 * half_scales.len());
    let lanes = EightTokenLanes {
        sum_pairs: half_sum_pairs[first_half * n_sb * 64..].as_ptr(),
        scales: half_scales[first_half * n_sb * 16..].as_ptr(),
        n_sb,
    };
    // Each row's totals, a vector of 16 tokens each, kept between panels.
    let mut totals = vec![[0f32; 16]; rows.len() * halves];
    // SAFETY: per the contract; every pointer stays inside the rows' super-blocks and the
    // pairs' values (asserted above).
    unsafe {
        let values = pair_values[first_pair * pair_stride..].as_ptr();
        let panel_super_blocks = (PANEL_BYTES / (PAIRS * PAIR_TOKENS * SUPER_BLOCK)).max(1);
        for first_sb in (0..n_sb).step_by(panel_super_blocks) {
            let panel = first_sb..(first_sb + panel_super_blocks).min(n_sb);
            for (pair, row) in rows.clone().step_by(2).enumerate() {
                let row_ptrs = [0, 1].map(|r| w.raw[(row + r) * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr());
                let pair_totals = &mut totals[2 * pair * halves..][..2 * halves];
                let mut acc = [[_mm512_setzero_ps(); 2]; 2];
                for r in 0..2 {
                    for h in 0..halves {
                        acc[r][h] = _mm512_loadu_ps(pair_totals[r * halves + h].as_ptr());
                    }
                }
                for sb in panel.clone() {
                    let blocks = [row_ptrs[0].add(sb * block_bytes), row_ptrs[1].add(sb * block_bytes)];
                    let headers = [header(blocks[0]), header(blocks[1])];
                    let mut xv = [values; PAIRS];
                    for (p, xv) in xv.iter_mut().enumerate() {
                        *xv = values.add(p * pair_stride + sb * PAIR_TOKENS * SUPER_BLOCK);
                    }
                    let products = q4k_eight_token_super_block::<PAIRS>(
                        blocks,
                        w.format.nibbles_at(),
                        [headers[0].2, headers[1].2],
                        &xv,
                    );
                    for (r, &(d, dmin, _, mins)) in headers.iter().enumerate() {
                        // Mins 2k and 2k + 1 as an i16 pair in every lane, against the tokens'
                        // sums of the same two sub-blocks.
                        let mut min_pairs = [_mm512_setzero_si512(); SUB_PAIRS];
                        for (k, min_pair) in min_pairs.iter_mut().enumerate() {
                            let two = mins >> (16 * k);
                            *min_pair = _mm512_set1_epi32((two & 0xff | (two >> 8 & 0xff) << 16) as i32);
                        }
                        for h in 0..halves {
                            let mut m = _mm512_setzero_si512();
                            for (k, min_pair) in min_pairs.iter().enumerate() {
                                m = _mm512_dpwssd_epi32(m, *min_pair, lanes.sum_pairs(sb, h, k));
                            }
                            let dx = lanes.scales(sb, h);
                            let total = &mut acc[r][h];
                            *total = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(products[r][h]),
                                _mm512_mul_ps(_mm512_set1_ps(d), dx),
                                *total,
                            );
                            *total = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(m),
                                _mm512_mul_ps(_mm512_set1_ps(-dmin), dx),
                                *total,
                            );
                        }
                    }
                }
                for r in 0..2 {
                    for h in 0..halves {
                        _mm512_storeu_ps(pair_totals[r * halves + h].as_mut_ptr(), acc[r][h]);
                    }
                }
            }
        }
    }
    for (row, row_totals) in totals.chunks_exact(halves).enumerate() {
        for t in 0..nt {
            out[row * TILE_TOKENS + t] = row_totals[t / 16][eight_token_lane(t % 16)];
        }
    }
}

/// A tile's halves' sub-block sums and scales ([`TokenGroups::half_sum_pairs`] and
/// `half_scales`), from its first half.
struct EightTokenLanes {
    sum_pairs: *const i32,
    scales: *const f32,
    n_sb: usize,
}

impl EightTokenLanes {
    /// Half `h`'s sums of sub-blocks 2k and 2k + 1 in super-block `sb`.
    ///
    /// # Safety
    /// The tile has half `h` (asserted where the pointers are taken); the CPU has avx512f.
    #[inline(always)]
    unsafe fn sum_pairs(&self, sb: usize, h: usize, k: usize) -> __m512i {
        // SAFETY: per the contract.
        unsafe { _mm512_loadu_si512(self.sum_pairs.add(((h * self.n_sb + sb) * SUB_PAIRS + k) * 16).cast()) }
    }

    /// Half `h`'s scales of super-block `sb`.
    ///
    /// # Safety
    /// As for [`sum_pairs`](Self::sum_pairs).
    #[inline(always)]
    unsafe fn scales(&self, sb: usize, h: usize) -> __m512 {
        // SAFETY: per the contract.
        unsafe { _mm512_loadu_ps(self.scales.add((h * self.n_sb + sb) * 16)) }
    }
}

/// Q4_K's products of one super-block of two rows for [`q4k_eight_token_pairs`]: `[row][half]`,
/// lane 4L + 2j + v holding token 8j + 2L + v of the half's two pairs.
///
/// # Safety
/// Each of `blocks` points at a whole Q4_K super-block whose nibbles start `nibbles_at` bytes
/// in; each of `xv` at a pair's 2,048 values of it; the CPU has avx512f, avx512bw and
/// avx512vnni.
#[inline(always)]
unsafe fn q4k_eight_token_super_block<const PAIRS: usize>(
    blocks: [*const u8; 2],
    nibbles_at: usize,
    sub_scales: [u64; 2],
    xv: &[*const i8; PAIRS],
) -> [[__m512i; 2]; 2] {
    // SAFETY: per the contract.
    unsafe {
        let low_nibbles = _mm512_set1_epi8(0x0f);
        let mut products = [[_mm512_setzero_si512(); 2]; 2];
        for sub in 0..SUBS {
            // ints[run][row]: the sub-block's 8 weights from 8·run, broadcast to eight tokens
            // (sub-blocks 2k and 2k + 1 are the low and high nibbles of the same 32 bytes).
            let mut ints = [[_mm512_setzero_si512(); 2]; 4];
            for (run, ints) in ints.iter_mut().enumerate() {
                for (r, ints) in ints.iter_mut().enumerate() {
                    let eight = blocks[r].add(nibbles_at + sub / 2 * 32 + 8 * run) as *const i64;
                    let raw = _mm512_set1_epi64(eight.read_unaligned());
                    let shifted = if sub.is_multiple_of(2) { raw } else { _mm512_srli_epi16::<4>(raw) };
                    *ints = _mm512_and_si512(shifted, low_nibbles);
                }
            }
            let mut scale = [_mm512_setzero_si512(); 2];
            for (scale, row_scales) in scale.iter_mut().zip(sub_scales) {
                *scale = _mm512_set1_epi16(i16::from((row_scales >> (8 * sub)) as u8));
            }
            // s[row][pair]: the pair's eight tokens' sums, two lanes a token.
            let mut s = [[_mm512_setzero_si512(); 4]; 2];
            for (p, xv) in xv.iter().enumerate() {
                for (run, ints) in ints.iter().enumerate() {
                    let a = _mm512_loadu_si512(xv.add((4 * sub + run) * 64).cast());
                    for r in 0..2 {
                        s[r][p] = _mm512_dpbusd_epi32(s[r][p], ints[r], a);
                    }
                }
            }
            for r in 0..2 {
                for h in 0..PAIRS.div_ceil(2) {
                    let packed = _mm512_packs_epi32(s[r][2 * h], s[r][2 * h + 1]);
                    products[r][h] = _mm512_dpwssd_epi32(products[r][h], packed, scale[r]);
                }
            }
        }
        products
    }
}

/// Pairs of groups a tile has at most.
const QUADS: usize = TILE_TOKENS / GROUP / 2;

/// f32 lanes of a pair of groups' totals for two rows: lane 4t + i holds token t's row 0 of
/// the first group (i = 0), row 1 (1), then the second group's rows (2, 3).
const QUAD_LANES: usize = 4 * GROUP;

/// Each pair of rows' totals of a tile's pairs of groups (in [`QUAD_LANES`]) into
/// `out[row · TILE_TOKENS + t]`, for its first `nt` tokens.
fn write_pair_totals<const GROUPS: usize>(totals: &[[f32; QUAD_LANES]], nt: usize, out: &mut [f32]) {
    for (pair, pair_totals) in totals.chunks_exact(GROUPS.div_ceil(2)).enumerate() {
        for r in 0..2 {
            for t in 0..nt {
                let (g, lane) = (t / GROUP, t % GROUP);
                out[(2 * pair + r) * TILE_TOKENS + t] = pair_totals[g / 2][4 * lane + 2 * (g % 2) + r];
            }
        }
    }
}

/// Two rows' values in [`QUAD_LANES`]: `first` for row 0, `second` for row 1.
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn quad_rows(first: f32, second: f32) -> __m512 {
    // SAFETY: per the contract.
    unsafe { _mm512_broadcast_f32x4(_mm_setr_ps(first, second, first, second)) }
}

/// Two groups' products in [`row_pairs`]' lanes ([r0t0 r0t1 r1t0 r1t1 | r0t2 r0t3 r1t2 r1t3]
/// each) in [`QUAD_LANES`].
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn quad_products(first: __m256i, second: __m256i) -> __m512i {
    // SAFETY: per the contract.
    unsafe {
        let order = _mm512_setr_epi32(0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15);
        _mm512_permutexvar_epi32(order, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second))
    }
}

/// Four vectors whose 128-bit lane t holds four sums of token t's, as one vector of their
/// totals in [`QUAD_LANES`]: lane 4t + i holds the total of `v[i]`'s lane t.
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn quad_sums(v: [__m512i; 4]) -> __m512i {
    // SAFETY: per the contract.
    unsafe {
        // [a0+a2 b0+b2 a1+a3 b1+b3], the same of c and d, then each one's total.
        let ab = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
        let cd = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
        _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd))
    }
}

/// The activations' scales of super-block `sb` for groups `g` and (where `second`) `g + 1`
/// in [`QUAD_LANES`] (zeros for a group that is not there).
///
/// # Safety
/// `scales` holds the tile's groups' scales ([`TileGroups`]); the CPU has avx512f.
#[inline(always)]
unsafe fn quad_scales(scales: *const f32, n_sb: usize, sb: usize, g: usize, second: bool) -> __m512 {
    // SAFETY: per the contract.
    unsafe {
        let first = _mm_loadu_ps(scales.add((g * n_sb + sb) * GROUP));
        let other = if second { _mm_loadu_ps(scales.add(((g + 1) * n_sb + sb) * GROUP)) } else { _mm_setzero_ps() };
        let order = _mm512_setr_epi32(0, 0, 16, 16, 1, 1, 17, 17, 2, 2, 18, 18, 3, 3, 19, 19);
        _mm512_permutex2var_ps(_mm512_castps128_ps512(first), order, _mm512_castps128_ps512(other))
    }
}

/// [`sub_block`] of Q5_K for two rows with VNNI, sub-blocks `2·half` and `2·half + 1`
/// together: each row's 32 nibble bytes, loaded once, give both sub-blocks' weights (low
/// nibbles, then high, each with its fifth bit), as four vectors of 8 each; against each
/// group's four runs of a sub-block (loaded once for both rows), summed by `dpbusd` and scaled
/// by `mullo`. (A row in each half of a 512-bit vector, which halves the instructions, measured
/// slower on Zen 4.)
///
/// # Safety
/// Each of `blocks` points at a whole super-block whose nibbles start `nibbles_at` bytes in;
/// each of `xv` at a group's 1,024 values of it; the CPU has avx2, avx512vl and avx512vnni.
#[inline(always)]
unsafe fn sub_block_pairs<const GROUPS: usize>(
    half: usize,
    blocks: [*const u8; 2],
    nibbles_at: usize,
    sub_scales: [u64; 2],
    xv: &[*const i8; GROUPS],
    products: &mut [[__m256i; GROUPS]; 2],
) {
    // SAFETY: per the contract.
    unsafe {
        let low_nibbles = _mm256_set1_epi8(0x0f);
        // ints[sub][row][j]: eight weights of sub-block 2·half + sub, broadcast.
        let mut ints = [[[_mm256_setzero_si256(); 4]; 2]; 2];
        for r in 0..2 {
            for j in 0..4 {
                let eight = blocks[r].add(nibbles_at + half * 32 + 8 * j) as *const i64;
                let raw = _mm256_set1_epi64x(eight.read_unaligned());
                ints[0][r][j] = _mm256_and_si256(raw, low_nibbles);
                ints[1][r][j] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low_nibbles);
                // Bits 2·half and 2·half + 1 of each byte of the fifth bits, to bit 4.
                let high = _mm256_set1_epi64x((blocks[r].add(16 + 8 * j) as *const i64).read_unaligned());
                for (sub, ints) in ints.iter_mut().enumerate() {
                    let shift = _mm_cvtsi32_si128((2 * half + sub) as i32);
                    let bit = _mm256_and_si256(_mm256_srl_epi16(high, shift), _mm256_set1_epi8(1));
                    ints[r][j] = _mm256_or_si256(ints[r][j], _mm256_slli_epi16::<4>(bit));
                }
            }
        }
        for (sub, ints) in ints.iter().enumerate() {
            let at = 2 * half + sub;
            let scale = [
                _mm256_set1_epi32(i32::from((sub_scales[0] >> (8 * at)) as u8)),
                _mm256_set1_epi32(i32::from((sub_scales[1] >> (8 * at)) as u8)),
            ];
            for g in 0..GROUPS {
                let runs = xv[g].add(at * 4 * 32);
                let mut a = [_mm256_setzero_si256(); 4];
                for (j, a) in a.iter_mut().enumerate() {
                    *a = _mm256_loadu_si256(runs.add(32 * j).cast());
                }
                for r in 0..2 {
                    let mut s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ints[r][0], a[0]);
                    s = _mm256_dpbusd_epi32(s, ints[r][1], a[1]);
                    s = _mm256_dpbusd_epi32(s, ints[r][2], a[2]);
                    s = _mm256_dpbusd_epi32(s, ints[r][3], a[3]);
                    products[r][g] = _mm256_add_epi32(products[r][g], _mm256_mullo_epi32(s, scale[r]));
                }
            }
        }
    }
}

/// 16 weight bytes from `at` as a 512-bit vector against two of a group's runs side by side:
/// bytes 0–7 broadcast to the first run's four tokens, bytes 8–15 to the second's.
///
/// # Safety
/// `at` points at 16 readable bytes; the CPU has avx512f and avx512bw.
#[inline(always)]
unsafe fn spread_runs(at: *const u8) -> __m512i {
    // SAFETY: per the contract.
    unsafe {
        let halves = _mm512_set_epi64(
            0x0f0e0d0c0b0a0908,
            0x0f0e0d0c0b0a0908,
            0x0f0e0d0c0b0a0908,
            0x0f0e0d0c0b0a0908,
            0x0706050403020100,
            0x0706050403020100,
            0x0706050403020100,
            0x0706050403020100,
        );
        _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(at.cast())), halves)
    }
}

/// Two rows' products of pairs of groups, 128-bit lanes [g0t0 g0t1 g1t0 g1t1],
/// [g0t2 g0t3 g1t2 g1t3] and the same again for other values, as each group's
/// [r0t0 r0t1 r1t0 r1t1 | r0t2 r0t3 r1t2 r1t3].
///
/// # Safety
/// The CPU has avx2 and avx512f.
#[inline(always)]
unsafe fn pair_lanes<const GROUPS: usize>(products: &[[__m512i; TILE_TOKENS / GROUP / 2]; 2]) -> [__m256i; GROUPS] {
    // SAFETY: per the contract.
    unsafe {
        let mut folded = [[_mm256_setzero_si256(); TILE_TOKENS / GROUP / 2]; 2];
        for r in 0..2 {
            for (p, folded) in folded[r].iter_mut().enumerate() {
                let p = products[r][p];
                *folded = _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64::<1>(p));
            }
        }
        let mut paired = [_mm256_setzero_si256(); GROUPS];
        for (g, paired) in paired.iter_mut().enumerate() {
            let (p0, p1) = (folded[0][g / 2], folded[1][g / 2]);
            *paired = if g.is_multiple_of(2) { _mm256_unpacklo_epi64(p0, p1) } else { _mm256_unpackhi_epi64(p0, p1) };
        }
        paired
    }
}

/// Q6_K's [`row_pairs`]: two rows at a time, in 512-bit vectors whose lanes [`pair_lanes`]
/// reads. A 32-value chunk's two 16-value spans, each with its own
/// scale, take a `dpbusd` each (i32 lanes of 4 products of at most 63·127, which fit in i16),
/// and two groups' sums of a span pack into one vector that `dpwssd` scales by the span's
/// scale. The −32 of every value comes from the groups' sums over 16 values, as in
/// [`q6k_token_groups`], whose integer totals and f32 operations these are.
///
/// # Safety
/// As for [`row_pairs`].
#[inline(always)]
unsafe fn q6k_row_pairs<const GROUPS: usize>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    assert!(rows.len().is_multiple_of(2) && rows.end <= w.rows && out_holds(out, rows.len(), nt));
    let TileGroups { values, stride, sums, scales } =
        TileGroups::new(x, w.cols, t0, GROUPS, &x.groups.sixteen_sums, Q6K_SPAN);
    let quads = GROUPS.div_ceil(2);
    let mut totals = vec![[0f32; QUAD_LANES]; rows.len() / 2 * quads];
    // SAFETY: per the contract; every pointer stays inside the rows' super-blocks and the
    // groups' values, sums and scales (asserted above and by `TileGroups::new`).
    unsafe {
        let panel_super_blocks = (PANEL_BYTES / (GROUPS * GROUP * SUPER_BLOCK)).max(1);
        for first_sb in (0..n_sb).step_by(panel_super_blocks) {
            let panel = first_sb..(first_sb + panel_super_blocks).min(n_sb);
            for (pair, row) in rows.clone().step_by(2).enumerate() {
                let row_ptrs = [0, 1].map(|r| w.raw[(row + r) * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr());
                let pair_totals = &mut totals[pair * quads..][..quads];
                let mut acc = [_mm512_setzero_ps(); QUADS];
                for q in 0..quads {
                    acc[q] = _mm512_loadu_ps(pair_totals[q].as_ptr());
                }
                for sb in panel.clone() {
                    let blocks = [row_ptrs[0].add(sb * block_bytes), row_ptrs[1].add(sb * block_bytes)];
                    let mut xv = [values; GROUPS];
                    for (g, xv) in xv.iter_mut().enumerate() {
                        *xv = values.add(g * stride + sb * GROUP * SUPER_BLOCK);
                    }
                    let paired = q6k_super_block_pairs::<GROUPS>(blocks, &xv);
                    // Each row's sixteen scales, twice: against two tokens' sixteen sums.
                    let mut scales16 = [_mm512_setzero_si512(); 2];
                    let mut d = [0f32; 2];
                    for r in 0..2 {
                        let row_scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(blocks[r].add(192).cast()));
                        scales16[r] = _mm512_broadcast_i64x4(row_scales);
                        d[r] = f16_value(f16::from_bits((blocks[r].add(208) as *const u16).read_unaligned()));
                    }
                    let d = quad_rows(d[0], d[1]);
                    for (q, acc) in acc.iter_mut().enumerate().take(quads) {
                        let (g, second) = (2 * q, 2 * q + 1 < GROUPS);
                        // The −32 of every value: each span's scale times its sum, a row and group
                        // at a time, as 128-bit lanes [t0 t1 t2 t3] of four partial sums.
                        let mut m = [_mm512_setzero_si512(); 4];
                        for k in 0..1 + usize::from(second) {
                            let group_sums = sums.add(((g + k) * n_sb + sb) * GROUP * 16);
                            // Tokens 0–1's sixteen sums each, then tokens 2–3's.
                            let (early, late) =
                                (_mm512_loadu_si512(group_sums.cast()), _mm512_loadu_si512(group_sums.add(32).cast()));
                            for r in 0..2 {
                                let (early, late) =
                                    (_mm512_madd_epi16(early, scales16[r]), _mm512_madd_epi16(late, scales16[r]));
                                m[2 * k + r] = _mm512_add_epi32(
                                    _mm512_shuffle_i64x2::<0b10_00_10_00>(early, late),
                                    _mm512_shuffle_i64x2::<0b11_01_11_01>(early, late),
                                );
                            }
                        }
                        let p = quad_products(paired[g], if second { paired[g + 1] } else { _mm256_setzero_si256() });
                        let total = _mm512_sub_epi32(p, _mm512_slli_epi32::<5>(quad_sums(m)));
                        let dx = quad_scales(scales, n_sb, sb, g, second);
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, dx), *acc);
                    }
                }
                for q in 0..quads {
                    _mm512_storeu_ps(pair_totals[q].as_mut_ptr(), acc[q]);
                }
            }
        }
    }
    write_pair_totals::<GROUPS>(&totals, nt, out);
}

/// Q6_K's unsigned products (before the −32) of one super-block of two rows, each group's in
/// [`row_pairs`]' lanes (by way of [`pair_lanes`]): one load holds two of a group's runs (runs
/// 2k and 2k + 1 lie side by side), against the row's 16 values as [8 broadcast to four tokens
/// | the next 8 likewise].
///
/// # Safety
/// Each of `blocks` points at a whole Q6_K super-block; each of `xv` at a group's 1,024 values
/// of it; the CPU has avx2, avx512f, avx512bw and avx512vnni.
#[inline(always)]
unsafe fn q6k_super_block_pairs<const GROUPS: usize>(
    blocks: [*const u8; 2],
    xv: &[*const i8; GROUPS],
) -> [__m256i; GROUPS] {
    // SAFETY: per the contract.
    unsafe {
        let (low_nibbles, high_pair) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
        let mut products = [[_mm512_setzero_si512(); TILE_TOKENS / GROUP / 2]; 2];
        for chunk in 0..SUPER_BLOCK / 32 {
            // Chunk 4h + k: nibble k / 2 of the low bits at 64h + 32·(k % 2), bit pair k of the
            // high bits at 128 + 32h (as q6k_one_token unpacks them).
            let (h, k) = (chunk / 4, chunk % 4);
            let mut ints = [[_mm512_setzero_si512(); 2]; 2];
            let mut scale = [[_mm512_setzero_si512(); 2]; 2];
            for r in 0..2 {
                for span in 0..2 {
                    let low = spread_runs(blocks[r].add(64 * h + 32 * (k % 2) + 16 * span));
                    let high = spread_runs(blocks[r].add(128 + 32 * h + 16 * span));
                    let nibbles = _mm512_and_si512(if k < 2 { low } else { _mm512_srli_epi16::<4>(low) }, low_nibbles);
                    let pair = match k {
                        0 => _mm512_slli_epi16::<4>(high),
                        1 => _mm512_slli_epi16::<2>(high),
                        2 => high,
                        _ => _mm512_srli_epi16::<2>(high),
                    };
                    ints[r][span] = _mm512_or_si512(nibbles, _mm512_and_si512(pair, high_pair));
                    scale[r][span] = _mm512_set1_epi16(i16::from(*blocks[r].add(192 + 2 * chunk + span) as i8));
                }
            }
            for pair in 0..GROUPS.div_ceil(2) {
                let mut a = [[_mm512_setzero_si512(); 2]; 2];
                for (g, a) in a.iter_mut().enumerate() {
                    if 2 * pair + g < GROUPS {
                        let runs = xv[2 * pair + g].add(chunk * 4 * 32);
                        for (span, a) in a.iter_mut().enumerate() {
                            *a = _mm512_loadu_si512(runs.add(64 * span).cast());
                        }
                    }
                }
                for r in 0..2 {
                    for span in 0..2 {
                        let mut s = [_mm512_setzero_si512(); 2];
                        for (g, s) in s.iter_mut().enumerate() {
                            if 2 * pair + g < GROUPS {
                                *s = _mm512_dpbusd_epi32(*s, ints[r][span], a[g][span]);
                            }
                        }
                        let packed = _mm512_packs_epi32(s[0], s[1]);
                        products[r][pair] = _mm512_dpwssd_epi32(products[r][pair], packed, scale[r][span]);
                    }
                }
            }
        }
        pair_lanes::<GROUPS>(&products)
    }
}

/// Q6_K's [`token_groups`]: each 16-value span's two runs of 8 (each broadcast against a
/// group's four tokens) add in i16 (at most 2·2·63·127 < 2¹⁵) before one `madd` applies the
/// span's scale; the −32 comes from the groups' sums over 16 values.
#[inline(always)]
unsafe fn q6k_token_groups<const GROUPS: usize>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let n_sb = w.super_blocks_per_row();
    let block_bytes = w.format.block_bytes();
    let TileGroups { values, stride, sums, scales } =
        TileGroups::new(x, w.cols, t0, GROUPS, &x.groups.sixteen_sums, Q6K_SPAN);
    let mut totals = vec![[0f32; GROUP]; rows.len() * GROUPS];
    // SAFETY: the caller has avx2, fma and f16c; every pointer stays inside the row's
    // super-blocks and the groups' values, sums and scales (asserted by `TileGroups::new` and
    // by the caller).
    unsafe {
        let (low_nibbles, low_pairs) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
        let panel_super_blocks = (PANEL_BYTES / (GROUPS * GROUP * SUPER_BLOCK)).max(1);
        for first_sb in (0..n_sb).step_by(panel_super_blocks) {
            let panel = first_sb..(first_sb + panel_super_blocks).min(n_sb);
            for row in rows.clone() {
                let row_ptr = w.raw[row * n_sb * block_bytes..][..n_sb * block_bytes].as_ptr();
                let row_totals = &mut totals[(row - rows.start) * GROUPS..][..GROUPS];
                let mut acc = [_mm_setzero_ps(); GROUPS];
                for g in 0..GROUPS {
                    acc[g] = _mm_loadu_ps(row_totals[g].as_ptr());
                }
                for sb in panel.clone() {
                    let block = row_ptr.add(sb * block_bytes);
                    let mut products = [_mm256_setzero_si256(); GROUPS];
                    for quarter in 0..SUPER_BLOCK / 32 {
                        // Values 32·quarter.. from one load of their low bits and one of their
                        // high bits, then each 8 of them broadcast to the four tokens' quarters.
                        let (h, k) = (quarter / 4, quarter % 4);
                        let low = _mm256_loadu_si256(block.add(64 * h + 32 * (k % 2)).cast());
                        let high = _mm256_loadu_si256(block.add(128 + 32 * h).cast());
                        let nibbles =
                            _mm256_and_si256(_mm256_srl_epi16(low, _mm_cvtsi32_si128(4 * (k / 2) as i32)), low_nibbles);
                        let pairs =
                            _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * k as i32)), low_pairs);
                        let all = _mm256_or_si256(nibbles, _mm256_slli_epi16::<4>(pairs));
                        let ints = [
                            _mm256_permute4x64_epi64::<0x00>(all),
                            _mm256_permute4x64_epi64::<0x55>(all),
                            _mm256_permute4x64_epi64::<0xaa>(all),
                            _mm256_permute4x64_epi64::<0xff>(all),
                        ];
                        for half in 0..2 {
                            // Runs 2·span and 2·span+1: the span's 16 values of each token.
                            let span = 2 * quarter + half;
                            let scale = _mm256_set1_epi16(i16::from(*block.add(192 + span) as i8));
                            for (g, products) in products.iter_mut().enumerate() {
                                let runs = values.add(g * stride + sb * GROUP * SUPER_BLOCK + 2 * span * 32);
                                let sum16 = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(ints[2 * half], _mm256_loadu_si256(runs.cast())),
                                    _mm256_maddubs_epi16(ints[2 * half + 1], _mm256_loadu_si256(runs.add(32).cast())),
                                );
                                *products = _mm256_add_epi32(*products, _mm256_madd_epi16(sum16, scale));
                            }
                        }
                    }
                    let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(block.add(192).cast()));
                    let d = f16_value(f16::from_bits((block.add(208) as *const u16).read_unaligned()));
                    for g in 0..GROUPS {
                        let at = g * n_sb + sb;
                        // products: [t0 t0 t1 t1 | t2 t2 t3 t3] → [t0 t1 t2 t3]
                        let halves = _mm256_hadd_epi32(products[g], products[g]);
                        let p =
                            _mm_unpacklo_epi64(_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves));
                        // Each token's sixteen sums times the scales, reduced to [t0 t1 t2 t3].
                        let group_sums = sums.add(at * GROUP * 16);
                        let mut offsets = [_mm256_setzero_si256(); GROUP];
                        for (t, offsets) in offsets.iter_mut().enumerate() {
                            *offsets = _mm256_madd_epi16(scales16, _mm256_loadu_si256(group_sums.add(16 * t).cast()));
                        }
                        let both = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(offsets[0], offsets[1]),
                            _mm256_hadd_epi32(offsets[2], offsets[3]),
                        );
                        let m = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256::<1>(both));
                        let total = _mm_sub_epi32(p, _mm_slli_epi32::<5>(m));
                        let dx = _mm_loadu_ps(scales.add(at * GROUP));
                        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(total), _mm_mul_ps(_mm_set1_ps(d), dx), acc[g]);
                    }
                }
                for g in 0..GROUPS {
                    _mm_storeu_ps(row_totals[g].as_mut_ptr(), acc[g]);
                }
            }
        }
    }
    write_totals::<GROUPS>(&totals, nt, out);
}
