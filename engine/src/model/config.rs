//! Hyperparameters of a decoder-only transformer, read from GGUF metadata or a HF config.json.

use crate::error::{Error, Result};

/// The model families the engine runs. Both are "llama-shaped"; qwen2 adds q/k/v biases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Self::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs (2i, 2i+1): llama.cpp's GGUF llama, whose q/k rows are permuted at conversion.
    Interleaved,
    /// Pairs (i, i + d/2): Hugging Face checkpoints and GGUF qwen2.
    Halves,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by a constant factor.
    Linear {
        factor: f32,
    },
    /// Llama 3.1's per-frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context_tokens: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_tokens: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_layout: RopeLayout,
    pub rope_scaling: RopeScaling,
}

impl ModelConfig {
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The cache shape for sequences of up to `max_tokens`.
    pub fn kv_shape(&self, max_tokens: usize) -> crate::kv::KvShape {
        crate::kv::KvShape {
            n_layers: self.n_layers,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            max_tokens: max_tokens.min(self.context_tokens),
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Bytes of f16 K and V that one token occupies across all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.kv_dim() * std::mem::size_of::<half::f16>()
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Metadata(what.to_string()));
        if self.hidden_size == 0 || self.n_layers == 0 || self.n_heads == 0 || self.vocab_size == 0 {
            return bad("hidden size, layer count, head count and vocabulary must be non-zero");
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("head count must be a multiple of the KV head count");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head dimension must be even and non-zero");
        }
        if self.context_tokens == 0 {
            return bad("context length must be non-zero");
        }
        Ok(())
    }
}
