//! Qwen3's mixture of experts (Qwen3-30B-A3B and kin): qwen3's attention, and in place of the
//! feed-forward network routed experts, the top `expert_used_count` of `expert_count` by the
//! router's softmax, their weights renormalized to sum to 1; no shared expert.

use super::config::ModelConfig;
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    c.experts = Some(r.expert_shape(arch, c)?);
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize, c: &ModelConfig) -> Result<Block> {
    let attention = r.attention(i, false, true, MAIN_ROPE)?;
    let used = c.experts.map_or(1, |e| e.used);
    let experts = r.experts(i, used, true, Activation::Silu)?;
    r.pre_norm_block(i, attention, Mlp::Experts(experts))
}
