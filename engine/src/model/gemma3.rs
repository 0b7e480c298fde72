//! Gemma 3: sliding-window layers interleaved with global ones (five to one unless the file
//! gives a period or a flag per layer), each kind with its own rotary base; q/k head norms; norms after attention
//! and after the feed-forward as well as before; GELU-tanh gated feed-forward; embeddings
//! scaled by √hidden. The file's norm weights already hold Gemma's `1 + w`.

use super::config::{ModelConfig, SlidingWindow};
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE, WINDOW_ROPE};
use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::Value;

/// One global layer after every five windowed ones (llama.cpp's default for gemma3).
const WINDOW_PATTERN: usize = 6;
/// The windowed layers' rotary base where the file gives none.
const WINDOW_ROPE_THETA: f32 = 10_000.0;

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    c.embedding_scale = (c.hidden_size as f32).sqrt();
    // Gemma 3 27B scales queries by 1/√(hidden/heads), which is not its head size.
    if c.n_layers == 62 {
        c.attention_scale = Some(1.0 / ((c.hidden_size / c.n_heads) as f32).sqrt());
    }
    let tokens = r.optional_usize(&format!("{arch}.attention.sliding_window"))?.unwrap_or(0);
    if tokens > 0 {
        let key = format!("{arch}.attention.sliding_window_pattern");
        let layers = match r.meta(&key) {
            Some(Value::Array(flags)) => windowed_flags(flags, c.n_layers).ok_or_else(|| {
                Error::Metadata(format!("'{key}' is not a flag for each of the {} layers", c.n_layers))
            })?,
            _ => {
                let period = r.optional_usize(&key)?.unwrap_or(WINDOW_PATTERN);
                (0..c.n_layers).map(|l| period == 0 || l % period < period - 1).collect()
            }
        };
        let rope_theta = r.optional_f32(&format!("{arch}.rope.freq_base_swa"))?.unwrap_or(WINDOW_ROPE_THETA);
        c.sliding_window = Some(SlidingWindow { tokens, layers, rope_theta: Some(rope_theta) });
    }
    Ok(())
}

/// Which layers are windowed, from a flag per layer (booleans or integers, nonzero for a
/// windowed layer, as llama.cpp reads them); `None` unless there is one for each layer.
fn windowed_flags(flags: &[Value], n_layers: usize) -> Option<Vec<bool>> {
    if flags.len() != n_layers {
        return None;
    }
    flags
        .iter()
        .map(|f| match f {
            Value::Bool(b) => Some(*b),
            Value::U32(v) => Some(*v != 0),
            Value::I32(v) => Some(*v != 0),
            _ => None,
        })
        .collect()
}

pub(super) fn block(r: &mut Reader, i: usize, c: &ModelConfig) -> Result<Block> {
    let rope = if c.window_of(i).is_some() { WINDOW_ROPE } else { MAIN_ROPE };
    let attention = r.attention(i, false, true, rope)?;
    let ffn = Mlp::Dense(r.feed_forward(i, Activation::GeluTanh)?);
    let mut block = r.pre_norm_block(i, attention, ffn)?;
    block.attn_post_norm = Some(r.vector(&format!("blk.{i}.post_attention_norm.weight"))?);
    block.ffn_post_norm = Some(r.vector(&format!("blk.{i}.post_ffw_norm.weight"))?);
    Ok(block)
}
