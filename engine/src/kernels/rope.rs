//! Rotary position embeddings: how a family pairs a head's dimensions, how its file scales the
//! frequencies, and the rotation of queries and keys by position. The model's config names the
//! layout and the scaling; the kernel below owns what they mean.

use super::ops::multiversioned;

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
    /// Phi-3's LongRoPE: per-frequency factors (a tensor of the file), and cos and sin scaled
    /// by `attn_factor`.
    LongRope {
        attn_factor: f32,
    },
    /// YaRN (Qwen3's long-context files, gpt-oss): the high frequencies kept, the low ones
    /// divided by `factor`, a ramp between them set by `beta_fast` and `beta_slow` rotations in
    /// `original_context_tokens`; cos and sin scaled by (1 + 0.1·ln factor)·`attn_factor`.
    Yarn {
        factor: f32,
        original_context_tokens: usize,
        beta_fast: f32,
        beta_slow: f32,
        attn_factor: f32,
    },
}

/// Rotary embedding angles for the head dimension, with the model's base and scaling.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    position_scale: f32,
    /// What cos and sin are multiplied by (LongRoPE's attention factor; 1 elsewhere).
    magnitude: f32,
    layout: RopeLayout,
}

impl Rope {
    pub fn new(
        head_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
        layout: RopeLayout,
        freq_factors: Option<&[f32]>,
    ) -> Self {
        let mut inv_freq: Vec<f32> =
            (0..head_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
        let (mut position_scale, mut magnitude) = (1.0, 1.0);
        match scaling {
            RopeScaling::None => {}
            RopeScaling::LongRope { attn_factor } => magnitude = *attn_factor,
            RopeScaling::Linear { factor } => position_scale = 1.0 / factor,
            RopeScaling::Yarn { factor, original_context_tokens, beta_fast, beta_slow, attn_factor } => {
                // The pair whose wavelength fits `rotations` times in the original context
                // (ggml's ggml_rope_yarn_corr_dim, as transformers' find_correction_dim).
                let dims = head_dim as f32;
                let pair = |rotations: f32| {
                    dims * (*original_context_tokens as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                        / (2.0 * theta.ln())
                };
                let (low, high) = (pair(*beta_fast).floor().max(0.0), pair(*beta_slow).ceil().min(dims - 1.0));
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let kept = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                    *f *= (1.0 - kept) / factor + kept;
                }
                magnitude = attn_factor * if *factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 };
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context_tokens } => {
                let old = *original_context_tokens as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        if let Some(factors) = freq_factors {
            inv_freq.iter_mut().zip(factors).for_each(|(f, s)| *f /= s);
        }
        Self { inv_freq, position_scale, magnitude, layout }
    }

    /// cos and sin tables (`positions × head_dim/2`) for the given positions.
    pub fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * self.position_scale * f;
                cos.push(angle.cos() * self.magnitude);
                sin.push(angle.sin() * self.magnitude);
            }
        }
        (cos, sin)
    }

    /// Rotates every head of every row in `x` (`rows × n_heads·head_dim`); row t uses table row t.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, cos: &[f32], sin: &[f32]) {
        rotate(
            x,
            n_heads * 2 * self.inv_freq.len(),
            self.inv_freq.len(),
            self.layout == RopeLayout::Interleaved,
            cos,
            sin,
        )
    }
}

multiversioned! {
    /// [`Rope::apply`] on rows of `width` values, heads of `2·half`.
    fn rotate(x: &mut [f32], width: usize, half: usize, interleaved: bool, cos: &[f32], sin: &[f32]) {
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            for head in row.chunks_exact_mut(2 * half) {
                if interleaved {
                    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(c.iter().zip(s)) {
                        let (x0, x1) = (pair[0], pair[1]);
                        pair[0] = x0 * c - x1 * s;
                        pair[1] = x0 * s + x1 * c;
                    }
                } else {
                    let (lo, hi) = head.split_at_mut(half);
                    for (((x0, x1), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(s) {
                        let (a, b) = (*x0, *x1);
                        *x0 = a * c - b * s;
                        *x1 = a * s + b * c;
                    }
                }
            }
        }
    }
}
