//! Block-quantized formats as the kernels want them.
//!
//! Weights: GGUF's Q4_0, Q4_1 and Q8_0 all become one "unsigned ints with scale and offset"
//! layout, `value = d·q + m` per 32-value block, so a single int8 dot-product kernel serves them
//! (Q4_0 is `d·(q−8)`, i.e. `m = −8d`; Q8_0 is stored as `q+128` with `m = −128d`). Scales are
//! kept as f32 in their own arrays, off the hot byte stream.
//!
//! Activations: each 32-value block is quantized to int8 with one f32 scale, and the block's
//! scaled sum is kept so the weights' offset term costs one multiply per block.

use half::f16;

pub const BLOCK: usize = 32;

/// Bytes one GGUF block occupies on disk.
const Q4_0_BYTES: usize = 18;
const Q4_1_BYTES: usize = 20;
const Q8_0_BYTES: usize = 34;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantBits {
    /// Two values per byte: low nibble is value j, high nibble value j+16 of the block (ggml order).
    Four,
    Eight,
}

impl QuantBits {
    pub fn bytes_per_block(self) -> usize {
        match self {
            Self::Four => BLOCK / 2,
            Self::Eight => BLOCK,
        }
    }
}

/// A row-major matrix of unsigned block-quantized weights.
#[derive(Debug, Clone)]
pub struct UqMatrix {
    pub rows: usize,
    pub cols: usize,
    pub bits: QuantBits,
    /// rows × blocks_per_row × bytes_per_block
    pub qs: Vec<u8>,
    /// rows × blocks_per_row
    pub d: Vec<f32>,
    /// rows × blocks_per_row
    pub m: Vec<f32>,
}

/// The GGUF block formats that map onto [`UqMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufBlockFormat {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl UqMatrix {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    pub fn row_bytes(&self) -> usize {
        self.blocks_per_row() * self.bits.bytes_per_block()
    }

    /// Repacks raw GGUF blocks (as stored in the file) of a `rows × cols` matrix.
    pub fn from_gguf(format: GgufBlockFormat, raw: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(BLOCK) {
            return None;
        }
        let n_blocks = rows * cols / BLOCK;
        let block_bytes = match format {
            GgufBlockFormat::Q4_0 => Q4_0_BYTES,
            GgufBlockFormat::Q4_1 => Q4_1_BYTES,
            GgufBlockFormat::Q8_0 => Q8_0_BYTES,
        };
        if raw.len() != n_blocks * block_bytes {
            return None;
        }
        let bits = match format {
            GgufBlockFormat::Q8_0 => QuantBits::Eight,
            _ => QuantBits::Four,
        };
        let mut qs = Vec::with_capacity(n_blocks * bits.bytes_per_block());
        let mut d = Vec::with_capacity(n_blocks);
        let mut m = Vec::with_capacity(n_blocks);
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        for block in raw.chunks_exact(block_bytes) {
            let scale = half_at(block, 0);
            match format {
                GgufBlockFormat::Q4_0 => {
                    d.push(scale);
                    m.push(-8.0 * scale);
                    qs.extend_from_slice(&block[2..18]);
                }
                GgufBlockFormat::Q4_1 => {
                    d.push(scale);
                    m.push(half_at(block, 2));
                    qs.extend_from_slice(&block[4..20]);
                }
                GgufBlockFormat::Q8_0 => {
                    d.push(scale);
                    m.push(-128.0 * scale);
                    qs.extend(block[2..34].iter().map(|&q| q ^ 0x80));
                }
            }
        }
        Some(Self { rows, cols, bits, qs, d, m })
    }

    /// Writes row `row`, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let bpb = self.bits.bytes_per_block();
        for b in 0..nb {
            let (d, m) = (self.d[row * nb + b], self.m[row * nb + b]);
            let qs = &self.qs[(row * nb + b) * bpb..][..bpb];
            let dst = &mut out[b * BLOCK..][..BLOCK];
            match self.bits {
                QuantBits::Four => {
                    for j in 0..BLOCK / 2 {
                        dst[j] = d * f32::from(qs[j] & 0x0f) + m;
                        dst[j + BLOCK / 2] = d * f32::from(qs[j] >> 4) + m;
                    }
                }
                QuantBits::Eight => {
                    for j in 0..BLOCK {
                        dst[j] = d * f32::from(qs[j]) + m;
                    }
                }
            }
        }
    }

    /// Stacks matrices with the same column count and bit width on top of each other.
    pub fn stack(parts: &[&UqMatrix]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.cols != first.cols || p.bits != first.bits) {
            return None;
        }
        let cat = |f: fn(&UqMatrix) -> &[u8]| parts.iter().flat_map(|p| f(p).iter().copied()).collect();
        let cat_f32 = |f: fn(&UqMatrix) -> &[f32]| parts.iter().flat_map(|p| f(p).iter().copied()).collect();
        Some(Self {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            bits: first.bits,
            qs: cat(|p| &p.qs),
            d: cat_f32(|p| &p.d),
            m: cat_f32(|p| &p.m),
        })
    }
}

/// `n` activation vectors of `cols` values, each block quantized to int8.
#[derive(Debug, Default, Clone)]
pub struct QuantizedActivations {
    pub n: usize,
    pub cols: usize,
    /// n × cols int8 values
    pub qs: Vec<i8>,
    /// n × blocks scales
    pub d: Vec<f32>,
    /// n × blocks: d · Σq, which multiplies the weights' per-block offset
    pub scaled_sums: Vec<f32>,
}

impl QuantizedActivations {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// Quantizes `x` (`n × cols`, row-major), reusing this value's buffers.
    pub fn quantize_into(&mut self, x: &[f32], n: usize, cols: usize) {
        debug_assert_eq!(x.len(), n * cols);
        debug_assert_eq!(cols % BLOCK, 0);
        self.n = n;
        self.cols = cols;
        self.qs.resize(n * cols, 0);
        let blocks = n * cols / BLOCK;
        self.d.resize(blocks, 0.0);
        self.scaled_sums.resize(blocks, 0.0);
        for (b, (src, dst)) in x.chunks_exact(BLOCK).zip(self.qs.chunks_exact_mut(BLOCK)).enumerate() {
            let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in dst.iter_mut().zip(src) {
                let r = (v * inv).round() as i32;
                *q = r as i8;
                sum += r;
            }
            // Scales are rounded to f16 as ggml's Q8_0/Q8_1 blocks store them, so products
            // match llama.cpp's and candle's to the last bit of the scale.
            self.d[b] = f16::from_f32(d).to_f32();
            self.scaled_sums[b] = f16::from_f32(d * sum as f32).to_f32();
        }
    }
}
