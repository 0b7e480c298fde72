//! The scoring contract of a storage-side device (the SmartSSD's FPGA kernel in `fpga/`): what
//! it is given, in which layout, and the exact scores it must return. This is the reference the
//! kernel's C simulation is checked against, bit for bit.
//!
//! Per KV head, the keys of `n_tokens` consecutive tokens are quantized rows, packed densely
//! (INT8: one byte per dimension; INT4: two signed nibbles per byte, the even dimension in the
//! low nibble, as [`super::ScoringKeys`] stores them), each head's region padded to whole 64-byte
//! words; one f32 scale per (head, token); the query is one INT8 row per KV head (its query
//! group's summed query, quantized), padded to whole words. A token's score is its integer
//! inner product with the query, times its key scale: `dot as f32 * scale`, one rounding, so any
//! IEEE implementation agrees exactly (|dot| < 2²⁴ for head_dim ≤ 128). The query's own scale
//! is common to all tokens and does not change their ranking. Scores go out in blocks of
//! `block_tokens` (position, score) pairs per head, each block readable as soon as it is written.

use super::KeyBits;

/// Bytes the device reads per bus word (512 bits).
pub const WORD_BYTES: usize = 64;

/// The largest head dimension the kernel is built for.
pub const MAX_HEAD_DIM: usize = 128;

/// Bytes of one token's quantized key row.
pub fn row_bytes(bits: KeyBits, head_dim: usize) -> usize {
    match bits {
        KeyBits::Int8 => head_dim,
        KeyBits::Int4 => head_dim / 2,
    }
}

/// Bytes of one head's key region: `n_tokens` rows, padded to whole words.
pub fn head_region_bytes(bits: KeyBits, head_dim: usize, n_tokens: usize) -> usize {
    (n_tokens * row_bytes(bits, head_dim)).div_ceil(WORD_BYTES) * WORD_BYTES
}

/// Whether the kernel handles this shape: rows must tile 64-byte words (a row is a divisor or
/// a multiple of a word), so none straddles two.
pub fn supports(bits: KeyBits, head_dim: usize) -> bool {
    let rb = row_bytes(bits, head_dim);
    head_dim.is_multiple_of(2) && head_dim <= MAX_HEAD_DIM && rb > 0 && (WORD_BYTES.is_multiple_of(rb) || rb.is_multiple_of(WORD_BYTES))
}

/// The query of one KV head as the device takes it: symmetric INT8 with the largest magnitude
/// at ±127.
pub fn quantize_query(query: &[f32]) -> Vec<i8> {
    let amax = query.iter().fold(0f32, |m, x| m.max(x.abs()));
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    query.iter().map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8).collect()
}

/// Dimension `d` of a packed row, as a signed integer.
fn key_value(bits: KeyBits, row: &[u8], d: usize) -> i32 {
    match bits {
        KeyBits::Int8 => i32::from(row[d] as i8),
        KeyBits::Int4 => {
            let byte = row[d / 2];
            let nibble = if d.is_multiple_of(2) { byte << 4 } else { byte & 0xf0 };
            i32::from((nibble as i8) >> 4)
        }
    }
}

/// The scores a device must return: `[head][token]`, `dot × scale`. `keys` holds each head's
/// region (see [`head_region_bytes`]) back to back, `scales` is `[head][token]`, `query` is
/// `[head][head_dim]` (unpadded here).
pub fn reference_scores(bits: KeyBits, head_dim: usize, n_tokens: usize, keys: &[u8], scales: &[f32], query: &[i8]) -> Vec<f32> {
    let n_heads = query.len() / head_dim;
    let (rb, region) = (row_bytes(bits, head_dim), head_region_bytes(bits, head_dim, n_tokens));
    let mut out = Vec::with_capacity(n_heads * n_tokens);
    for h in 0..n_heads {
        let q = &query[h * head_dim..][..head_dim];
        for t in 0..n_tokens {
            let row = &keys[h * region + t * rb..][..rb];
            let dot: i32 = (0..head_dim).map(|d| key_value(bits, row, d) * i32::from(q[d])).sum();
            out.push(dot as f32 * scales[h * n_tokens + t]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_scores_are_integer_dots_times_the_key_scale() {
        // Two tokens, one head, head_dim 2: INT4 row bytes pack (d0 low, d1 high).
        let keys = {
            let mut k = vec![0u8; WORD_BYTES];
            k[0] = 0x3f; // d0 = -1 (0xf), d1 = 3
            k[1] = 0x97; // d0 = 7, d1 = -7 (0x9)
            k
        };
        let scores = reference_scores(KeyBits::Int4, 2, 2, &keys, &[0.5, 2.0], &[10, -2]);
        assert_eq!(scores, vec![(-10 - 6) as f32 * 0.5, (70 + 14) as f32 * 2.0]);
        assert_eq!(quantize_query(&[0.5, -1.0, 0.0]), vec![64, -127, 0]);
        assert!(supports(KeyBits::Int4, 64) && supports(KeyBits::Int8, 128) && !supports(KeyBits::Int8, 96) && !supports(KeyBits::Int8, 256));
    }
}
