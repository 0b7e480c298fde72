//! Phi-3 and Phi-4: llama's blocks with the q, k and v projections fused into one tensor and
//! the gate and up projections into another, and LongRoPE's per-frequency factors where the
//! file has them. (Phi's sliding window is off, as llama.cpp has it.)

use super::config::ModelConfig;
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::Result;
use crate::kernels::rope::RopeScaling;

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    if r.meta(&format!("{arch}.rope.scaling.attn_factor")).is_some() || r.has_tensor("rope_factors_long.weight") {
        let attn_factor = r.optional_f32(&format!("{arch}.rope.scaling.attn_factor"))?.unwrap_or(1.0);
        c.rope_scaling = RopeScaling::LongRope { attn_factor };
    }
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize) -> Result<Block> {
    let attention = r.fused_attention(i, MAIN_ROPE)?;
    let ffn = Mlp::Dense(r.fused_feed_forward(i, Activation::Silu)?);
    r.pre_norm_block(i, attention, ffn)
}

/// LongRoPE's factors: the long ones where the model runs past its original context (as
/// llama.cpp does at the file's full context, its default), the short ones otherwise.
pub(super) fn rope_factors(r: &mut Reader, c: &ModelConfig) -> Result<Option<Vec<f32>>> {
    let arch = c.architecture.name();
    let original = r.optional_usize(&format!("{arch}.rope.scaling.original_context_length"))?;
    let long = original.is_none_or(|original| c.context_tokens > original);
    r.optional_vector(if long { "rope_factors_long.weight" } else { "rope_factors_short.weight" })
}
