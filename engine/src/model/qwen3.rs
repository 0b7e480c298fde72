//! Qwen3 (dense): qwen2's blocks without the q/k/v biases, with an RMS norm over each head of q
//! and of k before the rotation.

use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;

pub(super) fn block(r: &mut Reader, i: usize) -> Result<Block> {
    let attention = r.attention(i, false, true, MAIN_ROPE)?;
    let ffn = Mlp::Dense(r.feed_forward(i, Activation::Silu)?);
    r.pre_norm_block(i, attention, ffn)
}
