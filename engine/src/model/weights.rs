//! A model's tensors, in the layouts the kernels use: the embedding, the blocks as their family
//! assembled them ([`Block`]), the output norm and head.

use crate::error::{Error, Result};
use crate::kernels::matrix::Matrix;
use crate::model::config::ModelConfig;
use crate::model::layers::{check, check_vec, Block};

pub struct Weights {
    pub embedding: Matrix,
    pub blocks: Vec<Block>,
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
        let blocks: usize = self.blocks.iter().map(Block::weight_bytes).sum();
        blocks + self.embedding.weight_bytes() + self.lm_head.as_ref().map_or(0, Matrix::weight_bytes)
    }

    /// Checks every matrix against the configuration, so a wrong file fails at load, not mid-forward.
    pub fn validate(&self, c: &ModelConfig) -> Result<()> {
        check("token embedding", &self.embedding, c.vocab_size, c.hidden_size)?;
        check("output", self.lm_head(), c.vocab_size, c.hidden_size)?;
        check_vec("output norm", &self.output_norm, c.hidden_size)?;
        if self.blocks.len() != c.n_layers {
            return Err(Error::Metadata(format!(
                "{} layers in the file, {} in the metadata",
                self.blocks.len(),
                c.n_layers
            )));
        }
        self.blocks.iter().enumerate().try_for_each(|(i, b)| b.validate(i, c))
    }
}
