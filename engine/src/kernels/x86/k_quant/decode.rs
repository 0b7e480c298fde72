//! Decode's K-quant products: one token against four rows a pass. Q4_K takes its passes in
//! 256-bit vectors at every x86 level ([`Lanes256`]) and in 512-bit ones at AVX-512 with VNNI
//! ([`Lanes512`]); Q6_K at AVX-512 ([`q6k_rows`]), and a row at a time below it
//! ([`q6k_one_row`]).
//!
//! A row alone pays, each super-block, a horizontal sum of its integer products and scalar
//! FMAs; four rows reduce their totals together into one vector of row lanes and take the f32
//! operations lane by lane, each lane the same operations in the same order as a row alone (so
//! the bits are those of every other kernel), and each load of the token's values serves the
//! four. The pass's rows lie one after another in memory, so each super-block asks for the
//! matching part of the next pass, one sequential stream a pass ahead ([`prefetch_next_pass`]).
//!
//! At 512 bits a Q4_K load of 64 bytes holds four sub-blocks' nibbles (low nibbles
//! [2k | 2k + 2], high [2k + 1 | 2k + 3]) against the token's values paired the same way; a
//! Q6_K load of a half's 64 low-bit bytes, with its high bits shifted per 256-bit half, gives
//! 64 consecutive values. Each `dpbusd` lane then sums 4 products of at most 63·127, which fit
//! in i16, so two vectors pack into one that `dpwssd` scales by sub-block or span.

use super::super::super::k_quant::{
    scales_and_mins, KQuantFormat, KQuantMatrix, SuperBlockActivations, Q6K_SPAN, SUM_SPAN, SUPER_BLOCK, TILE_TOKENS,
};
use super::super::avx2::hsum_i32;
use super::super::{f16_value, prefetch_ahead, prefetch_next_pass};
use super::{one_token, quad_sums, SUBS};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

/// Rows a pass takes.
const PASS_ROWS: usize = 4;

// The rows a task hands the kernel come in whole passes, none left to the one-row loop.
const _: () = assert!(super::super::super::matrix::PASS_ROWS.is_multiple_of(PASS_ROWS));

/// Q6_K's 16-value spans in a super-block.
const SPANS: usize = SUPER_BLOCK / Q6K_SPAN;

/// How a pass reads one row's super-block at one vector width.
///
/// # Safety
/// Each function needs the CPU features its width names: avx2 for [`Lanes256`]; avx2, avx512f,
/// avx512bw and avx512vnni for [`Lanes512`].
pub(super) trait PassWidth {
    /// The token's values of a Q4_K super-block as the rows read them.
    type Q4kValues;
    /// A row's integer products, in i32 lanes whose sum is the row's.
    type Products: Copy;

    /// # Safety
    /// `xb` points at a super-block of the token's values; the CPU has the width's features.
    unsafe fn q4k_values(xb: *const i8) -> Self::Q4kValues;

    /// A Q4_K super-block's products with the token's values, each sub-block's times its
    /// scale (`scales`: the eight, a byte each).
    ///
    /// # Safety
    /// `block` points at a whole Q4_K super-block; the CPU has the width's features.
    unsafe fn q4k_products(block: *const u8, scales: u64, values: &Self::Q4kValues) -> Self::Products;

    /// Four rows' products as their totals: lane r holds row r's.
    ///
    /// # Safety
    /// The CPU has the width's features.
    unsafe fn totals(rows: [Self::Products; PASS_ROWS]) -> __m128i;
}

/// 256-bit vectors, a 32-value sub-block a vector: every x86 level.
pub(super) struct Lanes256;

/// 512-bit vectors with VNNI.
pub(super) struct Lanes512;

/// Q4_K's one-token products of `rows` with token `t`, into `out[(row - rows.start) ·
/// TILE_TOKENS]`, four rows a pass; rows past the last four take [`one_token`].
///
/// # Safety
/// The CPU has avx2, fma, f16c and the width's features; `w` is Q4_K.
#[inline(always)]
pub(super) unsafe fn q4k_rows<W: PassWidth>(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t: usize,
    out: &mut [f32],
) {
    assert!(w.format == KQuantFormat::Q4K && rows.end <= w.rows && t < x.n && x.cols == w.cols);
    assert!(out.len() >= rows.len() * TILE_TOKENS && w.raw.len() >= w.rows * w.row_bytes());
    assert!(
        x.qs.len() >= x.n * x.cols && x.d.len() * SUPER_BLOCK >= x.qs.len() && x.sums.len() * SUM_SPAN >= x.qs.len()
    );
    let n_sb = w.super_blocks_per_row();
    let (block_bytes, row_bytes) = (w.format.block_bytes(), w.row_bytes());
    let xq = x.qs[t * w.cols..][..w.cols].as_ptr();
    let xd = &x.d[t * n_sb..][..n_sb];
    let xs = x.sums[t * n_sb * SUBS..][..n_sb * SUBS].as_ptr();
    let whole = rows.start..rows.start + rows.len() / PASS_ROWS * PASS_ROWS;
    // SAFETY: features per the contract; every pointer stays inside the rows' super-blocks and
    // the token's values and sums (asserted above).
    unsafe {
        for first in whole.clone().step_by(PASS_ROWS) {
            let row_ptrs = pass_rows(w, first);
            let mut acc = _mm_setzero_ps();
            for (sb, &dx) in xd.iter().enumerate() {
                let values = W::q4k_values(xq.add(sb * SUPER_BLOCK));
                let sums = _mm_loadu_si128(xs.add(sb * SUBS).cast());
                let at = sb * block_bytes;
                prefetch_next_pass(row_ptrs[0], at, block_bytes, row_bytes, PASS_ROWS);
                // Written out row by row: a loop here is kept as one, its vectors spilled.
                let (p0, m0, h0) = q4k_row::<W>(row_ptrs[0].add(at), &values, sums);
                let (p1, m1, h1) = q4k_row::<W>(row_ptrs[1].add(at), &values, sums);
                let (p2, m2, h2) = q4k_row::<W>(row_ptrs[2].add(at), &values, sums);
                let (p3, m3, h3) = q4k_row::<W>(row_ptrs[3].add(at), &values, sums);
                let p = W::totals([p0, p1, p2, p3]);
                let m = _mm_hadd_epi32(_mm_hadd_epi32(m0, m1), _mm_hadd_epi32(m2, m3));
                // [d0 dmin0 d1 dmin1 …] as [d0 d1 d2 d3 | dmin0 dmin1 dmin2 dmin3].
                let d_dmin = _mm256_cvtph_ps(_mm_setr_epi32(h0, h1, h2, h3));
                let d_dmin = _mm256_permutevar8x32_ps(d_dmin, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
                let dx = _mm_set1_ps(dx);
                let (d, dmin) = (_mm256_castps256_ps128(d_dmin), _mm256_extractf128_ps::<1>(d_dmin));
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(p), _mm_mul_ps(d, dx), acc);
                // −m·(dmin·dx) + acc: one_token's m·(−dmin·dx) + acc to the bit.
                acc = _mm_fnmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(dmin, dx), acc);
            }
            store_pass(acc, &mut out[(first - rows.start) * TILE_TOKENS..]);
        }
        one_token::<false>(w, whole.end..rows.end, x, t, &mut out[whole.len() * TILE_TOKENS..]);
    }
}

/// One row's part of a Q4_K super-block in [`q4k_rows`]: its products, its mins times the
/// token's `sums` over each sub-block, and its d and dmin (two f16 side by side).
///
/// # Safety
/// `block` points at a whole Q4_K super-block; the CPU has avx2 and the width's features.
#[inline(always)]
unsafe fn q4k_row<W: PassWidth>(block: *const u8, values: &W::Q4kValues, sums: __m128i) -> (W::Products, __m128i, i32) {
    // SAFETY: per the contract.
    unsafe {
        let (scales, mins) = scales_and_mins(std::slice::from_raw_parts(block.add(4), 12));
        let products = W::q4k_products(block, scales, values);
        let min_products = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)), sums);
        (products, min_products, (block as *const i32).read_unaligned())
    }
}

/// Q6_K's one-token products at AVX-512 as [`q4k_rows`]; rows past the last four take
/// [`q6k_one_row`]. In 256-bit vectors unpacking the six bits bounds the product, and a pass
/// read 5% slower from memory than a row at a time.
///
/// # Safety
/// The CPU has avx2, fma, f16c, avx512f, avx512bw and avx512vnni; `w` is Q6_K.
#[inline(always)]
pub(super) unsafe fn q6k_rows(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t: usize,
    out: &mut [f32],
) {
    assert!(w.format == KQuantFormat::Q6K && rows.end <= w.rows && t < x.n && x.cols == w.cols);
    assert!(out.len() >= rows.len() * TILE_TOKENS && w.raw.len() >= w.rows * w.row_bytes());
    assert!(x.qs.len() >= x.n * x.cols && x.d.len() * SUPER_BLOCK >= x.qs.len());
    assert!(x.sixteen_sums.len() * Q6K_SPAN >= x.qs.len());
    let n_sb = w.super_blocks_per_row();
    let (block_bytes, row_bytes) = (w.format.block_bytes(), w.row_bytes());
    let xq = x.qs[t * w.cols..][..w.cols].as_ptr();
    let xd = &x.d[t * n_sb..][..n_sb];
    let xs = x.sixteen_sums[t * n_sb * SPANS..][..n_sb * SPANS].as_ptr();
    let whole = rows.start..rows.start + rows.len() / PASS_ROWS * PASS_ROWS;
    // SAFETY: features per the contract; every pointer stays inside the rows' super-blocks and
    // the token's values and sums (asserted above).
    unsafe {
        for first in whole.clone().step_by(PASS_ROWS) {
            let row_ptrs = pass_rows(w, first);
            let mut acc = _mm_setzero_ps();
            for (sb, &dx) in xd.iter().enumerate() {
                let xb = xq.add(sb * SUPER_BLOCK);
                // Written out: a closure around an intrinsic does not take this function's features.
                let values = [
                    _mm512_loadu_si512(xb.cast()),
                    _mm512_loadu_si512(xb.add(64).cast()),
                    _mm512_loadu_si512(xb.add(128).cast()),
                    _mm512_loadu_si512(xb.add(192).cast()),
                ];
                let sums = _mm256_loadu_si256(xs.add(sb * SPANS).cast());
                let at = sb * block_bytes;
                prefetch_next_pass(row_ptrs[0], at, block_bytes, row_bytes, PASS_ROWS);
                // Written out row by row, as in q4k_rows.
                let p0 = q6k_products_512(row_ptrs[0].add(at), &values, sums);
                let p1 = q6k_products_512(row_ptrs[1].add(at), &values, sums);
                let p2 = q6k_products_512(row_ptrs[2].add(at), &values, sums);
                let p3 = q6k_products_512(row_ptrs[3].add(at), &values, sums);
                let p = Lanes512::totals([p0, p1, p2, p3]);
                let d = _mm_setr_epi16(
                    q6k_d(row_ptrs[0].add(at)),
                    q6k_d(row_ptrs[1].add(at)),
                    q6k_d(row_ptrs[2].add(at)),
                    q6k_d(row_ptrs[3].add(at)),
                    0,
                    0,
                    0,
                    0,
                );
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(p), _mm_mul_ps(_mm_cvtph_ps(d), _mm_set1_ps(dx)), acc);
            }
            store_pass(acc, &mut out[(first - rows.start) * TILE_TOKENS..]);
        }
        q6k_one_row(w, whole.end..rows.end, x, t, &mut out[whole.len() * TILE_TOKENS..]);
    }
}

/// A Q6_K super-block's d, as f16 bits.
///
/// # Safety
/// `block` points at a whole Q6_K super-block.
#[inline(always)]
unsafe fn q6k_d(block: *const u8) -> i16 {
    // SAFETY: the super-block's last two bytes, per the contract.
    unsafe { (block.add(208) as *const i16).read_unaligned() }
}

/// Q6_K's one-token products a row at a time, at every x86 level and for the rows a pass
/// leaves: each super-block's [`q6k_products_256`] in one horizontal sum and one scalar FMA.
///
/// # Safety
/// The CPU has avx2, fma and f16c; `w` is Q6_K.
#[inline(always)]
pub(super) unsafe fn q6k_one_row(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t: usize,
    out: &mut [f32],
) {
    assert!(w.format == KQuantFormat::Q6K && rows.end <= w.rows && t < x.n && x.cols == w.cols);
    assert!(out.len() >= rows.len() * TILE_TOKENS && w.raw.len() >= w.rows * w.row_bytes());
    assert!(x.qs.len() >= x.n * x.cols && x.d.len() * SUPER_BLOCK >= x.qs.len());
    assert!(x.sixteen_sums.len() * Q6K_SPAN >= x.qs.len());
    let n_sb = w.super_blocks_per_row();
    let (block_bytes, row_bytes) = (w.format.block_bytes(), w.row_bytes());
    let xq = x.qs[t * w.cols..][..w.cols].as_ptr();
    let xd = &x.d[t * n_sb..][..n_sb];
    let xs = x.sixteen_sums[t * n_sb * SPANS..][..n_sb * SPANS].as_ptr();
    // SAFETY: features per the contract; every pointer stays inside the row's super-blocks and
    // the token's values and sums (asserted above).
    unsafe {
        for row in rows.clone() {
            let row_ptr = w.raw[row * row_bytes..][..row_bytes].as_ptr();
            let mut acc = 0f32;
            for (sb, &dx) in xd.iter().enumerate() {
                let block = row_ptr.add(sb * block_bytes);
                prefetch_ahead(row_ptr, sb * block_bytes, block_bytes);
                let sums = _mm256_loadu_si256(xs.add(sb * SPANS).cast());
                let total = q6k_products_256(block, xq.add(sb * SUPER_BLOCK), sums);
                let d = f16_value(f16::from_bits(q6k_d(block) as u16));
                acc = (hsum_i32(total) as f32).mul_add(d * dx, acc);
            }
            out[(row - rows.start) * TILE_TOKENS] = acc;
        }
    }
}

impl PassWidth for Lanes256 {
    /// Read in place: a sub-block's 32 values a load, as the rows need them.
    type Q4kValues = *const i8;
    type Products = __m256i;

    #[inline(always)]
    unsafe fn q4k_values(xb: *const i8) -> *const i8 {
        xb
    }

    /// Each sub-block's `maddubs` pairs times its scale in `madd`.
    #[inline(always)]
    unsafe fn q4k_products(block: *const u8, scales: u64, xb: &*const i8) -> __m256i {
        // SAFETY: per the contract.
        unsafe {
            let low_nibbles = _mm256_set1_epi8(0x0f);
            // Sub-block b's scale in every i16 lane of its own vector.
            let scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)));
            let nibbles = block.add(KQuantFormat::Q4K.nibbles_at());
            let mut products = _mm256_setzero_si256();
            for b in 0..SUBS {
                let pair = _mm256_loadu_si256(nibbles.add(b / 2 * 32).cast());
                let ints = if b.is_multiple_of(2) {
                    _mm256_and_si256(pair, low_nibbles)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(pair), low_nibbles)
                };
                let scale = _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(0x0100 + 0x0202 * b as i16));
                let pairs = _mm256_maddubs_epi16(ints, _mm256_loadu_si256(xb.add(32 * b).cast()));
                products = _mm256_add_epi32(products, _mm256_madd_epi16(pairs, scale));
            }
            products
        }
    }

    #[inline(always)]
    unsafe fn totals(rows: [__m256i; PASS_ROWS]) -> __m128i {
        // SAFETY: per the contract.
        unsafe {
            // [r0 r1 r2 r3 | r0 r1 r2 r3], each a half of its row's lanes.
            let halves = _mm256_hadd_epi32(_mm256_hadd_epi32(rows[0], rows[1]), _mm256_hadd_epi32(rows[2], rows[3]));
            _mm_add_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves))
        }
    }
}

impl PassWidth for Lanes512 {
    /// Sub-blocks [0 | 2], [1 | 3], [4 | 6] and [5 | 7], as a row's nibbles lie.
    type Q4kValues = [__m512i; 4];
    type Products = __m512i;

    #[inline(always)]
    unsafe fn q4k_values(xb: *const i8) -> [__m512i; 4] {
        // SAFETY: per the contract.
        unsafe {
            [
                side_by_side(xb, xb.add(64)),
                side_by_side(xb.add(32), xb.add(96)),
                side_by_side(xb.add(128), xb.add(192)),
                side_by_side(xb.add(160), xb.add(224)),
            ]
        }
    }

    /// Each load's low and high nibbles in a `dpbusd` from zero, packed to i16 and scaled by
    /// sub-block in `dpwssd`.
    #[inline(always)]
    unsafe fn q4k_products(block: *const u8, scales: u64, values: &[__m512i; 4]) -> __m512i {
        // SAFETY: per the contract.
        unsafe {
            let low_nibbles = _mm512_set1_epi8(0x0f);
            let scales = _mm512_set1_epi64(scales as i64);
            let nibbles = block.add(KQuantFormat::Q4K.nibbles_at());
            let mut products = _mm512_setzero_si512();
            for h in 0..2 {
                let q = _mm512_loadu_si512(nibbles.add(64 * h).cast());
                let low = _mm512_and_si512(q, low_nibbles);
                let high = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low_nibbles);
                let low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low, values[2 * h]);
                let high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), high, values[2 * h + 1]);
                let scale = _mm512_shuffle_epi8(scales, q4k_scale_order(h as i8));
                products = _mm512_dpwssd_epi32(products, _mm512_packs_epi32(low, high), scale);
            }
            products
        }
    }

    #[inline(always)]
    unsafe fn totals(rows: [__m512i; PASS_ROWS]) -> __m128i {
        // SAFETY: per the contract.
        unsafe {
            let p = quad_sums(rows);
            let p = _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64::<1>(p));
            _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p))
        }
    }
}

/// A half super-block (128 values) from three 32-byte loads, 32 values a vector, each half
/// of a vector's `maddubs` pairs (16 values) scaled by its own span's scale in `madd`, less 32
/// times each scale times the token's `sums` over its span.
///
/// # Safety
/// `block` points at a whole Q6_K super-block and `xb` at the token's 256 values; the CPU has
/// avx2.
#[inline(always)]
unsafe fn q6k_products_256(block: *const u8, xb: *const i8, sums: __m256i) -> __m256i {
    // SAFETY: per the contract.
    unsafe {
        let (low_nibbles, pair_bits) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        // Scales [s0 s2 .. s14 | s1 s3 .. s15] (i16) from the sixteen in order, so that one
        // shuffle puts s(2c) in the low half's lanes and s(2c+1) in the high half's.
        let even_odd = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
        );
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(block.add(192).cast()));
        // [s0 s2 s4 s6 s1 s3 s5 s7 | s8 s10 .. s9 s11 ..] → [s0 .. s14 | s1 .. s15]
        let split = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(scales16, even_odd));
        let mut products = _mm256_setzero_si256();
        for h in 0..2 {
            let (low0, low1) =
                (_mm256_loadu_si256(block.add(64 * h).cast()), _mm256_loadu_si256(block.add(64 * h + 32).cast()));
            let high = _mm256_loadu_si256(block.add(128 + 32 * h).cast());
            // Quarter k: nibble k / 2 of low (k % 2), bit pair k of high, at bits 4–5.
            let ints = [
                _mm256_or_si256(
                    _mm256_and_si256(low0, low_nibbles),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(high), pair_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(low1, low_nibbles),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(high), pair_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(low0), low_nibbles),
                    _mm256_and_si256(high, pair_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(low1), low_nibbles),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(high), pair_bits),
                ),
            ];
            for (k, ints) in ints.into_iter().enumerate() {
                let chunk = 4 * h + k;
                // s(2·chunk) to the low half's i16 lanes, s(2·chunk + 1) to the high's.
                let pick = _mm256_set1_epi16(0x0100 + 0x0202 * chunk as i16);
                let scale = _mm256_shuffle_epi8(split, pick);
                let pairs = _mm256_maddubs_epi16(ints, _mm256_loadu_si256(xb.add(32 * chunk).cast()));
                products = _mm256_add_epi32(products, _mm256_madd_epi16(pairs, scale));
            }
        }
        // The −32 of every value: each scale times its 16 values' sum.
        let offsets = _mm256_madd_epi16(scales16, sums);
        _mm256_sub_epi32(products, _mm256_slli_epi32::<5>(offsets))
    }
}

/// [`q6k_products_256`] in 512-bit vectors: a half's 64 low-bit bytes, with its high bits
/// shifted per 256-bit half, give 64 consecutive values (`values`: the token's, 64 a vector),
/// two vectors a half, each in a `dpbusd` from zero, packed to i16 and scaled by span in
/// `dpwssd`.
///
/// # Safety
/// `block` points at a whole Q6_K super-block; the CPU has avx2, avx512f, avx512bw and
/// avx512vnni.
#[inline(always)]
unsafe fn q6k_products_512(block: *const u8, values: &[__m512i; 4], sums: __m256i) -> __m512i {
    // SAFETY: per the contract.
    unsafe {
        let (low_nibbles, pair_bits) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
        // The second 32 low-bit bytes take the high bytes' pairs 1 and 3, two bits up.
        let high_shifts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(block.add(192).cast()));
        let scales = _mm512_castsi256_si512(scales16);
        let mut products = _mm512_setzero_si512();
        for h in 0..2 {
            let low = _mm512_loadu_si512(block.add(64 * h).cast());
            let high = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(128 + 32 * h).cast()));
            let high = _mm512_srlv_epi16(high, high_shifts);
            // Values 128h..128h + 64, then 128h + 64..128h + 128.
            let first = _mm512_or_si512(
                _mm512_and_si512(low, low_nibbles),
                _mm512_and_si512(_mm512_slli_epi16::<4>(high), pair_bits),
            );
            let second = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(low), low_nibbles),
                _mm512_and_si512(high, pair_bits),
            );
            let first = _mm512_dpbusd_epi32(_mm512_setzero_si512(), first, values[2 * h]);
            let second = _mm512_dpbusd_epi32(_mm512_setzero_si512(), second, values[2 * h + 1]);
            let scale = _mm512_permutexvar_epi16(q6k_span_order(h as i16), scales);
            products = _mm512_dpwssd_epi32(products, _mm512_packs_epi32(first, second), scale);
        }
        // The −32 of every value: each scale times its 16 values' sum.
        let offsets = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales16, sums));
        _mm512_sub_epi32(products, _mm512_zextsi256_si512(offsets))
    }
}

/// The starts of rows `first..first + PASS_ROWS` of `w`, each a whole row.
fn pass_rows(w: &KQuantMatrix, first: usize) -> [*const u8; PASS_ROWS] {
    let row_bytes = w.row_bytes();
    std::array::from_fn(|r| w.raw[(first + r) * row_bytes..][..row_bytes].as_ptr())
}

/// A pass's four products (lane r: row r's) to `out[r · TILE_TOKENS]`.
#[inline(always)]
fn store_pass(products: __m128, out: &mut [f32]) {
    let mut totals = [0f32; PASS_ROWS];
    // SAFETY: four floats into the array's four.
    unsafe { _mm_storeu_ps(totals.as_mut_ptr(), products) };
    for (r, total) in totals.into_iter().enumerate() {
        out[r * TILE_TOKENS] = total;
    }
}

/// 32 bytes from `first` and 32 from `second` in one vector.
///
/// # Safety
/// Both point at 32 readable bytes; the CPU has avx512f.
#[inline(always)]
unsafe fn side_by_side(first: *const i8, second: *const i8) -> __m512i {
    // SAFETY: per the contract.
    unsafe {
        let low = _mm512_castsi256_si512(_mm256_loadu_si256(first.cast()));
        _mm512_inserti64x4::<1>(low, _mm256_loadu_si256(second.cast()))
    }
}

/// For the nibbles of sub-blocks 4h..4h + 3 in [`Lanes512::q4k_products`], a `pshufb` order
/// that spreads the eight sub-block scales into its i16 lanes: in each 128-bit lane, four of
/// one sub-block's scale (byte 4h or 4h + 2 of the eight), then four of the next; -128 gives
/// the zero high bytes.
///
/// # Safety
/// The CPU has avx2 and avx512f.
#[inline(always)]
unsafe fn q4k_scale_order(h: i8) -> __m512i {
    let lane = |s: i8| {
        let (a, b, z) = (s, s + 1, -128);
        [a, z, a, z, a, z, a, z, b, z, b, z, b, z, b, z]
    };
    let (first, second) = (lane(4 * h), lane(4 * h + 2));
    let order: [i8; 64] = std::array::from_fn(|i| if i < 32 { first[i % 16] } else { second[i % 16] });
    // SAFETY: per the contract; the array holds 64 bytes.
    unsafe { _mm512_loadu_si512(order.as_ptr().cast()) }
}

/// For half `h` of a Q6_K super-block in [`q6k_products_512`], a `vpermw` order that
/// puts the spans' i16 scales where `packs` leaves their products: in 128-bit lane k, four of
/// span 8h + k's scale, then four of span 8h + 4 + k's.
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn q6k_span_order(h: i16) -> __m512i {
    let order: [i16; 32] = std::array::from_fn(|i| {
        let (k, j) = (i as i16 / 8, i as i16 % 8);
        8 * h + k + if j < 4 { 0 } else { 4 }
    });
    // SAFETY: per the contract; the array holds 64 bytes.
    unsafe { _mm512_loadu_si512(order.as_ptr().cast()) }
}
