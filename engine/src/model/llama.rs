//! Llama and the files that share its layout (SmolLM, Mistral, Llama 3): pre-norm blocks,
//! grouped-query attention without biases, SwiGLU; a sliding window on every layer where the
//! file gives one (Mistral 7B v0.1's 4,096 tokens).

use super::config::{ModelConfig, SlidingWindow};
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;
use crate::kernels::rope::RopeLayout;

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    // llama.cpp's converter permutes llama's q/k rows so that rotary pairs are (2i, 2i+1).
    c.rope_layout = RopeLayout::Interleaved;
    // (llama.cpp's llama graph ignores this key, so past the window its attention differs
    // from the model's training, and from ours.)
    if let Some(tokens) = r.optional_usize(&format!("{arch}.attention.sliding_window"))?.filter(|&t| t > 0) {
        c.sliding_window = Some(SlidingWindow { tokens, layers: vec![true; c.n_layers], rope_theta: None });
    }
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize) -> Result<Block> {
    let attention = r.attention(i, false, false, MAIN_ROPE)?;
    let ffn = Mlp::Dense(r.feed_forward(i, Activation::Silu)?);
    r.pre_norm_block(i, attention, ffn)
}
