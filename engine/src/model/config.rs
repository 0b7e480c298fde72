//! Hyperparameters of a decoder-only transformer, read from GGUF metadata or a HF config.json.

use crate::error::{Error, Result};
use crate::kernels::rope::{RopeLayout, RopeScaling};

/// The model families the engine runs; each has a file of its own beside this one that says
/// how its blocks are assembled from the shared pieces (`layers.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
    Qwen3Moe,
    GptOss,
}

impl Architecture {
    /// Every family, by its GGUF name (what an unsupported file's error lists).
    pub const ALL: [Self; 7] =
        [Self::Llama, Self::Qwen2, Self::Qwen3, Self::Qwen3Moe, Self::Gemma3, Self::Phi3, Self::GptOss];

    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Self::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "qwen3" | "Qwen3ForCausalLM" => Ok(Self::Qwen3),
            "gemma3" | "Gemma3ForCausalLM" => Ok(Self::Gemma3),
            "phi3" | "Phi3ForCausalLM" => Ok(Self::Phi3),
            "qwen3moe" | "Qwen3MoeForCausalLM" => Ok(Self::Qwen3Moe),
            "gpt-oss" | "GptOssForCausalLM" => Ok(Self::GptOss),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
            Self::Qwen3Moe => "qwen3moe",
            Self::GptOss => "gpt-oss",
        }
    }

    /// The families' names, comma-separated.
    pub fn supported_names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

/// Layers that attend only to the last `tokens` positions (their own included), as Gemma 3
/// interleaves them with global ones; each kind of layer has its own rotary base.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub tokens: usize,
    /// Per layer: whether it is windowed.
    pub layers: Vec<bool>,
    /// The windowed layers' own rotary base, unscaled, where they have one (Gemma 3); `None`:
    /// they rotate as the global layers do.
    pub rope_theta: Option<f32>,
}

/// A mixture of experts' shape: how many experts a layer has, how many each token uses, and
/// each one's feed-forward width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShape {
    pub count: usize,
    pub used: usize,
    pub intermediate_size: usize,
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
    pub sliding_window: Option<SlidingWindow>,
    /// What the token embeddings are multiplied by (Gemma: √hidden); 1 for most families.
    pub embedding_scale: f32,
    /// What queries are multiplied by before attention's softmax, where a family departs from
    /// 1/√head_dim (Gemma 3 27B: 1/√(hidden/heads)).
    pub attention_scale: Option<f32>,
    /// Routed experts in place of the dense feed-forward network (qwen3moe, gpt-oss).
    pub experts: Option<ExpertShape>,
}

impl ModelConfig {
    /// The attention window of layer `layer`, if it has one.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        self.sliding_window.as_ref().filter(|w| w.layers.get(layer).copied().unwrap_or(false)).map(|w| w.tokens)
    }

    /// Every layer's window, in order.
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        (0..self.n_layers).map(|l| self.window_of(l)).collect()
    }

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
        if let Some(w) = &self.sliding_window {
            if w.tokens == 0 || w.layers.len() != self.n_layers {
                return bad("a sliding window needs a non-zero length and a pattern entry for every layer");
            }
        }
        Ok(())
    }
}
