//! Qwen2 and Qwen2.5: llama's blocks with biases on the q, k and v projections, rotary halves.

use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;

pub(super) fn block(r: &mut Reader, i: usize) -> Result<Block> {
    let attention = r.attention(i, true, false, MAIN_ROPE)?;
    let ffn = Mlp::Dense(r.feed_forward(i, Activation::Silu)?);
    r.pre_norm_block(i, attention, ffn)
}
