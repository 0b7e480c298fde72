//! Llama and the files that share its layout (SmolLM, Mistral, Llama 3): pre-norm blocks,
//! grouped-query attention without biases, SwiGLU.

use super::config::{ModelConfig, RopeLayout};
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;

pub(super) fn configure(_r: &Reader, _arch: &str, c: &mut ModelConfig) -> Result<()> {
    // llama.cpp's converter permutes llama's q/k rows so that rotary pairs are (2i, 2i+1).
    c.rope_layout = RopeLayout::Interleaved;
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize) -> Result<Block> {
    let attention = r.attention(i, false, false, MAIN_ROPE)?;
    let ffn = Mlp::Dense(r.feed_forward(i, Activation::Silu)?);
    r.pre_norm_block(i, attention, ffn)
}
