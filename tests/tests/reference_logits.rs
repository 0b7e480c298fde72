//! Our forward pass against an implementation nobody here wrote: candle-transformers'
//! `quantized_llama` and `quantized_qwen2` on the same GGUF files, for a 64-token prefill and 32
//! decode steps.

mod common;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use hillside_bench::fidelity::{kl_divergence, likely_deviation, top_margin};
use hillside_engine::sampling::argmax;
use hillside_engine::{Engine, Logits};
use std::path::Path;

// Measured here (Sapphire Rapids, every SIMD level, both models): worst KL 0.0124 and worst
// |Δlog p| of the likely tokens 0.43 over the 33 steps; a wrong rotary layout gives KL > 1.
// Tokens below 1% are left to the KL bound (see `likely_deviation`): a change of summation order
// (one SIMD level against another) moves a 0.1% token's log-probability by up to 0.8, as int8
// rounding flips of the activations amplify through the layers; candle's own blocks (256 values
// with an f32 scale for K-quant weights) differ from ours (32 values, f16) more than that.
const KL_LIMIT: f64 = 0.03;
const LOGP_LIMIT: f64 = 0.6;

/// Per-step agreement of the next-token distributions: (KL(reference ‖ ours), the largest
/// log-probability difference over the reference's 20 likeliest tokens that it gives ≥ 1%).
fn compare(step: &str, ours: &[f32], reference: &[f32]) -> (f64, f64) {
    assert_eq!(ours.len(), reference.len());
    let kl = kl_divergence(reference, ours);
    let top_diff = likely_deviation(reference, ours);
    let margin = top_margin(reference) as f64;
    eprintln!(
        "{step}: KL {kl:.5}, likely top-20 max |Δlogp| {top_diff:.3}, top-2 margin {margin:.3}, argmax {} vs {}",
        argmax(ours),
        argmax(reference)
    );
    // Where the reference's winner is clear by more than our deviation, we must agree.
    if margin > 2.0 * top_diff {
        assert_eq!(argmax(ours), argmax(reference), "{step}: different top token despite a clear margin");
    }
    (kl, top_diff)
}

/// Prefill of 64 tokens of Pride and Prejudice, then 32 decode steps, ours against `reference`
/// (tokens, position → last-token logits). The top tokens must agree wherever the reference's
/// winner is clear (see [`compare`]); how many agree overall is reported, not bounded: this text
/// has steps whose two best tokens are 0.02–0.12 apart, and each level's summation order
/// settles a different share of those (SmolLM2: 31 of 33 at AVX-512, 27 at AVX2).
fn check_against_reference(path: &Path, mut reference: impl FnMut(&[u32], usize) -> Vec<f32>) {
    let engine = Engine::load(path).expect("load");
    let text = common::shared_document("pride-and-prejudice.txt");
    let start = text.find("It is a truth universally acknowledged").expect("opening line");
    let prompt: Vec<u32> = engine.tokenizer().encode(&text[start..start + 2000]).unwrap()[..64].to_vec();

    let mut seq = engine.new_sequence(Some(4096));
    let mut ours = engine.model().forward(&prompt, seq.kv.as_mut(), Logits::Last).unwrap();
    let mut theirs = reference(&prompt, 0);
    let mut steps = vec![compare("prefill", &ours, &theirs)];
    let mut same_top = usize::from(argmax(&ours) == argmax(&theirs));
    for step in 0..32 {
        // Both continue with the reference's choice, so every kernel level is compared on the
        // same text: with our own choice a near-tie (a margin of 0.01 happens) sends each level
        // down another continuation, and the figures would measure the text, not the kernels.
        let next = argmax(&theirs);
        ours = engine.model().forward(&[next], seq.kv.as_mut(), Logits::Last).unwrap();
        theirs = reference(&[next], prompt.len() + step);
        steps.push(compare(&format!("decode {step}"), &ours, &theirs));
        same_top += usize::from(argmax(&ours) == argmax(&theirs));
    }
    // Both quantize activations to int8 per 32-value block (with f16 scales); we keep K/V in
    // f16 where candle keeps f32, and sum in another order.
    let worst_kl = steps.iter().map(|s| s.0).fold(0.0, f64::max);
    let worst_top = steps.iter().map(|s| s.1).fold(0.0, f64::max);
    eprintln!("worst KL {worst_kl:.5}, worst likely top-20 |Δlogp| {worst_top:.3}, same top token {same_top}/33");
    assert!(worst_kl < KL_LIMIT, "next-token distributions drift from the reference: KL {worst_kl}");
    assert!(worst_top < LOGP_LIMIT, "log-probabilities drift from the reference: {worst_top}");
}

/// Last-token logits of a candle model's `forward(input, position)`.
fn candle_logits(forward: candle_core::Result<Tensor>) -> Vec<f32> {
    forward.unwrap().squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

fn token_tensor(tokens: &[u32]) -> Tensor {
    Tensor::new(tokens, &Device::Cpu).unwrap().unsqueeze(0).unwrap()
}

#[test]
fn logits_match_candle_quantized_llama() {
    let path = common::model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut reference = quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    check_against_reference(&path, |tokens, pos| candle_logits(reference.forward(&token_tensor(tokens), pos)));
}

/// Qwen2.5-Coder Q4_K_M: qwen2 (biases, 7:1 grouped queries, rotary halves) on Q4_K, Q5_0, Q6_K
/// and Q8_0 weights, with mixed formats in one layer's q/k/v.
#[test]
fn k_quant_logits_match_candle_quantized_qwen2() {
    let path = common::qwen_model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut reference = quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    check_against_reference(&path, |tokens, pos| candle_logits(reference.forward(&token_tensor(tokens), pos)));
}
