//! AVX-512 (F, BW, VL, VNNI) kernels.

use super::super::attention::KV_TILE;
use super::{dispatch_rows, row_blocks};
use half::f16;
use std::arch::x86_64::*;

/// Query rows the score kernel keeps in registers: 8 rows × 2 tiles of accumulators, with the
/// two tiles' key rows, fill 18 of the 32 registers (the broadcasts fold into the FMAs).
const MAX_SCORE_ROWS: usize = 8;
/// Query rows the value kernel keeps in registers: 12 rows × 2 vectors of accumulators.
const MAX_VALUE_ROWS: usize = 12;

/// Scores of keys `c0..c0+len` (c0 a multiple of KV_TILE) against `rows` query rows:
/// `scores[r·len + j] = q[r] · k[c0 + j]`. With `prefetch` (the head's V), the keys two
/// passes ahead and these keys' values are asked for as the keys are scored.
///
/// # Safety
/// The CPU must support avx512f and f16c; `hd % 16 == 0`.
#[target_feature(enable = "avx512f,f16c")]
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
    for block in row_blocks(rows, MAX_SCORE_ROWS) {
        let (q, scores) = (&q[block.start * hd..], &mut scores[block.start * len..]);
        let mut j = 0;
        // Two tiles at a time while more than one remains, so each broadcast query value
        // feeds two FMAs; then one tile.
        while j < len {
            let tiles = if len - j > KV_TILE { 2 } else { 1 };
            // SAFETY: features per contract; bounds asserted above.
            unsafe {
                if tiles == 2 {
                    dispatch_rows!(block.len(), score_tiles::<R, 2>(k, prefetch, hd, q, c0, len, j, scores))
                } else {
                    dispatch_rows!(block.len(), score_tiles::<R, 1>(k, prefetch, hd, q, c0, len, j, scores))
                }
            }
            j = (j + tiles * KV_TILE).min(len);
        }
    }
}

/// Scores of the T tiles from key `c0 + j` against R query rows, into `scores[r·len + j..]`;
/// keys past `len` (the last tile's padding) are not written.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::too_many_arguments)]
// The loop index also addresses the tile by pointer, so it stays an index.
#[allow(clippy::needless_range_loop)]
unsafe fn score_tiles<const R: usize, const T: usize>(
    k: &[f16],
    prefetch: Option<&[f16]>,
    hd: usize,
    q: &[f32],
    c0: usize,
    len: usize,
    j: usize,
    scores: &mut [f32],
) {
    let q: [&[f32]; R] = std::array::from_fn(|r| &q[r * hd..][..hd]);
    let tile = (c0 + j) / KV_TILE;
    let base = k[tile * hd * KV_TILE..][..T * hd * KV_TILE].as_ptr();
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let values = prefetch.map(|v| v.as_ptr().wrapping_add((c0 + j) * hd));
    for d in 0..hd {
        // (Loops, not closures, around intrinsics: a closure would not inherit the features.)
        let mut keys = [_mm512_setzero_ps(); T];
        for (t, key) in keys.iter_mut().enumerate() {
            // SAFETY: row d of tile t, inside the T·hd·KV_TILE values above.
            *key = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(base.add((t * hd + d) * KV_TILE).cast()) });
        }
        // Every other row, as a 64-byte line holds two of a tile's: the K line two passes on, and
        // the V line at the same offset in these keys' values (which span as many lines).
        if let (Some(values), 0) = (values, d % 2) {
            for t in 0..T {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(((2 * T + t) * hd + d) * KV_TILE).cast());
                _mm_prefetch::<_MM_HINT_T0>(values.wrapping_add((t * hd + d) * KV_TILE).cast());
            }
        }
        for r in 0..R {
            let qd = _mm512_set1_ps(q[r][d]);
            for t in 0..T {
                acc[r][t] = _mm512_fmadd_ps(qd, keys[t], acc[r][t]);
            }
        }
    }
    for (r, tiles) in acc.iter().enumerate() {
        for (t, tile_scores) in tiles.iter().enumerate() {
            let start = j + t * KV_TILE;
            let n = KV_TILE.min(len - start);
            let mask = ((1u32 << n) - 1) as __mmask16;
            // SAFETY: the mask keeps the store to the n scores of row r from `start`.
            unsafe { _mm512_mask_storeu_ps(scores[r * len + start..][..n].as_mut_ptr(), mask, *tile_scores) };
        }
    }
}

/// `acc[r] += Σ_j p[r][j] · v[c0+j]` for j in 0..len, over `rows` rows.
///
/// # Safety
/// The CPU must support avx512f and f16c; `hd % 16 == 0`.
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate_values(v: &[f16], hd: usize, p: &[f32], rows: usize, c0: usize, len: usize, acc: &mut [f32]) {
    assert!(hd.is_multiple_of(16) && (c0 + len) * hd <= v.len() && p.len() >= rows * len && acc.len() >= rows * hd);
    let values = &v[c0 * hd..][..len * hd];
    for block in row_blocks(rows, MAX_VALUE_ROWS) {
        let (p, acc) = (&p[block.start * len..], &mut acc[block.start * hd..]);
        let mut column = 0;
        while column < hd {
            let width = if column + 32 <= hd { 32 } else { 16 };
            // SAFETY: features per contract; bounds asserted above.
            unsafe {
                if width == 32 {
                    dispatch_rows!(block.len(), accumulate_columns::<R, 2>(values, hd, p, len, column, acc))
                } else {
                    dispatch_rows!(block.len(), accumulate_columns::<R, 1>(values, hd, p, len, column, acc))
                }
            }
            column += width;
        }
    }
}

/// [`accumulate_values`] for R rows and the 16·C columns from `column`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
// The loop index also addresses the tile by pointer, so it stays an index.
#[allow(clippy::needless_range_loop)]
unsafe fn accumulate_columns<const R: usize, const C: usize>(
    values: &[f16],
    hd: usize,
    p: &[f32],
    len: usize,
    column: usize,
    acc: &mut [f32],
) {
    assert!(values.len() >= len * hd && column + 16 * C <= hd);
    let p: [&[f32]; R] = std::array::from_fn(|r| &p[r * len..][..len]);
    let mut sums = [[_mm512_setzero_ps(); C]; R];
    for j in 0..len {
        let mut row = [_mm512_setzero_ps(); C];
        for (c, vector) in row.iter_mut().enumerate() {
            // SAFETY: 16 values of row j from column + 16c, inside `values` (asserted above).
            *vector =
                _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(values.as_ptr().add(j * hd + column + 16 * c).cast()) });
        }
        for r in 0..R {
            let w = _mm512_set1_ps(p[r][j]);
            for c in 0..C {
                sums[r][c] = _mm512_fmadd_ps(w, row[c], sums[r][c]);
            }
        }
    }
    for (r, columns) in sums.iter().enumerate() {
        for (c, sum) in columns.iter().enumerate() {
            let dst = acc[r * hd + column + 16 * c..][..16].as_mut_ptr();
            // SAFETY: 16 floats of row r, inside `acc`.
            unsafe { _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), *sum)) };
        }
    }
}

/// exp(x) for 16 lanes: 2^n · e^r with |r| ≤ ln2/2, a degree-6 polynomial for e^r.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut poly = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(poly, n)
}

/// Replaces each value with exp(value − max) and returns their sum.
///
/// # Safety
/// The CPU must support avx512f.
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_shifted(row: &mut [f32], max: f32) -> f32 {
    let m = _mm512_set1_ps(max);
    let mut total = _mm512_setzero_ps();
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 16 floats.
        unsafe {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m));
            _mm512_storeu_ps(c.as_mut_ptr(), e);
            total = _mm512_add_ps(total, e);
        }
    }
    let rest = chunks.into_remainder();
    let mask: __mmask16 = ((1u32 << rest.len()) - 1) as __mmask16;
    // SAFETY: the mask covers only the remaining values.
    unsafe {
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, rest.as_ptr()), m));
        _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, e);
        total = _mm512_add_ps(total, _mm512_maskz_mov_ps(mask, e));
    }
    _mm512_reduce_add_ps(total)
}

/// Scores (`out[head][i]`) of `tokens` against per-KV-head queries for signed INT8 (`int4 == false`) or INT4
/// key rows (`[token][head]`, `row_bytes` each, one f32 scale per row); see
/// `score::ScoringKeys::score`. INT4 bytes hold dimension 2i in the low nibble, 2i+1 in the high.
///
/// # Safety
/// The CPU must support avx512f; `head_dim % 32 == 0`; rows of every token lie in `data`.
#[target_feature(enable = "avx512f")]
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
            let mut acc = _mm512_setzero_ps();
            // SAFETY (loads): each 16-byte load stays inside this row's row_bytes (hd % 32 == 0).
            if int4 {
                for c in (0..row_bytes).step_by(16) {
                    let bytes = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(ptr.add(c) as *const __m128i) });
                    let lo = _mm512_srai_epi32(_mm512_slli_epi32(bytes, 28), 28);
                    let hi = _mm512_srai_epi32(_mm512_slli_epi32(bytes, 24), 28);
                    let q_even = _mm512_loadu_ps(even[h * hd / 2 + c..][..16].as_ptr());
                    let q_odd = _mm512_loadu_ps(odd[h * hd / 2 + c..][..16].as_ptr());
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), q_even, acc);
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), q_odd, acc);
                }
            } else {
                for c in (0..hd).step_by(16) {
                    let k = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(unsafe {
                        _mm_loadu_si128(ptr.add(c) as *const __m128i)
                    }));
                    acc = _mm512_fmadd_ps(k, _mm512_loadu_ps(query[h * hd + c..][..16].as_ptr()), acc);
                }
            }
            out[h * n + i] = _mm512_reduce_add_ps(acc) * scales[row];
        }
    }
}

/// A device query's scores from a low-precision key copy, in integers: `out[h][i] = dot(k, q)
/// as f32 × scale` for each KV head `h` and token `tokens[i]`, the device's exact number
/// (`query` holds one INT8 row per KV head). VNNI's `dpbusd` multiplies unsigned by signed
/// bytes, so keys enter offset to unsigned — an INT4 nibble XOR 8 is its value + 8, an INT8
/// byte XOR 0x80 its value + 128 — and the offset times the query's sum is taken back off.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl and avx512vnni.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
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
    let row_bytes = super::key_row_bytes(data, scales, n_kv, hd, 64, int4, query.len(), tokens, out.len());
    let chunks = hd / 64;
    // Per (head, 64-dimension chunk), the query bytes in the order the key bytes arrive: INT4
    // unpacks 32 bytes to their low nibbles (even dimensions) then their high ones (odd).
    let mut q_words = vec![0i8; n_kv * hd];
    for (chunk, q) in q_words.chunks_exact_mut(64).zip(query.chunks_exact(64)) {
        if int4 {
            for j in 0..32 {
                chunk[j] = q[2 * j];
                chunk[32 + j] = q[2 * j + 1];
            }
        } else {
            chunk.copy_from_slice(q);
        }
    }
    let offset = if int4 { 8 } else { 128 };
    let offset_sums: Vec<i32> =
        query.chunks_exact(hd).map(|q| offset * q.iter().map(|&x| i32::from(x)).sum::<i32>()).collect();
    let (low_nibbles, nibble_bias, byte_bias) =
        (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x08), _mm512_set1_epi8(-128));
    // The key bytes of one row's 64-dimension chunk, as the unsigned operand of VNNI.
    let key_chunk = |row: usize, c: usize| {
        let ptr = data[row * row_bytes..][..row_bytes].as_ptr();
        // SAFETY: each load reads whole bytes of this row (32 per chunk for INT4, 64 for
        // INT8), inside the bounds asserted above.
        if int4 {
            let packed = unsafe { _mm256_loadu_si256(ptr.add(c * 32).cast()) };
            let lo = _mm256_xor_si256(_mm256_and_si256(packed, low_nibbles), nibble_bias);
            let hi = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles), nibble_bias);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        } else {
            _mm512_xor_si512(unsafe { _mm512_loadu_si512(ptr.add(c * 64).cast()) }, byte_bias)
        }
    };
    // The 64 query bytes that meet a key chunk (the slice bounds-checks what the load reads).
    let query_chunk = |h: usize, c: usize| _mm512_loadu_si512(q_words[(h * chunks + c) * 64..][..64].as_ptr().cast());
    let n = tokens.len();
    // Sixteen tokens at a time: their sums are reduced together, which costs a fifth of
    // reducing each on its own.
    let blocks = tokens.chunks_exact(ROWS);
    let tail = blocks.remainder();
    for (b, block) in blocks.enumerate() {
        let i = b * ROWS;
        let block: &[u32; ROWS] = block.try_into().expect("chunks_exact");
        for h in 0..n_kv {
            let mut acc = [_mm512_setzero_si512(); ROWS];
            for c in 0..chunks {
                let q = query_chunk(h, c);
                for (acc, &t) in acc.iter_mut().zip(block) {
                    *acc = _mm512_dpbusd_epi32(*acc, key_chunk(t as usize * n_kv + h, c), q);
                }
            }
            let sums = _mm512_sub_epi32(reduce_16(&acc), _mm512_set1_epi32(offset_sums[h]));
            let row_scales: [f32; ROWS] = std::array::from_fn(|j| scales[block[j] as usize * n_kv + h]);
            let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_loadu_ps(row_scales.as_ptr()));
            _mm512_storeu_ps(out[h * n + i..][..ROWS].as_mut_ptr(), scaled);
        }
    }
    for (i, &t) in tokens.iter().enumerate().skip(n - tail.len()) {
        for h in 0..n_kv {
            let row = t as usize * n_kv + h;
            let mut acc = _mm512_setzero_si512();
            for c in 0..chunks {
                acc = _mm512_dpbusd_epi32(acc, key_chunk(row, c), query_chunk(h, c));
            }
            out[h * n + i] = (_mm512_reduce_add_epi32(acc) - offset_sums[h]) as f32 * scales[row];
        }
    }
}

/// Rows [`score_keys_int`] reduces together.
const ROWS: usize = 16;

/// The sums of each of 16 vectors' lanes, as one vector (lane j: the sum of `v[j]`): adds of
/// interleaved halves, so each level halves the vectors and doubles the sums each lane holds.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce_16(v: &[__m512i; ROWS]) -> __m512i {
    // Within each 128-bit lane: pairs, then quads, of vectors fold into one.
    let pair = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let quad = |ab, cd| _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    // Lane l of quads[g] now holds [v4g, v4g+1, v4g+2, v4g+3] summed over 128-bit lane l.
    let quads: [__m512i; 4] =
        std::array::from_fn(|g| quad(pair(v[4 * g], v[4 * g + 1]), pair(v[4 * g + 2], v[4 * g + 3])));
    // Across the 128-bit lanes: lanes (0+1, 2+3) of two quads, then of those.
    let across = |a, b| {
        _mm512_add_epi32(_mm512_shuffle_i32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b))
    };
    across(across(quads[0], quads[1]), across(quads[2], quads[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_over_the_softmax_range() {
        if !crate::kernels::SimdLevel::Avx512Vnni.is_supported() {
            return; // nothing to compare on this CPU; the portable path uses f32::exp
        }
        let mut xs: Vec<f32> = (0..1000).map(|i| -80.0 + i as f32 * 0.08).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        let sum = unsafe { exp_shifted(&mut xs, 0.0) };
        for (got, want) in xs.iter().zip(&want) {
            assert!((got - want).abs() <= 2e-6 * want.max(1e-30), "{got} vs {want}");
        }
        assert!((sum - want.iter().sum::<f32>()).abs() < 1e-5 * sum);
    }
}
