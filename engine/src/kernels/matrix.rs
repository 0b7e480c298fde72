//! Weight matrices and their products with activations: `out[t][r] = Σ_c w[r][c] · x[t][c]`.
//!
//! One call serves decode (one token: a GEMV) and prefill (many tokens: each weight block is
//! unpacked once and used for a tile of tokens while it sits in registers).

use super::parallel::{task_count, DisjointWriter};
use super::quant::{QuantBits, QuantizedActivations, UqMatrix, BLOCK};
use super::SimdLevel;
use rayon::prelude::*;
use std::ops::Range;

/// Tokens whose products one kernel call computes together.
pub const TOKEN_TILE: usize = 4;

/// A dense f32 matrix (safetensors checkpoints, and GGUF types without a quantized kernel).
#[derive(Debug, Clone)]
pub struct DenseMatrix {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

#[derive(Debug, Clone)]
pub enum Matrix {
    Quantized(UqMatrix),
    Dense(DenseMatrix),
}

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Self::Quantized(q) => q.rows,
            Self::Dense(d) => d.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Quantized(q) => q.cols,
            Self::Dense(d) => d.cols,
        }
    }

    /// Bytes the kernels stream per full product (what a GEMV reads from memory).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Self::Quantized(q) => q.qs.len() + 4 * (q.d.len() + q.m.len()),
            Self::Dense(d) => 4 * d.w.len(),
        }
    }

    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        match self {
            Self::Quantized(q) => q.dequantize_row(row, out),
            Self::Dense(d) => out.copy_from_slice(&d.w[row * d.cols..][..d.cols]),
        }
    }

    fn to_dense(&self) -> DenseMatrix {
        match self {
            Self::Dense(d) => d.clone(),
            Self::Quantized(q) => {
                let mut w = vec![0f32; q.rows * q.cols];
                for (r, row) in w.chunks_exact_mut(q.cols).enumerate() {
                    q.dequantize_row(r, row);
                }
                DenseMatrix { rows: q.rows, cols: q.cols, w }
            }
        }
    }

    /// Stacks matrices with the same column count (for fused q/k/v and gate/up products).
    /// Quantized parts of one format stay quantized; a mix becomes dense.
    pub fn stack(parts: &[&Matrix]) -> Matrix {
        let quantized: Option<Vec<&UqMatrix>> = parts
            .iter()
            .map(|p| match p {
                Self::Quantized(q) => Some(q),
                Self::Dense(_) => None,
            })
            .collect();
        if let Some(stacked) = quantized.and_then(|q| UqMatrix::stack(&q)) {
            return Self::Quantized(stacked);
        }
        let dense: Vec<DenseMatrix> = parts.iter().map(|p| p.to_dense()).collect();
        Self::Dense(DenseMatrix {
            rows: dense.iter().map(|d| d.rows).sum(),
            cols: dense[0].cols,
            w: dense.into_iter().flat_map(|d| d.w).collect(),
        })
    }

    /// `out` (n × rows) = `x` (n × cols) · selfᵀ. `scratch` holds the quantized activations
    /// between calls so decode allocates nothing.
    pub fn matmul(&self, x: &[f32], n: usize, scratch: &mut QuantizedActivations, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols(), "matmul input shape");
        assert_eq!(out.len(), n * self.rows(), "matmul output shape");
        match self {
            Self::Quantized(w) => {
                scratch.quantize_into(x, n, w.cols);
                uq_matmul(w, scratch, out, super::simd_level());
            }
            Self::Dense(w) => dense_matmul(w, x, n, out),
        }
    }
}

fn uq_matmul(w: &UqMatrix, x: &QuantizedActivations, out: &mut [f32], level: SimdLevel) {
    let rows = w.rows;
    // Enough rows per task that the task's weights are worth a trip through the pool.
    let tasks = task_count(rows, 16);
    let rows_per_task = rows.div_ceil(tasks);
    let writer = DisjointWriter::new(out);
    (0..tasks).into_par_iter().for_each(|task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        let mut sums = vec![0f32; (r1 - r0) * TOKEN_TILE];
        for t0 in (0..x.n).step_by(TOKEN_TILE) {
            let nt = TOKEN_TILE.min(x.n - t0);
            uq_dot_rows(w, r0..r1, x, t0, nt, &mut sums, level);
            for (r, row_sums) in (r0..r1).zip(sums.chunks_exact(TOKEN_TILE)) {
                for (t, &s) in row_sums[..nt].iter().enumerate() {
                    // SAFETY: each task owns rows r0..r1 of every token's output.
                    unsafe { writer.write((t0 + t) * rows + r, s) };
                }
            }
        }
    });
}

/// Products of weight rows `rows` with tokens `t0 .. t0+nt` into
/// `out[(row - rows.start) · TOKEN_TILE + t]`.
#[inline]
fn uq_dot_rows(w: &UqMatrix, rows: Range<usize>, x: &QuantizedActivations, t0: usize, nt: usize, out: &mut [f32], level: SimdLevel) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => {
            // SAFETY: the level is only Avx512Vnni when the CPU reports every feature it needs.
            unsafe { super::x86::uq_dot_rows(w, rows, x, t0, nt, out) }
        }
        _ => {
            let start = rows.start;
            for r in rows {
                for t in 0..nt {
                    out[(r - start) * TOKEN_TILE + t] = uq_dot_portable(w, r, x, t0 + t);
                }
            }
        }
    }
}

pub(crate) fn uq_dot_portable(w: &UqMatrix, row: usize, x: &QuantizedActivations, t: usize) -> f32 {
    let nb = w.blocks_per_row();
    let bpb = w.bits.bytes_per_block();
    let mut acc = 0f32;
    for b in 0..nb {
        let wq = &w.qs[(row * nb + b) * bpb..][..bpb];
        let xq = &x.qs[(t * nb + b) * BLOCK..][..BLOCK];
        let mut isum = 0i32;
        match w.bits {
            QuantBits::Four => {
                for j in 0..BLOCK / 2 {
                    isum += i32::from(wq[j] & 0x0f) * i32::from(xq[j]);
                    isum += i32::from(wq[j] >> 4) * i32::from(xq[j + BLOCK / 2]);
                }
            }
            QuantBits::Eight => {
                for j in 0..BLOCK {
                    isum += i32::from(wq[j]) * i32::from(xq[j]);
                }
            }
        }
        let (wd, wm) = (w.d[row * nb + b], w.m[row * nb + b]);
        acc += wd * x.d[t * nb + b] * isum as f32 + wm * x.scaled_sums[t * nb + b];
    }
    acc
}

fn dense_matmul(w: &DenseMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    let rows = w.rows;
    let tasks = task_count(rows, 8);
    let rows_per_task = rows.div_ceil(tasks);
    let writer = DisjointWriter::new(out);
    (0..tasks).into_par_iter().for_each(|task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        for t in 0..n {
            let xt = &x[t * w.cols..][..w.cols];
            for r in r0..r1 {
                let s = dot_f32(&w.w[r * w.cols..][..w.cols], xt);
                // SAFETY: each task owns rows r0..r1 of every token's output.
                unsafe { writer.write(t * rows + r, s) };
            }
        }
    });
}

/// A dot product written so the compiler vectorizes it (eight independent accumulators).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (xa, xb) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += xa[i] * xb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::GgufBlockFormat;

    /// Random GGUF Q4_1 blocks for a rows × cols matrix (deterministic).
    fn random_q4_1(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let mut raw = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            let d = half::f16::from_f32((next() % 1000) as f32 / 50_000.0);
            let m = half::f16::from_f32(-((next() % 1000) as f32) / 10_000.0);
            raw.extend_from_slice(&d.to_le_bytes());
            raw.extend_from_slice(&m.to_le_bytes());
            raw.extend((0..16).map(|_| (next() & 0xff) as u8));
        }
        raw
    }

    #[test]
    fn simd_and_portable_products_agree_with_dequantized_reference() {
        let (rows, cols, n) = (37, 576, 7);
        let raw = random_q4_1(rows, cols, 7);
        let w = UqMatrix::from_gguf(GgufBlockFormat::Q4_1, &raw, rows, cols).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
        let mut qx = QuantizedActivations::default();
        qx.quantize_into(&x, n, cols);
        let dense = Matrix::Quantized(w.clone()).to_dense();
        for level in [SimdLevel::Portable, crate::kernels::simd_level()] {
            let mut out = vec![0f32; n * rows];
            uq_matmul(&w, &qx, &mut out, level);
            for t in 0..n {
                for r in 0..rows {
                    let exact = dot_f32(&dense.w[r * cols..][..cols], &x[t * cols..][..cols]);
                    let got = out[t * rows + r];
                    // int8 activations: error well under 1% of the row's magnitude
                    assert!((got - exact).abs() < 0.02 * (1.0 + exact.abs()), "{level:?} t{t} r{r}: {got} vs {exact}");
                    assert!((got - uq_dot_portable(&w, r, &qx, t)).abs() < 1e-3 * (1.0 + exact.abs()));
                }
            }
        }
    }

    #[test]
    fn q8_0_roundtrips_through_the_unsigned_layout() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        raw.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let w = UqMatrix::from_gguf(GgufBlockFormat::Q8_0, &raw, 1, 32).unwrap();
        let mut row = vec![0f32; 32];
        w.dequantize_row(0, &mut row);
        for (i, v) in row.iter().enumerate() {
            assert_eq!(*v, 0.5 * (i as f32 - 16.0));
        }
    }
}
