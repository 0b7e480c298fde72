//! Block-quantized formats as the kernels want them.
//!
//! Weights: GGUF's Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, and the table formats IQ4_NL, IQ4_XS and
//! MXFP4 all become unsigned ints in 32-value blocks, each block with an f16 scale `d`, so one
//! int8 dot-product kernel serves them. A block's values are `d·(q − zero)` for the symmetric
//! formats (Q4_0: zero 8, Q5_0: 16, Q8_0: stored as q+128 with zero 128) and `d·q + m` with a
//! per-block f16 `m` for the others. Scales stay f16 as in the file, so a legacy-format model
//! takes in memory what it takes on disk. The K-quants (Q4_K, Q5_K, Q6_K) stay as the file has
//! them ([`super::k_quant`]).
//!
//! Activations: each 32-value block is quantized to int8 with one scale, and the block's sum
//! times its scale is kept so a weight block's offset costs one multiply per block.

use super::huge_pages::{concat_in_huge_pages, vec_in_huge_pages};
use super::k_quant::SuperBlockActivations;
use super::parallel::{task_count, DisjointWriter};
use super::spin_pool::pool;
use half::f16;

pub const BLOCK: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantBits {
    /// Two values per byte: low nibble is value j, high nibble value j+16 of the block (ggml order).
    Four,
    /// As `Four`, then 4 bytes whose bit j (little-endian) is value j's fifth bit.
    Five,
    Eight,
    /// IQ4_NL, IQ4_XS and MXFP4: nibbles in `Four`'s order, each an index into the matrix's
    /// [`UqMatrix::table`] of 16 values, so the file's 4 bits a value stay 4 bits in memory.
    FourTable,
}

impl QuantBits {
    pub fn bytes_per_block(self) -> usize {
        match self {
            Self::Four | Self::FourTable => BLOCK / 2,
            Self::Five => BLOCK / 2 + BLOCK / 8,
            Self::Eight => BLOCK,
        }
    }
}

/// How a block's unsigned ints become values, besides the scale.
#[derive(Debug, Clone, PartialEq)]
pub enum Offset {
    /// `d·(q − zero)`: one zero point for the whole matrix.
    Zero(u8),
    /// `d·q + m`: rows × blocks_per_row offsets.
    PerBlock(Vec<f16>),
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
    pub d: Vec<f16>,
    pub offset: Offset,
    /// For [`QuantBits::FourTable`]: the unsigned int each nibble stands for (the format's
    /// signed value + 128, with the zero point 128, as Q8_0 is kept).
    pub table: Option<&'static [u8; 16]>,
}

/// IQ4_NL's (and IQ4_XS's) non-linear values, ggml's `kvalues_iq4nl`, plus 128.
const IQ4_NL_TABLE: [u8; 16] = [1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241];
/// MXFP4's E2M1 values doubled (ggml's `kvalues_mxfp4`: 0, 1, 2, 3, 4, 6, 8, 12 and their
/// negatives), plus 128; the doubling is undone by halving each block's scale.
const MXFP4_TABLE: [u8; 16] = [128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116];

/// The scale of 32-value block `sub` of an IQ4_XS super-block: `d·(ls − 32)`, its 6-bit `ls`
/// split into four low bits (bytes 4–7, two a byte) and two high ones (bytes 2–3).
fn iq4_xs_scale(block: &[u8], sub: usize) -> f32 {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    let high = u16::from_le_bytes([block[2], block[3]]);
    let low = (block[4 + sub / 2] >> (4 * (sub % 2))) & 0x0f;
    d * (i32::from(low | (((high >> (2 * sub)) & 3) as u8) << 4) - 32) as f32
}

/// MXFP4's E8M0 block scale, halved for [`MXFP4_TABLE`]'s doubled values: 2^(e − 128), as
/// ggml's `GGML_E8M0_TO_FP32_HALF`.
fn mxfp4_scale(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// The GGUF block formats that map onto [`UqMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufBlockFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

/// Values in a K-quant super-block.
const SUPER_BLOCK: usize = 256;

impl GgufBlockFormat {
    /// Bytes one block occupies in the file.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
            Self::Mxfp4 => 17,
        }
    }

    /// Values one block of the file holds.
    pub fn block_values(self) -> usize {
        match self {
            Self::Q4K | Self::Q5K | Self::Q6K | Self::Iq4Xs => SUPER_BLOCK,
            _ => BLOCK,
        }
    }

    /// Bytes a `rows × cols` matrix of these blocks takes in the file; `None` if its rows are
    /// not whole blocks.
    pub fn tensor_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_values()) {
            return None;
        }
        (rows.checked_mul(cols)? / self.block_values()).checked_mul(self.block_bytes())
    }
}

impl UqMatrix {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    pub fn row_bytes(&self) -> usize {
        self.blocks_per_row() * self.bits.bytes_per_block()
    }

    /// Bytes the matrix holds (what one full product streams).
    pub fn bytes(&self) -> usize {
        let offsets = match &self.offset {
            Offset::Zero(_) => 0,
            Offset::PerBlock(m) => m.len(),
        };
        self.qs.len() + 2 * (self.d.len() + offsets)
    }

    /// The value block `b` of row `row` adds per unit of the activations' scaled block sum:
    /// `m`, or `−zero·d`.
    #[inline]
    pub fn block_offset(&self, index: usize) -> f32 {
        match &self.offset {
            Offset::Zero(z) => -f32::from(*z) * self.d[index].to_f32(),
            Offset::PerBlock(m) => m[index].to_f32(),
        }
    }

    /// Repacks raw GGUF blocks (as stored in the file) of a `rows × cols` matrix; `None` if
    /// their size is not the shape's, (MXFP4) a block's scale is beyond f16's range, or the
    /// format is a K-quant (a [`super::k_quant::KQuantMatrix`]).
    pub fn from_gguf(format: GgufBlockFormat, raw: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if raw.len() != format.tensor_bytes(rows, cols)? {
            return None;
        }
        let mut w = Self::for_blocks(format, rows, cols)?;
        w.push_blocks(format, raw)?;
        Some(w)
    }

    /// An empty `rows × cols` matrix for `format`'s blocks, which [`UqMatrix::push_blocks`]
    /// fills; `None` if the rows are not whole blocks or the format is a K-quant.
    pub fn for_blocks(format: GgufBlockFormat, rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(format.block_values()) {
            return None;
        }
        let n_blocks = rows.checked_mul(cols)? / BLOCK;
        let (bits, offset, table) = match format {
            GgufBlockFormat::Q4_0 => (QuantBits::Four, Offset::Zero(8), None),
            GgufBlockFormat::Q4_1 => (QuantBits::Four, Offset::PerBlock(Vec::with_capacity(n_blocks)), None),
            GgufBlockFormat::Q5_0 => (QuantBits::Five, Offset::Zero(16), None),
            GgufBlockFormat::Q5_1 => (QuantBits::Five, Offset::PerBlock(Vec::with_capacity(n_blocks)), None),
            GgufBlockFormat::Q8_0 => (QuantBits::Eight, Offset::Zero(128), None),
            // Kept as the file has them, in their own matrix (`k_quant`).
            GgufBlockFormat::Q4K | GgufBlockFormat::Q5K | GgufBlockFormat::Q6K => return None,
            GgufBlockFormat::Iq4Nl | GgufBlockFormat::Iq4Xs => {
                (QuantBits::FourTable, Offset::Zero(128), Some(&IQ4_NL_TABLE))
            }
            GgufBlockFormat::Mxfp4 => (QuantBits::FourTable, Offset::Zero(128), Some(&MXFP4_TABLE)),
        };
        Some(Self {
            rows,
            cols,
            bits,
            qs: vec_in_huge_pages(n_blocks * bits.bytes_per_block()),
            d: vec_in_huge_pages(n_blocks),
            offset,
            table,
        })
    }

    /// Appends the file's next blocks (`raw`, whole blocks of `format`, the one
    /// [`UqMatrix::for_blocks`] was given); `None` if (MXFP4) a block's scale is beyond f16's
    /// range.
    ///
    /// - Q5_0 and Q5_1 put the nibbles before the fifth bits, as Q4 has them.
    /// - Q8_0 keeps q + 128.
    /// - IQ4_NL, IQ4_XS and MXFP4 keep their nibbles, and each block's scale as f16: IQ4_XS's
    ///   `d·(ls − 32)` rounded to it, as the K-quants' are; an MXFP4 scale under f16's least,
    ///   2⁻²⁴, flushed to zero (its values are under 12·2⁻²⁵).
    pub fn push_blocks(&mut self, format: GgufBlockFormat, raw: &[u8]) -> Option<()> {
        debug_assert!(raw.len().is_multiple_of(format.block_bytes()), "whole blocks");
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]);
        for block in raw.chunks_exact(format.block_bytes()) {
            match format {
                GgufBlockFormat::Q4_0 => {
                    self.d.push(half_at(block, 0));
                    self.qs.extend_from_slice(&block[2..18]);
                }
                GgufBlockFormat::Q4_1 => {
                    self.push_scale_and_min(half_at(block, 0), half_at(block, 2));
                    self.qs.extend_from_slice(&block[4..20]);
                }
                GgufBlockFormat::Q5_1 => {
                    self.push_scale_and_min(half_at(block, 0), half_at(block, 2));
                    self.qs.extend_from_slice(&block[8..24]);
                    self.qs.extend_from_slice(&block[4..8]);
                }
                GgufBlockFormat::Q5_0 => {
                    self.d.push(half_at(block, 0));
                    self.qs.extend_from_slice(&block[6..22]);
                    self.qs.extend_from_slice(&block[2..6]);
                }
                GgufBlockFormat::Q8_0 => {
                    self.d.push(half_at(block, 0));
                    self.qs.extend(block[2..34].iter().map(|&q| q ^ 0x80));
                }
                GgufBlockFormat::Iq4Nl => {
                    self.d.push(half_at(block, 0));
                    self.qs.extend_from_slice(&block[2..18]);
                }
                GgufBlockFormat::Mxfp4 => {
                    let d = f16::from_f32(mxfp4_scale(block[0]));
                    if d.is_infinite() {
                        return None;
                    }
                    self.d.push(d);
                    self.qs.extend_from_slice(&block[1..17]);
                }
                GgufBlockFormat::Iq4Xs => {
                    self.d.extend((0..SUPER_BLOCK / BLOCK).map(|sub| f16::from_f32(iq4_xs_scale(block, sub))));
                    self.qs.extend_from_slice(&block[8..136]);
                }
                GgufBlockFormat::Q4K | GgufBlockFormat::Q5K | GgufBlockFormat::Q6K => {
                    unreachable!("`for_blocks` refuses them")
                }
            }
        }
        Some(())
    }

    fn push_scale_and_min(&mut self, d: f16, m: f16) {
        self.d.push(d);
        if let Offset::PerBlock(mins) = &mut self.offset {
            mins.push(m);
        }
    }

    /// The unsigned ints of block `index` (row-major block index), in value order.
    #[inline]
    pub fn block_ints(&self, index: usize) -> [u8; BLOCK] {
        let bpb = self.bits.bytes_per_block();
        if let Some(table) = self.table {
            let qs = &self.qs[index * bpb..][..bpb];
            return std::array::from_fn(|j| table[usize::from((qs[j % 16] >> (4 * (j / 16))) & 0x0f)]);
        }
        let qs = &self.qs[index * bpb..][..bpb];
        let mut q = [0u8; BLOCK];
        match self.bits {
            QuantBits::Four | QuantBits::Five => {
                for j in 0..BLOCK / 2 {
                    q[j] = qs[j] & 0x0f;
                    q[j + BLOCK / 2] = qs[j] >> 4;
                }
                if self.bits == QuantBits::Five {
                    let high = u32::from_le_bytes([qs[16], qs[17], qs[18], qs[19]]);
                    for (j, v) in q.iter_mut().enumerate() {
                        *v |= (((high >> j) & 1) as u8) << 4;
                    }
                }
            }
            QuantBits::Eight => q.copy_from_slice(qs),
            QuantBits::FourTable => unreachable!("taken above"),
        }
        q
    }

    /// Writes row `row`, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for (b, dst) in out[..self.cols].chunks_exact_mut(BLOCK).enumerate() {
            let index = row * nb + b;
            let ints = self.block_ints(index);
            let (d, m) = (self.d[index].to_f32(), self.block_offset(index));
            for (v, q) in dst.iter_mut().zip(ints) {
                *v = d * f32::from(q) + m;
            }
        }
    }

    /// Stacks matrices with the same column count and format on top of each other.
    pub fn stack(parts: &[&UqMatrix]) -> Option<Self> {
        let first = parts.first()?;
        let same_offsets = |p: &UqMatrix| match (&p.offset, &first.offset) {
            (Offset::Zero(a), Offset::Zero(b)) => a == b,
            (Offset::PerBlock(_), Offset::PerBlock(_)) => true,
            _ => false,
        };
        if parts
            .iter()
            .any(|p| p.cols != first.cols || p.bits != first.bits || p.table != first.table || !same_offsets(p))
        {
            return None;
        }
        let offset = match &first.offset {
            Offset::Zero(z) => Offset::Zero(*z),
            Offset::PerBlock(_) => Offset::PerBlock(concat_in_huge_pages(
                &parts
                    .iter()
                    .map(|p| if let Offset::PerBlock(m) = &p.offset { m.as_slice() } else { &[] })
                    .collect::<Vec<_>>(),
            )),
        };
        // Allocated once at what the parts hold; a collected `flat_map` grows by doubling and
        // can leave a stacked matrix with up to twice its size allocated.
        Some(Self {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            bits: first.bits,
            qs: concat_in_huge_pages(&parts.iter().map(|p| p.qs.as_slice()).collect::<Vec<_>>()),
            d: concat_in_huge_pages(&parts.iter().map(|p| p.d.as_slice()).collect::<Vec<_>>()),
            offset,
            table: first.table,
        })
    }
}

/// The values of raw IQ4_NL, IQ4_XS or MXFP4 blocks as ggml computes them, with f32 scales:
/// for a tensor whose scales the kernels' f16 cannot hold (MXFP4's reach 2¹²⁷), and as the
/// tests' reference. Other formats give `None`.
pub fn dequantize_table_format(format: GgufBlockFormat, raw: &[u8]) -> Option<Vec<f32>> {
    let table = match format {
        GgufBlockFormat::Mxfp4 => &MXFP4_TABLE,
        GgufBlockFormat::Iq4Nl | GgufBlockFormat::Iq4Xs => &IQ4_NL_TABLE,
        _ => return None,
    };
    let mut out = Vec::with_capacity(raw.len() / format.block_bytes() * format.block_values());
    let mut push_block = |d: f32, qs: &[u8]| {
        let value = |q: u8| d * (f32::from(table[usize::from(q)]) - 128.0);
        out.extend(qs.iter().map(|&q| value(q & 0x0f)));
        out.extend(qs.iter().map(|&q| value(q >> 4)));
    };
    for block in raw.chunks_exact(format.block_bytes()) {
        match format {
            GgufBlockFormat::Mxfp4 => push_block(mxfp4_scale(block[0]), &block[1..17]),
            GgufBlockFormat::Iq4Nl => push_block(f16::from_le_bytes([block[0], block[1]]).to_f32(), &block[2..18]),
            _ => {
                for sub in 0..SUPER_BLOCK / BLOCK {
                    push_block(iq4_xs_scale(block, sub), &block[8 + 16 * sub..][..16]);
                }
            }
        }
    }
    Some(out)
}

/// `n` activation vectors of `cols` values, each block quantized to int8.
#[derive(Debug, Default, Clone)]
pub struct QuantizedActivations {
    pub n: usize,
    pub cols: usize,
    /// n × cols int8 values, in [−127, 127]
    pub qs: Vec<i8>,
    /// n × blocks scales
    pub d: Vec<f32>,
    /// n × blocks: d · Σq, which multiplies a weight block's offset. Exact in f32 (an 11-bit
    /// scale times a sum of 13 bits) for the zero-point formats; rounded to f16 where the
    /// weights carry their own offset, as ggml's Q8_1 blocks store it, so those products match
    /// llama.cpp's and candle's.
    pub scaled_sums: Vec<f32>,
    pub scaled_sums_f16: Vec<f32>,
    /// For more than one token, on an x86 CPU with AVX2: the same activations four tokens to a
    /// group, for the prompt kernels of the 32-value formats.
    pub groups: TokenGroups,
    /// The same activations a super-block at a time, for the K-quants (filled only for them).
    pub super_blocks: SuperBlockActivations,
}

impl QuantizedActivations {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// The scaled sums that pair with `w`'s offsets, one a block.
    #[inline]
    pub fn sums_for(&self, w: &UqMatrix) -> &[f32] {
        match w.offset {
            Offset::Zero(_) => &self.scaled_sums,
            Offset::PerBlock(_) => &self.scaled_sums_f16,
        }
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
        self.scaled_sums_f16.resize(blocks, 0.0);
        // A prompt's tokens are quantized in parallel (a serial pass took 5% of a prefill).
        let nb = cols / BLOCK;
        let tasks = task_count(n, 8);
        let tokens_per_task = n.div_ceil(tasks);
        let (qs, d) = (DisjointWriter::new(&mut self.qs), DisjointWriter::new(&mut self.d));
        let (sums, sums_f16) =
            (DisjointWriter::new(&mut self.scaled_sums), DisjointWriter::new(&mut self.scaled_sums_f16));
        pool().run(tasks, &|task| {
            let tokens = task * tokens_per_task..((task + 1) * tokens_per_task).min(n);
            let (first, blocks) = (tokens.start * nb, tokens.len() * nb);
            // SAFETY: each task owns its tokens' values and blocks.
            unsafe {
                let x = &x[first * BLOCK..][..blocks * BLOCK];
                let out = QuantizedBlocks {
                    qs: qs.slice(first * BLOCK, blocks * BLOCK),
                    d: d.slice(first, blocks),
                    sums: sums.slice(first, blocks),
                    sums_f16: sums_f16.slice(first, blocks),
                };
                #[cfg(target_arch = "x86_64")]
                if super::simd_level() != super::SimdLevel::Portable {
                    // (every level but Portable has avx2, fma and f16c, checked when chosen)
                    return super::x86::avx2::quantize_blocks(x, out);
                }
                quantize_blocks(x, out)
            };
        });
        // Only the x86 tile kernels read them.
        if n > 1 && super::SimdLevel::Avx2.is_supported() {
            self.groups.fill(&self.qs, &self.d, &self.scaled_sums, &self.scaled_sums_f16, n, cols);
        } else {
            self.groups.clear();
        }
    }
}

/// Tokens a group of [`QuantizedActivations::groups`] holds.
pub const GROUP_TOKENS: usize = 4;
/// Blocks a chunk of [`TokenGroups`] holds.
pub const CHUNK_BLOCKS: usize = 4;
/// Values of a block that one lane of a dot product takes.
pub const QUAD: usize = 4;

/// Activations four tokens to a group, laid out so that one vector lane adds a block's four
/// products for one token: the lanes of a vector are [block][token], and a weight quad
/// broadcast to a block's four lanes meets four tokens' values. A block's sum for a token is
/// then one lane, with no reduction across lanes.
///
/// Per group and chunk of [`CHUNK_BLOCKS`] blocks: eight quads (quad q: values 4q..4q+3 of
/// each block) of 64 bytes each, [block][token][4 values]; the blocks' scales and scaled sums as
/// [block][token]. Blocks past the row's last and tokens past the last are zeros.
#[derive(Debug, Default, Clone)]
pub struct TokenGroups {
    pub values: Vec<i8>,
    pub d: Vec<f32>,
    pub sums: Vec<f32>,
    pub sums_f16: Vec<f32>,
    /// Chunks a group holds: the row's blocks over four, rounded up.
    pub chunks: usize,
}

/// Bytes of one quad of a chunk of [`TokenGroups::values`]: four blocks × four tokens.
pub const QUAD_BYTES: usize = CHUNK_BLOCKS * GROUP_TOKENS * QUAD;
/// Bytes a chunk of [`TokenGroups::values`] holds.
const GROUP_CHUNK_BYTES: usize = BLOCK / QUAD * QUAD_BYTES;
/// Scales a chunk of [`TokenGroups::d`] holds.
const CHUNK_SCALES: usize = CHUNK_BLOCKS * GROUP_TOKENS;

impl TokenGroups {
    fn clear(&mut self) {
        self.values.clear();
        self.d.clear();
        self.sums.clear();
        self.sums_f16.clear();
        self.chunks = 0;
    }

    /// The scaled sums that pair with `w`'s offsets (see [`QuantizedActivations::sums_for`]).
    #[inline]
    pub fn sums_for(&self, w: &UqMatrix) -> &[f32] {
        match w.offset {
            Offset::Zero(_) => &self.sums,
            Offset::PerBlock(_) => &self.sums_f16,
        }
    }

    /// Where block `b`'s quad 0 for group `g` starts in `values`; quad q is q · [`QUAD_BYTES`]
    /// further.
    #[inline]
    pub fn values_at(&self, g: usize, b: usize) -> usize {
        g * self.chunks * GROUP_CHUNK_BYTES + values_in_group(b)
    }

    /// Where block `b`'s scales for group `g` start in `d`, `sums` and `sums_f16`.
    #[inline]
    pub fn scales_at(&self, g: usize, b: usize) -> usize {
        g * self.chunks * CHUNK_SCALES + scales_in_group(b)
    }

    /// Lays out `n` tokens' quantized values `qs` and their blocks' `d`, `sums` and `sums_f16`.
    fn fill(&mut self, qs: &[i8], d: &[f32], sums: &[f32], sums_f16: &[f32], n: usize, cols: usize) {
        let nb = cols / BLOCK;
        let groups = n.div_ceil(GROUP_TOKENS);
        self.chunks = nb.div_ceil(CHUNK_BLOCKS);
        let group_values = self.chunks * GROUP_CHUNK_BYTES;
        let group_scales = self.chunks * CHUNK_SCALES;
        // Padding stays zero; every other value is overwritten below.
        self.values.clear();
        self.values.resize(groups * group_values, 0);
        for scales in [&mut self.d, &mut self.sums, &mut self.sums_f16] {
            scales.clear();
            scales.resize(groups * group_scales, 0.0);
        }
        let tasks = task_count(groups, 2);
        let groups_per_task = groups.div_ceil(tasks);
        let values = DisjointWriter::new(&mut self.values);
        let scales = [&mut self.d, &mut self.sums, &mut self.sums_f16].map(|s| DisjointWriter::new(s));
        let sources = [d, sums, sums_f16];
        pool().run(tasks, &|task| {
            for g in task * groups_per_task..((task + 1) * groups_per_task).min(groups) {
                // SAFETY: each task owns its groups' values and scales.
                let (out, mut outs) = unsafe {
                    (
                        values.slice(g * group_values, group_values),
                        [0, 1, 2].map(|i| scales[i].slice(g * group_scales, group_scales)),
                    )
                };
                for t in g * GROUP_TOKENS..((g + 1) * GROUP_TOKENS).min(n) {
                    let k = t % GROUP_TOKENS;
                    for (b, block) in qs[t * cols..][..cols].chunks_exact(BLOCK).enumerate() {
                        let at = values_in_group(b) + k * QUAD;
                        for (q, quad) in block.chunks_exact(QUAD).enumerate() {
                            out[at + q * QUAD_BYTES..][..QUAD].copy_from_slice(quad);
                        }
                        let at = scales_in_group(b) + k;
                        for (out, source) in outs.iter_mut().zip(sources) {
                            out[at] = source[t * nb + b];
                        }
                    }
                }
            }
        });
    }
}

/// Where block `b`'s quad 0 starts in a group's part of [`TokenGroups::values`].
#[inline]
fn values_in_group(b: usize) -> usize {
    b / CHUNK_BLOCKS * GROUP_CHUNK_BYTES + b % CHUNK_BLOCKS * QUAD * GROUP_TOKENS
}

/// Where block `b`'s scales start in a group's part of [`TokenGroups::d`].
#[inline]
fn scales_in_group(b: usize) -> usize {
    b / CHUNK_BLOCKS * CHUNK_SCALES + b % CHUNK_BLOCKS * GROUP_TOKENS
}

/// Where the quantization of a run of blocks goes: their parts of [`QuantizedActivations`]'
/// `qs`, `d`, `scaled_sums` and `scaled_sums_f16`.
pub(super) struct QuantizedBlocks<'a> {
    pub qs: &'a mut [i8],
    pub d: &'a mut [f32],
    pub sums: &'a mut [f32],
    pub sums_f16: &'a mut [f32],
}

/// The portable quantization: each block of 32 to int8 with its f16-rounded scale.
fn quantize_blocks(x: &[f32], out: QuantizedBlocks) {
    let QuantizedBlocks { qs, d, sums, sums_f16 } = out;
    for (b, (src, dst)) in x.chunks_exact(BLOCK).zip(qs.chunks_exact_mut(BLOCK)).enumerate() {
        let amax = super::ops::abs_max(src);
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in dst.iter_mut().zip(src) {
            let r = (v * inv).round() as i32;
            *q = r as i8;
            sum += r;
        }
        // The scale is rounded to f16 as ggml's Q8_0/Q8_1 blocks store it, so products match
        // llama.cpp's and candle's to the last bit of the scale.
        d[b] = f16::from_f32(scale).to_f32();
        sums[b] = d[b] * sum as f32;
        sums_f16[b] = f16::from_f32(scale * sum as f32).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_quantization_is_the_portable_one_to_the_bit() {
        if !super::super::SimdLevel::Avx2.is_supported() {
            return;
        }
        // Halves that round away from zero (±k.5 at scale 1), a block of zeros, tiny values,
        // and an irregular pattern.
        let ties: Vec<f32> = (0..32).map(|i| if i == 0 { 127.0 } else { (i as f32 - 16.0) * 7.5 + 0.5 }).collect();
        let irregular: Vec<f32> = (0..32 * 40).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let x: Vec<f32> =
            ties.iter().copied().chain([0.0; 32]).chain((0..32).map(|i| i as f32 * 1e-30)).chain(irregular).collect();
        let blocks = x.len() / BLOCK;
        let run = |avx2: bool| {
            let (mut qs, mut d, mut sums, mut sums_f16) =
                (vec![0i8; x.len()], vec![0f32; blocks], vec![0f32; blocks], vec![0f32; blocks]);
            let out = QuantizedBlocks { qs: &mut qs, d: &mut d, sums: &mut sums, sums_f16: &mut sums_f16 };
            if avx2 {
                // SAFETY: checked above that the CPU has the features.
                unsafe { super::super::x86::avx2::quantize_blocks(&x, out) }
            } else {
                quantize_blocks(&x, out)
            }
            (qs, d, sums, sums_f16)
        };
        let (portable, avx2) = (run(false), run(true));
        assert_eq!(portable.0, avx2.0, "int8 values");
        for (name, a, b) in
            [("scales", &portable.1, &avx2.1), ("sums", &portable.2, &avx2.2), ("f16 sums", &portable.3, &avx2.3)]
        {
            assert!(a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: {a:?} vs {b:?}");
        }
        assert!(portable.0[..32].iter().any(|&q| q % 2 != 0), "the tie block rounds to odd values too");
    }
}
