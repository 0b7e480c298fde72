//! The tensors of a llama-shaped model, in the layouts the kernels use.

use crate::error::{Error, Result};
use crate::kernels::matrix::Matrix;
use crate::model::config::ModelConfig;

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// q, k and v projections stacked: `q_dim + 2·kv_dim` rows.
    pub qkv: Matrix,
    pub qkv_bias: Option<Vec<f32>>,
    pub attn_output: Matrix,
    pub ffn_norm: Vec<f32>,
    /// gate and up projections stacked: `2·intermediate` rows.
    pub gate_up: Matrix,
    pub down: Matrix,
}

pub struct Weights {
    pub embedding: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<Matrix>,
    /// Llama 3 GGUF files carry per-frequency rope factors as a tensor.
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl Weights {
    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }

    pub fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.weight_bytes() + l.attn_output.weight_bytes() + l.gate_up.weight_bytes() + l.down.weight_bytes()
            })
            .sum();
        layers + self.embedding.weight_bytes() + self.lm_head.as_ref().map_or(0, Matrix::weight_bytes)
    }

    /// Checks every matrix against the configuration, so a wrong file fails at load, not mid-forward.
    pub fn validate(&self, c: &ModelConfig) -> Result<()> {
        let check = |name: &str, m: &Matrix, rows: usize, cols: usize| {
            if m.rows() == rows && m.cols() == cols {
                Ok(())
            } else {
                Err(Error::TensorShape {
                    name: name.to_string(),
                    expected: vec![rows, cols],
                    actual: vec![m.rows(), m.cols()],
                })
            }
        };
        let check_vec = |name: &str, v: &[f32], len: usize| {
            if v.len() == len {
                Ok(())
            } else {
                Err(Error::TensorShape { name: name.to_string(), expected: vec![len], actual: vec![v.len()] })
            }
        };
        check("token embedding", &self.embedding, c.vocab_size, c.hidden_size)?;
        check("output", self.lm_head(), c.vocab_size, c.hidden_size)?;
        check_vec("output norm", &self.output_norm, c.hidden_size)?;
        if self.layers.len() != c.n_layers {
            return Err(Error::Metadata(format!(
                "{} layers in the file, {} in the metadata",
                self.layers.len(),
                c.n_layers
            )));
        }
        for (i, l) in self.layers.iter().enumerate() {
            check(&format!("layer {i} qkv"), &l.qkv, c.q_dim() + 2 * c.kv_dim(), c.hidden_size)?;
            check(&format!("layer {i} attention output"), &l.attn_output, c.hidden_size, c.q_dim())?;
            check(&format!("layer {i} gate/up"), &l.gate_up, 2 * c.intermediate_size, c.hidden_size)?;
            check(&format!("layer {i} down"), &l.down, c.hidden_size, c.intermediate_size)?;
            check_vec(&format!("layer {i} attention norm"), &l.attn_norm, c.hidden_size)?;
            check_vec(&format!("layer {i} ffn norm"), &l.ffn_norm, c.hidden_size)?;
            if let Some(b) = &l.qkv_bias {
                check_vec(&format!("layer {i} qkv bias"), b, c.q_dim() + 2 * c.kv_dim())?;
            }
        }
        Ok(())
    }
}
