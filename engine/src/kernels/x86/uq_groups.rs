//! A prompt's products of the 32-value block formats (Q4_0 to Q8_0, IQ4_NL, MXFP4) at
//! AVX-512 with VNNI, four tokens to a vector: 8 weights of a row broadcast against 8 values of
//! each of four tokens ([`QuantizedActivations::groups`]), so one `dpbusd` serves four tokens
//! and a weight block is unpacked once for the whole tile. Per row the blocks' integer sums are
//! turned from token lanes into block lanes, and each token then takes the same f32 operations,
//! in the same order, as the one-token kernel ([`avx2::uq_dot_rows_avx512`]): a token's
//! product has the same bits in a prompt as alone. (Taking each block's scale against the
//! partial sums of four values, as a 512-bit vector of two blocks holds them, cost a
//! conversion, a permute and an FMA a block and token; here they are shared by eight blocks.)

use super::super::matrix::TOKEN_TILE;
use super::super::quant::{QuantBits, QuantizedActivations, UqMatrix, BLOCK, GROUP_TOKENS};
use super::avx2::{self, BlockOffsets, GROUP};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of a group's block: four runs of 32.
const GROUP_BLOCK_BYTES: usize = GROUP_TOKENS * BLOCK;

/// Products of weight rows `rows` with tokens `t0..t0+nt` (t0 a multiple of four,
/// 2 ≤ nt ≤ TOKEN_TILE), into `out[(row - rows.start) · TOKEN_TILE + t]`, with the bits of
/// [`avx2::uq_dot_rows_avx512`] for each token alone.
///
/// # Safety
/// The CPU must support avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn uq_dot_rows(
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
    // SAFETY (every arm): features per this function's contract; bounds asserted above.
    unsafe {
        match (w.bits, nt.div_ceil(GROUP_TOKENS)) {
            (QuantBits::Four, 1) => tile::<1, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Four, _) => tile::<2, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, 1) => tile::<1, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, _) => tile::<2, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, 1) => tile::<1, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, _) => tile::<2, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, 1) => tile::<1, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, _) => tile::<2, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
        }
    }
}

// A tile is at most two groups.
const _: () = assert!(TOKEN_TILE <= 2 * GROUP_TOKENS);

#[inline(always)]
unsafe fn tile<const GROUPS: usize, const BITS: u8>(
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
        // VNNI multiplies every format unsigned, offsets and all.
        let offsets = BlockOffsets::of_row(w, row, false);
        let mut acc = [_mm256_setzero_ps(); 2 * GROUP_TOKENS];
        let ctx = Row { wq, table, wd, offsets: &offsets, values, cols, xd: &xd, sums: &sums, bpb, nt };
        let mut b = 0;
        // SAFETY (every call): blocks b..b+N ≤ nb lie inside the row's weights, scales and
        // offsets, each token's scales and sums, and the groups' values.
        while b + GROUP <= nb {
            unsafe { ctx.blocks::<GROUPS, BITS, GROUP>(b, &mut acc) };
            b += GROUP;
        }
        // The last nb % 8 blocks in groups of 4, 2 and 1, as the one-token kernel takes them.
        if b + 4 <= nb {
            unsafe { ctx.blocks::<GROUPS, BITS, 4>(b, &mut acc) };
            b += 4;
        }
        if b + 2 <= nb {
            unsafe { ctx.blocks::<GROUPS, BITS, 2>(b, &mut acc) };
            b += 2;
        }
        if b < nb {
            unsafe { ctx.blocks::<GROUPS, BITS, 1>(b, &mut acc) };
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
    /// [`uq_dot_rows`] needs.
    #[inline(always)]
    unsafe fn blocks<const GROUPS: usize, const BITS: u8, const N: usize>(
        &self,
        b: usize,
        acc: &mut [__m256; 2 * GROUP_TOKENS],
    ) {
        // SAFETY: per the contract.
        unsafe {
            // sums[g][i]: block b+i against group g, lanes [t0 t0 t1 t1 | t2 t2 t3 t3].
            let mut sums = [[_mm256_setzero_si256(); GROUP]; GROUPS];
            for i in 0..N {
                let eights = weight_eights::<BITS>(self.wq.add((b + i) * self.bpb), self.table);
                for (g, sums) in sums.iter_mut().enumerate() {
                    let runs = self.values.add(g * GROUP_TOKENS * self.cols + (b + i) * GROUP_BLOCK_BYTES);
                    let mut s = _mm256_setzero_si256();
                    for (j, eight) in eights.iter().enumerate() {
                        s = _mm256_dpbusd_epi32(s, *eight, _mm256_loadu_si256(runs.add(32 * j).cast()));
                    }
                    sums[i] = s;
                }
            }
            let d = avx2::f16_group(&self.wd[b..b + N]);
            let offset = self.offsets.lanes(d, b, N);
            let mask = avx2::lane_mask(N);
            for (g, sums) in sums.iter().enumerate() {
                for (k, products) in token_lanes(sums).into_iter().enumerate() {
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
}

/// A block's 32 weights as four vectors of 8 unsigned ints, each 8 broadcast to the four
/// tokens' quarters (a table format's nibbles looked up in `table`, a 5-bit format's fifth
/// bits added).
///
/// # Safety
/// `ptr` points at one whole block; the CPU has avx2.
#[inline(always)]
unsafe fn weight_eights<const BITS: u8>(ptr: *const u8, table: __m256i) -> [__m256i; 4] {
    // SAFETY: the loads read the block's own bytes per the contract.
    unsafe {
        let eight = |at: usize| _mm256_set1_epi64x((ptr.add(at) as *const i64).read_unaligned());
        if BITS == QuantBits::Eight as u8 {
            return [eight(0), eight(8), eight(16), eight(24)];
        }
        // Byte j holds value j in its low nibble and value j + 16 in its high one.
        let low_nibbles = _mm256_set1_epi8(0x0f);
        let (first, second) = (eight(0), eight(8));
        let codes = [
            _mm256_and_si256(first, low_nibbles),
            _mm256_and_si256(second, low_nibbles),
            _mm256_and_si256(_mm256_srli_epi16::<4>(first), low_nibbles),
            _mm256_and_si256(_mm256_srli_epi16::<4>(second), low_nibbles),
        ];
        if BITS == QuantBits::FourTable as u8 {
            return codes.map(|c| _mm256_shuffle_epi8(table, c));
        }
        if BITS == QuantBits::Five as u8 {
            // Value j's fifth bit is bit j of the 32-bit mask after the nibbles: vector j adds
            // 0x10 to its bytes by mask byte j, once in each token's quarter.
            let mask = (ptr.add(16) as *const u32).read_unaligned().to_le_bytes();
            let fifth = _mm256_set1_epi8(0x10);
            return std::array::from_fn(|j| {
                _mm256_mask_add_epi8(codes[j], u32::from(mask[j]) * 0x0101_0101, codes[j], fifth)
            });
        }
        codes
    }
}

/// Eight blocks' sums in token lanes ([t0 t0 t1 t1 | t2 t2 t3 t3], two halves a token) as
/// each token's eight block sums, a lane a block.
///
/// # Safety
/// The CPU has avx2.
#[inline(always)]
unsafe fn token_lanes(sums: &[__m256i; GROUP]) -> [__m256i; GROUP_TOKENS] {
    // SAFETY: per the contract.
    unsafe {
        // hadd: [b t0, b t1, b' t0, b' t1 | b t2, b t3, b' t2, b' t3]; the shuffle puts each
        // token's two blocks side by side: [b t0, b' t0, b t1, b' t1 | ...].
        let pair = |i: usize| _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(sums[i], sums[i + 1]));
        let (p01, p23, p45, p67) = (pair(0), pair(2), pair(4), pair(6));
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
