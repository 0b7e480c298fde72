//! Reading a model from a GGUF file (llama.cpp's format) with candle's GGUF parser.

use super::config::{Architecture, ModelConfig, RopeLayout, RopeScaling};
use super::weights::{LayerWeights, Weights};
use crate::error::{Error, Result};
use crate::kernels::matrix::{DenseMatrix, Matrix};
use crate::kernels::quant::{GgufBlockFormat, UqMatrix};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
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

struct Reader {
    path: PathBuf,
    file: BufReader<File>,
    content: Content,
}

impl Reader {
    fn bad(&self, reason: impl Into<String>) -> Error {
        Error::BadModelFile { path: self.path.clone(), reason: reason.into() }
    }

    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(Error::MissingTensor(name.to_string()));
        }
        self.content
            .tensor(&mut self.file, name, &Device::Cpu)
            .map_err(|e| Error::BadModelFile { path: self.path.clone(), reason: format!("tensor '{name}': {e}") })
    }

    fn matrix(&mut self, name: &str) -> Result<Matrix> {
        let t = self.qtensor(name)?;
        let (rows, cols) = t.shape().dims2().map_err(|_| self.bad(format!("tensor '{name}' is not a matrix")))?;
        let format = match t.dtype() {
            GgmlDType::Q4_0 => Some(GgufBlockFormat::Q4_0),
            GgmlDType::Q4_1 => Some(GgufBlockFormat::Q4_1),
            GgmlDType::Q5_0 => Some(GgufBlockFormat::Q5_0),
            GgmlDType::Q5_1 => Some(GgufBlockFormat::Q5_1),
            GgmlDType::Q8_0 => Some(GgufBlockFormat::Q8_0),
            GgmlDType::Q4K => Some(GgufBlockFormat::Q4K),
            GgmlDType::Q5K => Some(GgufBlockFormat::Q5K),
            GgmlDType::Q6K => Some(GgufBlockFormat::Q6K),
            _ => None,
        };
        if let Some(format) = format {
            let raw = t.data()?;
            return UqMatrix::from_gguf(format, &raw, rows, cols)
                .map(Matrix::Quantized)
                .ok_or_else(|| self.bad(format!("tensor '{name}' has inconsistent block data")));
        }
        // Formats without a dedicated kernel run dense (correct, slower).
        let w = t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Matrix::Dense(DenseMatrix { rows, cols, w }))
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>> {
        let t = self.qtensor(name)?;
        Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
    }

    fn optional_vector(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.vector(name) {
            Err(Error::MissingTensor(_)) => Ok(None),
            other => other.map(Some),
        }
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn meta_usize(&self, key: &str) -> Result<usize> {
        self.optional_usize(key)?.ok_or_else(|| Error::Metadata(format!("missing key '{key}'")))
    }

    fn optional_usize(&self, key: &str) -> Result<Option<usize>> {
        self.meta(key)
            .map(|v| v.to_u64().or_else(|_| v.to_u32().map(u64::from)).map(|x| x as usize))
            .transpose()
            .map_err(|e| Error::Metadata(format!("'{key}': {e}")))
    }

    fn optional_f32(&self, key: &str) -> Result<Option<f32>> {
        self.meta(key).map(|v| v.to_f32()).transpose().map_err(|e| Error::Metadata(format!("'{key}': {e}")))
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
        &self.reader.content.metadata
    }

    /// Frees the vocabulary arrays (once the tokenizer is built, before the weights come in,
    /// so they do not add to the load's peak memory).
    pub fn drop_vocabulary(&mut self) {
        for key in VOCABULARY_KEYS {
            self.reader.content.metadata.remove(key);
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
    let file = File::open(path).map_err(io_err)?;
    if !is_gguf(path) {
        return Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: "not a GGUF file (the first bytes are not 'GGUF')".into(),
        });
    }
    let mut file = BufReader::new(file);
    file.rewind().map_err(io_err)?;
    let content = Content::read(&mut file)
        .map_err(|e| Error::BadModelFile { path: path.to_path_buf(), reason: format!("unreadable header: {e}") })?;
    let r = Reader { path: path.to_path_buf(), file, content };

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
        _ => RopeScaling::None,
    };
    let config = ModelConfig {
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
        // llama.cpp permutes llama's q/k rows to pair dimensions (2i, 2i+1); qwen2 keeps HF's halves.
        rope_layout: match architecture {
            Architecture::Llama => RopeLayout::Interleaved,
            Architecture::Qwen2 => RopeLayout::Halves,
        },
        rope_scaling,
    };
    config.validate()?;
    Ok(GgufFile { reader: r, config })
}

fn read_weights(mut r: Reader, config: &ModelConfig) -> Result<Weights> {
    let architecture = config.architecture;
    // The largest tensors first: loading holds one tensor's file bytes beside its repacked
    // copy, and that is cheapest before everything else is resident.
    let embedding = r.matrix("token_embd.weight")?;
    let lm_head = match r.matrix("output.weight") {
        Err(Error::MissingTensor(_)) => None,
        other => Some(other?),
    };
    let mut layers = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let p = |name: &str| format!("blk.{i}.{name}");
        let (q, k, v) =
            (r.matrix(&p("attn_q.weight"))?, r.matrix(&p("attn_k.weight"))?, r.matrix(&p("attn_v.weight"))?);
        let qkv_bias = match architecture {
            Architecture::Qwen2 => {
                let mut bias = r.vector(&p("attn_q.bias"))?;
                bias.extend(r.vector(&p("attn_k.bias"))?);
                bias.extend(r.vector(&p("attn_v.bias"))?);
                Some(bias)
            }
            Architecture::Llama => None,
        };
        let (gate, up) = (r.matrix(&p("ffn_gate.weight"))?, r.matrix(&p("ffn_up.weight"))?);
        layers.push(LayerWeights {
            attn_norm: r.vector(&p("attn_norm.weight"))?,
            qkv: Matrix::stack(&[&q, &k, &v])
                .map_err(|e| r.bad(format!("layer {i}'s attn_q, attn_k and attn_v: {e}")))?,
            qkv_bias,
            attn_output: r.matrix(&p("attn_output.weight"))?,
            ffn_norm: r.vector(&p("ffn_norm.weight"))?,
            gate_up: Matrix::stack(&[&gate, &up])
                .map_err(|e| r.bad(format!("layer {i}'s ffn_gate and ffn_up: {e}")))?,
            down: r.matrix(&p("ffn_down.weight"))?,
        });
    }
    let weights = Weights {
        embedding,
        layers,
        output_norm: r.vector("output_norm.weight")?,
        lm_head,
        rope_freq_factors: r.optional_vector("rope_freqs.weight")?,
    };
    weights.validate(config).map_err(|e| r.bad(e.to_string()))?;
    Ok(weights)
}
