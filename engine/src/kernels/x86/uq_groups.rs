//! A prompt's products of the 32-value block formats (Q4_0 to Q8_0, IQ4_NL, MXFP4), four
//! tokens to a vector: 8 weights of a row broadcast against 8 values of each of four tokens
//! ([`QuantizedActivations::groups`]), so one dot product serves four tokens and a weight block
//! is unpacked once for the whole tile. Per row the blocks' integer sums are turned from token
//! lanes into block lanes, and each token then takes the same f32 operations, in the same order,
//! as the one-token kernel of its level ([`avx2`]'s `uq_dot_rows*`): a token's product has the
//! same bits in a prompt as alone.
//!
//! Every level's dot product (`DOT`) gives the same integer sums. With `maddubs` a block's four
//! runs add in i16 before one `madd` (4- and 5-bit weights: at most 4·2·31·127 < 2¹⁵); 8-bit
//! weights and a table format's looked-up ones, multiplied signed as the one-token kernel does,
//! take a `madd` per run.

use super::super::matrix::TOKEN_TILE;
use super::super::quant::{QuantBits, QuantizedActivations, UqMatrix, BLOCK, GROUP_TOKENS};
use super::avx2::{self, signed_weights, BlockOffsets, AVX512_VNNI, AVX_VNNI, GROUP, MADDUBS};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of a group's block: four runs of 32.
const GROUP_BLOCK_BYTES: usize = GROUP_TOKENS * BLOCK;

/// Products of weight rows `rows` with tokens `t0..t0+nt` (t0 a multiple of four,
/// 2 ≤ nt ≤ TOKEN_TILE), into `out[(row - rows.start) · TOKEN_TILE + t]`, with the bits of
/// [`avx2::uq_dot_rows`] for each token alone.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn uq_dot_rows(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<MADDUBS>(w, rows, x, t0, nt, out) }
}

/// [`uq_dot_rows`] with AVX-VNNI, the bits of [`avx2::uq_dot_rows_vnni`].
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn uq_dot_rows_vnni(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<AVX_VNNI>(w, rows, x, t0, nt, out) }
}

/// [`uq_dot_rows`] with AVX-512 VNNI, the bits of [`avx2::uq_dot_rows_avx512`].
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn uq_dot_rows_avx512(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    // SAFETY: features per contract.
    unsafe { uq_dot_rows_with::<AVX512_VNNI>(w, rows, x, t0, nt, out) }
}

#[inline(always)]
unsafe fn uq_dot_rows_with<const DOT: u8>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    assert!(rows.end <= w.rows && t0 + nt <= x.n && x.cols == w.cols && (2..=TOKEN_TILE).contains(&nt));
    assert!(
        t0.is_multiple_of(GROUP_TOKENS) && x.groups.len() >= (t0 + nt).div_ceil(GROUP_TOKENS) * GROUP_TOKENS * x.cols
    );
    assert!(out.len() >= rows.len() * TOKEN_TILE);
    assert!(w.qs.len() >= w.rows * w.row_bytes() && w.d.len() >= w.rows * w.blocks_per_row());
    // SAFETY (every arm): features per the callers' contracts; bounds asserted above.
    unsafe {
        match (w.bits, nt.div_ceil(GROUP_TOKENS)) {
            (QuantBits::Four, 1) => tile::<1, DOT, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Four, _) => tile::<2, DOT, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, 1) => tile::<1, DOT, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, _) => tile::<2, DOT, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, 1) => tile::<1, DOT, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, _) => tile::<2, DOT, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, 1) => tile::<1, DOT, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, _) => tile::<2, DOT, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
        }
    }
}

// A tile is at most two groups.
const _: () = assert!(TOKEN_TILE <= 2 * GROUP_TOKENS);

#[inline(always)]
unsafe fn tile<const GROUPS: usize, const DOT: u8, const BITS: u8>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let nb = w.blocks_per_row();
    let bpb = w.bits.bytes_per_block();
    let cols = w.cols;
    let values = x.groups[t0 * cols..].as_ptr();
    // Tokens past `nt` in the last group are zeros and take no f32 operations; their slices
    // are the last token's, never read.
    let token = |t: usize| t0 + t.min(nt - 1);
    let xd: [&[f32]; 2 * GROUP_TOKENS] = std::array::from_fn(|t| &x.d[token(t) * nb..][..nb]);
    let sums: [&[f32]; 2 * GROUP_TOKENS] = std::array::from_fn(|t| &x.sums_for(w)[token(t) * nb..][..nb]);
    // SAFETY: the caller has avx2.
    let table = unsafe { avx2::table_lanes(w) };
    let row_bytes = nb * bpb;
    for row in rows.clone() {
        let wd = &w.d[row * nb..][..nb];
        let wq = w.qs[row * row_bytes..][..row_bytes].as_ptr();
        let offsets = BlockOffsets::of_row(w, row, signed_weights::<DOT, BITS>());
        let mut acc = [_mm256_setzero_ps(); 2 * GROUP_TOKENS];
        let ctx = Row { wq, table, wd, offsets: &offsets, values, cols, xd: &xd, sums: &sums, bpb, nt };
        let mut b = 0;
        // SAFETY (every call): blocks b..b+N ≤ nb lie inside the row's weights, scales and
        // offsets, each token's scales and sums, and the groups' values.
        while b + GROUP <= nb {
            unsafe { ctx.blocks::<GROUPS, DOT, BITS, GROUP>(b, &mut acc) };
            b += GROUP;
        }
        // The last nb % 8 blocks in groups of 4, 2 and 1, as the one-token kernel takes them.
        if b + 4 <= nb {
            unsafe { ctx.blocks::<GROUPS, DOT, BITS, 4>(b, &mut acc) };
            b += 4;
        }
        if b + 2 <= nb {
            unsafe { ctx.blocks::<GROUPS, DOT, BITS, 2>(b, &mut acc) };
            b += 2;
        }
        if b < nb {
            unsafe { ctx.blocks::<GROUPS, DOT, BITS, 1>(b, &mut acc) };
        }
        for (t, acc) in acc[..nt].iter().enumerate() {
            out[(row - rows.start) * TOKEN_TILE + t] = avx2::hsum(*acc);
        }
    }
}

/// One weight row of a tile and what its blocks are multiplied with.
struct Row<'a> {
    wq: *const u8,
    table: __m256i,
    wd: &'a [f16],
    offsets: &'a BlockOffsets<'a>,
    values: *const i8,
    cols: usize,
    xd: &'a [&'a [f32]; 2 * GROUP_TOKENS],
    sums: &'a [&'a [f32]; 2 * GROUP_TOKENS],
    bpb: usize,
    nt: usize,
}

impl Row<'_> {
    /// Adds to `acc[t]` the products of blocks `b..b+N` (N ≤ 8) with token t, and the blocks'
    /// offsets times the token's scaled sums, as [`avx2`]'s `group_products` does for one token.
    ///
    /// # Safety
    /// Blocks b..b+N lie inside the row and the tokens' activations; the CPU has what
    /// [`uq_dot_rows_with`]'s caller needs.
    #[inline(always)]
    unsafe fn blocks<const GROUPS: usize, const DOT: u8, const BITS: u8, const N: usize>(
        &self,
        b: usize,
        acc: &mut [__m256; 2 * GROUP_TOKENS],
    ) {
        // SAFETY: per the contract.
        unsafe {
            // pairs[g][p]: blocks b+2p and b+2p+1 against group g, reduced as they come so that a
            // group's eight blocks take four registers, not eight.
            let mut pairs = [[_mm256_setzero_si256(); GROUP / 2]; GROUPS];
            for p in 0..N.div_ceil(2) {
                let first = self.block_sums::<GROUPS, DOT, BITS>(b + 2 * p);
                let second = if 2 * p + 1 < N {
                    self.block_sums::<GROUPS, DOT, BITS>(b + 2 * p + 1)
                } else {
                    [_mm256_setzero_si256(); GROUPS]
                };
                for (g, pairs) in pairs.iter_mut().enumerate() {
                    pairs[p] = pair_lanes(first[g], second[g]);
                }
            }
            let d = avx2::f16_group(&self.wd[b..b + N]);
            let offset = self.offsets.lanes(d, b, N);
            let mask = avx2::lane_mask(N);
            for (g, pairs) in pairs.iter().enumerate() {
                for (k, products) in token_lanes(pairs).into_iter().enumerate() {
                    let t = g * GROUP_TOKENS + k;
                    if t >= self.nt {
                        break;
                    }
                    if let Some(offset) = offset {
                        acc[t] =
                            _mm256_fmadd_ps(offset, _mm256_maskload_ps(self.sums[t].as_ptr().add(b), mask), acc[t]);
                    }
                    let dx = _mm256_maskload_ps(self.xd[t].as_ptr().add(b), mask);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), _mm256_mul_ps(d, dx), acc[t]);
                }
            }
        }
    }

    /// Block `b`'s integer sums against each group, lanes [t0 t0 t1 t1 | t2 t2 t3 t3].
    ///
    /// # Safety
    /// As for [`Row::blocks`].
    #[inline(always)]
    unsafe fn block_sums<const GROUPS: usize, const DOT: u8, const BITS: u8>(&self, b: usize) -> [__m256i; GROUPS] {
        // SAFETY: per the contract.
        unsafe {
            let eights = weight_eights::<DOT, BITS>(self.wq.add(b * self.bpb), self.table);
            let mut sums = [_mm256_setzero_si256(); GROUPS];
            for (g, sum) in sums.iter_mut().enumerate() {
                let runs = self.values.add(g * GROUP_TOKENS * self.cols + b * GROUP_BLOCK_BYTES);
                let mut run = [_mm256_setzero_si256(); 4];
                for (j, run) in run.iter_mut().enumerate() {
                    *run = _mm256_loadu_si256(runs.add(32 * j).cast());
                }
                *sum = if DOT == MADDUBS && !signed_weights::<DOT, BITS>() {
                    let mut pairs = [_mm256_setzero_si256(); 4];
                    for (j, pairs) in pairs.iter_mut().enumerate() {
                        *pairs = _mm256_maddubs_epi16(eights[j], run[j]);
                    }
                    let sum16 =
                        _mm256_add_epi16(_mm256_add_epi16(pairs[0], pairs[1]), _mm256_add_epi16(pairs[2], pairs[3]));
                    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
                } else {
                    let mut s = _mm256_setzero_si256();
                    for j in 0..4 {
                        s = if signed_weights::<DOT, BITS>() {
                            avx2::dot_i8i8::<DOT>(s, eights[j], run[j])
                        } else {
                            avx2::dot_u8i8::<DOT>(s, eights[j], run[j])
                        };
                    }
                    s
                };
            }
            sums
        }
    }
}

/// A block's 32 weights as four vectors of 8 bytes, each 8 broadcast to the four tokens'
/// quarters: unsigned ints (a table format's nibbles looked up in `table`, a 5-bit format's
/// fifth bits added), or signed where [`signed_weights`].
///
/// # Safety
/// `ptr` points at one whole block; the CPU has avx2 (and avx512bw and avx512vl at
/// AVX512_VNNI).
#[inline(always)]
unsafe fn weight_eights<const DOT: u8, const BITS: u8>(ptr: *const u8, table: __m256i) -> [__m256i; 4] {
    // SAFETY: the loads read the block's own bytes per the contract.
    unsafe {
        let mut eights = unsigned_eights::<DOT, BITS>(ptr, table);
        if signed_weights::<DOT, BITS>() {
            for e in &mut eights {
                *e = _mm256_xor_si256(*e, _mm256_set1_epi8(-128));
            }
        }
        eights
    }
}

/// [`weight_eights`] as unsigned ints.
///
/// # Safety
/// As for [`weight_eights`].
#[inline(always)]
unsafe fn unsigned_eights<const DOT: u8, const BITS: u8>(ptr: *const u8, table: __m256i) -> [__m256i; 4] {
    // SAFETY: the loads read the block's own bytes per the contract.
    unsafe {
        let eight = |at: usize| _mm256_set1_epi64x((ptr.add(at) as *const i64).read_unaligned());
        if BITS == QuantBits::Eight as u8 {
            return [eight(0), eight(8), eight(16), eight(24)];
        }
        // Byte j holds value j in its low nibble and value j + 16 in its high one.
        let low_nibbles = _mm256_set1_epi8(0x0f);
        let (first, second) = (eight(0), eight(8));
        let mut codes = [
            _mm256_and_si256(first, low_nibbles),
            _mm256_and_si256(second, low_nibbles),
            _mm256_and_si256(_mm256_srli_epi16::<4>(first), low_nibbles),
            _mm256_and_si256(_mm256_srli_epi16::<4>(second), low_nibbles),
        ];
        if BITS == QuantBits::FourTable as u8 {
            for c in &mut codes {
                *c = _mm256_shuffle_epi8(table, *c);
            }
            return codes;
        }
        if BITS == QuantBits::Five as u8 {
            // Value j's fifth bit is bit j of the 32-bit mask after the nibbles: vector j adds
            // 0x10 to its bytes by mask byte j, once in each token's quarter.
            let mask = (ptr.add(16) as *const u32).read_unaligned().to_le_bytes();
            let fifth = _mm256_set1_epi8(0x10);
            if DOT == AVX512_VNNI {
                for (c, mask) in codes.iter_mut().zip(mask) {
                    *c = _mm256_mask_add_epi8(*c, u32::from(mask) * 0x0101_0101, *c, fifth);
                }
                return codes;
            }
            // Without AVX-512's byte masks: the 32 values' 0x10s in value order, as the
            // one-token kernel makes them, then vector j's eight broadcast to the four quarters.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(i32::from_le_bytes(mask)),
                _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let fifths = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), fifth);
            codes[0] = _mm256_or_si256(codes[0], _mm256_permute4x64_epi64::<0x00>(fifths));
            codes[1] = _mm256_or_si256(codes[1], _mm256_permute4x64_epi64::<0x55>(fifths));
            codes[2] = _mm256_or_si256(codes[2], _mm256_permute4x64_epi64::<0xaa>(fifths));
            codes[3] = _mm256_or_si256(codes[3], _mm256_permute4x64_epi64::<0xff>(fifths));
        }
        codes
    }
}

/// Two blocks' sums in token lanes ([t0 t0 t1 t1 | t2 t2 t3 t3]) as each token's two blocks side
/// by side: [b t0, b' t0, b t1, b' t1 | b t2, b' t2, b t3, b' t3].
///
/// # Safety
/// The CPU has avx2.
#[inline(always)]
unsafe fn pair_lanes(first: __m256i, second: __m256i) -> __m256i {
    // SAFETY: per the contract. hadd gives [b t0, b t1, b' t0, b' t1 | b t2, b t3, b' t2, b' t3].
    unsafe { _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(first, second)) }
}

/// Eight blocks' sums as four [`pair_lanes`] (blocks 0–1, 2–3, 4–5, 6–7) into each token's
/// eight block sums, a lane a block.
///
/// # Safety
/// The CPU has avx2.
#[inline(always)]
unsafe fn token_lanes(pairs: &[__m256i; GROUP / 2]) -> [__m256i; GROUP_TOKENS] {
    // SAFETY: per the contract.
    unsafe {
        let [p01, p23, p45, p67] = *pairs;
        // [blocks 0–3 of t0 | of t2] and [of t1 | of t3], then the same of blocks 4–7.
        let (even_low, odd_low) = (_mm256_unpacklo_epi64(p01, p23), _mm256_unpackhi_epi64(p01, p23));
        let (even_high, odd_high) = (_mm256_unpacklo_epi64(p45, p67), _mm256_unpackhi_epi64(p45, p67));
        [
            _mm256_permute2x128_si256::<0x20>(even_low, even_high),
            _mm256_permute2x128_si256::<0x20>(odd_low, odd_high),
            _mm256_permute2x128_si256::<0x31>(even_low, even_high),
            _mm256_permute2x128_si256::<0x31>(odd_low, odd_high),
        ]
    }
}
