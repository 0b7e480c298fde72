//! Qwen3's mixture of experts (Qwen3-30B-A3B and kin): qwen3's attention, and in place of the
//! feed-forward network routed experts, the top `expert_used_count` of `expert_count` by the
//! router's softmax, their weights renormalized to sum to 1; no shared expert.

use super::config::{ExpertShape, ModelConfig};
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::{Error, Result};

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let count = r.meta_usize(&key("expert_count"))?;
    let used = r.meta_usize(&key("expert_used_count"))?;
    if used == 0 || used > count {
        return Err(Error::Metadata(format!("{used} of {count} experts used per token")));
    }
    let intermediate_size = r.optional_usize(&key("expert_feed_forward_length"))?.unwrap_or(c.intermediate_size);
    c.experts = Some(ExpertShape { count, used, intermediate_size });
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize, c: &ModelConfig) -> Result<Block> {
    let attention = r.attention(i, false, true, MAIN_ROPE)?;
    let used = c.experts.map_or(1, |e| e.used);
    let experts = r.experts(i, used, true, Activation::Silu)?;
    r.pre_norm_block(i, attention, Mlp::Experts(experts))
}
