//! The K-quant products at x86-64-v3 (AVX2, FMA, F16C), which every x86 level runs (AVX-512
//! the same instructions, with 32 registers). Each sub-block's 6-bit scale multiplies its
//! `maddubs` pairs in `madd`, so a super-block's products add up exactly in i32 lanes; its mins
//! meet the activations' sums in one more `madd`.
//!
//! One token (decode) streams each row once, a 32-value sub-block a vector. A tile of tokens
//! goes four at a time ([`token_groups`]): a vector holds 8 values of each of four tokens and the
//! row's 8 values broadcast against them, so the four `maddubs` of a sub-block add in i16 (at
//! most 8·31·127 < 2¹⁵) before one `madd` applies its scale, where a vector a sub-block needs a
//! `madd` for each. VNNI would not help: its i32 sums would still need the scale, a slower
//! `mullo` (measured: no faster on Zen 4).

use super::super::k_quant::{
    scales_and_mins, KQuantFormat, KQuantMatrix, SuperBlockActivations, GROUP, SUM_SPAN, SUPER_BLOCK, TILE_TOKENS,
};
use super::avx2::{hsum_i32, hsum_i32_128};
use super::{f16_value, prefetch_ahead};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

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

/// [`dot_rows`] with the same instructions, EVEX-encoded: AVX-512VL gives the compiler 32
/// vector registers, where a tile's products and a sub-block's weights spill from 16.
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw and avx512vl.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn dot_rows_avx512(
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
        x.qs.len() >= x.n * x.cols && x.d.len() * SUPER_BLOCK >= x.qs.len() && x.sums.len() * SUM_SPAN >= x.qs.len()
    );
    // SAFETY (every arm): features per this function's contract; bounds asserted above.
    unsafe {
        match (w.format, nt) {
            (KQuantFormat::Q4K, 1) => one_token::<false>(w, rows, x, t0, out),
            (KQuantFormat::Q5K, 1) => one_token::<true>(w, rows, x, t0, out),
            (KQuantFormat::Q4K, 2..=4) => token_groups::<1, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 2..=4) => token_groups::<1, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, 5..=8) => token_groups::<2, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 5..=8) => token_groups::<2, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, 9..=12) => token_groups::<3, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, 9..=12) => token_groups::<3, true>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q4K, _) => token_groups::<4, false>(w, rows, x, t0, nt, out),
            (KQuantFormat::Q5K, _) => token_groups::<4, true>(w, rows, x, t0, nt, out),
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
    let first_group = t0 / GROUP;
    assert!(t0.is_multiple_of(GROUP) && (first_group + GROUPS) * GROUP * w.cols <= x.groups.values.len());
    assert!(
        x.groups.sums.len() * SUM_SPAN == x.groups.values.len()
            && x.groups.scales.len() * SUPER_BLOCK == x.groups.values.len()
    );
    let values = x.groups.values[first_group * GROUP * w.cols..].as_ptr();
    let sums = x.groups.sums[first_group * GROUP * w.cols / SUM_SPAN..].as_ptr();
    let scales = x.groups.scales[first_group * GROUP * n_sb..].as_ptr();
    // Each row's four totals a group, kept between panels.
    let mut totals = vec![[0f32; GROUP]; rows.len() * GROUPS];
    // SAFETY: the caller has avx2, fma and f16c; every pointer stays inside the row's
    // super-blocks and the groups' values, sums and scales (asserted above and by the caller).
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
                        std::array::from_fn(|g| values.add((g * n_sb + sb) * GROUP * SUPER_BLOCK));
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
    for (row, row_totals) in totals.chunks_exact(GROUPS).enumerate() {
        for t in 0..nt {
            out[row * TILE_TOKENS + t] = row_totals[t / GROUP][t % GROUP];
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
