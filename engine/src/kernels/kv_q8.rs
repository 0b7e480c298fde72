//! K/V rows in 8 bits, the way KIVI (Liu et al. 2024) found keys and values quantize best: keys
//! per channel (a few channels of K carry outliers in every token, and a row-wise scale would
//! spend the 8 bits on them), values per token. A block of rows is kept as one signed byte per
//! value and f16 scales, one per column or one per row; each value comes back within half a
//! step of its scale. The cold pool keeps its groups this way when asked to
//! ([`crate::kv::cold::format`]); dequantizing runs on every cold read, so it has an F16C
//! version.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// The longest row [`dequantize`] takes (a head's dimension; 256 in the largest models).
const MAX_COLS: usize = 512;

/// Which values of a block of rows share a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleAxis {
    /// One scale per column (channel), over every row: keys.
    Columns,
    /// One scale per row (token): values.
    Rows,
}

impl ScaleAxis {
    /// Scales of a block of `rows` × `cols`.
    pub fn scales(self, rows: usize, cols: usize) -> usize {
        match self {
            Self::Columns => cols,
            Self::Rows => rows,
        }
    }
}

/// Quantizes `rows` rows of `cols` f16 values (bits) into `qs` (one byte each, two's
/// complement) and `scales` (f16, little-endian bytes, one per column or row as `axis` says):
/// each scale is its values' largest magnitude / 127, and each value is rounded to the nearest
/// multiple of its scale as stored (f16).
pub fn quantize(x: &[u16], cols: usize, axis: ScaleAxis, qs: &mut [u8], scales: &mut [u8]) {
    let rows = x.len() / cols;
    let n_scales = axis.scales(rows, cols);
    assert!(x.len() == rows * cols && qs.len() >= x.len() && scales.len() >= 2 * n_scales);
    let mut values = vec![0f32; x.len()];
    x.reinterpret_cast::<f16>().convert_to_f32_slice(&mut values);
    let mut max = vec![0f32; n_scales];
    let scale_of = |r: usize, c: usize| if axis == ScaleAxis::Columns { c } else { r };
    for (r, row) in values.chunks_exact(cols).enumerate() {
        for (c, v) in row.iter().enumerate() {
            let m = &mut max[scale_of(r, c)];
            *m = m.max(v.abs());
        }
    }
    let inverse: Vec<f32> = max
        .iter()
        .zip(scales.chunks_exact_mut(2))
        .map(|(&m, bytes)| {
            let d = f16::from_f32(m / 127.0);
            bytes.copy_from_slice(&d.to_bits().to_le_bytes());
            if d.to_f32() > 0.0 {
                1.0 / d.to_f32()
            } else {
                0.0
            }
        })
        .collect();
    for (r, (row, q)) in values.chunks_exact(cols).zip(qs.chunks_exact_mut(cols)).enumerate() {
        for (c, (v, q)) in row.iter().zip(q).enumerate() {
            *q = (v * inverse[scale_of(r, c)]).round().clamp(-127.0, 127.0) as i8 as u8;
        }
    }
}

/// The f16 values (bits) that `qs` and `scales` (as [`quantize`] wrote them for rows of
/// `cols`) hold, into `out`.
pub fn dequantize(qs: &[u8], cols: usize, axis: ScaleAxis, scales: &[u8], out: &mut [u16]) {
    let rows = qs.len() / cols;
    assert!(qs.len() == rows * cols && out.len() >= qs.len() && scales.len() >= 2 * axis.scales(rows, cols));
    let scale = |i: usize| f16::from_bits(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]])).to_f32();
    let row_scale = |r: usize| if axis == ScaleAxis::Rows { scale(r) } else { 1.0 };
    #[cfg(target_arch = "x86_64")]
    if super::simd_level() != super::SimdLevel::Portable && cols.is_multiple_of(8) {
        // The column scales are widened in the kernel: a cold read decodes single rows too,
        // and converting them apart would cost more than the row.
        let column_scales = (axis == ScaleAxis::Columns).then(|| &scales[..2 * cols]);
        for (r, (q, out)) in qs.chunks_exact(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
            // SAFETY: every level but Portable has avx2, fma and f16c, checked when chosen.
            unsafe { super::x86::avx2::dequantize_q8_row(q, column_scales, row_scale(r), out) };
        }
        return;
    }
    // Each row's factors: the column scales, or its own scale in every column.
    assert!(cols <= MAX_COLS, "rows of {cols} values");
    let mut columns = [1f32; MAX_COLS];
    if axis == ScaleAxis::Columns {
        columns[..cols].iter_mut().enumerate().for_each(|(c, f)| *f = scale(c));
    }
    let columns = &columns[..cols];
    let mut values = [0f32; MAX_COLS];
    for (r, (q, out)) in qs.chunks_exact(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
        dequantize_row(q, columns, row_scale(r), &mut values[..cols]);
        out.reinterpret_cast_mut::<f16>().convert_from_f32_slice(&values[..cols]);
    }
}

/// One row's values as f32: each byte times its column's factor and the row's.
#[inline(always)]
pub(crate) fn dequantize_row(q: &[u8], columns: &[f32], row: f32, out: &mut [f32]) {
    for ((o, &q), &c) in out.iter_mut().zip(q).zip(columns) {
        *o = f32::from(q as i8) * (c * row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f16 bits of K-like rows of 64: two outlier channels, tiny values, zeros.
    fn rows(n: usize) -> Vec<u16> {
        (0..n * 64)
            .map(|i| {
                let v = match (i % 64, i % 97) {
                    (5 | 40, _) => 30.0 + (i % 7) as f32,
                    (_, 1) => -3e-5,
                    (_, 2) => 0.0,
                    _ => ((i * 7919) % 2001) as f32 / 1000.0 - 1.0,
                };
                f16::from_f32(v).to_bits()
            })
            .collect()
    }

    fn value(bits: u16) -> f32 {
        f16::from_bits(bits).to_f32()
    }

    #[test]
    fn a_round_trip_is_within_half_a_step_of_each_value_on_either_axis() {
        let x = rows(16);
        for axis in [ScaleAxis::Columns, ScaleAxis::Rows] {
            let n = axis.scales(16, 64);
            let (mut qs, mut scales, mut back) = (vec![0u8; x.len()], vec![0u8; 2 * n], vec![0u16; x.len()]);
            quantize(&x, 64, axis, &mut qs, &mut scales);
            dequantize(&qs, 64, axis, &scales, &mut back);
            let scale = |i: usize| value(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]));
            for (i, (&v, &w)) in x.iter().zip(&back).enumerate() {
                let d = scale(if axis == ScaleAxis::Columns { i % 64 } else { i / 64 });
                let (v, w) = (value(v), value(w));
                assert!((v - w).abs() <= d / 2.0 + w.abs() * 1e-3, "{axis:?} value {i}: {v} came back {w}");
            }
        }
        // Per channel, the outlier channels leave the others their precision; per row they
        // would not.
        let (mut qs, mut scales, mut back) = (vec![0u8; x.len()], vec![0u8; 128], vec![0u16; x.len()]);
        let mut error = |axis| {
            quantize(&x, 64, axis, &mut qs, &mut scales);
            dequantize(&qs, 64, axis, &scales, &mut back);
            x.iter()
                .zip(&back)
                .enumerate()
                .filter(|(i, _)| i % 64 == 10)
                .map(|(_, (&v, &w))| (value(v) - value(w)).abs())
                .fold(0f32, f32::max)
        };
        assert!(error(ScaleAxis::Columns) * 10.0 < error(ScaleAxis::Rows));
        // A block of zeros stays zeros.
        let zeros = vec![0u16; 64];
        quantize(&zeros, 64, ScaleAxis::Rows, &mut qs, &mut scales);
        dequantize(&qs[..64], 64, ScaleAxis::Rows, &scales, &mut back);
        assert!(back[..64].iter().all(|&w| w == 0));
    }

    #[test]
    fn every_level_dequantizes_as_the_portable_one_to_the_bit() {
        let x = rows(16);
        for axis in [ScaleAxis::Columns, ScaleAxis::Rows] {
            let (mut qs, mut scales) = (vec![0u8; x.len()], vec![0u8; 128]);
            quantize(&x, 64, axis, &mut qs, &mut scales);
            let mut fast = vec![0u16; x.len()];
            dequantize(&qs, 64, axis, &scales, &mut fast);
            let scale = |i: usize| value(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]));
            let columns: Vec<f32> = (0..64).map(|c| if axis == ScaleAxis::Columns { scale(c) } else { 1.0 }).collect();
            let mut portable = vec![0f32; 64];
            for (r, (q, got)) in qs.chunks_exact(64).zip(fast.chunks_exact(64)).enumerate() {
                dequantize_row(q, &columns, if axis == ScaleAxis::Rows { scale(r) } else { 1.0 }, &mut portable);
                let want: Vec<u16> = portable.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                assert_eq!(got, &want[..], "{axis:?} row {r}");
            }
        }
    }
}
