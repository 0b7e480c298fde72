//! A prompt's products of the 32-value block formats (Q4_0 to Q8_0, IQ4_NL, MXFP4), four
//! tokens at a time with no reduction across lanes: the activations are laid out
//! ([`TokenGroups`]) so that a vector's 32-bit lanes are [block][token], and a quad of each
//! block's weights (four values) broadcast over its block's four lanes meets the same quad of four
//! tokens. Eight dot products, one a quad, leave each lane holding one block's sum for one token,
//! so its scales apply lane by lane.
//!
//! Each token takes the same f32 operations, in the same order, as the one-token kernel of its
//! level ([`avx2`]'s `uq_dot_rows*`): a token's eight f32 lanes (here spread over 8 / BLOCKS
//! vectors, one per set of lanes) take block b's products in lane b mod 8, the last nb mod 8
//! blocks in runs of 4, 2 and 1 from the first lane, and are summed at the end the same way, so
//! a token's product has the same bits in a prompt as alone.
//!
//! Two widths share the walk ([`Lanes`]): 256-bit vectors of two blocks for AVX2 and AVX-VNNI,
//! one row at a time (sixteen registers); 512-bit vectors of four blocks at AVX-512, two rows at
//! a time, which share each load of the activations.
//!
//! Every level's dot product (`DOT`) gives the same integer sums. With `maddubs` four quads add in
//! i16 before one `madd` (4- and 5-bit weights: at most 4·2·31·127 < 2¹⁵); 8-bit weights and a
//! table format's looked-up ones, multiplied signed as the one-token kernel does, take a `madd`
//! per quad.

use super::super::matrix::TOKEN_TILE;
use super::super::quant::{
    QuantBits, QuantizedActivations, TokenGroups, UqMatrix, BLOCK, CHUNK_BLOCKS, GROUP_TOKENS, QUAD, QUAD_BYTES,
};
use super::avx2::{self, signed_weights, BlockOffsets, AVX512_VNNI, AVX_VNNI, GROUP, MADDUBS};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

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
    unsafe { uq_dot_rows_with::<Ymm<MADDUBS>>(w, rows, x, t0, nt, out) }
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
    unsafe { uq_dot_rows_with::<Ymm<AVX_VNNI>>(w, rows, x, t0, nt, out) }
}

/// [`uq_dot_rows`] with AVX-512 VNNI on 512-bit vectors, the bits of
/// [`avx2::uq_dot_rows_avx512`].
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
    unsafe { uq_dot_rows_with::<Zmm>(w, rows, x, t0, nt, out) }
}

#[inline(always)]
unsafe fn uq_dot_rows_with<V: Lanes>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let groups = &x.groups;
    let nb = w.blocks_per_row();
    assert!(rows.end <= w.rows && t0 + nt <= x.n && x.cols == w.cols && (2..=TOKEN_TILE).contains(&nt));
    assert!(t0.is_multiple_of(GROUP_TOKENS) && groups.chunks == nb.div_ceil(CHUNK_BLOCKS));
    let last_group = (t0 + nt).div_ceil(GROUP_TOKENS);
    assert!(
        groups.values.len() >= groups.values_at(last_group, 0) && groups.d.len() >= groups.scales_at(last_group, 0)
    );
    assert!(groups.sums_for(w).len() == groups.d.len());
    assert!(out.len() >= rows.len() * TOKEN_TILE);
    assert!(w.qs.len() >= w.rows * w.row_bytes() && w.d.len() >= w.rows * nb);
    // SAFETY (every arm): features per the callers' contracts; bounds asserted above.
    unsafe {
        match (w.bits, nt.div_ceil(GROUP_TOKENS)) {
            (QuantBits::Four, 1) => tile::<V, 1, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Four, _) => tile::<V, 2, { QuantBits::Four as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, 1) => tile::<V, 1, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::FourTable, _) => tile::<V, 2, { QuantBits::FourTable as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, 1) => tile::<V, 1, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Eight, _) => tile::<V, 2, { QuantBits::Eight as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, 1) => tile::<V, 1, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
            (QuantBits::Five, _) => tile::<V, 2, { QuantBits::Five as u8 }>(w, rows, x, t0, nt, out),
        }
    }
}

// A tile is at most two groups.
const _: () = assert!(TOKEN_TILE <= 2 * GROUP_TOKENS);

/// The tile's rows, [`Lanes::ROWS`] at a time where they pair up.
#[inline(always)]
unsafe fn tile<V: Lanes, const GROUPS: usize, const BITS: u8>(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    let tile = Tile::<V> {
        w,
        groups: &x.groups,
        sums: x.groups.sums_for(w),
        first_group: t0 / GROUP_TOKENS,
        // SAFETY: the caller has avx2.
        table: unsafe { V::table(w) },
        nt,
    };
    let mut row = rows.start;
    // SAFETY (every call): rows below `rows.end` ≤ w.rows, checked by the caller with the rest.
    unsafe {
        if V::ROWS == 2 {
            while row + 2 <= rows.end {
                tile.rows::<2, GROUPS, BITS>(row, &mut out[(row - rows.start) * TOKEN_TILE..]);
                row += 2;
            }
        }
        while row < rows.end {
            tile.rows::<1, GROUPS, BITS>(row, &mut out[(row - rows.start) * TOKEN_TILE..]);
            row += 1;
        }
    }
}

/// One tile's matrix, tokens and the lookup table of its format.
struct Tile<'a, V: Lanes> {
    w: &'a UqMatrix,
    groups: &'a TokenGroups,
    sums: &'a [f32],
    first_group: usize,
    table: V::I,
    nt: usize,
}

impl<V: Lanes> Tile<'_, V> {
    /// Rows `row..row+R` against the tile's tokens, into `out[r · TOKEN_TILE + t]`.
    ///
    /// # Safety
    /// The rows lie in the matrix; the CPU has what [`uq_dot_rows_with`]'s caller needs.
    #[inline(always)]
    unsafe fn rows<const R: usize, const GROUPS: usize, const BITS: u8>(&self, row: usize, out: &mut [f32]) {
        let nb = self.w.blocks_per_row();
        // SAFETY: per the contract; every step's blocks lie below nb.
        unsafe {
            // One set of accumulators per vector of a group of eight blocks: set k holds the
            // lanes of blocks ≡ k·BLOCKS.. (mod 8), as the one-token kernel's lanes do. Four
            // variables rather than an array indexed by k, which would keep them in memory.
            let offsets: [BlockOffsets; R] =
                std::array::from_fn(|r| BlockOffsets::of_row(self.w, row + r, V::signed::<BITS>()));
            let zero = [[V::zero_f(); R]; GROUPS];
            let (mut set0, mut set1, mut set2, mut set3) = (zero, zero, zero, zero);
            let mut b = 0;
            while b + GROUP <= nb {
                let blocks = V::BLOCKS;
                self.step::<R, GROUPS, BITS>(row, &offsets, b, blocks, &mut set0);
                self.step::<R, GROUPS, BITS>(row, &offsets, b + blocks, blocks, &mut set1);
                if V::SETS == 4 {
                    self.step::<R, GROUPS, BITS>(row, &offsets, b + 2 * blocks, blocks, &mut set2);
                    self.step::<R, GROUPS, BITS>(row, &offsets, b + 3 * blocks, blocks, &mut set3);
                }
                b += GROUP;
            }
            // The last nb % 8 blocks as the one-token kernel takes them: runs of 4, 2 and 1,
            // each from the first of a token's eight lanes.
            if b + 4 <= nb {
                self.step::<R, GROUPS, BITS>(row, &offsets, b, V::BLOCKS, &mut set0);
                if V::BLOCKS == 2 {
                    self.step::<R, GROUPS, BITS>(row, &offsets, b + 2, 2, &mut set1);
                }
                b += 4;
            }
            if b + 2 <= nb {
                self.step::<R, GROUPS, BITS>(row, &offsets, b, 2, &mut set0);
                b += 2;
            }
            if b < nb {
                self.step::<R, GROUPS, BITS>(row, &offsets, b, 1, &mut set0);
            }
            let mut acc = [[[V::zero_f(); MAX_SETS]; R]; GROUPS];
            for (k, set) in [set0, set1, set2, set3].into_iter().enumerate() {
                for (acc, set) in acc.iter_mut().zip(set) {
                    for (acc, set) in acc.iter_mut().zip(set) {
                        acc[k] = set;
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                for (r, sets) in acc.iter().enumerate() {
                    let tokens = V::token_lanes(sets);
                    for (k, lanes) in tokens.into_iter().enumerate() {
                        let t = g * GROUP_TOKENS + k;
                        if t < self.nt {
                            out[r * TOKEN_TILE + t] = avx2::hsum(lanes);
                        }
                    }
                }
            }
        }
    }

    /// Adds the products of blocks `b..b+n` (n ≤ BLOCKS; b a multiple of BLOCKS but in a short
    /// step) of rows `row..row+R` to the first lanes of `acc`, each block's offset times the
    /// tokens' scaled sums first, as the one-token kernel does.
    ///
    /// # Safety
    /// As for [`Tile::rows`]; blocks b..b+n lie in the row.
    #[inline(always)]
    unsafe fn step<const R: usize, const GROUPS: usize, const BITS: u8>(
        &self,
        row: usize,
        row_offsets: &[BlockOffsets; R],
        b: usize,
        n: usize,
        acc: &mut [[V::F; R]; GROUPS],
    ) {
        let w = self.w;
        let (nb, bpb) = (w.blocks_per_row(), w.bits.bytes_per_block());
        // SAFETY: per the contract; a short step reads its blocks from zero-padded copies.
        unsafe {
            let mut halves = [[V::zero_i(); 2]; R];
            let mut scales = [V::zero_f(); R];
            let mut offsets = [None; R];
            for r in 0..R {
                let at = (row + r) * nb + b;
                let mut padded = Padded::default();
                let (wq, wd) = if n == V::BLOCKS {
                    (w.qs.as_ptr().add(at * bpb), w.d.as_ptr().add(at))
                } else {
                    padded.copy(&w.qs[at * bpb..][..n * bpb], &w.d[at..][..n]);
                    (padded.qs.as_ptr(), padded.d.as_ptr())
                };
                halves[r] = V::halves::<BITS>(wq, bpb, self.table);
                scales[r] = V::block_scales(wd);
                offsets[r] = match row_offsets[r] {
                    BlockOffsets::None => None,
                    BlockOffsets::ScaleTimes(factor) => Some(V::mul(scales[r], V::splat(factor))),
                    BlockOffsets::PerBlock(m) if n == V::BLOCKS => Some(V::block_scales(m.as_ptr().add(b))),
                    BlockOffsets::PerBlock(m) => {
                        padded.copy(&[], &m[b..b + n]);
                        Some(V::block_scales(padded.d.as_ptr()))
                    }
                };
            }
            // Each half's sums apart, so that no chain of dot products is more than four long.
            let mut half_sums = [[[V::zero_i(); R]; GROUPS]; 2];
            for (h, sums) in half_sums.iter_mut().enumerate() {
                let mut quads = [[V::zero_i(); QUAD]; R];
                for (quads, halves) in quads.iter_mut().zip(&halves) {
                    for (j, quad) in quads.iter_mut().enumerate() {
                        *quad = V::quad(halves[h], j);
                    }
                }
                for (g, sums) in sums.iter_mut().enumerate() {
                    let at = self.groups.values_at(self.first_group + g, b) + h * QUAD * QUAD_BYTES;
                    let mut values = [V::zero_i(); QUAD];
                    for (j, v) in values.iter_mut().enumerate() {
                        *v = V::load_values(self.groups.values.as_ptr().add(at + j * QUAD_BYTES), n);
                    }
                    for (sum, quads) in sums.iter_mut().zip(&quads) {
                        *sum = V::dot_quads::<BITS>(*sum, quads, &values);
                    }
                }
            }
            for (g, acc) in acc.iter_mut().enumerate() {
                let at = self.groups.scales_at(self.first_group + g, b);
                let dx = V::load_f(self.groups.d.as_ptr().add(at), n);
                let token_sums = V::load_f(self.sums.as_ptr().add(at), n);
                for r in 0..R {
                    let acc = &mut acc[r];
                    if let Some(offset) = offsets[r] {
                        *acc = V::fmadd(offset, token_sums, *acc);
                    }
                    let sums = V::add_i(half_sums[0][g][r], half_sums[1][g][r]);
                    *acc = V::fmadd(V::cvt(sums), V::mul(scales[r], dx), *acc);
                }
            }
        }
    }
}

/// The most lane sets a width takes (256-bit vectors: four of two blocks).
const MAX_SETS: usize = GROUP / 2;

/// A short step's blocks copied out with zeros after them, so that whole vectors load.
struct Padded {
    qs: [u8; CHUNK_BLOCKS * BLOCK],
    d: [f16; CHUNK_BLOCKS],
}

impl Default for Padded {
    fn default() -> Self {
        Self { qs: [0; CHUNK_BLOCKS * BLOCK], d: [f16::ZERO; CHUNK_BLOCKS] }
    }
}

impl Padded {
    fn copy(&mut self, qs: &[u8], d: &[f16]) {
        self.qs = [0; CHUNK_BLOCKS * BLOCK];
        self.qs[..qs.len()].copy_from_slice(qs);
        self.d = [f16::ZERO; CHUNK_BLOCKS];
        self.d[..d.len()].copy_from_slice(d);
    }
}

/// A vector width's operations on vectors of [`Lanes::BLOCKS`] blocks × four tokens, in 32-bit
/// lanes [block][token] (128 bits a block).
///
/// Every method is `unsafe` for its CPU features: the caller is compiled with those of the
/// width ([`Ymm`]: avx2, fma, f16c, and avxvnni at AVX_VNNI; [`Zmm`]: those and avx512f,
/// avx512bw, avx512vl, avx512vnni), and pointers point at whole vectors' worth of data. The
/// `unsafe` blocks of the two implementations rest on this contract alone.
trait Lanes {
    type I: Copy;
    type F: Copy;
    /// Blocks a vector holds.
    const BLOCKS: usize;
    /// Vectors a group of eight blocks spreads over.
    const SETS: usize = GROUP / Self::BLOCKS;
    /// Rows taken at a time where they pair up.
    const ROWS: usize;

    /// Whether weights of format `BITS` are multiplied as signed bytes ([`signed_weights`]).
    fn signed<const BITS: u8>() -> bool;

    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    /// A table format's 16 values in every 128-bit lane.
    unsafe fn table(w: &UqMatrix) -> Self::I;
    /// The blocks' values 0–15 and 16–31, a block to a 128-bit lane, as bytes the dot product
    /// takes (unsigned, or signed where [`signed_weights`]).
    unsafe fn halves<const BITS: u8>(ptr: *const u8, bpb: usize, table: Self::I) -> [Self::I; 2];
    /// Quad `j` (0–3) of each 128-bit lane, over the whole lane.
    unsafe fn quad(v: Self::I, j: usize) -> Self::I;
    /// The values of `n` blocks from `ptr`, zeros after them (a short step is the row's last).
    unsafe fn load_values(ptr: *const i8, n: usize) -> Self::I;
    /// `acc` plus each lane's four quads of weights times values.
    unsafe fn dot_quads<const BITS: u8>(acc: Self::I, weights: &[Self::I; QUAD], values: &[Self::I; QUAD]) -> Self::I;
    /// The blocks' f16 values, each over its block's four lanes.
    unsafe fn block_scales(ptr: *const f16) -> Self::F;
    /// The scales of `n` blocks from `ptr`, zeros after them (as for `load_values`).
    unsafe fn load_f(ptr: *const f32, n: usize) -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn cvt(v: Self::I) -> Self::F;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    /// Each of the four tokens' eight lanes, blocks ≡ 0..8 (mod 8) in order, from the first
    /// [`Lanes::SETS`] sets.
    unsafe fn token_lanes(sets: &[Self::F; MAX_SETS]) -> [__m256; GROUP_TOKENS];
}

/// 256-bit vectors of two blocks, for AVX2 and AVX-VNNI.
struct Ymm<const DOT: u8>;

impl<const DOT: u8> Lanes for Ymm<DOT> {
    type I = __m256i;
    type F = __m256;
    const BLOCKS: usize = 2;
    const ROWS: usize = 1;

    fn signed<const BITS: u8>() -> bool {
        signed_weights::<DOT, BITS>()
    }

    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn table(w: &UqMatrix) -> __m256i {
        unsafe { avx2::table_lanes(w) }
    }

    #[inline(always)]
    unsafe fn halves<const BITS: u8>(ptr: *const u8, bpb: usize, table: __m256i) -> [__m256i; 2] {
        unsafe {
            let mut halves = if BITS == QuantBits::Eight as u8 {
                let (first, second) = (_mm256_loadu_si256(ptr.cast()), _mm256_loadu_si256(ptr.add(BLOCK).cast()));
                [_mm256_permute2x128_si256::<0x20>(first, second), _mm256_permute2x128_si256::<0x31>(first, second)]
            } else {
                let nibbles = _mm256_set_m128i(_mm_loadu_si128(ptr.add(bpb).cast()), _mm_loadu_si128(ptr.cast()));
                let low_nibbles = _mm256_set1_epi8(0x0f);
                let mut halves = [
                    _mm256_and_si256(nibbles, low_nibbles),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(nibbles), low_nibbles),
                ];
                if BITS == QuantBits::FourTable as u8 {
                    for h in &mut halves {
                        *h = _mm256_shuffle_epi8(table, *h);
                    }
                }
                if BITS == QuantBits::Five as u8 {
                    // Value j's fifth bit is bit j of the block's mask: byte j of a half takes
                    // mask byte j/8 (values 16.. from bytes 2 and 3), keeps bit j mod 8, and
                    // turns a set one into 0x10.
                    let mask = |block: usize| (ptr.add(block * bpb + BLOCK / 2) as *const i32).read_unaligned();
                    let masks = _mm256_setr_epi32(mask(0), 0, 0, 0, mask(1), 0, 0, 0);
                    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let (low, high) = (0x0101_0101_0101_0101i64, 0x0202_0202_0202_0202i64);
                    let spreads =
                        [_mm256_setr_epi64x(0, low, 0, low), _mm256_setr_epi64x(high, high | low, high, high | low)];
                    for (h, spread) in halves.iter_mut().zip(spreads) {
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(masks, spread), bit), bit);
                        *h = _mm256_or_si256(*h, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
                    }
                }
                halves
            };
            if signed_weights::<DOT, BITS>() {
                for h in &mut halves {
                    *h = _mm256_xor_si256(*h, _mm256_set1_epi8(-128));
                }
            }
            halves
        }
    }

    #[inline(always)]
    unsafe fn quad(v: __m256i, j: usize) -> __m256i {
        unsafe {
            match j {
                0 => _mm256_shuffle_epi32::<0x00>(v),
                1 => _mm256_shuffle_epi32::<0x55>(v),
                2 => _mm256_shuffle_epi32::<0xaa>(v),
                _ => _mm256_shuffle_epi32::<0xff>(v),
            }
        }
    }

    #[inline(always)]
    unsafe fn load_values(ptr: *const i8, _n: usize) -> __m256i {
        // A vector of two blocks ends inside its quad of four, whatever n.
        unsafe { _mm256_loadu_si256(ptr.cast()) }
    }

    #[inline(always)]
    unsafe fn dot_quads<const BITS: u8>(acc: __m256i, weights: &[__m256i; QUAD], values: &[__m256i; QUAD]) -> __m256i {
        unsafe {
            if DOT == MADDUBS && !signed_weights::<DOT, BITS>() {
                let mut sum16 = _mm256_setzero_si256();
                for (w, v) in weights.iter().zip(values) {
                    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(*w, *v));
                }
                return _mm256_add_epi32(acc, _mm256_madd_epi16(sum16, _mm256_set1_epi16(1)));
            }
            let mut acc = acc;
            for (w, v) in weights.iter().zip(values) {
                acc = if signed_weights::<DOT, BITS>() {
                    avx2::dot_i8i8::<DOT>(acc, *w, *v)
                } else {
                    avx2::dot_u8i8::<DOT>(acc, *w, *v)
                };
            }
            acc
        }
    }

    #[inline(always)]
    unsafe fn block_scales(ptr: *const f16) -> __m256 {
        unsafe {
            let two = _mm_cvtph_ps(_mm_cvtsi32_si128((ptr as *const i32).read_unaligned()));
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))
        }
    }

    #[inline(always)]
    unsafe fn load_f(ptr: *const f32, _n: usize) -> __m256 {
        // As for `load_values`: inside the chunk.
        unsafe { _mm256_loadu_ps(ptr) }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn cvt(v: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }

    #[inline(always)]
    unsafe fn token_lanes(sets: &[__m256; MAX_SETS]) -> [__m256; GROUP_TOKENS] {
        unsafe {
            // Each set to [t0's two blocks, t1's, t2's, t3's], then a 4 × 4 transpose of those
            // 64-bit pairs.
            let by_token = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let pairs = |s: __m256| _mm256_castps_pd(_mm256_permutevar8x32_ps(s, by_token));
            let (s0, s1, s2, s3) = (pairs(sets[0]), pairs(sets[1]), pairs(sets[2]), pairs(sets[3]));
            let (even01, odd01) = (_mm256_unpacklo_pd(s0, s1), _mm256_unpackhi_pd(s0, s1));
            let (even23, odd23) = (_mm256_unpacklo_pd(s2, s3), _mm256_unpackhi_pd(s2, s3));
            [
                _mm256_castpd_ps(_mm256_permute2f128_pd::<0x20>(even01, even23)),
                _mm256_castpd_ps(_mm256_permute2f128_pd::<0x20>(odd01, odd23)),
                _mm256_castpd_ps(_mm256_permute2f128_pd::<0x31>(even01, even23)),
                _mm256_castpd_ps(_mm256_permute2f128_pd::<0x31>(odd01, odd23)),
            ]
        }
    }
}

/// 512-bit vectors of four blocks, for AVX-512 VNNI.
struct Zmm;

/// The 32-bit lanes of `n` blocks' four tokens.
fn lanes_of(n: usize) -> __mmask16 {
    ((1u32 << (n * GROUP_TOKENS)) - 1) as __mmask16
}

impl Lanes for Zmm {
    type I = __m512i;
    type F = __m512;
    const BLOCKS: usize = 4;
    const ROWS: usize = 2;

    fn signed<const BITS: u8>() -> bool {
        signed_weights::<AVX512_VNNI, BITS>()
    }

    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn table(w: &UqMatrix) -> __m512i {
        unsafe {
            match w.table {
                Some(table) => _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast())),
                None => _mm512_setzero_si512(),
            }
        }
    }

    #[inline(always)]
    unsafe fn halves<const BITS: u8>(ptr: *const u8, bpb: usize, table: __m512i) -> [__m512i; 2] {
        unsafe {
            if BITS == QuantBits::Eight as u8 {
                let (first, second) = (_mm512_loadu_si512(ptr.cast()), _mm512_loadu_si512(ptr.add(2 * BLOCK).cast()));
                return [
                    _mm512_shuffle_i64x2::<0b10_00_10_00>(first, second),
                    _mm512_shuffle_i64x2::<0b11_01_11_01>(first, second),
                ];
            }
            let nibbles = if BITS == QuantBits::Five as u8 {
                let block = |i: usize| _mm_loadu_si128(ptr.add(i * bpb).cast());
                let low = _mm256_set_m128i(block(1), block(0));
                let high = _mm256_set_m128i(block(3), block(2));
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
            } else {
                _mm512_loadu_si512(ptr.cast())
            };
            let low_nibbles = _mm512_set1_epi8(0x0f);
            let mut halves = [
                _mm512_and_si512(nibbles, low_nibbles),
                _mm512_and_si512(_mm512_srli_epi16::<4>(nibbles), low_nibbles),
            ];
            if BITS == QuantBits::FourTable as u8 {
                for h in &mut halves {
                    *h = _mm512_shuffle_epi8(table, *h);
                }
            }
            if BITS == QuantBits::Five as u8 {
                // Value j's fifth bit is bit j of its block's mask: the low 16 bits mark the
                // first half's bytes, the high 16 the second's, a block's 16 bytes a lane.
                let (mut low, mut high) = (0u64, 0u64);
                for i in 0..CHUNK_BLOCKS {
                    let mask = u64::from((ptr.add(i * bpb + BLOCK / 2) as *const u32).read_unaligned());
                    low |= (mask & 0xffff) << (16 * i);
                    high |= (mask >> 16) << (16 * i);
                }
                let fifth = _mm512_set1_epi8(0x10);
                halves[0] = _mm512_or_si512(halves[0], _mm512_maskz_mov_epi8(low, fifth));
                halves[1] = _mm512_or_si512(halves[1], _mm512_maskz_mov_epi8(high, fifth));
            }
            halves
        }
    }

    #[inline(always)]
    unsafe fn quad(v: __m512i, j: usize) -> __m512i {
        unsafe {
            match j {
                0 => _mm512_shuffle_epi32::<0x00>(v),
                1 => _mm512_shuffle_epi32::<0x55>(v),
                2 => _mm512_shuffle_epi32::<0xaa>(v),
                _ => _mm512_shuffle_epi32::<0xff>(v),
            }
        }
    }

    #[inline(always)]
    unsafe fn load_values(ptr: *const i8, n: usize) -> __m512i {
        // A short step's blocks may start mid-chunk: its vector would end past the quad.
        unsafe {
            if n == Self::BLOCKS {
                _mm512_loadu_si512(ptr.cast())
            } else {
                _mm512_maskz_loadu_epi32(lanes_of(n), ptr.cast())
            }
        }
    }

    #[inline(always)]
    unsafe fn dot_quads<const BITS: u8>(acc: __m512i, weights: &[__m512i; QUAD], values: &[__m512i; QUAD]) -> __m512i {
        unsafe {
            let mut acc = acc;
            for (w, v) in weights.iter().zip(values) {
                acc = _mm512_dpbusd_epi32(acc, *w, *v);
            }
            acc
        }
    }

    #[inline(always)]
    unsafe fn block_scales(ptr: *const f16) -> __m512 {
        unsafe {
            let four = _mm_cvtph_ps(_mm_cvtsi64_si128((ptr as *const i64).read_unaligned()));
            let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(four))
        }
    }

    #[inline(always)]
    unsafe fn load_f(ptr: *const f32, n: usize) -> __m512 {
        // As for `load_values`.
        unsafe {
            if n == Self::BLOCKS {
                _mm512_loadu_ps(ptr)
            } else {
                _mm512_maskz_loadu_ps(lanes_of(n), ptr)
            }
        }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn cvt(v: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }

    #[inline(always)]
    unsafe fn token_lanes(sets: &[__m512; MAX_SETS]) -> [__m256; GROUP_TOKENS] {
        unsafe {
            // Token t's lanes are t, t+4, t+8, t+12 of each set; the second set's from 16.
            let mut tokens = [_mm256_setzero_ps(); GROUP_TOKENS];
            for (t, lanes) in tokens.iter_mut().enumerate() {
                let t = t as i32;
                let index =
                    _mm512_setr_epi32(t, t + 4, t + 8, t + 12, t + 16, t + 20, t + 24, t + 28, 0, 0, 0, 0, 0, 0, 0, 0);
                *lanes = _mm512_castps512_ps256(_mm512_permutex2var_ps(sets[0], index, sets[1]));
            }
            tokens
        }
    }
}
