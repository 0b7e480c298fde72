//! gpt-oss (OpenAI's open-weight mixture of experts): windowed layers alternating with global
//! ones (every even layer attends to its last `sliding_window` tokens, as llama.cpp reads the
//! file), q/k/v and output biases, a learned sink logit per head in attention's softmax, YaRN
//! rotary scaling (the file's), and routed experts with biases through the clamped SwiGLU, the
//! chosen experts weighted by the softmax of their router logits alone. The norm before the
//! experts is the file's `post_attention_norm`.

use super::config::{ModelConfig, SlidingWindow};
use super::gguf::Reader;
use super::layers::{Activation, Block, Mlp, MAIN_ROPE};
use crate::error::{Error, Result};

/// Windowed layers alternate with global ones, the first windowed (llama.cpp's period for gpt-oss).
const WINDOW_PERIOD: usize = 2;

pub(super) fn configure(r: &Reader, arch: &str, c: &mut ModelConfig) -> Result<()> {
    c.experts = Some(r.expert_shape(arch, c)?);
    let tokens = r.meta_usize(&format!("{arch}.attention.sliding_window"))?;
    if tokens > 0 {
        let layers = (0..c.n_layers).map(|l| l % WINDOW_PERIOD < WINDOW_PERIOD - 1).collect();
        c.sliding_window = Some(SlidingWindow { tokens, layers, rope_theta: None });
    }
    Ok(())
}

pub(super) fn block(r: &mut Reader, i: usize, c: &ModelConfig) -> Result<Block> {
    let p = |name: &str| format!("blk.{i}.{name}");
    let mut attention = r.attention(i, true, false, MAIN_ROPE)?;
    attention.output_bias = Some(r.vector(&p("attn_output.bias"))?);
    attention.sinks = Some(r.vector(&p("attn_sinks.weight"))?);
    let used = c.experts.map_or(1, |e| e.used);
    // The softmax over the chosen experts' logits is the full softmax renormalized over them.
    let mut experts = r.experts(i, used, true, Activation::SiluClamped)?;
    experts.router_bias = Some(r.vector(&p("ffn_gate_inp.bias"))?);
    let gate = r.expert_biases(&p("ffn_gate_exps.bias"))?;
    let up = r.expert_biases(&p("ffn_up_exps.bias"))?;
    let down = r.expert_biases(&p("ffn_down_exps.bias"))?;
    let (Some(gate), Some(up), Some(down)) = (gate, up, down) else {
        return Err(Error::MissingTensor(p("ffn_{gate,up,down}_exps.bias")));
    };
    if gate.len() != experts.experts.len() || up.len() != gate.len() || down.len() != gate.len() {
        return Err(Error::Metadata(format!("layer {i}'s expert biases are not one per expert")));
    }
    for (((expert, gate), up), down) in experts.experts.iter_mut().zip(gate).zip(up).zip(down) {
        expert.gate_up_bias = Some([gate, up].concat());
        expert.down_bias = Some(down);
    }
    Ok(Block {
        attn_norm: r.vector(&p("attn_norm.weight"))?,
        attention,
        attn_post_norm: None,
        ffn_norm: r.vector(&p("post_attention_norm.weight"))?,
        mlp: Mlp::Experts(experts),
        ffn_post_norm: None,
    })
}
