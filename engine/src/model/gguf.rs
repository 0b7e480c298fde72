//! Reading a model from a GGUF file (llama.cpp's format): the header by [`gguf_header`], the
//! tensors into the kernels' layouts, or dequantized by candle where the kernels have none.

use super::config::{Architecture, ExpertShape, ModelConfig};
use super::gguf_header::{self, GgufHeader, TensorInfo, TensorType};
use super::layers::{Activation, Block, Experts, FeedForward, Mlp, SelfAttention};
use super::weights::Weights;
use super::{gemma3, gpt_oss, llama, phi3, qwen2, qwen3, qwen3moe};
use crate::error::{Error, Result};
use crate::kernels::matrix::{DenseMatrix, HalfMatrix, HalfValues, Matrix};
use crate::kernels::quant::{dequantize_table_format, GgufBlockFormat};
use crate::kernels::rope::{RopeLayout, RopeScaling};
use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::Device;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

pub type Metadata = HashMap<String, Value>;

/// Whether the file starts with GGUF's magic bytes.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

pub struct GgufModel {
    pub config: ModelConfig,
    pub weights: Weights,
}

/// A GGUF file whose header is read: metadata and configuration, tensors still on disk.
pub struct GgufFile {
    reader: Reader,
    config: ModelConfig,
}

/// Header arrays only the tokenizer reads: a 150K vocabulary keeps tens of MB in them.
const VOCABULARY_KEYS: [&str; 4] =
    ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"];

/// A GGUF file's header and its tensors, read one by one as a family's loader asks for them.
pub(super) struct Reader {
    path: PathBuf,
    file: File,
    header: GgufHeader,
}

impl Reader {
    pub(super) fn bad(&self, reason: impl Into<String>) -> Error {
        Error::BadModelFile { path: self.path.clone(), reason: reason.into() }
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensors.get(name).ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// Tensor `name`'s type, shape and bytes.
    fn tensor(&mut self, name: &str) -> Result<(TensorType, Vec<usize>, Vec<u8>)> {
        let info = self.info(name)?;
        let (kind, dims, offset) = (info.kind, info.dims.clone(), info.offset_bytes);
        let raw = self.bytes_at(offset, info.size_bytes)?;
        Ok((kind, dims, raw))
    }

    /// `len` bytes of the file from `offset`.
    fn bytes_at(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut raw = vec![0u8; len];
        self.file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.file.read_exact(&mut raw))
            .map_err(|source| Error::ModelIo { path: self.path.clone(), source })?;
        Ok(raw)
    }

    pub(super) fn has_tensor(&self, name: &str) -> bool {
        self.header.tensors.contains_key(name)
    }

    pub(super) fn matrix(&mut self, name: &str) -> Result<Matrix> {
        let info = self.info(name)?;
        let (kind, offset, len) = (info.kind, info.offset_bytes, info.size_bytes);
        let &[rows, cols] = info.dims.as_slice() else {
            return Err(self.bad(format!("tensor '{name}' is not a matrix")));
        };
        self.matrix_at(name, kind, (offset, len), rows, cols)
    }

    /// A `rows × cols` matrix of tensor `name`'s type from the file's `len` bytes at `offset`:
    /// the block formats read into the kernels' layout a little at a time, so that loading holds
    /// no second copy of a tensor; the rest from the bytes whole ([`Reader::matrix_of`]).
    fn matrix_at(
        &mut self,
        name: &str,
        kind: TensorType,
        (offset, len): (u64, usize),
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        if let Some(format) = block_format(kind) {
            self.file
                .seek(SeekFrom::Start(offset))
                .map_err(|source| Error::ModelIo { path: self.path.clone(), source })?;
            let file = &mut self.file;
            let read = Matrix::read_gguf_blocks(format, rows, cols, |buf| file.read_exact(buf))
                .map_err(|source| Error::ModelIo { path: self.path.clone(), source })?;
            if let Some(w) = read {
                return Ok(w);
            }
        }
        let raw = self.bytes_at(offset, len)?;
        self.matrix_of(name, kind, &raw, rows, cols)
    }

    /// A `rows × cols` matrix of tensor `name`'s type from its bytes `raw`: in the kernels'
    /// layout, 16-bit floats as they are, or dense f32 (correct, slower) for the rest.
    fn matrix_of(&self, name: &str, kind: TensorType, raw: &[u8], rows: usize, cols: usize) -> Result<Matrix> {
        let halves = || raw.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let half = match kind {
            TensorType::F16 => Some(HalfValues::F16(halves().map(half::f16::from_bits).collect())),
            TensorType::Bf16 => Some(HalfValues::Bf16(halves().map(half::bf16::from_bits).collect())),
            _ => None,
        };
        if let Some(w) = half {
            return Ok(Matrix::Half(HalfMatrix { rows, cols, w }));
        }
        // The header checked the bytes against the shape, so a refusal here is a scale the
        // kernels' f16 cannot hold (MXFP4's), and that matrix runs dense.
        if let Some(w) = block_format(kind).and_then(|format| Matrix::from_gguf_blocks(format, raw, rows, cols)) {
            return Ok(w);
        }
        let w = self.dequantize(name, kind, raw, vec![rows, cols])?;
        Ok(Matrix::Dense(DenseMatrix { rows, cols, w }))
    }

    /// Tensor `name`'s values (`dims`, outermost first) from its bytes.
    fn dequantize(&self, name: &str, kind: TensorType, raw: &[u8], dims: Vec<usize>) -> Result<Vec<f32>> {
        if let Some(values) = block_format(kind).and_then(|format| dequantize_table_format(format, raw)) {
            return Ok(values);
        }
        let dtype = match kind {
            TensorType::F32 => GgmlDType::F32,
            TensorType::F16 => GgmlDType::F16,
            TensorType::Bf16 => GgmlDType::BF16,
            TensorType::Q4_0 => GgmlDType::Q4_0,
            TensorType::Q4_1 => GgmlDType::Q4_1,
            TensorType::Q5_0 => GgmlDType::Q5_0,
            TensorType::Q5_1 => GgmlDType::Q5_1,
            TensorType::Q8_0 => GgmlDType::Q8_0,
            TensorType::Q8_1 => GgmlDType::Q8_1,
            TensorType::Q2K => GgmlDType::Q2K,
            TensorType::Q3K => GgmlDType::Q3K,
            TensorType::Q4K => GgmlDType::Q4K,
            TensorType::Q5K => GgmlDType::Q5K,
            TensorType::Q6K => GgmlDType::Q6K,
            TensorType::Q8K => GgmlDType::Q8K,
            TensorType::Iq4Nl | TensorType::Iq4Xs | TensorType::Mxfp4 => unreachable!("dequantized above"),
            TensorType::Other(format) => {
                return Err(self.bad(format!("tensor '{name}' is stored as {format}, which Hillside does not read yet")))
            }
        };
        let t = qtensor_from_ggml(dtype, raw, dims, &Device::Cpu)?;
        Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
    }

    pub(super) fn vector(&mut self, name: &str) -> Result<Vec<f32>> {
        let (kind, dims, raw) = self.tensor(name)?;
        self.dequantize(name, kind, &raw, dims)
    }

    pub(super) fn optional_vector(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.vector(name) {
            Err(Error::MissingTensor(_)) => Ok(None),
            other => other.map(Some),
        }
    }

    pub(super) fn meta(&self, key: &str) -> Option<&Value> {
        self.header.metadata.get(key)
    }

    pub(super) fn meta_usize(&self, key: &str) -> Result<usize> {
        self.optional_usize(key)?.ok_or_else(|| Error::Metadata(format!("missing key '{key}'")))
    }

    pub(super) fn optional_usize(&self, key: &str) -> Result<Option<usize>> {
        self.meta(key)
            .map(|v| v.to_u64().or_else(|_| v.to_u32().map(u64::from)).map(|x| x as usize))
            .transpose()
            .map_err(|e| Error::Metadata(format!("'{key}': {e}")))
    }

    /// The routed experts' shape from the file's `expert_*` keys (the feed-forward width where
    /// it gives no expert width of its own).
    pub(super) fn expert_shape(&self, arch: &str, c: &ModelConfig) -> Result<ExpertShape> {
        let key = |k: &str| format!("{arch}.{k}");
        let count = self.meta_usize(&key("expert_count"))?;
        let used = self.meta_usize(&key("expert_used_count"))?;
        if used == 0 || used > count {
            return Err(Error::Metadata(format!("{used} of {count} experts used per token")));
        }
        let intermediate_size = self.optional_usize(&key("expert_feed_forward_length"))?.unwrap_or(c.intermediate_size);
        Ok(ExpertShape { count, used, intermediate_size })
    }

    pub(super) fn optional_f32(&self, key: &str) -> Result<Option<f32>> {
        self.meta(key).map(|v| v.to_f32()).transpose().map_err(|e| Error::Metadata(format!("'{key}': {e}")))
    }

    /// Layer `i`'s self-attention: separate q, k and v projections stacked into one, with the
    /// biases and per-head norms the family has, rotated by the model's rope number `rope`.
    pub(super) fn attention(&mut self, i: usize, biases: bool, head_norms: bool, rope: usize) -> Result<SelfAttention> {
        let p = |name: &str| format!("blk.{i}.{name}");
        let (q, k, v) =
            (self.matrix(&p("attn_q.weight"))?, self.matrix(&p("attn_k.weight"))?, self.matrix(&p("attn_v.weight"))?);
        let qkv_bias = if biases {
            let mut bias = self.vector(&p("attn_q.bias"))?;
            bias.extend(self.vector(&p("attn_k.bias"))?);
            bias.extend(self.vector(&p("attn_v.bias"))?);
            Some(bias)
        } else {
            None
        };
        let (q_norm, k_norm) = if head_norms {
            (Some(self.vector(&p("attn_q_norm.weight"))?), Some(self.vector(&p("attn_k_norm.weight"))?))
        } else {
            (None, None)
        };
        Ok(SelfAttention {
            qkv: Matrix::stack(&[&q, &k, &v])
                .map_err(|e| self.bad(format!("layer {i}'s attn_q, attn_k and attn_v: {e}")))?,
            qkv_bias,
            q_norm,
            k_norm,
            output: self.matrix(&p("attn_output.weight"))?,
            output_bias: None,
            sinks: None,
            rope,
        })
    }

    /// Layer `i`'s self-attention from one fused q/k/v projection (`attn_qkv`, as phi3 files
    /// have it), or from separate ones where the file has those.
    pub(super) fn fused_attention(&mut self, i: usize, rope: usize) -> Result<SelfAttention> {
        let name = format!("blk.{i}.attn_qkv.weight");
        if !self.has_tensor(&name) {
            return self.attention(i, false, false, rope);
        }
        Ok(SelfAttention {
            qkv: self.matrix(&name)?,
            qkv_bias: None,
            q_norm: None,
            k_norm: None,
            output: self.matrix(&format!("blk.{i}.attn_output.weight"))?,
            output_bias: None,
            sinks: None,
            rope,
        })
    }

    /// Layer `i`'s gated feed-forward network from one fused projection whose first half is
    /// the gate and second half the up projection (`ffn_up`, `2·intermediate` rows: phi3).
    pub(super) fn fused_feed_forward(&mut self, i: usize, activation: Activation) -> Result<FeedForward> {
        Ok(FeedForward {
            gate_up: self.matrix(&format!("blk.{i}.ffn_up.weight"))?,
            down: self.matrix(&format!("blk.{i}.ffn_down.weight"))?,
            activation,
            gate_up_bias: None,
            down_bias: None,
        })
    }

    /// Layer `i`'s routed experts: the router, and each expert's slice of the stacked gate, up
    /// and down tensors (`ffn_gate_exps`: experts × width × hidden).
    pub(super) fn experts(
        &mut self,
        i: usize,
        used: usize,
        normalize: bool,
        activation: Activation,
    ) -> Result<Experts> {
        let p = |name: &str| format!("blk.{i}.{name}");
        let router = self.matrix(&p("ffn_gate_inp.weight"))?;
        let gates = self.expert_matrices(&p("ffn_gate_exps.weight"))?;
        let ups = self.expert_matrices(&p("ffn_up_exps.weight"))?;
        let downs = self.expert_matrices(&p("ffn_down_exps.weight"))?;
        if gates.len() != ups.len() || gates.len() != downs.len() {
            return Err(self.bad(format!("layer {i}'s expert tensors hold different numbers of experts")));
        }
        let mut experts = Vec::with_capacity(gates.len());
        // Each expert's gate and up go as soon as they are stacked: holding them all until the
        // layer is done would keep the layer's gates and ups twice over while it loads.
        for (x, ((gate, up), down)) in gates.into_iter().zip(ups).zip(downs).enumerate() {
            let gate_up = Matrix::stack(&[&gate, &up])
                .map_err(|e| self.bad(format!("layer {i}'s expert {x} gate and up: {e}")))?;
            experts.push(FeedForward { gate_up, down, activation, gate_up_bias: None, down_bias: None });
        }
        Ok(Experts { router, router_bias: None, experts, used, normalize })
    }

    /// The biases of a stacked expert tensor (`experts × len`, one row per expert), where the
    /// file has them (gpt-oss).
    pub(super) fn expert_biases(&mut self, name: &str) -> Result<Option<Vec<Vec<f32>>>> {
        if !self.has_tensor(name) {
            return Ok(None);
        }
        let (kind, dims, raw) = self.tensor(name)?;
        let &[_, len] = dims.as_slice() else {
            return Err(self.bad(format!("tensor '{name}' is not one bias per expert")));
        };
        let values = self.dequantize(name, kind, &raw, dims.clone())?;
        Ok(Some(values.chunks_exact(len.max(1)).map(<[f32]>::to_vec).collect()))
    }

    /// The experts of a stacked expert tensor (`experts × rows × cols`), each a matrix of its
    /// own over its slice of the file's blocks.
    fn expert_matrices(&mut self, name: &str) -> Result<Vec<Matrix>> {
        let info = self.info(name)?;
        let (kind, offset, len) = (info.kind, info.offset_bytes, info.size_bytes);
        let &[count, rows, cols] = info.dims.as_slice() else {
            return Err(self.bad(format!("tensor '{name}' is not a stack of matrices")));
        };
        if count == 0 {
            return Err(self.bad(format!("tensor '{name}' holds no experts")));
        }
        let each = len / count;
        (0..count).map(|e| self.matrix_at(name, kind, (offset + (e * each) as u64, each), rows, cols)).collect()
    }

    /// Layer `i`'s gated feed-forward network from separate gate and up projections.
    pub(super) fn feed_forward(&mut self, i: usize, activation: Activation) -> Result<FeedForward> {
        let p = |name: &str| format!("blk.{i}.{name}");
        let (gate, up) = (self.matrix(&p("ffn_gate.weight"))?, self.matrix(&p("ffn_up.weight"))?);
        Ok(FeedForward {
            gate_up: Matrix::stack(&[&gate, &up])
                .map_err(|e| self.bad(format!("layer {i}'s ffn_gate and ffn_up: {e}")))?,
            down: self.matrix(&p("ffn_down.weight"))?,
            activation,
            gate_up_bias: None,
            down_bias: None,
        })
    }

    /// The pre-norm block most families share: norm, attention, norm, feed-forward.
    pub(super) fn pre_norm_block(&mut self, i: usize, attention: SelfAttention, mlp: Mlp) -> Result<Block> {
        Ok(Block {
            attn_norm: self.vector(&format!("blk.{i}.attn_norm.weight"))?,
            attention,
            attn_post_norm: None,
            ffn_norm: self.vector(&format!("blk.{i}.ffn_norm.weight"))?,
            mlp,
            ffn_post_norm: None,
        })
    }
}

/// The kernels' block format for a GGUF tensor type, where they have one.
fn block_format(kind: TensorType) -> Option<GgufBlockFormat> {
    match kind {
        TensorType::Q4_0 => Some(GgufBlockFormat::Q4_0),
        TensorType::Q4_1 => Some(GgufBlockFormat::Q4_1),
        TensorType::Q5_0 => Some(GgufBlockFormat::Q5_0),
        TensorType::Q5_1 => Some(GgufBlockFormat::Q5_1),
        TensorType::Q8_0 => Some(GgufBlockFormat::Q8_0),
        TensorType::Q4K => Some(GgufBlockFormat::Q4K),
        TensorType::Q5K => Some(GgufBlockFormat::Q5K),
        TensorType::Q6K => Some(GgufBlockFormat::Q6K),
        TensorType::Iq4Nl => Some(GgufBlockFormat::Iq4Nl),
        TensorType::Iq4Xs => Some(GgufBlockFormat::Iq4Xs),
        TensorType::Mxfp4 => Some(GgufBlockFormat::Mxfp4),
        _ => None,
    }
}

/// Reads the whole model: header, then tensors.
pub fn load(path: &Path) -> Result<GgufModel> {
    open(path)?.load_weights()
}

impl GgufFile {
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn metadata(&self) -> &Metadata {
        &self.reader.header.metadata
    }

    /// Frees the vocabulary arrays (once the tokenizer is built, before the weights come in,
    /// so they do not add to the load's peak memory).
    pub fn drop_vocabulary(&mut self) {
        for key in VOCABULARY_KEYS {
            self.reader.header.metadata.remove(key);
        }
    }

    /// Reads the tensors: the model, with the configuration read by `open`.
    pub fn load_weights(self) -> Result<GgufModel> {
        let weights = read_weights(self.reader, &self.config)?;
        Ok(GgufModel { config: self.config, weights })
    }
}

/// Reads the header and the model configuration.
pub fn open(path: &Path) -> Result<GgufFile> {
    let io_err = |source| Error::ModelIo { path: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(io_err)?;
    let header = gguf_header::read(&mut BufReader::new(&mut file)).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::BadModelFile { path: path.to_path_buf(), reason: e.to_string() },
        _ => io_err(e),
    })?;
    let r = Reader { path: path.to_path_buf(), file, header };

    let arch_name = r
        .meta("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or_else(|| Error::Metadata("missing 'general.architecture'".into()))?;
    let architecture = Architecture::from_name(&arch_name)?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let hidden_size = r.meta_usize(&key("embedding_length"))?;
    let n_heads = r.meta_usize(&key("attention.head_count"))?;
    let head_dim = match r.optional_usize(&key("attention.key_length"))? {
        Some(d) => d,
        None => hidden_size / n_heads.max(1),
    };
    let vocab_size = match r.optional_usize(&key("vocab_size"))? {
        Some(v) => v,
        None => r.meta("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()).map_or(0, Vec::len),
    };
    let rope_scaling = match r.meta(&key("rope.scaling.type")).and_then(|v| v.to_string().ok()).map(String::as_str) {
        Some("linear") => RopeScaling::Linear { factor: r.optional_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0) },
        // llama.cpp's defaults where the file gives none.
        Some("yarn") => RopeScaling::Yarn {
            factor: r.optional_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            original_context_tokens: r.meta_usize(&key("rope.scaling.original_context_length"))?,
            beta_fast: r.optional_f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
            beta_slow: r.optional_f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
            attn_factor: r.optional_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0),
        },
        // LongRoPE's factors are tensors the family reads (phi3).
        Some("none" | "longrope") | None => RopeScaling::None,
        Some(other) => return Err(Error::Metadata(format!("unsupported rope scaling '{other}'"))),
    };
    let mut config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: r.meta_usize(&key("feed_forward_length"))?,
        n_layers: r.meta_usize(&key("block_count"))?,
        n_heads,
        n_kv_heads: r.optional_usize(&key("attention.head_count_kv"))?.unwrap_or(n_heads),
        head_dim,
        vocab_size,
        context_tokens: r.meta_usize(&key("context_length"))?,
        rms_norm_eps: r.optional_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        rope_theta: r.optional_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
        // llama.cpp permutes llama's q/k rows to pair dimensions (2i, 2i+1); the others keep HF's halves.
        rope_layout: RopeLayout::Halves,
        rope_scaling,
        sliding_window: None,
        embedding_scale: 1.0,
        attention_scale: None,
        experts: None,
    };
    if let Some(rotated) = r.optional_usize(&key("rope.dimension_count"))? {
        if rotated != head_dim {
            return Err(Error::Metadata(format!(
                "rotary embeddings over {rotated} of each head's {head_dim} dimensions are not supported yet"
            )));
        }
    }
    match architecture {
        Architecture::Llama => llama::configure(&r, &arch_name, &mut config)?,
        Architecture::Qwen2 | Architecture::Qwen3 => {}
        Architecture::Phi3 => phi3::configure(&r, &arch_name, &mut config)?,
        Architecture::Qwen3Moe => qwen3moe::configure(&r, &arch_name, &mut config)?,
        Architecture::GptOss => gpt_oss::configure(&r, &arch_name, &mut config)?,
        Architecture::Gemma3 => gemma3::configure(&r, &arch_name, &mut config)?,
    }
    config.validate()?;
    Ok(GgufFile { reader: r, config })
}

fn read_weights(mut r: Reader, config: &ModelConfig) -> Result<Weights> {
    // The largest tensors first: one in a format without a kernel of its own is read whole
    // beside its converted copy, and that is cheapest before everything else is resident.
    let embedding = r.matrix("token_embd.weight")?;
    let lm_head = match r.matrix("output.weight") {
        Err(Error::MissingTensor(_)) => None,
        other => Some(other?),
    };
    let mut blocks = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        blocks.push(match config.architecture {
            Architecture::Llama => llama::block(&mut r, i)?,
            Architecture::Qwen2 => qwen2::block(&mut r, i)?,
            Architecture::Qwen3 => qwen3::block(&mut r, i)?,
            Architecture::Gemma3 => gemma3::block(&mut r, i, config)?,
            Architecture::Phi3 => phi3::block(&mut r, i)?,
            Architecture::Qwen3Moe => qwen3moe::block(&mut r, i, config)?,
            Architecture::GptOss => gpt_oss::block(&mut r, i, config)?,
        });
    }
    let weights = Weights {
        embedding,
        blocks,
        output_norm: r.vector("output_norm.weight")?,
        lm_head,
        rope_freq_factors: match config.architecture {
            Architecture::Phi3 => phi3::rope_factors(&mut r, config)?,
            _ => r.optional_vector("rope_freqs.weight")?,
        },
    };
    weights.validate(config).map_err(|e| r.bad(e.to_string()))?;
    Ok(weights)
}
