//! The pieces every family's blocks are assembled from, as llama.cpp's graph builders share
//! `build_norm`, `build_attn` and `build_ffn`: self-attention (fused q/k/v, optional biases,
//! optional per-head q/k norms, an optional window), the gated feed-forward kinds, and the block
//! that chains them between norms. A family file (`llama.rs`, `gemma3.rs`, …) only says which
//! pieces its layers have; the math lives here, once.

use crate::error::{Error, Result};
use crate::kernels::matrix::Matrix;
use crate::kernels::ops::{add_bias, geglu_in_place, rms_norm_in_place, swiglu_clamped_in_place, swiglu_in_place};
use crate::kernels::quant::QuantizedActivations;
use crate::kernels::rope::Rope;
use crate::model::config::ModelConfig;

/// The model's rotary embedding that most layers use ([`SelfAttention::rope`]).
pub const MAIN_ROPE: usize = 0;
/// The windowed layers' own rotary embedding, where their base differs (Gemma 3).
pub const WINDOW_ROPE: usize = 1;

/// The gate's nonlinearity in a gated feed-forward network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) · up (llama, qwen).
    Silu,
    /// gelu_tanh(gate) · up (gemma).
    GeluTanh,
    /// gpt-oss's SwiGLU, clamped: `g·σ(1.702·g) · (u + 1)`, with `g = min(gate, 7)` and `u` the
    /// up projection clamped to ±7.
    SiluClamped,
}

/// Self-attention's weights: the q, k and v projections stacked into one product, and what a
/// family adds around it.
pub struct SelfAttention {
    /// q, k and v projections stacked: `q_dim + 2·kv_dim` rows.
    pub qkv: Matrix,
    pub qkv_bias: Option<Vec<f32>>,
    /// RMS norms over each head of q and of k, before the rotation (qwen3, gemma3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub output: Matrix,
    pub output_bias: Option<Vec<f32>>,
    /// A learned logit per query head that joins every row's softmax with no value of its own,
    /// so a head can attend to nothing (gpt-oss).
    pub sinks: Option<Vec<f32>>,
    /// Which of the model's rotary embeddings this layer uses (windowed layers may have their own).
    pub rope: usize,
}

/// The gated feed-forward network: `down(act(gate(x)) · up(x))`.
pub struct FeedForward {
    /// gate and up projections stacked: `2·intermediate` rows.
    pub gate_up: Matrix,
    pub down: Matrix,
    pub activation: Activation,
    /// Biases of the gate and up rows (`2·intermediate`) and of the output (gpt-oss's experts).
    pub gate_up_bias: Option<Vec<f32>>,
    pub down_bias: Option<Vec<f32>>,
}

/// Routed experts (a mixture of experts): for each token the router's softmax picks `used` of
/// the experts, whose outputs are summed with those probabilities (renormalized to sum to 1
/// where the family does). Tokens are grouped by expert, so each chosen expert's weights are
/// read once for a whole batch, and a decode step reads only its token's experts.
pub struct Experts {
    /// `experts.len() × hidden`.
    pub router: Matrix,
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<FeedForward>,
    pub used: usize,
    pub normalize: bool,
}

/// What follows attention's norm in a block: one network, or routed experts.
pub enum Mlp {
    Dense(FeedForward),
    Experts(Experts),
}

/// One transformer block: `x += post_attn(attn(attn_norm(x)))`, then
/// `x += post_ffn(mlp(ffn_norm(x)))`, the post-norms only where the family has them (gemma3).
pub struct Block {
    pub attn_norm: Vec<f32>,
    pub attention: SelfAttention,
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub mlp: Mlp,
    pub ffn_post_norm: Option<Vec<f32>>,
}

/// Reusable buffers of one forward pass's feed-forward networks.
#[derive(Default)]
pub struct MlpBuffers {
    gate_up: Vec<f32>,
    router: Vec<f32>,
    rows: Vec<f32>,
    out: Vec<f32>,
}

/// Reusable buffers of one forward pass's q/k/v projection.
#[derive(Default)]
pub struct ProjectionBuffers {
    qkv: Vec<f32>,
}

impl SelfAttention {
    /// q, k and v of the `n` rows of `h` (the normed hidden states), with biases, head norms
    /// and rotary embedding applied (`cos`/`sin`: the layer's rope tables for these rows).
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &self,
        c: &ModelConfig,
        rope: &Rope,
        (cos, sin): (&[f32], &[f32]),
        h: &[f32],
        n: usize,
        scratch: &mut QuantizedActivations,
        buffers: &mut ProjectionBuffers,
        q: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) {
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
        let qkv = &mut buffers.qkv;
        qkv.resize(n * (q_dim + 2 * kv_dim), 0.0);
        self.qkv.matmul(h, n, scratch, qkv);
        if let Some(bias) = &self.qkv_bias {
            add_bias(qkv, bias);
        }
        for (t, row) in qkv.chunks_exact(q_dim + 2 * kv_dim).enumerate() {
            q[t * q_dim..][..q_dim].copy_from_slice(&row[..q_dim]);
            k[t * kv_dim..][..kv_dim].copy_from_slice(&row[q_dim..][..kv_dim]);
            v[t * kv_dim..][..kv_dim].copy_from_slice(&row[q_dim + kv_dim..][..kv_dim]);
        }
        // A norm whose weight is one head long runs over every head of every row.
        if let Some(norm) = &self.q_norm {
            rms_norm_in_place(q, norm, c.rms_norm_eps);
        }
        if let Some(norm) = &self.k_norm {
            rms_norm_in_place(k, norm, c.rms_norm_eps);
        }
        rope.apply(q, c.n_heads, cos, sin);
        rope.apply(k, c.n_kv_heads, cos, sin);
        if let Some(scale) = c.attention_scale {
            // The kernels divide by √head_dim; this makes the product the family's scale.
            let factor = scale * (c.head_dim as f32).sqrt();
            q.iter_mut().for_each(|x| *x *= factor);
        }
    }
}

impl Mlp {
    /// The network over the `n` rows of `h`, in place.
    pub fn forward(&self, h: &mut [f32], n: usize, scratch: &mut QuantizedActivations, buffers: &mut MlpBuffers) {
        match self {
            Self::Dense(ffn) => ffn.forward(h, n, scratch, &mut buffers.gate_up),
            Self::Experts(experts) => experts.forward(h, n, scratch, buffers),
        }
    }

    /// Bytes of weights one token's step reads (the chosen experts' only).
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            Self::Dense(ffn) => ffn.weight_bytes(),
            Self::Experts(e) => {
                let all: usize = e.experts.iter().map(FeedForward::weight_bytes).sum();
                e.router.weight_bytes() + all / e.experts.len().max(1) * e.used
            }
        }
    }
}

impl Experts {
    fn forward(&self, h: &mut [f32], n: usize, scratch: &mut QuantizedActivations, buffers: &mut MlpBuffers) {
        let (n_experts, hidden) = (self.experts.len(), self.router.cols());
        let MlpBuffers { gate_up, router, rows, out } = buffers;
        router.resize(n * n_experts, 0.0);
        self.router.matmul(h, n, scratch, router);
        if let Some(bias) = &self.router_bias {
            add_bias(router, bias);
        }
        // Each expert's tokens and their weights.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_experts];
        let mut order: Vec<usize> = Vec::with_capacity(n_experts);
        for (t, logits) in router.chunks_exact_mut(n_experts).enumerate() {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for l in logits.iter_mut() {
                *l = (*l - max).exp();
                sum += *l;
            }
            order.clear();
            order.extend(0..n_experts);
            order.select_nth_unstable_by(self.used - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
            let chosen = &order[..self.used];
            let total: f32 = if self.normalize { chosen.iter().map(|&e| logits[e]).sum() } else { sum };
            for &e in chosen {
                routed[e].push((t, logits[e] / total));
            }
        }
        out.clear();
        out.resize(n * hidden, 0.0);
        for (expert, tokens) in self.experts.iter().zip(&routed).filter(|(_, tokens)| !tokens.is_empty()) {
            rows.clear();
            rows.extend(tokens.iter().flat_map(|&(t, _)| &h[t * hidden..][..hidden]));
            expert.forward(rows, tokens.len(), scratch, gate_up);
            for (row, &(t, weight)) in rows.chunks_exact(hidden).zip(tokens) {
                out[t * hidden..][..hidden].iter_mut().zip(row).for_each(|(o, &x)| *o += weight * x);
            }
        }
        h[..n * hidden].copy_from_slice(out);
    }
}

impl FeedForward {
    pub fn weight_bytes(&self) -> usize {
        self.gate_up.weight_bytes() + self.down.weight_bytes()
    }

    /// `h = down(act(gate(h)) · up(h))` for the `n` rows of `h`; `gate_up` is a buffer.
    pub fn forward(&self, h: &mut [f32], n: usize, scratch: &mut QuantizedActivations, gate_up: &mut Vec<f32>) {
        let width = self.gate_up.rows() / 2;
        gate_up.resize(n * 2 * width, 0.0);
        self.gate_up.matmul(h, n, scratch, gate_up);
        if let Some(bias) = &self.gate_up_bias {
            add_bias(gate_up, bias);
        }
        let act = match self.activation {
            Activation::Silu => swiglu_in_place(gate_up, width),
            Activation::GeluTanh => geglu_in_place(gate_up, width),
            Activation::SiluClamped => swiglu_clamped_in_place(gate_up, width),
        };
        self.down.matmul(act, n, scratch, h);
        if let Some(bias) = &self.down_bias {
            add_bias(&mut h[..n * self.down.rows()], bias);
        }
    }
}

/// `x` through `norm` where the block has it (a post-norm), in place.
pub fn post_norm(norm: Option<&Vec<f32>>, x: &mut [f32], eps: f32) {
    if let Some(w) = norm {
        rms_norm_in_place(x, w, eps);
    }
}

impl Block {
    /// Checks every matrix and vector against the configuration, so a wrong file fails at
    /// load, not mid-forward.
    pub fn validate(&self, i: usize, c: &ModelConfig) -> Result<()> {
        let a = &self.attention;
        check(&format!("layer {i} qkv"), &a.qkv, c.q_dim() + 2 * c.kv_dim(), c.hidden_size)?;
        check(&format!("layer {i} attention output"), &a.output, c.hidden_size, c.q_dim())?;
        match &self.mlp {
            Mlp::Dense(ffn) => ffn.validate(&format!("layer {i}"), c.intermediate_size, c.hidden_size)?,
            Mlp::Experts(e) => {
                let (count, used, width) = c.experts.map_or((0, 0, 0), |x| (x.count, x.used, x.intermediate_size));
                if e.experts.len() != count || e.used != used || used == 0 || used > count {
                    return Err(Error::Metadata(format!(
                        "layer {i} has {} experts, {} used; the metadata says {count}, {used}",
                        e.experts.len(),
                        e.used
                    )));
                }
                check(&format!("layer {i} router"), &e.router, count, c.hidden_size)?;
                if let Some(bias) = &e.router_bias {
                    check_vec(&format!("layer {i} router bias"), bias, count)?;
                }
                for (x, ffn) in e.experts.iter().enumerate() {
                    ffn.validate(&format!("layer {i} expert {x}"), width, c.hidden_size)?;
                }
            }
        }
        check_vec(&format!("layer {i} attention norm"), &self.attn_norm, c.hidden_size)?;
        check_vec(&format!("layer {i} ffn norm"), &self.ffn_norm, c.hidden_size)?;
        let optional = [
            ("qkv bias", &a.qkv_bias, c.q_dim() + 2 * c.kv_dim()),
            ("q norm", &a.q_norm, c.head_dim),
            ("k norm", &a.k_norm, c.head_dim),
            ("attention output bias", &a.output_bias, c.hidden_size),
            ("attention sinks", &a.sinks, c.n_heads),
            ("post-attention norm", &self.attn_post_norm, c.hidden_size),
            ("post-ffn norm", &self.ffn_post_norm, c.hidden_size),
        ];
        for (name, v, len) in optional {
            if let Some(v) = v {
                check_vec(&format!("layer {i} {name}"), v, len)?;
            }
        }
        Ok(())
    }

    /// Bytes of weights one token's step reads.
    pub fn weight_bytes(&self) -> usize {
        self.attention.qkv.weight_bytes() + self.attention.output.weight_bytes() + self.mlp.weight_bytes_per_token()
    }
}

impl FeedForward {
    fn validate(&self, name: &str, width: usize, hidden: usize) -> Result<()> {
        check(&format!("{name} gate/up"), &self.gate_up, 2 * width, hidden)?;
        check(&format!("{name} down"), &self.down, hidden, width)?;
        if let Some(bias) = &self.gate_up_bias {
            check_vec(&format!("{name} gate/up bias"), bias, 2 * width)?;
        }
        if let Some(bias) = &self.down_bias {
            check_vec(&format!("{name} down bias"), bias, hidden)?;
        }
        Ok(())
    }
}

pub(crate) fn check(name: &str, m: &Matrix, rows: usize, cols: usize) -> Result<()> {
    if m.rows() == rows && m.cols() == cols {
        Ok(())
    } else {
        Err(Error::TensorShape { name: name.to_string(), expected: vec![rows, cols], actual: vec![m.rows(), m.cols()] })
    }
}

pub(crate) fn check_vec(name: &str, v: &[f32], len: usize) -> Result<()> {
    if v.len() == len {
        Ok(())
    } else {
        Err(Error::TensorShape { name: name.to_string(), expected: vec![len], actual: vec![v.len()] })
    }
}
