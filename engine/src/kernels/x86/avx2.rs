//! x86-64-v3 kernels (AVX2, FMA, F16C), each also built with VNNI dot products for the CPUs
//! that have them (`DOT`: [`MADDUBS`], [`AVX_VNNI`] or [`AVX512_VNNI`], the same products in
//! VEX or EVEX encoding). Without VNNI an unsigned × signed byte product
//! takes `maddubs` (pairs into saturating i16) and `madd` (pairs into i32); its operands are kept
//! where no pair can saturate: 4-, 5- and 6-bit weights (≤ 63·127·2), and 8-bit values (Q8_0's,
//! and a table format's looked-up ones) multiplied as |a| × sign(b, a) (≤ 128·127·2 < 2¹⁵).

use super::super::attention::KV_TILE;
use super::super::matrix::TOKEN_TILE;
use super::super::quant::{Offset, QuantBits, QuantizedActivations, QuantizedBlocks, UqMatrix, BLOCK};
use super::{dispatch_rows, format_of, prefetch_ahead, row_blocks};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

/// Byte products by `maddubs` and `madd`.
pub(super) const MADDUBS: u8 = 0;
/// Byte products by AVX-VNNI's VEX-encoded `vpdpbusd`.
pub(super) const AVX_VNNI: u8 = 1;
/// Byte products by AVX-512 VNNI's EVEX-encoded `vpdpbusd` on 256-bit vectors.
pub(super) const AVX512_VNNI: u8 = 2;

/// Σ over groups of four of u8 × i8 products, added to the i32 lanes of `acc`.
#[inline(always)]
pub(super) unsafe fn dot_u8i8<const DOT: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY (every arm): the caller is compiled with avx2, and with avxvnni for AVX_VNNI or
    // avx512vnni and avx512vl for AVX512_VNNI.
    unsafe {
        match DOT {
            AVX_VNNI => _mm256_dpbusd_avx_epi32(acc, u, s),
            AVX512_VNNI => _mm256_dpbusd_epi32(acc, u, s),
            _ => _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))),
        }
    }
}

/// Σ a·b over groups of four signed bytes (neither −128 in `b`), added to `acc`.
#[inline(always)]
pub(super) unsafe fn dot_i8i8<const DOT: u8>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: as for dot_u8i8.
    unsafe { dot_u8i8::<DOT>(acc, _mm256_abs_epi8(a), _mm256_sign_epi8(b, a)) }
}

/// The 32 unsigned ints of one weight block, in value order (4- and 5-bit formats).
///
/// # Safety
/// `ptr` points at the block's `bits.bytes_per_block()` bytes; the CPU has avx2.
#[inline(always)]
unsafe fn unpack_block(bits: QuantBits, ptr: *const u8) -> __m256i {
    debug_assert!(matches!(bits, QuantBits::Four | QuantBits::Five), "{bits:?} blocks are not apart");
    // SAFETY: the loads read the block's own bytes per the contract.
    unsafe {
        let low_nibbles = _mm_set1_epi8(0x0f);
        let raw = _mm_loadu_si128(ptr.cast());
        let lo = _mm_and_si128(raw, low_nibbles);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low_nibbles);
        let q = _mm256_set_m128i(hi, lo);
        if bits != QuantBits::Five {
            return q;
        }
        // Byte j of the block takes bit j of the 32-bit mask: copy mask byte j/8 to byte j,
        // keep bit j%8, and turn a set bit into 0x10.
        let mask = (ptr.add(16) as *const u32).read_unaligned();
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(mask as i32),
            _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
    }
}

/// Products of weight rows `rows` with token `t` (decode's product, and a prompt's last token
/// when it is alone in its tile), into `out[(row - rows.start) · TOKEN_TILE]`; a prompt's
/// tiles take [`super::uq_groups`], with the same bits.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn uq_dot_rows(w: &UqMatrix, rows: Range<usize>, x: &QuantizedActivations, t: usize, out: &mut [f32]) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<MADDUBS>(w, rows, x, t, out) }
}

/// [`uq_dot_rows`] with VNNI dot products.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn uq_dot_rows_vnni(w: &UqMatrix, rows: Range<usize>, x: &QuantizedActivations, t: usize, out: &mut [f32]) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<AVX_VNNI>(w, rows, x, t, out) }
}

/// [`uq_dot_rows`] with AVX-512 VNNI's dot products (on 256-bit vectors: a 512-bit vector of
/// two blocks took more to reduce than it saved).
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn uq_dot_rows_avx512(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t: usize,
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<AVX512_VNNI>(w, rows, x, t, out) }
}

#[inline(always)]
unsafe fn uq_dot_rows_with<const DOT: u8>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t: usize,
    out: &mut [f32],
) {
    assert!(rows.end <= w.rows && t < x.n && x.cols == w.cols);
    assert!(out.len() >= rows.len() * TOKEN_TILE);
    assert!(w.qs.len() >= w.rows * w.row_bytes() && w.d.len() >= w.rows * w.blocks_per_row());
    // SAFETY (every arm): features per the callers' contracts; bounds asserted above.
    unsafe {
        match w.bits {
            QuantBits::Four => one_token::<DOT, { QuantBits::Four as u8 }>(w, rows, x, t, out),
            QuantBits::Five => one_token::<DOT, { QuantBits::Five as u8 }>(w, rows, x, t, out),
            QuantBits::Eight => one_token::<DOT, { QuantBits::Eight as u8 }>(w, rows, x, t, out),
            QuantBits::FourTable => one_token::<DOT, { QuantBits::FourTable as u8 }>(w, rows, x, t, out),
        }
    }
}

/// Whether weights of format `BITS` are multiplied as signed bytes (q − 128): 8-bit ones
/// without VNNI, whose unsigned pairs could saturate `maddubs`.
pub(super) const fn signed_weights<const DOT: u8, const BITS: u8>() -> bool {
    DOT == MADDUBS && (BITS == QuantBits::Eight as u8 || BITS == QuantBits::FourTable as u8)
}

/// Block `ptr`'s 32 weights as bytes for [`block_dot`]: unsigned ints (a table format's
/// nibbles looked up in `table`, the matrix's table in both lanes), or signed when
/// [`signed_weights`].
#[inline(always)]
unsafe fn load_block<const DOT: u8, const BITS: u8>(ptr: *const u8, table: __m256i) -> __m256i {
    // SAFETY: the caller passes a pointer to one whole block.
    unsafe {
        let q = if BITS == QuantBits::Eight as u8 {
            _mm256_loadu_si256(ptr.cast())
        } else if BITS == QuantBits::FourTable as u8 {
            _mm256_shuffle_epi8(table, unpack_block(QuantBits::Four, ptr))
        } else {
            unpack_block(format_of(BITS), ptr)
        };
        if signed_weights::<DOT, BITS>() {
            _mm256_xor_si256(q, _mm256_set1_epi8(-128))
        } else {
            q
        }
    }
}

/// A table format's 16 unsigned values in both 128-bit lanes, for `_mm256_shuffle_epi8`; zero
/// for the other formats.
#[inline(always)]
pub(super) unsafe fn table_lanes(w: &UqMatrix) -> __m256i {
    // SAFETY: the caller has avx2; the load reads the table's own 16 bytes.
    unsafe {
        match w.table {
            Some(table) => _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast())),
            None => _mm256_setzero_si256(),
        }
    }
}

/// Sums of four products (i32 lanes) of a block from [`load_block`] with 32 activations: lanes
/// 0–3 are values 0–15, lanes 4–7 values 16–31.
#[inline(always)]
unsafe fn block_dot<const DOT: u8, const BITS: u8>(wv: __m256i, xv: __m256i) -> __m256i {
    // SAFETY: the callers are compiled with avx2 (and avxvnni when VNNI).
    unsafe {
        let zero = _mm256_setzero_si256();
        if signed_weights::<DOT, BITS>() {
            dot_i8i8::<DOT>(zero, wv, xv)
        } else {
            dot_u8i8::<DOT>(zero, wv, xv)
        }
    }
}

/// Blocks a weight row is taken in: their sums are reduced to one lane each (hadd), so the
/// eight blocks' scales take one conversion, one multiply and one FMA.
pub(super) const GROUP: usize = 8;

#[inline(always)]
unsafe fn one_token<const DOT: u8, const BITS: u8>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t: usize,
    out: &mut [f32],
) {
    let nb = w.blocks_per_row();
    let bpb = w.bits.bytes_per_block();
    let token = Token {
        values: x.qs[t * w.cols..][..w.cols].as_ptr(),
        d: &x.d[t * nb..][..nb],
        sums: &x.sums_for(w)[t * nb..][..nb],
    };
    let start = rows.start;
    let row_bytes = nb * bpb;
    // SAFETY: the callers have avx2.
    let table = unsafe { table_lanes(w) };
    for row in rows {
        let wd = &w.d[row * nb..][..nb];
        let wq = w.qs[row * row_bytes..][..row_bytes].as_ptr();
        let mut acc = _mm256_setzero_ps();
        // The blocks' offsets (times the activations' scaled sums) go in with their products.
        let offsets = BlockOffsets::of_row(w, row, signed_weights::<DOT, BITS>());
        let mut b = 0;
        // SAFETY (every call): blocks b..b+N ≤ nb lie inside this row's weights, scales and
        // offsets and the token's activations, scales and sums.
        while b + GROUP <= nb {
            prefetch_ahead(wq, b * bpb, GROUP * bpb);
            unsafe { group_products::<DOT, BITS, GROUP>(wq, table, wd, &offsets, &token, b, bpb, &mut acc) };
            b += GROUP;
        }
        // The last nb % 8 blocks go in groups of 4, 2 and 1 of fixed length: a group of a
        // length known only at run time keeps its blocks in memory, not in registers.
        if b < nb {
            prefetch_ahead(wq, b * bpb, (nb - b) * bpb);
        }
        if b + 4 <= nb {
            unsafe { group_products::<DOT, BITS, 4>(wq, table, wd, &offsets, &token, b, bpb, &mut acc) };
            b += 4;
        }
        if b + 2 <= nb {
            unsafe { group_products::<DOT, BITS, 2>(wq, table, wd, &offsets, &token, b, bpb, &mut acc) };
            b += 2;
        }
        if b < nb {
            unsafe { group_products::<DOT, BITS, 1>(wq, table, wd, &offsets, &token, b, bpb, &mut acc) };
        }
        out[(row - start) * TOKEN_TILE] = hsum(acc);
    }
}

/// One token's quantized activations: its values, and a scale and a scaled sum a block.
struct Token<'a> {
    values: *const i8,
    d: &'a [f32],
    sums: &'a [f32],
}

/// What a row's blocks add beside their products, each times the activations' scaled sum.
pub(super) enum BlockOffsets<'a> {
    /// Nothing: the zero point is taken off in the integer sums.
    None,
    /// A zero point: the block's scale times this factor.
    ScaleTimes(f32),
    /// An offset of each block's own.
    PerBlock(&'a [f16]),
}

impl<'a> BlockOffsets<'a> {
    /// Row `row`'s offsets in `w`: none when its weights are multiplied signed (8-bit weights
    /// without VNNI, see the module comment), whose zero point is off already.
    pub(super) fn of_row(w: &'a UqMatrix, row: usize, signed: bool) -> Self {
        let nb = w.blocks_per_row();
        match &w.offset {
            _ if signed => BlockOffsets::None,
            Offset::Zero(z) => BlockOffsets::ScaleTimes(-f32::from(*z)),
            Offset::PerBlock(m) => BlockOffsets::PerBlock(&m[row * nb..][..nb]),
        }
    }

    /// The offsets of blocks `b..b+n` (n ≤ 8) as lanes, zero past n; `d`: their scales.
    ///
    /// # Safety
    /// The blocks lie inside the row; the caller has avx2 and f16c.
    #[inline(always)]
    pub(super) unsafe fn lanes(&self, d: __m256, b: usize, n: usize) -> Option<__m256> {
        // SAFETY: per the contract.
        unsafe {
            match self {
                BlockOffsets::None => None,
                BlockOffsets::ScaleTimes(factor) => Some(_mm256_mul_ps(d, _mm256_set1_ps(*factor))),
                BlockOffsets::PerBlock(m) => Some(f16_group(&m[b..b + n])),
            }
        }
    }
}

/// Adds to `acc` the products of blocks `b..b+N` (N ≤ 8) of one weight row with the token's
/// activations, and the blocks' offsets times the token's scaled sums (`table`: the matrix's
/// [`table_lanes`]).
///
/// # Safety
/// Blocks b..b+N lie inside the row (`wq`, `bpb` bytes a block; `wd`; `offsets`) and inside
/// the token's values, scales and sums; the caller has avx2, fma, f16c (and avxvnni or
/// avx512vnni with avx512vl for those `DOT`s).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group_products<const DOT: u8, const BITS: u8, const N: usize>(
    wq: *const u8,
    table: __m256i,
    wd: &[f16],
    offsets: &BlockOffsets,
    token: &Token,
    b: usize,
    bpb: usize,
    acc: &mut __m256,
) {
    // SAFETY: per the contract.
    unsafe {
        let mut v = [_mm256_setzero_si256(); GROUP];
        for (i, v) in v[..N].iter_mut().enumerate() {
            let block = load_block::<DOT, BITS>(wq.add((b + i) * bpb), table);
            *v = block_dot::<DOT, BITS>(block, _mm256_loadu_si256(token.values.add((b + i) * BLOCK).cast()));
        }
        let d = f16_group(&wd[b..b + N]);
        let mask = lane_mask(N);
        if let Some(offset) = offsets.lanes(d, b, N) {
            *acc = _mm256_fmadd_ps(offset, _mm256_maskload_ps(token.sums.as_ptr().add(b), mask), *acc);
        }
        // [blocks 0–3's sums of lanes 0–3 | of lanes 4–7], the same of blocks 4–7; then
        // lane i of `lower` and `upper` is block i's sum over values 0–15 and 16–31.
        let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        let lower = _mm256_permute2x128_si256::<0x20>(q0, q1);
        let upper = _mm256_permute2x128_si256::<0x31>(q0, q1);
        let dx = _mm256_maskload_ps(token.d.as_ptr().add(b), mask);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lower, upper)), _mm256_mul_ps(d, dx), *acc);
    }
}

/// Up to eight f16 values as f32 lanes, zero past the end.
#[inline(always)]
pub(super) unsafe fn f16_group(values: &[f16]) -> __m256 {
    // SAFETY: the callers have f16c; a short group is copied to a padded buffer first.
    unsafe {
        if values.len() == GROUP {
            _mm256_cvtph_ps(_mm_loadu_si128(values.as_ptr().cast()))
        } else {
            // A loop of fixed length, not `copy_from_slice`, which calls `memcpy` for a length
            // known only at run time.
            let mut padded = [f16::ZERO; GROUP];
            for (i, p) in padded.iter_mut().enumerate() {
                *p = values.get(i).copied().unwrap_or(f16::ZERO);
            }
            _mm256_cvtph_ps(_mm_loadu_si128(padded.as_ptr().cast()))
        }
    }
}

/// A mask of the first `n` of eight i32 lanes, for `maskload`.
#[inline(always)]
pub(super) fn lane_mask(n: usize) -> __m256i {
    // SAFETY: the callers have avx2.
    unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
}

/// The sum of a vector's eight lanes.
#[inline(always)]
pub(super) fn hsum(v: __m256) -> f32 {
    // SAFETY: callers are compiled with avx2.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// The sum of the i32 lanes.
#[inline(always)]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: callers are compiled with avx2.
    unsafe { hsum_i32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))) }
}

/// The sum of the four i32 lanes.
#[inline(always)]
pub(super) fn hsum_i32_128(v: __m128i) -> i32 {
    // SAFETY: callers are compiled with avx2.
    unsafe {
        let s = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    }
}

/// Quantizes blocks of 32 activations to int8 with their scales, as
/// `quant::quantize_blocks` does (the same rounding, half away from zero, and the same f16
/// roundings), with F16C for those instead of the software conversion.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn quantize_blocks(x: &[f32], out: QuantizedBlocks) {
    let QuantizedBlocks { qs, d, sums, sums_f16 } = out;
    let blocks = x.len() / BLOCK;
    assert!(qs.len() >= blocks * BLOCK && d.len() >= blocks && sums.len() >= blocks && sums_f16.len() >= blocks);
    let sign = _mm256_set1_ps(-0.0);
    let below_half = _mm256_set1_ps(0.5 - f32::EPSILON / 4.0);
    // Dwords of two rounds of packing back in value order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..blocks {
        let mut v = [_mm256_setzero_ps(); 4];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: 8 values of block b < blocks, inside `x`.
            *v = unsafe { _mm256_loadu_ps(x.as_ptr().add(b * BLOCK + 8 * i)) };
        }
        let largest = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let y = _mm256_mul_ps(v[i], inv);
            // Half away from zero: add just under ½ with y's sign, then truncate.
            q[i] = _mm256_cvttps_epi32(_mm256_add_ps(y, _mm256_or_ps(_mm256_and_ps(y, sign), below_half)));
        }
        let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        // SAFETY: the 32 bytes of block b, inside `qs`.
        unsafe {
            _mm256_storeu_si256(qs.as_mut_ptr().add(b * BLOCK).cast(), _mm256_permutevar8x32_epi32(bytes, order))
        };
        d[b] = round_to_f16(scale);
        sums[b] = d[b] * sum as f32;
        sums_f16[b] = round_to_f16(scale * sum as f32);
    }
}

/// `value` rounded to the nearest f16 (ties to even, as `half` rounds).
#[inline(always)]
fn round_to_f16(value: f32) -> f32 {
    // SAFETY: callers are compiled with f16c.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(value)))) }
}

/// Query rows one score or value kernel keeps in registers: 6 rows × 2 vectors of accumulators,
/// with the two K (or V) vectors and a broadcast query, fill 15 of the 16 registers.
const MAX_ROWS: usize = 6;

/// Scores of keys `c0..c0+len` (c0 a multiple of KV_TILE) against `rows` query rows:
/// `scores[r·len + j] = q[r] · k[c0 + j]`. With `prefetch` (the head's V), the keys two
/// passes ahead and these keys' values are asked for as the keys are scored.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `hd % 16 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn score_keys(
    k: &[f16],
    prefetch: Option<&[f16]>,
    hd: usize,
    q: &[f32],
    rows: usize,
    c0: usize,
    len: usize,
    scores: &mut [f32],
) {
    let tiles_end = (c0 + len).div_ceil(KV_TILE);
    assert!(tiles_end * KV_TILE * hd <= k.len() && q.len() >= rows * hd && scores.len() >= rows * len);
    for block in row_blocks(rows, MAX_ROWS) {
        let (q, scores) = (&q[block.start * hd..], &mut scores[block.start * len..]);
        // SAFETY: features per contract; bounds asserted above.
        unsafe { dispatch_rows!(block.len(), score_keys_r::<R>(k, prefetch, hd, q, c0, len, scores)) }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
// The loop index also addresses the tile by pointer, so it stays an index.
#[allow(clippy::needless_range_loop)]
unsafe fn score_keys_r<const R: usize>(
    k: &[f16],
    prefetch: Option<&[f16]>,
    hd: usize,
    q: &[f32],
    c0: usize,
    len: usize,
    scores: &mut [f32],
) {
    let q: [&[f32]; R] = std::array::from_fn(|r| &q[r * hd..][..hd]);
    let mut j = 0;
    while j < len {
        let tile = (c0 + j) / KV_TILE;
        let base = k[tile * hd * KV_TILE..][..hd * KV_TILE].as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let values = prefetch.map(|v| v.as_ptr().wrapping_add((c0 + j) * hd));
        for d in 0..hd {
            // SAFETY: the 16 keys of row d of this tile, inside its hd·KV_TILE values.
            let (lo, hi) = unsafe {
                let row = base.add(d * KV_TILE);
                (_mm256_cvtph_ps(_mm_loadu_si128(row.cast())), _mm256_cvtph_ps(_mm_loadu_si128(row.add(8).cast())))
            };
            // Every other row, as a 64-byte line holds two of a tile's: the K line two passes on, and
            // the V line at the same offset in these keys' values (which span as many lines).
            if let (Some(values), 0) = (values, d % 2) {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add((2 * hd + d) * KV_TILE).cast());
                _mm_prefetch::<_MM_HINT_T0>(values.wrapping_add(d * KV_TILE).cast());
            }
            for r in 0..R {
                let qd = _mm256_set1_ps(q[r][d]);
                acc[r][0] = _mm256_fmadd_ps(qd, lo, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qd, hi, acc[r][1]);
            }
        }
        let n = KV_TILE.min(len - j);
        for (r, [lo, hi]) in acc.iter().enumerate() {
            let mut tile_scores = [0f32; KV_TILE];
            // SAFETY: 16 floats into a local 16-float array.
            unsafe {
                _mm256_storeu_ps(tile_scores.as_mut_ptr(), *lo);
                _mm256_storeu_ps(tile_scores.as_mut_ptr().add(8), *hi);
            }
            scores[r * len + j..][..n].copy_from_slice(&tile_scores[..n]);
        }
        j += n;
    }
}

/// `acc[r] += Σ_j p[r][j] · v[c0+j]` for j in 0..len, over `rows` rows.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `hd % 16 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate_values(v: &[f16], hd: usize, p: &[f32], rows: usize, c0: usize, len: usize, acc: &mut [f32]) {
    assert!(hd.is_multiple_of(16) && (c0 + len) * hd <= v.len() && p.len() >= rows * len && acc.len() >= rows * hd);
    let values = &v[c0 * hd..][..len * hd];
    for block in row_blocks(rows, MAX_ROWS) {
        let (p, acc) = (&p[block.start * len..], &mut acc[block.start * hd..]);
        for column in (0..hd).step_by(16) {
            // SAFETY: features per contract; bounds asserted above.
            unsafe { dispatch_rows!(block.len(), accumulate_values_r::<R>(values, hd, p, len, column, acc)) }
        }
    }
}

/// [`accumulate_values`] for R rows and the 16 columns from `column`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
// The loop index also addresses the tile by pointer, so it stays an index.
#[allow(clippy::needless_range_loop)]
unsafe fn accumulate_values_r<const R: usize>(
    values: &[f16],
    hd: usize,
    p: &[f32],
    len: usize,
    column: usize,
    acc: &mut [f32],
) {
    let p: [&[f32]; R] = std::array::from_fn(|r| &p[r * len..][..len]);
    assert!(values.len() >= len * hd && column + 16 <= hd);
    let mut sums = [[_mm256_setzero_ps(); 2]; R];
    for j in 0..len {
        // SAFETY: 16 values of row j from `column`, inside `values` (asserted above).
        let (lo, hi) = unsafe {
            let row = values.as_ptr().add(j * hd + column);
            (_mm256_cvtph_ps(_mm_loadu_si128(row.cast())), _mm256_cvtph_ps(_mm_loadu_si128(row.add(8).cast())))
        };
        for r in 0..R {
            let w = _mm256_set1_ps(p[r][j]);
            sums[r][0] = _mm256_fmadd_ps(w, lo, sums[r][0]);
            sums[r][1] = _mm256_fmadd_ps(w, hi, sums[r][1]);
        }
    }
    for (r, [lo, hi]) in sums.iter().enumerate() {
        let dst = acc[r * hd + column..][..16].as_mut_ptr();
        // SAFETY: 16 floats of row r from `column`, inside `acc`.
        unsafe {
            _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), *lo));
            _mm256_storeu_ps(dst.add(8), _mm256_add_ps(_mm256_loadu_ps(dst.add(8)), *hi));
        }
    }
}

/// Scores (`out[head][i]`) of `tokens` against per-KV-head f32 queries for signed INT8 or INT4
/// key rows; see [`super::avx512::score_keys_lowp`] for the layout.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `head_dim % 32 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn score_keys_lowp(
    data: &[u8],
    scales: &[f32],
    n_kv: usize,
    hd: usize,
    int4: bool,
    query: &[f32],
    tokens: &[u32],
    out: &mut [f32],
) {
    let row_bytes = super::key_row_bytes(data, scales, n_kv, hd, 32, int4, query.len(), tokens, out.len());
    // INT4: the query split into even and odd dimensions, to meet the unpacked nibbles.
    let (even, odd) = if int4 { super::even_and_odd(query) } else { Default::default() };
    let n = tokens.len();
    for (i, &t) in tokens.iter().enumerate() {
        for h in 0..n_kv {
            let row = t as usize * n_kv + h;
            let ptr = data[row * row_bytes..][..row_bytes].as_ptr();
            let mut acc = _mm256_setzero_ps();
            // SAFETY (loads): each 8-byte load stays inside this row's row_bytes (hd % 32 == 0).
            if int4 {
                for c in (0..row_bytes).step_by(8) {
                    let bytes = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(ptr.add(c).cast()) });
                    let lo = _mm256_srai_epi32(_mm256_slli_epi32(bytes, 28), 28);
                    let hi = _mm256_srai_epi32(_mm256_slli_epi32(bytes, 24), 28);
                    let q_even = _mm256_loadu_ps(even[h * hd / 2 + c..][..8].as_ptr());
                    let q_odd = _mm256_loadu_ps(odd[h * hd / 2 + c..][..8].as_ptr());
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), q_even, acc);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), q_odd, acc);
                }
            } else {
                for c in (0..hd).step_by(8) {
                    let k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(ptr.add(c).cast()) }));
                    acc = _mm256_fmadd_ps(k, _mm256_loadu_ps(query[h * hd + c..][..8].as_ptr()), acc);
                }
            }
            out[h * n + i] = hsum(acc) * scales[row];
        }
    }
}

/// A device query's scores from a low-precision key copy, in integers (see
/// [`super::avx512::score_keys_int`]): keys and query bytes are multiplied signed.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn score_keys_int(
    data: &[u8],
    scales: &[f32],
    n_kv: usize,
    hd: usize,
    int4: bool,
    query: &[i8],
    tokens: &[u32],
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { score_keys_int_with::<MADDUBS>(data, scales, n_kv, hd, int4, query, tokens, out) }
}

/// [`score_keys_int`] with VNNI dot products.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn score_keys_int_vnni(
    data: &[u8],
    scales: &[f32],
    n_kv: usize,
    hd: usize,
    int4: bool,
    query: &[i8],
    tokens: &[u32],
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { score_keys_int_with::<AVX_VNNI>(data, scales, n_kv, hd, int4, query, tokens, out) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_keys_int_with<const DOT: u8>(
    data: &[u8],
    scales: &[f32],
    n_kv: usize,
    hd: usize,
    int4: bool,
    query: &[i8],
    tokens: &[u32],
    out: &mut [f32],
) {
    let row_bytes = super::key_row_bytes(data, scales, n_kv, hd, 64, int4, query.len(), tokens, out.len());
    let chunks = hd / 32;
    // Per (head, 32-dimension chunk), the query bytes in the order the key bytes arrive: INT4
    // unpacks 16 bytes to their low nibbles (even dimensions) then their high ones (odd).
    let mut q_words = vec![0i8; n_kv * hd];
    for (chunk, q) in q_words.chunks_exact_mut(32).zip(query.chunks_exact(32)) {
        if int4 {
            for j in 0..16 {
                chunk[j] = q[2 * j];
                chunk[16 + j] = q[2 * j + 1];
            }
        } else {
            chunk.copy_from_slice(q);
        }
    }
    let n = tokens.len();
    for (i, &t) in tokens.iter().enumerate() {
        for h in 0..n_kv {
            let row = t as usize * n_kv + h;
            let ptr = data[row * row_bytes..][..row_bytes].as_ptr();
            let mut acc = _mm256_setzero_si256();
            for c in 0..chunks {
                // SAFETY: each load reads whole bytes of this row (16 per chunk for INT4, 32 for
                // INT8), inside the bounds asserted above; the query chunk's slice is checked.
                unsafe {
                    let keys = if int4 {
                        // Signed nibbles to signed bytes: (n ^ 8) − 8.
                        let packed = _mm_loadu_si128(ptr.add(c * 16).cast());
                        let nibbles = _mm_set1_epi8(0x0f);
                        let lo = _mm_and_si128(packed, nibbles);
                        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), nibbles);
                        let eight = _mm256_set1_epi8(8);
                        _mm256_sub_epi8(_mm256_xor_si256(_mm256_set_m128i(hi, lo), eight), eight)
                    } else {
                        _mm256_loadu_si256(ptr.add(c * 32).cast())
                    };
                    let q = _mm256_loadu_si256(q_words[(h * chunks + c) * 32..][..32].as_ptr().cast());
                    // Keys are clamped to ±127; the query may hold −128, so it goes first.
                    acc = dot_i8i8::<DOT>(acc, q, keys);
                }
            }
            out[h * n + i] = hsum_i32(acc) as f32 * scales[row];
        }
    }
}

/// `kv_q8::dequantize_row`, narrowed to f16: eight values at a time, widened to f32, times
/// their columns' scales (f16, little-endian bytes, widened with F16C; none: 1) and the row's,
/// narrowed with F16C (round to nearest even, as the portable conversion).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize_q8_row(q: &[u8], column_scales: Option<&[u8]>, row: f32, out: &mut [u16]) {
    let cols = q.len();
    assert!(cols.is_multiple_of(8) && column_scales.is_none_or(|s| s.len() >= 2 * cols) && out.len() >= cols);
    let row = _mm256_set1_ps(row);
    for c in (0..cols).step_by(8) {
        // SAFETY: the 8 bytes, 8 scales (16 bytes) read and the 16 bytes written lie inside the
        // asserted lengths.
        unsafe {
            let factors = match column_scales {
                Some(scales) => _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().add(2 * c).cast())), row),
                None => row,
            };
            let values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(c).cast())));
            _mm_storeu_si128(
                out.as_mut_ptr().add(c).cast(),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(values, factors)),
            );
        }
    }
}

/// `attention::write_k_tile`: sixteen dimensions at a time, the marked lanes' rows are loaded
/// (one register per token), transposed in registers and stored a dimension's sixteen lanes at
/// once, blended with what the tile holds where lanes are unmarked.
///
/// # Safety
/// The CPU must support avx2.
#[target_feature(enable = "avx2")]
pub unsafe fn write_k_tile(tile: &mut [u16], rows: &[&[u16]; KV_TILE], lanes: u16) {
    const _: () = assert!(KV_TILE == 16, "one register holds a tile's lanes of a dimension");
    let hd = tile.len() / KV_TILE;
    assert!(hd.is_multiple_of(16) && lanes != 0);
    // Unmarked lanes read a marked lane's row (its values are blended away).
    let any = rows[lanes.trailing_zeros() as usize];
    let src: [&[u16]; KV_TILE] = std::array::from_fn(|l| if lanes >> l & 1 == 1 { rows[l] } else { any });
    assert!(src.iter().all(|row| row.len() >= hd));
    let bits = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, i16::MIN);
    let marked = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(lanes as i16), bits), bits);
    for d0 in (0..hd).step_by(16) {
        // SAFETY: 16 values from d0 of each row, inside the asserted lengths.
        let mut r: [__m256i; 16] =
            std::array::from_fn(|l| unsafe { _mm256_loadu_si256(src[l].as_ptr().add(d0).cast()) });
        transpose_16x16_epi16(&mut r);
        for (j, &dim) in r.iter().enumerate() {
            // SAFETY: row d0 + j of the tile, 16 values inside its hd·16.
            unsafe {
                let dst = tile.as_mut_ptr().add((d0 + j) * KV_TILE).cast::<__m256i>();
                let out =
                    if lanes == u16::MAX { dim } else { _mm256_blendv_epi8(_mm256_loadu_si256(dst), dim, marked) };
                _mm256_storeu_si256(dst, out);
            }
        }
    }
}

/// Transposes 16 rows of 16 u16 (row `l` in `r[l]`) so that `r[j]` holds column `j`.
#[inline(always)]
fn transpose_16x16_epi16(r: &mut [__m256i; 16]) {
    // SAFETY: the callers have avx2.
    unsafe {
        // Each 128-bit half transposes its 8 columns as an 8-way interleave (16-, 32-, then
        // 64-bit units); the halves are swapped into place last.
        let a: [__m256i; 16] = std::array::from_fn(|i| {
            let (x, y) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi16(x, y)
            } else {
                _mm256_unpackhi_epi16(x, y)
            }
        });
        // b[4q + k]: columns 2k and 2k + 1 (low half; 2k + 8 and 2k + 9 high) of rows 4q..4q+4.
        let b: [__m256i; 16] = std::array::from_fn(|i| {
            let (q, k) = (i / 4, i % 4);
            let (x, y) = (a[4 * q + k / 2], a[4 * q + 2 + k / 2]);
            if k % 2 == 0 {
                _mm256_unpacklo_epi32(x, y)
            } else {
                _mm256_unpackhi_epi32(x, y)
            }
        });
        // c[o][m]: column m (low half; m + 8 high) of rows 8o..8o+8.
        let c: [[__m256i; 8]; 2] = std::array::from_fn(|o| {
            std::array::from_fn(|m| {
                let (x, y) = (b[8 * o + m / 2], b[8 * o + 4 + m / 2]);
                if m % 2 == 0 {
                    _mm256_unpacklo_epi64(x, y)
                } else {
                    _mm256_unpackhi_epi64(x, y)
                }
            })
        });
        for m in 0..8 {
            r[m] = _mm256_permute2x128_si256::<0x20>(c[0][m], c[1][m]);
            r[m + 8] = _mm256_permute2x128_si256::<0x31>(c[0][m], c[1][m]);
        }
    }
}
