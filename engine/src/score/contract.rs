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

use super::{KeyBits, ScoringKeys};
use crate::aligned::{AlignedBuf, IO_ALIGN};
use crate::error::Result;

/// Where each layer's key chunks ([`KeyChunkLayout`]) lie on the SSD: what the host writes as
/// the sequence grows and the device reads, peer to peer. The cold pool's file holds them
/// (`kv::cold::KeyChunkSection`); scoring needs only this much of it.
pub trait KeyChunkFile: Send + Sync {
    /// Writes one layer's chunk (the chunk's size from the start of `buf`).
    fn write(&self, layer: usize, chunk: usize, buf: &AlignedBuf) -> Result<()>;

    /// Reads `dst.len()` bytes from `offset` into one layer's chunk, into `dst`: a page-aligned
    /// buffer, normally a card's peer-to-peer mapping, so the bytes go from the SSD to the FPGA
    /// without passing through DRAM.
    fn read(&self, layer: usize, chunk: usize, offset: usize, dst: &mut [u8]) -> Result<()>;
}

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
    head_dim.is_multiple_of(2)
        && head_dim <= MAX_HEAD_DIM
        && rb > 0
        && (WORD_BYTES.is_multiple_of(rb) || rb.is_multiple_of(WORD_BYTES))
}

/// The query of one KV head as the device takes it: symmetric INT8 with the largest magnitude
/// at ±127.
pub fn quantize_query(query: &[f32]) -> Vec<i8> {
    let amax = query.iter().fold(0f32, |m, x| m.max(x.abs()));
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    query.iter().map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8).collect()
}

/// A decode step's query as the device takes it, and as the host scores the cold tokens when
/// the device is absent: per KV head, an INT8 row and its scale. Every storage-side score is
/// `(float)dot × key scale` (the device's exact number) times the query scale, so the host's
/// stand-in and the card rank tokens identically, and on the same scale as the query itself.
pub struct DeviceQuery {
    head_dim: usize,
    rows: Vec<i8>,
    scales: Vec<f32>,
}

impl DeviceQuery {
    /// `query` holds one row of `head_dim` per KV head.
    pub fn new(query: &[f32], head_dim: usize) -> Self {
        let mut rows = Vec::with_capacity(query.len());
        let mut scales = Vec::with_capacity(query.len() / head_dim);
        for row in query.chunks_exact(head_dim) {
            rows.extend(quantize_query(row));
            scales.push(row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0);
        }
        Self { head_dim, rows, scales }
    }

    pub fn n_heads(&self) -> usize {
        self.scales.len()
    }

    /// `[head][head_dim]` INT8 rows.
    pub fn rows(&self) -> &[i8] {
        &self.rows
    }

    /// A device score of `head` in the host's units.
    pub fn rescale(&self, head: usize, device_score: f32) -> f32 {
        device_score * self.scales[head]
    }

    /// `out[h][i]`: what the device would return for `tokens[i]`, rescaled, from the host's
    /// scoring copy.
    pub fn score(&self, keys: &ScoringKeys, tokens: &[u32], out: &mut [f32]) {
        keys.score_int(&self.rows, tokens, out);
        for (head, &scale) in out.chunks_exact_mut(tokens.len().max(1)).zip(&self.scales) {
            head.iter_mut().for_each(|s| *s *= scale); // `rescale`, as one loop that vectorizes
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
}

/// Tokens per scoring-key chunk on the SSD: what one device run scores.
pub const CHUNK_TOKENS: usize = 256;

/// One layer's chunk of [`CHUNK_TOKENS`] tokens' scoring keys as the cold pool stores it for the
/// device: the kernel's key regions (one per KV head), then its `[head][token]` scales, each
/// part padded to whole pages so both can be read with direct I/O straight into device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyChunkLayout {
    pub bits: KeyBits,
    pub n_heads: usize,
    pub head_dim: usize,
}

impl KeyChunkLayout {
    pub fn keys_bytes(&self) -> usize {
        (self.n_heads * head_region_bytes(self.bits, self.head_dim, CHUNK_TOKENS)).next_multiple_of(IO_ALIGN)
    }

    pub fn scales_bytes(&self) -> usize {
        (self.n_heads * CHUNK_TOKENS * 4).next_multiple_of(IO_ALIGN)
    }

    pub fn chunk_bytes(&self) -> usize {
        self.keys_bytes() + self.scales_bytes()
    }

    /// Bytes of the device's query buffer: one word-padded INT8 row per head.
    pub fn query_bytes(&self) -> usize {
        self.n_heads * self.head_dim.next_multiple_of(WORD_BYTES)
    }

    /// Writes chunk `chunk` of `keys` (every token of it must be present) into `out`.
    pub fn fill(&self, keys: &ScoringKeys, chunk: usize, out: &mut [u8]) {
        let region = head_region_bytes(self.bits, self.head_dim, CHUNK_TOKENS);
        let (key_part, scale_part) = out[..self.chunk_bytes()].split_at_mut(self.keys_bytes());
        key_part.fill(0);
        for h in 0..self.n_heads {
            let scales = &mut scale_part[h * CHUNK_TOKENS * 4..][..CHUNK_TOKENS * 4];
            keys.copy_head_rows(h, chunk * CHUNK_TOKENS, CHUNK_TOKENS, &mut key_part[h * region..][..region], scales);
        }
    }

    /// Writes `query` into the device's query buffer `out` (`query_bytes()` long).
    pub fn fill_query(&self, query: &DeviceQuery, out: &mut [u8]) {
        let row = self.head_dim.next_multiple_of(WORD_BYTES);
        out.fill(0);
        for (h, q) in query.rows().chunks_exact(self.head_dim).enumerate() {
            out[h * row..][..self.head_dim].iter_mut().zip(q).for_each(|(o, &q)| *o = q as u8);
        }
    }
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
pub fn reference_scores(
    bits: KeyBits,
    head_dim: usize,
    n_tokens: usize,
    keys: &[u8],
    scales: &[f32],
    query: &[i8],
) -> Vec<f32> {
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
        assert!(
            supports(KeyBits::Int4, 64)
                && supports(KeyBits::Int8, 128)
                && !supports(KeyBits::Int8, 96)
                && !supports(KeyBits::Int8, 256)
        );
    }

    #[test]
    fn host_scores_of_a_device_query_equal_the_devices_on_the_chunk_layout() {
        let heads = 3;
        for (bits, hd) in [(KeyBits::Int4, 64), (KeyBits::Int8, 64), (KeyBits::Int4, 128), (KeyBits::Int8, 128)] {
            let k: Vec<f32> =
                (0..CHUNK_TOKENS * heads * hd).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.5).collect();
            let q: Vec<f32> = (0..heads * hd).map(|i| (i % 11) as f32 / 3.0 - 1.7).collect();
            let mut keys = ScoringKeys::new(bits, heads, hd);
            keys.push(&k);
            let layout = KeyChunkLayout { bits, n_heads: heads, head_dim: hd };
            let mut chunk = vec![0u8; layout.chunk_bytes()];
            layout.fill(&keys, 0, &mut chunk);
            let scales: Vec<f32> = chunk[layout.keys_bytes()..][..heads * CHUNK_TOKENS * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let query = DeviceQuery::new(&q, hd);
            let device = reference_scores(bits, hd, CHUNK_TOKENS, &chunk[..layout.keys_bytes()], &scales, query.rows());
            let tokens: Vec<u32> = (0..CHUNK_TOKENS as u32).collect();
            let mut host = vec![0f32; heads * CHUNK_TOKENS];
            query.score(&keys, &tokens, &mut host);
            for (i, (&h, &d)) in host.iter().zip(&device).enumerate() {
                assert_eq!(
                    h.to_bits(),
                    query.rescale(i / CHUNK_TOKENS, d).to_bits(),
                    "{bits:?} hd {hd} head {} token {}",
                    i / CHUNK_TOKENS,
                    i % CHUNK_TOKENS
                );
            }
        }
    }
}
