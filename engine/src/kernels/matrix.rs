//! Weight matrices and their products with activations: `out[t][r] = Σ_c w[r][c] · x[t][c]`.
//!
//! One call serves decode (one token: a GEMV) and prefill (many tokens: each weight block is
//! unpacked once and used for a tile of tokens while it sits in registers).

use super::huge_pages::{concat_in_huge_pages, vec_in_huge_pages};
use super::k_quant::{KQuantFormat, KQuantMatrix, SuperBlockActivations, TILE_TOKENS as K_QUANT_TILE};
use super::parallel::{task_count, DisjointWriter};
use super::quant::{GgufBlockFormat, QuantBits, QuantizedActivations, UqMatrix, BLOCK};
use super::spin_pool::pool;
use super::SimdLevel;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::ops::Range;

/// The most of a tensor's file bytes [`Matrix::read_gguf_blocks`] holds beside the matrix.
pub const READ_CHUNK_BYTES: usize = 1 << 20;

/// Tokens whose products one kernel call computes together.
pub const TOKEN_TILE: usize = 8;

/// Weights a prompt's tokens take at a time (see `uq_matmul`).
const CHUNK_BYTES: usize = 128 * 1024;

/// Rows a task's chunks come in multiples of (see [`tiled_matmul`]): the widest pass of any
/// product kernel, which each kernel checks its own pass against.
pub(crate) const PASS_ROWS: usize = 4;

/// A dense f32 matrix (safetensors checkpoints, and GGUF types without a quantized kernel).
#[derive(Debug, Clone)]
pub struct DenseMatrix {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

/// A matrix of 16-bit floats as the file stores them (F16 or BF16): half the memory of f32, and
/// half the bytes a product reads. Each row is widened to f32 (exactly) before its products,
/// which are then those of the [`DenseMatrix`] of the same values, to the bit.
#[derive(Debug, Clone)]
pub struct HalfMatrix {
    pub rows: usize,
    pub cols: usize,
    pub w: HalfValues,
}

/// rows × cols values, row-major.
#[derive(Debug, Clone)]
pub enum HalfValues {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl HalfMatrix {
    /// Row `row` widened into `out` (`cols` values).
    pub fn row_into(&self, row: usize, out: &mut [f32]) {
        let range = row * self.cols..(row + 1) * self.cols;
        match &self.w {
            HalfValues::F16(w) => w[range].convert_to_f32_slice(out),
            HalfValues::Bf16(w) => w[range].convert_to_f32_slice(out),
        }
    }

    /// The matrix of `a`'s rows, then `b`'s; `None` if their value types differ.
    fn stack(a: &Self, b: &Self) -> Option<Self> {
        let w = match (&a.w, &b.w) {
            (HalfValues::F16(x), HalfValues::F16(y)) => HalfValues::F16(concat_in_huge_pages(&[x, y])),
            (HalfValues::Bf16(x), HalfValues::Bf16(y)) => HalfValues::Bf16(concat_in_huge_pages(&[x, y])),
            _ => return None,
        };
        Some(Self { rows: a.rows + b.rows, cols: a.cols, w })
    }
}

#[derive(Debug, Clone)]
pub enum Matrix {
    Quantized(UqMatrix),
    /// Q4_K, Q5_K and Q6_K, as the file has them.
    KQuant(KQuantMatrix),
    Dense(DenseMatrix),
    Half(HalfMatrix),
    /// Matrices of different formats stacked by rows, each product through its own kernel
    /// (a K-quant file gives q and k one format and v another in some layers).
    Stacked(Vec<Matrix>),
}

/// The K-quant format a block format is kept in, if it is one kept as the file has it.
fn k_quant_format(format: GgufBlockFormat) -> Option<KQuantFormat> {
    match format {
        GgufBlockFormat::Q4K => Some(KQuantFormat::Q4K),
        GgufBlockFormat::Q5K => Some(KQuantFormat::Q5K),
        GgufBlockFormat::Q6K => Some(KQuantFormat::Q6K),
        _ => None,
    }
}

/// Where a product's rows go: row `r` of token `t` at `t · stride + first_row + r`.
struct OutRows<'w, 'a> {
    writer: &'w DisjointWriter<'a>,
    stride: usize,
    first_row: usize,
}

impl Matrix {
    /// Raw GGUF blocks of a `rows × cols` matrix in the kernels' layout; `None` if their size is
    /// not the shape's or (MXFP4) a block's scale is beyond f16's range.
    pub fn from_gguf_blocks(format: GgufBlockFormat, raw: &[u8], rows: usize, cols: usize) -> Option<Matrix> {
        match k_quant_format(format) {
            Some(k) => KQuantMatrix::from_gguf(k, concat_in_huge_pages(&[raw]), rows, cols).map(Self::KQuant),
            None => UqMatrix::from_gguf(format, raw, rows, cols).map(Self::Quantized),
        }
    }

    /// [`Matrix::from_gguf_blocks`] with the file's bytes taken from `read`, each call filling
    /// the buffer it is given with the next of them, at most [`READ_CHUNK_BYTES`] at a time: the
    /// matrix is the only copy of its weights that loading holds. `Ok(None)` where
    /// `from_gguf_blocks` gives `None` (what was read is then lost: the caller reads again).
    pub fn read_gguf_blocks(
        format: GgufBlockFormat,
        rows: usize,
        cols: usize,
        mut read: impl FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Option<Matrix>> {
        let Some(bytes) = format.tensor_bytes(rows, cols) else { return Ok(None) };
        if let Some(k) = k_quant_format(format) {
            // Kept as the file has them: read straight into the matrix's own bytes.
            let mut raw = vec_in_huge_pages(bytes);
            raw.resize(bytes, 0);
            for chunk in raw.chunks_mut(READ_CHUNK_BYTES) {
                read(chunk)?;
            }
            return Ok(KQuantMatrix::from_gguf(k, raw, rows, cols).map(Self::KQuant));
        }
        let Some(mut w) = UqMatrix::for_blocks(format, rows, cols) else { return Ok(None) };
        let chunk_bytes = (READ_CHUNK_BYTES / format.block_bytes()).max(1) * format.block_bytes();
        let mut buf = vec![0u8; chunk_bytes.min(bytes)];
        let mut left = bytes;
        while left > 0 {
            let chunk = &mut buf[..chunk_bytes.min(left)];
            read(chunk)?;
            if w.push_blocks(format, chunk).is_none() {
                return Ok(None);
            }
            left -= chunk.len();
        }
        Ok(Some(Self::Quantized(w)))
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Quantized(q) => q.rows,
            Self::KQuant(q) => q.rows,
            Self::Dense(d) => d.rows,
            Self::Half(h) => h.rows,
            Self::Stacked(parts) => parts.iter().map(Self::rows).sum(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Quantized(q) => q.cols,
            Self::KQuant(q) => q.cols,
            Self::Dense(d) => d.cols,
            Self::Half(h) => h.cols,
            Self::Stacked(parts) => parts[0].cols(),
        }
    }

    /// Bytes the kernels stream per full product (what a GEMV reads from memory).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Self::Quantized(q) => q.bytes(),
            Self::KQuant(q) => q.raw.len(),
            Self::Dense(d) => 4 * d.w.len(),
            Self::Half(h) => 2 * h.rows * h.cols,
            Self::Stacked(parts) => parts.iter().map(Self::weight_bytes).sum(),
        }
    }

    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        match self {
            Self::Quantized(q) => q.dequantize_row(row, out),
            Self::KQuant(q) => q.dequantize_row(row, out),
            Self::Dense(d) => out.copy_from_slice(&d.w[row * d.cols..][..d.cols]),
            Self::Half(h) => h.row_into(row, &mut out[..h.cols]),
            Self::Stacked(parts) => {
                let mut row = row;
                for part in parts {
                    if row < part.rows() {
                        return part.dequantize_row(row, out);
                    }
                    row -= part.rows();
                }
                panic!("row past the stacked matrix");
            }
        }
    }

    /// Stacks matrices with the same column count (for fused q/k/v and gate/up products); an
    /// error names the widths when they differ. Neighbours of one format (or both dense)
    /// become one matrix; where formats differ the result keeps its parts.
    pub fn stack(parts: &[&Matrix]) -> Result<Matrix, String> {
        // `cols` of a stack is its first part's: parts of another width would be read past
        // their rows' ends by the products.
        if let Some(other) = parts.iter().find(|p| p.cols() != parts[0].cols()) {
            return Err(format!("matrices of {} and {} columns cannot be stacked", parts[0].cols(), other.cols()));
        }
        let mut joined: Vec<Matrix> = Vec::with_capacity(parts.len());
        for &part in parts {
            let merged = match (joined.last(), part) {
                (Some(Self::Quantized(a)), Self::Quantized(b)) => UqMatrix::stack(&[a, b]).map(Self::Quantized),
                (Some(Self::KQuant(a)), Self::KQuant(b)) => KQuantMatrix::stack(&[a, b]).map(Self::KQuant),
                (Some(Self::Dense(a)), Self::Dense(b)) if a.cols == b.cols => Some(Self::Dense(DenseMatrix {
                    rows: a.rows + b.rows,
                    cols: a.cols,
                    w: concat_in_huge_pages(&[&a.w, &b.w]),
                })),
                (Some(Self::Half(a)), Self::Half(b)) => HalfMatrix::stack(a, b).map(Self::Half),
                _ => None,
            };
            match merged {
                Some(m) => *joined.last_mut().expect("merged with the last part") = m,
                None => joined.push(part.clone()),
            }
        }
        Ok(if joined.len() == 1 { joined.pop().expect("one part") } else { Self::Stacked(joined) })
    }

    /// `out` (n × rows) = `x` (n × cols) · selfᵀ. `scratch` holds the quantized activations
    /// between calls so decode allocates nothing.
    pub fn matmul(&self, x: &[f32], n: usize, scratch: &mut QuantizedActivations, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols(), "matmul input shape");
        assert_eq!(out.len(), n * self.rows(), "matmul output shape");
        self.quantize_activations(x, n, scratch);
        let stride = self.rows();
        self.product(x, n, scratch, &OutRows { writer: &DisjointWriter::new(out), stride, first_row: 0 });
    }

    /// Quantizes `x` (n × cols) into `scratch` once in each form some part takes.
    pub fn quantize_activations(&self, x: &[f32], n: usize, scratch: &mut QuantizedActivations) {
        let forms = self.activation_forms();
        if forms.blocks {
            scratch.quantize_into(x, n, self.cols());
        }
        if forms.super_blocks {
            scratch.super_blocks.quantize_into(x, n, self.cols());
        }
    }

    /// The quantizations of the activations the parts' products take.
    pub fn activation_forms(&self) -> ActivationForms {
        match self {
            Self::Quantized(_) => ActivationForms { blocks: true, super_blocks: false },
            Self::KQuant(_) => ActivationForms { blocks: false, super_blocks: true },
            Self::Dense(_) | Self::Half(_) => ActivationForms::default(),
            Self::Stacked(parts) => {
                parts.iter().map(Self::activation_forms).fold(ActivationForms::default(), |a, b| ActivationForms {
                    blocks: a.blocks || b.blocks,
                    super_blocks: a.super_blocks || b.super_blocks,
                })
            }
        }
    }

    /// `out` (n × rows) = `x` · selfᵀ with `x` already quantized by
    /// [`Self::quantize_activations`]: the kernels alone, as `hillside bench kernels` times them.
    pub fn product_of_quantized(&self, x: &QuantizedActivations, out: &mut [f32]) {
        assert!(!matches!(self, Self::Dense(_) | Self::Half(_)), "a float matrix takes its activations unquantized");
        let n = if self.activation_forms().blocks { x.n } else { x.super_blocks.n };
        assert_eq!(out.len(), n * self.rows(), "product output shape");
        self.product(&[], n, x, &OutRows { writer: &DisjointWriter::new(out), stride: self.rows(), first_row: 0 });
    }

    /// The product, with `quantized` holding `x` quantized where a part needs it.
    fn product(&self, x: &[f32], n: usize, quantized: &QuantizedActivations, out: &OutRows) {
        match self {
            Self::Quantized(w) => uq_matmul(w, quantized, out, super::simd_level()),
            Self::KQuant(w) => k_quant_matmul(w, &quantized.super_blocks, out, super::simd_level()),
            Self::Dense(w) => dense_matmul(w, x, n, out),
            Self::Half(w) => half_matmul(w, x, n, out),
            Self::Stacked(parts) => {
                let mut first_row = out.first_row;
                for part in parts {
                    part.product(x, n, quantized, &OutRows { writer: out.writer, stride: out.stride, first_row });
                    first_row += part.rows();
                }
            }
        }
    }
}

/// Which quantizations of the activations a product takes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ActivationForms {
    /// 32-value blocks ([`QuantizedActivations`]' own)
    pub blocks: bool,
    /// 256-value super-blocks ([`QuantizedActivations::super_blocks`])
    pub super_blocks: bool,
}

fn uq_matmul(w: &UqMatrix, x: &QuantizedActivations, out: &OutRows, level: SimdLevel) {
    tiled_matmul(w.rows, w.row_bytes(), x.n, TOKEN_TILE, out, &|rows, t0, nt, sums| {
        uq_dot_rows(w, rows, x, t0, nt, sums, level)
    });
}

fn k_quant_matmul(w: &KQuantMatrix, x: &SuperBlockActivations, out: &OutRows, level: SimdLevel) {
    tiled_matmul(w.rows, w.row_bytes(), x.n, K_QUANT_TILE, out, &|rows, t0, nt, sums| {
        k_quant_dot_rows(w, rows, x, t0, nt, sums, level)
    });
}

/// Products of some weight rows with a tile of tokens (see [`tiled_matmul`]).
type DotRows<'a> = dyn Fn(Range<usize>, usize, usize, &mut [f32]) + Sync + 'a;

/// A product of `rows` weight rows of `row_bytes` each with `n` tokens, split among the
/// threads by rows, tokens `tile` at a time: `dot_rows(rows, t0, nt, sums)` puts the products
/// of `rows` with tokens `t0..t0+nt` at `sums[(row - rows.start) · tile + t]`.
fn tiled_matmul(rows: usize, row_bytes: usize, n: usize, tile: usize, out: &OutRows, dot_rows: &DotRows) {
    // Enough rows per task that the task's weights are worth a trip through the pool.
    let tasks = task_count(rows, 16);
    // Tasks and chunks of a whole number of passes, so that a kernel that takes rows four at a
    // time (the K-quants' decode) or in pairs (their AVX-512 tiles) leaves none to its slower
    // one-row loop.
    let rows_per_task = rows.div_ceil(tasks).next_multiple_of(PASS_ROWS).max(PASS_ROWS);
    // A prompt's tokens take a task's rows a chunk at a time, each chunk for every token, so
    // that the chunk's weights stay in the core's L2 cache (512 KiB on Zen 2/3, 256 KiB on
    // older Intel) while every token passes, rather than stream in again for each tile of tokens.
    let chunk_rows = (CHUNK_BYTES / row_bytes.max(1) / PASS_ROWS * PASS_ROWS).clamp(PASS_ROWS, rows_per_task);
    pool().run(tasks, &|task| {
        let task_rows = task * rows_per_task..((task + 1) * rows_per_task).min(rows);
        let mut sums = vec![0f32; chunk_rows.min(task_rows.len()) * tile];
        for r0 in task_rows.clone().step_by(chunk_rows) {
            let r1 = (r0 + chunk_rows).min(task_rows.end);
            for t0 in (0..n).step_by(tile) {
                let nt = tile.min(n - t0);
                dot_rows(r0..r1, t0, nt, &mut sums);
                for t in 0..nt {
                    // SAFETY: each task owns rows r0..r1 of every token's output.
                    let dst = unsafe { out.writer.slice((t0 + t) * out.stride + out.first_row + r0, r1 - r0) };
                    for (d, row_sums) in dst.iter_mut().zip(sums.chunks_exact(tile)) {
                        *d = row_sums[t];
                    }
                }
            }
        }
    });
}

/// Products of weight rows `rows` with tokens `t0 .. t0+nt` into
/// `out[(row - rows.start) · TOKEN_TILE + t]`.
#[inline]
fn uq_dot_rows(
    w: &UqMatrix,
    rows: Range<usize>,
    x: &QuantizedActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    level: SimdLevel,
) {
    // SAFETY (x86 arms): a level is only chosen when the CPU reports every feature it needs.
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni if nt == 1 => unsafe { super::x86::avx2::uq_dot_rows_avx512(w, rows, x, t0, out) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => unsafe { super::x86::uq_groups::uq_dot_rows_avx512(w, rows, x, t0, nt, out) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::AvxVnni if nt == 1 => unsafe { super::x86::avx2::uq_dot_rows_vnni(w, rows, x, t0, out) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::AvxVnni => unsafe { super::x86::uq_groups::uq_dot_rows_vnni(w, rows, x, t0, nt, out) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if nt == 1 => unsafe { super::x86::avx2::uq_dot_rows(w, rows, x, t0, out) },
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { super::x86::uq_groups::uq_dot_rows(w, rows, x, t0, nt, out) },
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

/// [`uq_dot_rows`] of a K-quant matrix: the AVX2 kernel at every x86 level (see `x86::k_quant`).
#[inline]
fn k_quant_dot_rows(
    w: &KQuantMatrix,
    rows: Range<usize>,
    x: &SuperBlockActivations,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    level: SimdLevel,
) {
    // SAFETY (x86 arms): a level is only chosen when the CPU reports every feature it needs,
    // and every level but Portable has avx2, fma and f16c.
    #[cfg(target_arch = "x86_64")]
    match level {
        SimdLevel::Avx512Vnni => return unsafe { super::x86::k_quant::dot_rows_avx512(w, rows, x, t0, nt, out) },
        SimdLevel::AvxVnni | SimdLevel::Avx2 => {
            return unsafe { super::x86::k_quant::dot_rows(w, rows, x, t0, nt, out) }
        }
        SimdLevel::Portable => {}
    }
    let _ = level;
    let start = rows.start;
    for r in rows {
        for t in 0..nt {
            out[(r - start) * K_QUANT_TILE + t] = w.dot_portable(r, x, t0 + t);
        }
    }
}

pub(crate) fn uq_dot_portable(w: &UqMatrix, row: usize, x: &QuantizedActivations, t: usize) -> f32 {
    let nb = w.blocks_per_row();
    let bpb = w.bits.bytes_per_block();
    let sums = x.sums_for(w);
    let mut acc = 0f32;
    for b in 0..nb {
        let index = row * nb + b;
        let wq = &w.qs[index * bpb..][..bpb];
        let xq = &x.qs[(t * nb + b) * BLOCK..][..BLOCK];
        let isum: i32 = match w.bits {
            QuantBits::Four => (0..BLOCK / 2)
                .map(|j| {
                    i32::from(wq[j] & 0x0f) * i32::from(xq[j]) + i32::from(wq[j] >> 4) * i32::from(xq[j + BLOCK / 2])
                })
                .sum(),
            QuantBits::Five => {
                let high = u32::from_le_bytes([wq[16], wq[17], wq[18], wq[19]]);
                let q = |j: usize, nibble: u8| i32::from(nibble | ((((high >> j) & 1) as u8) << 4));
                (0..BLOCK / 2)
                    .map(|j| {
                        q(j, wq[j] & 0x0f) * i32::from(xq[j])
                            + q(j + BLOCK / 2, wq[j] >> 4) * i32::from(xq[j + BLOCK / 2])
                    })
                    .sum()
            }
            QuantBits::Eight => wq.iter().zip(xq).map(|(&q, &v)| i32::from(q) * i32::from(v)).sum(),
            QuantBits::FourTable => {
                w.block_ints(index).iter().zip(xq).map(|(&q, &v)| i32::from(q) * i32::from(v)).sum()
            }
        };
        acc += w.d[index].to_f32() * x.d[t * nb + b] * isum as f32 + w.block_offset(index) * sums[t * nb + b];
    }
    acc
}

fn dense_matmul(w: &DenseMatrix, x: &[f32], n: usize, out: &OutRows) {
    let rows = w.rows;
    let tasks = task_count(rows, 8);
    let rows_per_task = rows.div_ceil(tasks);
    pool().run(tasks, &|task| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        for t in 0..n {
            let xt = &x[t * w.cols..][..w.cols];
            for r in r0..r1 {
                let s = dot_f32(&w.w[r * w.cols..][..w.cols], xt);
                // SAFETY: each task owns rows r0..r1 of every token's output.
                unsafe { out.writer.write(t * out.stride + out.first_row + r, s) };
            }
        }
    });
}

fn half_matmul(w: &HalfMatrix, x: &[f32], n: usize, out: &OutRows) {
    let rows = w.rows;
    let tasks = task_count(rows, 8);
    let rows_per_task = rows.div_ceil(tasks);
    pool().run(tasks, &|task| {
        let (r0, r1) = (task * rows_per_task, ((task + 1) * rows_per_task).min(rows));
        // One row widened at a time, then multiplied with every token while it is in L1.
        let mut row = vec![0f32; w.cols];
        for r in r0..r1 {
            w.row_into(r, &mut row);
            for t in 0..n {
                let s = dot_f32(&row, &x[t * w.cols..][..w.cols]);
                // SAFETY: each task owns rows r0..r1 of every token's output.
                unsafe { out.writer.write(t * out.stride + out.first_row + r, s) };
            }
        }
    });
}

super::ops::multiversioned! {
    /// A dot product written so the compiler vectorizes it.
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        super::ops::dot_lanes(a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::GgufBlockFormat;

    fn dequantized(w: &UqMatrix) -> DenseMatrix {
        let mut dense = DenseMatrix { rows: w.rows, cols: w.cols, w: vec![0f32; w.rows * w.cols] };
        for (r, row) in dense.w.chunks_exact_mut(w.cols).enumerate() {
            w.dequantize_row(r, row);
        }
        dense
    }

    /// `x · wᵀ` at `level`.
    fn product(w: &UqMatrix, x: &QuantizedActivations, level: SimdLevel) -> Vec<f32> {
        let mut out = vec![0f32; x.n * w.rows];
        uq_matmul(w, x, &OutRows { writer: &DisjointWriter::new(&mut out), stride: w.rows, first_row: 0 }, level);
        out
    }

    /// Random GGUF blocks of `format` for a rows × cols matrix (deterministic).
    fn random_blocks(format: GgufBlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let mut raw = Vec::new();
        if format.block_values() > BLOCK || matches!(format, GgufBlockFormat::Iq4Nl | GgufBlockFormat::Mxfp4) {
            return random_table_blocks(format, rows * cols, &mut next);
        }
        for _ in 0..rows * cols / BLOCK {
            raw.extend_from_slice(&half::f16::from_f32((next() % 1000) as f32 / 50_000.0).to_le_bytes());
            if matches!(format, GgufBlockFormat::Q4_1 | GgufBlockFormat::Q5_1) {
                raw.extend_from_slice(&half::f16::from_f32(-((next() % 1000) as f32) / 10_000.0).to_le_bytes());
            }
            let payload = match format {
                GgufBlockFormat::Q4_0 | GgufBlockFormat::Q4_1 => 16,
                GgufBlockFormat::Q5_0 | GgufBlockFormat::Q5_1 => 20,
                GgufBlockFormat::Q8_0 => 32,
                _ => unreachable!("taken above"),
            };
            raw.extend((0..payload).map(|_| (next() & 0xff) as u8));
        }
        raw
    }

    /// Random blocks of a table format for `values` values: scales of a few hundredths, any
    /// nibbles (MXFP4: exponents around 2⁻⁶, a few far enough out to be f16 subnormals).
    fn random_table_blocks(format: GgufBlockFormat, values: usize, next: &mut impl FnMut() -> u32) -> Vec<u8> {
        let mut raw = Vec::new();
        for _ in 0..values / format.block_values() {
            match format {
                GgufBlockFormat::Mxfp4 => {
                    let base = if next().is_multiple_of(16) { 100 } else { 118 };
                    raw.push(base + (next() % 8) as u8)
                }
                _ => {
                    raw.extend_from_slice(&half::f16::from_f32((next() % 1000) as f32 / 200_000.0 + 1e-4).to_le_bytes())
                }
            }
            let payload = format.block_bytes() - raw.len() % format.block_bytes();
            raw.extend((0..payload).map(|_| (next() & 0xff) as u8));
        }
        raw
    }

    #[test]
    fn table_formats_hold_ggmls_values_in_four_bits() {
        for format in [GgufBlockFormat::Iq4Nl, GgufBlockFormat::Iq4Xs, GgufBlockFormat::Mxfp4] {
            let (rows, cols) = (5, 512);
            let raw = random_blocks(format, rows, cols, 11);
            let w = UqMatrix::from_gguf(format, &raw, rows, cols).unwrap();
            assert_eq!(w.qs.len(), rows * cols / 2, "{format:?}: four bits a value");
            // An f16 scale a block where MXFP4 has a byte and IQ4_XS 4.25 bits: at most 1/16 more.
            assert!(w.bytes() * 16 <= raw.len() * 17, "{format:?}: {} bytes for the file's {}", w.bytes(), raw.len());
            let ggml = crate::kernels::quant::dequantize_table_format(format, &raw).unwrap();
            let ours = dequantized(&w).w;
            for (i, (a, b)) in ours.iter().zip(&ggml).enumerate() {
                // IQ4_XS's sub-block scales are rounded to f16; an MXFP4 scale below f16's
                // least flushes to zero (its values are under 12·2⁻²⁵); the rest is exact.
                let tolerance = match format {
                    GgufBlockFormat::Iq4Xs => b.abs() / 1024.0,
                    _ => 12.0 * 2f32.powi(-25),
                };
                assert!((a - b).abs() <= tolerance, "{format:?} value {i}: {a} vs ggml's {b}");
            }
        }
        // An MXFP4 scale of 2¹⁶ or more is past f16: refused, for the dense path to take.
        let mut raw = random_blocks(GgufBlockFormat::Mxfp4, 1, 32, 1);
        raw[0] = 144;
        assert!(UqMatrix::from_gguf(GgufBlockFormat::Mxfp4, &raw, 1, 32).is_none());
    }

    #[test]
    fn every_level_and_format_agrees_with_the_dequantized_reference() {
        // 23 blocks a row: the AVX-512 kernel's pairs and its odd last block, AVX2's two groups
        // of eight and its short ones of 4, 2 and 1. 11 tokens: a whole tile of 8 and a short one.
        let (rows, cols, n) = (37, 23 * BLOCK, 11);
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
        let mut qx = QuantizedActivations::default();
        qx.quantize_into(&x, n, cols);
        let formats = [
            GgufBlockFormat::Q4_0,
            GgufBlockFormat::Q4_1,
            GgufBlockFormat::Q5_0,
            GgufBlockFormat::Q5_1,
            GgufBlockFormat::Q8_0,
            GgufBlockFormat::Iq4Nl,
            GgufBlockFormat::Mxfp4,
        ];
        for (seed, format) in formats.into_iter().enumerate() {
            let raw = random_blocks(format, rows, cols, seed as u64 + 7);
            let w = UqMatrix::from_gguf(format, &raw, rows, cols).unwrap();
            let dense = dequantized(&w);
            for level in SimdLevel::supported() {
                let out = product(&w, &qx, level);
                for t in 0..n {
                    for r in 0..rows {
                        let (wr, xt) = (&dense.w[r * cols..][..cols], &x[t * cols..][..cols]);
                        let exact = dot_f32(wr, xt);
                        let magnitude: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                        let got = out[t * rows + r];
                        // int8 activations: each product off by at most 1/254 of its block's largest
                        assert!(
                            (got - exact).abs() < 0.01 * magnitude,
                            "{format:?} {level:?} t{t} r{r}: {got} vs {exact}"
                        );
                        let portable = uq_dot_portable(&w, r, &qx, t);
                        assert!(
                            (got - portable).abs() < 1e-5 * magnitude,
                            "{format:?} {level:?} t{t} r{r}: {got} vs portable {portable}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_prompt_across_row_chunks_gets_every_row_with_the_bits_of_each_token_alone() {
        // An offset a block, a table, signed bytes without VNNI, and fifth bits.
        for format in [GgufBlockFormat::Q4_1, GgufBlockFormat::Mxfp4, GgufBlockFormat::Q8_0, GgufBlockFormat::Q5_0] {
            // A chunk of rows and half of another in every task, whatever the thread count; 15
            // blocks a row, so that the last seven go in runs of 4, 2 and 1.
            let cols = 15 * BLOCK;
            let probe = UqMatrix::from_gguf(format, &random_blocks(format, 1, cols, 1), 1, cols).unwrap();
            let chunk_rows = CHUNK_BYTES / probe.row_bytes();
            let rows = 4 * pool().threads() * (chunk_rows + chunk_rows / 2);
            let n = 9;
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
            let mut prompt = QuantizedActivations::default();
            prompt.quantize_into(&x, n, cols);
            let w = UqMatrix::from_gguf(format, &random_blocks(format, rows, cols, 3), rows, cols).unwrap();
            let dense = dequantized(&w);
            for level in SimdLevel::supported() {
                let together = product(&w, &prompt, level);
                for (r, row) in dense.w.chunks_exact(cols).enumerate() {
                    let magnitude: f32 = row.iter().zip(&x[..cols]).map(|(a, b)| (a * b).abs()).sum();
                    let (got, portable) = (together[r], uq_dot_portable(&w, r, &prompt, 0));
                    assert!(
                        (got - portable).abs() < 1e-5 * magnitude,
                        "{format:?} {level:?} row {r}: {got} vs portable {portable}"
                    );
                }
                for t in 0..n {
                    let mut alone = QuantizedActivations::default();
                    alone.quantize_into(&x[t * cols..][..cols], 1, cols);
                    let alone = product(&w, &alone, level);
                    let same = alone.iter().zip(&together[t * rows..][..rows]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} {level:?}: token {t} of the prompt differs from the token alone");
                }
            }
        }
    }

    /// `x · wᵀ` of a K-quant matrix at `level`.
    fn k_quant_product(w: &KQuantMatrix, x: &SuperBlockActivations, level: SimdLevel) -> Vec<f32> {
        let mut out = vec![0f32; x.n * w.rows];
        let rows = OutRows { writer: &DisjointWriter::new(&mut out), stride: w.rows, first_row: 0 };
        k_quant_matmul(w, x, &rows, level);
        out
    }

    /// Random K-quant super-blocks (random bytes throughout, with small d and dmin, or Q6_K's
    /// d, so values stay in range).
    fn random_k_quant_blocks(format: GgufBlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let block_bytes = format.block_bytes();
        let mut raw = random_blocks(GgufBlockFormat::Q8_0, rows * cols / 256 * block_bytes / 34 + 1, 32, seed);
        raw.truncate(rows * cols / 256 * block_bytes);
        for block in raw.chunks_exact_mut(block_bytes) {
            if format == GgufBlockFormat::Q6K {
                block[208..].copy_from_slice(&half::f16::from_f32(0.0003).to_le_bytes());
            } else {
                block[..2].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
                block[2..4].copy_from_slice(&half::f16::from_f32(0.002).to_le_bytes());
            }
        }
        raw
    }

    #[test]
    fn k_quants_match_candles_dequantization_and_every_level_computes_them() {
        use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
        // One token (decode's kernel), 3 (one group of four, short), then 11 to 27 (three to seven
        // groups of a 32-token tile, which Q5_K takes in 16-token halves) and 45 (a whole tile and
        // a short one); 7 rows, so that pairs of rows leave one over. Four tokens of 1,024 values
        // are a whole page, so the groups lie a padded stride apart.
        for n in [1, 3, 11, 18, 21, 27, 45] {
            let (rows, cols) = (7, 1024);
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
            let mut qx = SuperBlockActivations::default();
            qx.quantize_into(&x, n, cols);
            let k_quants = [
                (GgufBlockFormat::Q4K, GgmlDType::Q4K),
                (GgufBlockFormat::Q5K, GgmlDType::Q5K),
                (GgufBlockFormat::Q6K, GgmlDType::Q6K),
            ];
            for (format, dtype) in k_quants {
                let raw = random_k_quant_blocks(format, rows, cols, 3);
                let reference = qtensor_from_ggml(dtype, &raw, vec![rows, cols], &candle_core::Device::Cpu)
                    .unwrap()
                    .dequantize(&candle_core::Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let Some(Matrix::KQuant(w)) = Matrix::from_gguf_blocks(format, &raw, rows, cols) else {
                    panic!("{format:?} is kept as the file has it")
                };
                // The file's bytes, and ggml's values to the bit.
                assert_eq!(w.raw.len(), raw.len(), "{format:?}");
                let mut dense = vec![0f32; rows * cols];
                for (r, row) in dense.chunks_exact_mut(cols).enumerate() {
                    w.dequantize_row(r, row);
                }
                assert!(dense.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{format:?}");
                for level in SimdLevel::supported() {
                    let out = k_quant_product(&w, &qx, level);
                    for t in 0..n {
                        for r in 0..rows {
                            let (wr, xt) = (&reference[r * cols..][..cols], &x[t * cols..][..cols]);
                            let magnitude: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                            let got = out[t * rows + r];
                            let exact = dot_f32(wr, xt);
                            assert!(
                                (got - exact).abs() < 0.01 * magnitude,
                                "{format:?} {level:?} t{t} r{r}: {got} vs {exact}"
                            );
                            // The portable product's bits at every level.
                            let portable = w.dot_portable(r, &qx, t);
                            assert_eq!(
                                got.to_bits(),
                                portable.to_bits(),
                                "{format:?} {level:?} t{t} r{r}: {got} vs portable {portable}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_k_quant_prompt_across_row_chunks_gets_each_token_s_bits_alone() {
        for format in [GgufBlockFormat::Q4K, GgufBlockFormat::Q5K, GgufBlockFormat::Q6K] {
            // Rows of 19 super-blocks: two whole panels of a tile's and a short one.
            let cols = 19 * 256;
            let chunk_rows = CHUNK_BYTES / (cols / 256 * format.block_bytes());
            let rows = 4 * pool().threads() * (chunk_rows + chunk_rows / 2);
            let n = 9;
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
            let mut prompt = SuperBlockActivations::default();
            prompt.quantize_into(&x, n, cols);
            let Some(Matrix::KQuant(w)) =
                Matrix::from_gguf_blocks(format, &random_k_quant_blocks(format, rows, cols, 5), rows, cols)
            else {
                panic!("{format:?} is kept as the file has it")
            };
            for level in SimdLevel::supported() {
                let together = k_quant_product(&w, &prompt, level);
                for t in 0..n {
                    let mut alone = SuperBlockActivations::default();
                    alone.quantize_into(&x[t * cols..][..cols], 1, cols);
                    let alone = k_quant_product(&w, &alone, level);
                    let same = alone.iter().zip(&together[t * rows..][..rows]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} {level:?}: token {t} of the prompt differs from the token alone");
                }
            }
        }
    }

    #[test]
    fn half_matrices_take_two_bytes_a_value_and_give_the_dense_products_to_the_bit() {
        let (rows, cols, n) = (19, 96, 5);
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 2001) as f32 / 700.0 - 1.4).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 104_729) % 997) as f32 / 400.0 - 1.2).collect();
        let mut scratch = QuantizedActivations::default();
        let product = |m: &Matrix| {
            let mut out = vec![0f32; n * m.rows()];
            m.matmul(&x, n, &mut QuantizedActivations::default(), &mut out);
            out
        };
        let halves = [
            HalfValues::F16(values.iter().map(|&v| f16::from_f32(v)).collect()),
            HalfValues::Bf16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
        ];
        for w in halves {
            let half = Matrix::Half(HalfMatrix { rows, cols, w });
            assert_eq!(half.weight_bytes(), 2 * rows * cols);
            let mut widened = vec![0f32; rows * cols];
            for (r, row) in widened.chunks_exact_mut(cols).enumerate() {
                half.dequantize_row(r, row);
            }
            let dense = Matrix::Dense(DenseMatrix { rows, cols, w: widened });
            let (ours, reference) = (product(&half), product(&dense));
            assert!(ours.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{half:?}");
            // Stacked with another of its kind, the two stay one matrix of 16-bit values.
            let stacked = Matrix::stack(&[&half, &half]).unwrap();
            assert!(matches!(&stacked, Matrix::Half(h) if h.rows == 2 * rows), "{stacked:?}");
            let mut out = vec![0f32; n * 2 * rows];
            stacked.matmul(&x, n, &mut scratch, &mut out);
            assert_eq!(
                out[..rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                ours[..rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn matrices_of_different_formats_stack_into_one_product() {
        let cols = 64;
        let q5 = Matrix::Quantized(
            UqMatrix::from_gguf(GgufBlockFormat::Q5_0, &random_blocks(GgufBlockFormat::Q5_0, 5, cols, 1), 5, cols)
                .unwrap(),
        );
        let q8 = Matrix::Quantized(
            UqMatrix::from_gguf(GgufBlockFormat::Q8_0, &random_blocks(GgufBlockFormat::Q8_0, 2, cols, 2), 2, cols)
                .unwrap(),
        );
        let dense = Matrix::Dense(DenseMatrix { rows: 3, cols, w: (0..3 * cols).map(|i| i as f32 / 100.0).collect() });
        let parts = [&q5, &q8, &dense];
        let stacked = Matrix::stack(&parts).unwrap();
        assert!(matches!(&stacked, Matrix::Stacked(p) if p.len() == 3), "a mix keeps its parts (and their bytes)");
        let q5_twice = Matrix::stack(&[&q5, &q5, &q8]).unwrap();
        assert!(
            matches!(&q5_twice, Matrix::Stacked(p) if p.len() == 2 && p[0].rows() == 10),
            "neighbours of one format join"
        );
        assert_eq!((stacked.rows(), stacked.weight_bytes()), (10, parts.iter().map(|p| p.weight_bytes()).sum()));
        let n = 3;
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let mut scratch = QuantizedActivations::default();
        let mut out = vec![0f32; n * 10];
        stacked.matmul(&x, n, &mut scratch, &mut out);
        let mut first_row = 0;
        for part in parts {
            let mut alone = vec![0f32; n * part.rows()];
            part.matmul(&x, n, &mut scratch, &mut alone);
            for t in 0..n {
                assert_eq!(&out[t * 10 + first_row..][..part.rows()], &alone[t * part.rows()..][..part.rows()]);
            }
            let (mut row, mut expected) = (vec![0f32; cols], vec![0f32; cols]);
            stacked.dequantize_row(first_row + 1, &mut row);
            part.dequantize_row(1, &mut expected);
            assert_eq!(row, expected);
            first_row += part.rows();
        }
    }

    /// Read from a file a chunk at a time, every format gives the matrix its bytes whole give,
    /// and no read asks for more than a chunk; a failed read is the load's error.
    #[test]
    fn a_matrix_read_a_chunk_at_a_time_is_the_one_its_bytes_give() {
        use GgufBlockFormat::*;
        // Over a chunk in every format: 3·2²⁰ values take 1.5 MiB at Q4_0's 4.5 bits.
        let (rows, cols) = (48, 65_536);
        for format in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K, Iq4Nl, Iq4Xs, Mxfp4] {
            let raw = match format.block_values() > BLOCK && format != Iq4Xs {
                true => random_k_quant_blocks(format, rows, cols, 9),
                false => random_blocks(format, rows, cols, 9),
            };
            let whole = Matrix::from_gguf_blocks(format, &raw, rows, cols).unwrap();
            let (mut at, mut reads) = (0, 0);
            let read = Matrix::read_gguf_blocks(format, rows, cols, |buf| {
                assert!(buf.len() <= READ_CHUNK_BYTES, "{format:?}: a read of {} bytes", buf.len());
                buf.copy_from_slice(&raw[at..at + buf.len()]);
                (at, reads) = (at + buf.len(), reads + 1);
                Ok(())
            })
            .unwrap()
            .unwrap();
            assert_eq!((at, read.weight_bytes()), (raw.len(), whole.weight_bytes()), "{format:?}");
            assert!(reads > 1, "{format:?}");
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for row in [0, 17, rows - 1] {
                read.dequantize_row(row, &mut a);
                whole.dequantize_row(row, &mut b);
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{format:?} row {row}");
            }

            let mut calls = 0;
            let failed = Matrix::read_gguf_blocks(format, rows, cols, |_| {
                calls += 1;
                match calls {
                    2 => Err(std::io::Error::from_raw_os_error(5)),
                    _ => Ok(()),
                }
            });
            assert_eq!(failed.unwrap_err().raw_os_error(), Some(5), "{format:?}");
        }
    }

    #[test]
    fn block_data_of_the_wrong_size_or_shape_is_refused() {
        let q4_1 = random_blocks(GgufBlockFormat::Q4_1, 2, 64, 1);
        assert!(UqMatrix::from_gguf(GgufBlockFormat::Q4_1, &q4_1[..q4_1.len() - 1], 2, 64).is_none(), "truncated");
        assert!(UqMatrix::from_gguf(GgufBlockFormat::Q4_1, &q4_1, 2, 48).is_none(), "rows not whole blocks");
        let q4_k = vec![0u8; 2 * 144];
        let matrix = |format, raw: &[u8], rows, cols| Matrix::from_gguf_blocks(format, raw, rows, cols);
        assert!(matrix(GgufBlockFormat::Q4K, &q4_k, 1, 512).is_some());
        assert!(matrix(GgufBlockFormat::Q4K, &q4_k[..287], 1, 512).is_none(), "truncated super-block");
        assert!(matrix(GgufBlockFormat::Q4K, &q4_k, 2, 256 + 32).is_none(), "rows not whole super-blocks");
        assert!(matrix(GgufBlockFormat::Q5K, &q4_k, 1, 512).is_none(), "Q5_K blocks are 176 bytes");
        assert!(matrix(GgufBlockFormat::Q6K, &q4_k, 1, 512).is_none(), "Q6_K blocks are 210 bytes");
        assert!(matrix(GgufBlockFormat::Q6K, &[0u8; 420], 1, 512).is_some());
    }

    #[test]
    fn legacy_formats_take_their_file_size_in_memory() {
        for (format, block_bytes) in [
            (GgufBlockFormat::Q4_0, 18),
            (GgufBlockFormat::Q4_1, 20),
            (GgufBlockFormat::Q5_0, 22),
            (GgufBlockFormat::Q8_0, 34),
        ] {
            let raw = random_blocks(format, 4, 64, 1);
            assert_eq!(raw.len(), 4 * 2 * block_bytes);
            assert_eq!(UqMatrix::from_gguf(format, &raw, 4, 64).unwrap().bytes(), raw.len(), "{format:?}");
        }
    }

    #[test]
    fn q5_0_reads_the_fifth_bit_from_its_mask() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
        raw.extend_from_slice(&0x8000_0001u32.to_le_bytes()); // values 0 and 31 have bit 4 set
        raw.extend(std::iter::repeat_n(0x21u8, 16)); // low nibbles 1, high nibbles 2
        let w = UqMatrix::from_gguf(GgufBlockFormat::Q5_0, &raw, 1, 32).unwrap();
        let mut row = vec![0f32; 32];
        w.dequantize_row(0, &mut row);
        assert_eq!(row[0], (1 + 16 - 16) as f32);
        assert_eq!(row[1], (1 - 16) as f32);
        assert_eq!(row[16], (2 - 16) as f32);
        assert_eq!(row[31], (2 + 16 - 16) as f32);
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
