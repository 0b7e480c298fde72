//! Reading a Hugging Face checkpoint: `config.json` plus one or more `.safetensors` files
//! (f32, f16 or bf16), with candle's safetensors reader.

use super::config::{Architecture, ModelConfig};
use super::layers::{Activation, Block, FeedForward, Mlp, SelfAttention, MAIN_ROPE};
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::kernels::matrix::{DenseMatrix, HalfMatrix, HalfValues, Matrix};
use crate::kernels::rope::{RopeLayout, RopeScaling};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::DType;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    attention_factor: Option<f32>,
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f32,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

impl HfConfig {
    fn to_model_config(&self) -> Result<ModelConfig> {
        let arch_name = self
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or_else(|| self.model_type.clone())
            .ok_or_else(|| Error::Metadata("config.json names no architecture".into()))?;
        let rope_scaling = match &self.rope_scaling {
            None => RopeScaling::None,
            Some(s) => match s.rope_type.as_deref() {
                Some("linear") => RopeScaling::Linear { factor: s.factor.unwrap_or(1.0) },
                Some("llama3") => RopeScaling::Llama3 {
                    factor: s.factor.unwrap_or(8.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_context_tokens: s.original_max_position_embeddings.unwrap_or(8192),
                },
                // transformers' defaults; its `attention_factor`, where given, replaces YaRN's
                // own 1 + 0.1·ln factor.
                Some("yarn") => {
                    let factor = s.factor.unwrap_or(1.0);
                    let own = if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 };
                    RopeScaling::Yarn {
                        factor,
                        original_context_tokens: s
                            .original_max_position_embeddings
                            .unwrap_or(self.max_position_embeddings),
                        beta_fast: s.beta_fast.unwrap_or(32.0),
                        beta_slow: s.beta_slow.unwrap_or(1.0),
                        attn_factor: s.attention_factor.map_or(1.0, |a| a / own),
                    }
                }
                other => return Err(Error::Metadata(format!("unsupported rope scaling {other:?}"))),
            },
        };
        let config = ModelConfig {
            architecture: Architecture::from_name(&arch_name)?,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            n_layers: self.num_hidden_layers,
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1)),
            vocab_size: self.vocab_size,
            context_tokens: self.max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta.unwrap_or(10_000.0),
            rope_layout: RopeLayout::Halves,
            rope_scaling,
            sliding_window: None,
            embedding_scale: 1.0,
            attention_scale: None,
            experts: None,
        };
        if !matches!(config.architecture, Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3) {
            return Err(Error::Metadata(format!(
                "{arch_name} checkpoints load from GGUF files only (llama.cpp's convert_hf_to_gguf.py makes one)"
            )));
        }
        config.validate()?;
        Ok(config)
    }
}

/// The `.safetensors` files of a checkpoint directory, or the single file given.
fn weight_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|source| Error::ModelIo { path: path.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: "no .safetensors files in the directory".into(),
        });
    }
    Ok(files)
}

/// The checkpoint directory: the path itself, or the folder holding the given file.
pub fn checkpoint_dir(path: &Path) -> &Path {
    if path.is_file() {
        path.parent().unwrap_or(Path::new("."))
    } else {
        path
    }
}

/// The checkpoint's configuration, from its config.json.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    read_hf_config(path)?.to_model_config()
}

fn read_hf_config(path: &Path) -> Result<HfConfig> {
    let config_path = checkpoint_dir(path).join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|source| Error::ModelIo { path: config_path.clone(), source })?;
    serde_json::from_str(&text).map_err(|e| Error::BadModelFile { path: config_path, reason: e.to_string() })
}

pub fn load(path: &Path) -> Result<(ModelConfig, Weights)> {
    let hf = read_hf_config(path)?;
    let config = hf.to_model_config()?;
    let files = weight_files(path)?;
    // SAFETY: candle memory-maps the files read-only; Hillside never writes model files while
    // they are loaded.
    let st = unsafe { MmapedSafetensors::multi(&files) }
        .map_err(|e| Error::BadModelFile { path: path.to_path_buf(), reason: e.to_string() })?;
    let tensor = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
        let t = st.load(name, &candle_core::Device::Cpu).map_err(|_| Error::MissingTensor(name.to_string()))?;
        let dims = t.dims().to_vec();
        Ok((dims, t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
    };
    // 16-bit floats stay as the checkpoint has them; other types become f32.
    let matrix = |name: &str| -> Result<Matrix> {
        let t = st.load(name, &candle_core::Device::Cpu).map_err(|_| Error::MissingTensor(name.to_string()))?;
        let &[rows, cols] = t.dims() else {
            return Err(Error::TensorShape { name: name.into(), expected: vec![0, 0], actual: t.dims().to_vec() });
        };
        let values = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::F16 => Matrix::Half(HalfMatrix { rows, cols, w: HalfValues::F16(values.to_vec1()?) }),
            DType::BF16 => Matrix::Half(HalfMatrix { rows, cols, w: HalfValues::Bf16(values.to_vec1()?) }),
            _ => Matrix::Dense(DenseMatrix { rows, cols, w: values.to_dtype(DType::F32)?.to_vec1()? }),
        })
    };
    let vector = |name: &str| tensor(name).map(|(_, v)| v);
    let bad = |reason: String| Error::BadModelFile { path: path.to_path_buf(), reason };

    let mut blocks = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let p = |name: &str| format!("model.layers.{i}.{name}");
        let attn = |proj: &str| matrix(&p(&format!("self_attn.{proj}_proj.weight")));
        let qkv_bias = match config.architecture {
            Architecture::Qwen2 => {
                let mut bias = vector(&p("self_attn.q_proj.bias"))?;
                bias.extend(vector(&p("self_attn.k_proj.bias"))?);
                bias.extend(vector(&p("self_attn.v_proj.bias"))?);
                Some(bias)
            }
            _ => None,
        };
        let (q_norm, k_norm) = match config.architecture {
            Architecture::Qwen3 => {
                (Some(vector(&p("self_attn.q_norm.weight"))?), Some(vector(&p("self_attn.k_norm.weight"))?))
            }
            _ => (None, None),
        };
        let (gate, up) = (matrix(&p("mlp.gate_proj.weight"))?, matrix(&p("mlp.up_proj.weight"))?);
        blocks.push(Block {
            attn_norm: vector(&p("input_layernorm.weight"))?,
            attention: SelfAttention {
                qkv: Matrix::stack(&[&attn("q")?, &attn("k")?, &attn("v")?])
                    .map_err(|e| bad(format!("layer {i}'s q, k and v projections: {e}")))?,
                qkv_bias,
                q_norm,
                k_norm,
                output: attn("o")?,
                output_bias: None,
                sinks: None,
                rope: MAIN_ROPE,
            },
            attn_post_norm: None,
            ffn_norm: vector(&p("post_attention_layernorm.weight"))?,
            mlp: Mlp::Dense(FeedForward {
                gate_up: Matrix::stack(&[&gate, &up])
                    .map_err(|e| bad(format!("layer {i}'s gate and up projections: {e}")))?,
                down: matrix(&p("mlp.down_proj.weight"))?,
                activation: Activation::Silu,
                gate_up_bias: None,
                down_bias: None,
            }),
            ffn_post_norm: None,
        });
    }
    let lm_head = if hf.tie_word_embeddings {
        None
    } else {
        match matrix("lm_head.weight") {
            Err(Error::MissingTensor(_)) => None,
            other => Some(other?),
        }
    };
    let weights = Weights {
        embedding: matrix("model.embed_tokens.weight")?,
        blocks,
        output_norm: vector("model.norm.weight")?,
        lm_head,
        rope_freq_factors: None,
    };
    weights.validate(&config).map_err(|e| bad(e.to_string()))?;
    Ok((config, weights))
}
