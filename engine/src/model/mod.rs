//! The transformer: embedding, `n_layers` blocks of RMSNorm → GQA attention → RMSNorm → SwiGLU,
//! and the output projection. Attention reads and writes the cache only through [`KvStore`].

pub mod config;
pub mod gguf;
pub mod safetensors;
pub mod weights;

use crate::error::{Error, Result};
use crate::kernels::attention::attend;
use crate::kernels::ops::{add_bias, add_in_place, rms_norm, swiglu, Rope};
use crate::kernels::quant::QuantizedActivations;
use crate::kv::{KvShape, KvStore};
use config::ModelConfig;
use weights::Weights;

/// Which positions' logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (what generation needs).
    Last,
    /// Every token's, `n × vocab` (perplexity, evaluation).
    All,
}

pub struct Model {
    pub config: ModelConfig,
    weights: Weights,
    rope: Rope,
}

impl Model {
    pub fn new(config: ModelConfig, weights: Weights) -> Self {
        let rope = Rope::new(
            config.head_dim,
            config.rope_theta,
            &config.rope_scaling,
            config.rope_layout,
            weights.rope_freq_factors.as_deref(),
        );
        Self { config, weights, rope }
    }

    /// Bytes of weights one decode step streams.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// The cache shape this model needs for sequences of up to `max_tokens`.
    pub fn kv_shape(&self, max_tokens: usize) -> KvShape {
        KvShape {
            n_layers: self.config.n_layers,
            n_kv_heads: self.config.n_kv_heads,
            head_dim: self.config.head_dim,
            max_tokens: max_tokens.min(self.config.context_tokens),
        }
    }

    /// Runs `tokens`, which follow the `kv.len_tokens()` tokens already cached, through the
    /// model; their K/V are appended to `kv`. Returns logits as asked (`vocab` per row).
    pub fn forward(&self, tokens: &[u32], kv: &mut dyn KvStore, want: Logits) -> Result<Vec<f32>> {
        // Run the whole pass on a pool thread: the kernels' parallel loops then split work
        // within the pool instead of paying a cross-thread hand-off each (~200 per token).
        rayon::scope(|_| self.forward_on_pool(tokens, kv, want))
    }

    fn forward_on_pool(&self, tokens: &[u32], kv: &mut dyn KvStore, want: Logits) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        let pos0 = kv.len_tokens();
        let limit = kv.shape().max_tokens;
        if pos0 + n > limit {
            return Err(Error::ContextOverflow { prompt_tokens: pos0 + n, context_tokens: limit });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::InvalidParameter(format!("token id {bad} is outside the vocabulary ({})", c.vocab_size)));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let (hidden, q_dim, kv_dim, inter) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let positions: Vec<usize> = (pos0..pos0 + n).collect();
        let (cos, sin) = self.rope.tables(&positions);

        let mut x = vec![0f32; n * hidden];
        for (row, &t) in x.chunks_exact_mut(hidden).zip(tokens) {
            self.weights.embedding.dequantize_row(t as usize, row);
        }
        let mut h = vec![0f32; n * hidden];
        let mut qkv = vec![0f32; n * (q_dim + 2 * kv_dim)];
        let (mut q, mut k, mut v) = (vec![0f32; n * q_dim], vec![0f32; n * kv_dim], vec![0f32; n * kv_dim]);
        let mut attn = vec![0f32; n * q_dim];
        let mut gate_up = vec![0f32; n * 2 * inter];
        let mut act = vec![0f32; n * inter];
        let mut scratch = QuantizedActivations::default();

        for (l, layer) in self.weights.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, c.rms_norm_eps, &mut h);
            layer.qkv.matmul(&h, n, &mut scratch, &mut qkv);
            if let Some(bias) = &layer.qkv_bias {
                add_bias(&mut qkv, bias);
            }
            for (t, row) in qkv.chunks_exact(q_dim + 2 * kv_dim).enumerate() {
                q[t * q_dim..][..q_dim].copy_from_slice(&row[..q_dim]);
                k[t * kv_dim..][..kv_dim].copy_from_slice(&row[q_dim..][..kv_dim]);
                v[t * kv_dim..][..kv_dim].copy_from_slice(&row[q_dim + kv_dim..][..kv_dim]);
            }
            self.rope.apply(&mut q, c.n_heads, &cos, &sin);
            self.rope.apply(&mut k, c.n_kv_heads, &cos, &sin);

            kv.append(l, &k, &v)?;
            let selection = kv.select(l, &q, &positions)?;
            {
                let view = kv.gather(l, &selection)?;
                attend(&q, &positions, c.n_heads, &view, &mut attn);
            }
            kv.observe(l, &selection);

            layer.attn_output.matmul(&attn, n, &mut scratch, &mut h);
            add_in_place(&mut x, &h);

            rms_norm(&x, &layer.ffn_norm, c.rms_norm_eps, &mut h);
            layer.gate_up.matmul(&h, n, &mut scratch, &mut gate_up);
            swiglu(&gate_up, inter, &mut act);
            layer.down.matmul(&act, n, &mut scratch, &mut h);
            add_in_place(&mut x, &h);
        }
        kv.commit(n);

        let rows = match want {
            Logits::Last => &x[(n - 1) * hidden..],
            Logits::All => &x[..],
        };
        let m = rows.len() / hidden;
        let mut normed = vec![0f32; rows.len()];
        rms_norm(rows, &self.weights.output_norm, c.rms_norm_eps, &mut normed);
        let mut logits = vec![0f32; m * c.vocab_size];
        self.weights.lm_head().matmul(&normed, m, &mut scratch, &mut logits);
        Ok(logits)
    }
}
