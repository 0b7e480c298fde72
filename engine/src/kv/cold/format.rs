//! How the cold pool keeps a group's K and V on disk. Writers hand it f16 rows (K then V, as
//! [`super::ColdPool::buffer`] lays them out), which a q8 pool encodes on the way to the
//! disk; readers get them back as f16 rows, or staged as kept and decoded a row at a time
//! ([`ColdType::decode_row`]).
//!
//! `q8` ([`crate::kernels::kv_q8`]) keeps a byte per value, with K's scales per channel and
//! V's per token: a group of 16 tokens of a 64-dimension head takes 2,048 bytes of values and
//! 160 of scales, 2,560 on disk with its padding to whole sectors, instead of f16's 4,096:
//! every cold read moves 37.5% less.

use super::GROUP_TOKENS;
use crate::kernels::kv_q8::{self, ScaleAxis};
use crate::kernels::prefetch_lines;
use serde::{Deserialize, Serialize};

/// Sector size: the direct-I/O alignment that q8 groups need (f16 groups are whole pages).
pub const SECTOR_BYTES: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ColdType {
    /// The f16 rows as they are: exact.
    #[default]
    #[serde(rename = "f16")]
    F16,
    /// A signed byte per value, with an f16 scale per channel of K and per token of V.
    #[serde(rename = "q8")]
    Q8,
}

named_choices!(ColdType, "cold-pool type", { F16 => "f16", Q8 => "q8" });

impl ColdType {
    /// Bytes that keep a group of `values` f16 values (its K and V together, in rows of
    /// `head_dim`).
    pub fn bytes(self, values: usize, head_dim: usize) -> usize {
        match self {
            Self::F16 => 2 * values,
            // A byte per value; a scale per channel of K and per token of V.
            Self::Q8 => values + 2 * (head_dim + values / 2 / head_dim),
        }
    }

    /// The same group on disk, padded to a whole number of [`ColdType::alignment`]s.
    pub fn disk_bytes(self, values: usize, head_dim: usize) -> usize {
        self.bytes(values, head_dim).div_ceil(self.alignment()) * self.alignment()
    }

    /// Row `within` of a group as the file keeps it (`group`, [`ColdType::disk_bytes`] long):
    /// its K and V f16 values (bits), `head_dim` each, into `k` and `v`.
    pub fn decode_row(self, group: &[u8], head_dim: usize, within: usize, k: &mut [u16], v: &mut [u16]) {
        let values = 2 * GROUP_TOKENS * head_dim;
        let (k_at, v_at) = (within * head_dim, values / 2 + within * head_dim);
        match self {
            Self::F16 => {
                copy_words(&group[2 * k_at..][..2 * head_dim], k);
                copy_words(&group[2 * v_at..][..2 * head_dim], v);
            }
            Self::Q8 => {
                let (qs, scales) = group.split_at(values);
                let (k_scales, v_scales) = scales.split_at(2 * head_dim);
                kv_q8::dequantize(&qs[k_at..][..head_dim], head_dim, ScaleAxis::Columns, k_scales, k);
                kv_q8::dequantize(&qs[v_at..][..head_dim], head_dim, ScaleAxis::Rows, &v_scales[2 * within..], v);
            }
        }
    }

    /// Asks the CPU to start loading row `within` of a group as the file keeps it, which
    /// [`ColdType::decode_row`] reads soon after.
    pub fn prefetch_row(self, group: &[u8], head_dim: usize, within: usize) {
        let values = 2 * GROUP_TOKENS * head_dim;
        let (k_at, v_at) = (within * head_dim, values / 2 + within * head_dim);
        match self {
            Self::F16 => {
                prefetch_lines(&group[2 * k_at..][..2 * head_dim]);
                prefetch_lines(&group[2 * v_at..][..2 * head_dim]);
            }
            Self::Q8 => {
                prefetch_lines(&group[k_at..][..head_dim]);
                prefetch_lines(&group[v_at..][..head_dim]);
            }
        }
    }

    /// A whole group as the file keeps it, as f16 rows (bits: K's, then V's) into `out`.
    pub fn decode_group(self, group: &[u8], head_dim: usize, out: &mut [u16]) {
        match self {
            Self::F16 => copy_words(&group[..2 * out.len()], out),
            Self::Q8 => decode_q8(group, head_dim, out),
        }
    }

    /// What direct I/O on a group must be aligned to, in the file and in memory.
    pub fn alignment(self) -> usize {
        match self {
            Self::F16 => crate::aligned::IO_ALIGN,
            Self::Q8 => SECTOR_BYTES,
        }
    }
}

/// Little-endian f16 bits from bytes that need not be aligned.
fn copy_words(bytes: &[u8], out: &mut [u16]) {
    for (w, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *w = u16::from_le_bytes([b[0], b[1]]);
    }
}

/// Encodes one group's f16 values (bits: K's rows of `head_dim`, then V's) as q8 into `disk`,
/// [`ColdType::disk_bytes`] long: K's bytes, V's, K's scales (one per channel), V's (one per
/// token), then zeros.
pub fn encode_q8(group: &[u16], head_dim: usize, disk: &mut [u8]) {
    let values = group.len();
    let (qs, rest) = disk[..ColdType::Q8.disk_bytes(values, head_dim)].split_at_mut(values);
    let (k_scales, rest) = rest.split_at_mut(2 * head_dim);
    let (v_scales, padding) = rest.split_at_mut(2 * values / 2 / head_dim);
    let ((k, v), (k_qs, v_qs)) = (group.split_at(values / 2), qs.split_at_mut(values / 2));
    kv_q8::quantize(k, head_dim, ScaleAxis::Columns, k_qs, k_scales);
    kv_q8::quantize(v, head_dim, ScaleAxis::Rows, v_qs, v_scales);
    padding.fill(0);
}

/// Decodes one q8 group from its bytes on disk into `out`, its f16 values (bits).
pub fn decode_q8(disk: &[u8], head_dim: usize, out: &mut [u16]) {
    let values = out.len();
    let (qs, rest) = disk.split_at(values);
    let (k_scales, rest) = rest.split_at(2 * head_dim);
    let v_scales = &rest[..2 * values / 2 / head_dim];
    let ((k_qs, v_qs), (k, v)) = (qs.split_at(values / 2), out.split_at_mut(values / 2));
    kv_q8::dequantize(k_qs, head_dim, ScaleAxis::Columns, k_scales, k);
    kv_q8::dequantize(v_qs, head_dim, ScaleAxis::Rows, v_scales, v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_q8_group_is_five_sectors_and_reads_back_within_half_a_step_whole_or_by_row() {
        let (values, hd) = (2 * 16 * 64, 64);
        assert_eq!(ColdType::F16.disk_bytes(values, hd), 4096);
        assert_eq!(ColdType::Q8.disk_bytes(values, hd), 2560);
        let groups: Vec<u16> =
            (0..2 * values).map(|i| half::f16::from_f32(((i * 37) % 101) as f32 / 25.0 - 2.0).to_bits()).collect();
        let mut disk = vec![0xEEu8; 2 * 2560];
        for (group, out) in groups.chunks_exact(values).zip(disk.chunks_exact_mut(2560)) {
            encode_q8(group, hd, out);
        }
        assert!(disk[2048 + 2 * (64 + 16)..2560].iter().all(|&b| b == 0), "the padding is zeros");
        let mut back = vec![0u16; values];
        decode_q8(&disk[2560..], hd, &mut back);
        for (&v, &w) in groups[values..].iter().zip(&back) {
            let (v, w) = (half::f16::from_bits(v).to_f32(), half::f16::from_bits(w).to_f32());
            assert!((v - w).abs() <= 2.0 / 127.0 / 2.0 * 1.01, "{v} came back {w}");
        }
        // Row by row, each type gives what the whole group decodes to.
        let f16_bytes: Vec<u8> = groups[values..].iter().flat_map(|w| w.to_le_bytes()).collect();
        for (cold_type, group, whole) in
            [(ColdType::Q8, &disk[2560..], &back[..]), (ColdType::F16, &f16_bytes[..], &groups[values..])]
        {
            let mut decoded = vec![0u16; values];
            cold_type.decode_group(group, hd, &mut decoded);
            assert_eq!(decoded, whole, "{cold_type:?}");
            for within in 0..16 {
                let (mut k, mut v) = ([0u16; 64], [0u16; 64]);
                cold_type.decode_row(group, hd, within, &mut k, &mut v);
                assert_eq!(
                    (&k[..], &v[..]),
                    (&whole[within * hd..][..hd], &whole[values / 2 + within * hd..][..hd]),
                    "{cold_type:?} row {within}"
                );
            }
        }
    }
}
