//! Element-wise and per-row operations of the transformer block.

use crate::model::config::{RopeLayout, RopeScaling};

/// `out = x / rms(x) · weight` for each row of `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (row, dst) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
            *d = v * inv * w;
        }
    }
}

/// SwiGLU in place: for rows laid out as `[gate (width) | up (width)]`, `silu(gate) · up` as
/// rows of `width` at the start of `gate_up`, returned. Each row's result replaces its gate and
/// then moves down to t·width, where only rows already done lay, so the MLP needs no buffer of
/// its own.
pub fn swiglu_in_place(gate_up: &mut [f32], width: usize) -> &[f32] {
    let n = gate_up.len() / (2 * width);
    for t in 0..n {
        let (gate, up) = gate_up[2 * t * width..][..2 * width].split_at_mut(width);
        gate.iter_mut().zip(&*up).for_each(|(g, &u)| *g = *g / (1.0 + (-*g).exp()) * u);
        gate_up.copy_within(2 * t * width..(2 * t + 1) * width, t * width);
    }
    &gate_up[..n * width]
}

pub fn add_in_place(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
}

pub fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// Rotary embedding angles for the head dimension, with the model's base and scaling.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    position_scale: f32,
    layout: RopeLayout,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f32, scaling: &RopeScaling, layout: RopeLayout, freq_factors: Option<&[f32]>) -> Self {
        let mut inv_freq: Vec<f32> =
            (0..head_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
        let mut position_scale = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => position_scale = 1.0 / factor,
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
        Self { inv_freq, position_scale, layout }
    }

    /// cos and sin tables (`positions × head_dim/2`) for the given positions.
    pub fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * self.position_scale * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }

    /// Rotates every head of every row in `x` (`rows × n_heads·head_dim`); row t uses table row t.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, cos: &[f32], sin: &[f32]) {
        let half = self.inv_freq.len();
        let hd = 2 * half;
        for (t, row) in x.chunks_exact_mut(n_heads * hd).enumerate() {
            let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            for head in row.chunks_exact_mut(hd) {
                for i in 0..half {
                    let (a, b) = match self.layout {
                        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                        RopeLayout::Halves => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c[i] - x1 * s[i];
                    head[b] = x0 * s[i] + x1 * c[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_in_place_matches_the_formula_row_by_row() {
        let (n, width) = (5, 7);
        let gate_up: Vec<f32> = (0..n * 2 * width).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let expected: Vec<f32> = gate_up
            .chunks_exact(2 * width)
            .flat_map(|row| (0..width).map(move |i| row[i] / (1.0 + (-row[i]).exp()) * row[width + i]))
            .collect();
        let mut buf = gate_up.clone();
        assert_eq!(swiglu_in_place(&mut buf, width), &expected[..]);
    }
}
