//! Fidelity measurements shared by `hillside eval` and the tests: teacher-forced decoding of a
//! real text, token by token, so that sparse stores select exactly as they would in generation.

use crate::error::Result;
use crate::model::Logits;
use crate::sampling::argmax;
use crate::{Engine, Sequence};

/// What a teacher-forced pass saw at each scored position.
#[derive(Debug, Clone, Default)]
pub struct TeacherForced {
    /// −log p(token) for each scored token.
    pub nll: Vec<f64>,
    /// The model's top-1 prediction at each scored position.
    pub top1: Vec<u32>,
}

impl TeacherForced {
    pub fn perplexity(&self) -> f64 {
        (self.nll.iter().sum::<f64>() / self.nll.len().max(1) as f64).exp()
    }

    /// Share of positions where both passes predicted the same next token.
    pub fn top1_agreement(&self, other: &TeacherForced) -> f64 {
        let same = self.top1.iter().zip(&other.top1).filter(|(a, b)| a == b).count();
        same as f64 / self.top1.len().min(other.top1.len()).max(1) as f64
    }
}

fn log_prob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = logits.iter().map(|l| ((l - max) as f64).exp()).sum::<f64>().ln() + max as f64;
    logits[token as usize] as f64 - log_z
}

/// Prefills `tokens[..prompt_len]` in chunks, then feeds the rest one token at a time, scoring
/// each against the logits that preceded it. `after_step` sees the sequence after every step.
pub fn teacher_forced(
    engine: &Engine,
    seq: &mut Sequence,
    tokens: &[u32],
    prompt_len: usize,
    chunk_tokens: usize,
    mut after_step: impl FnMut(&Sequence),
) -> Result<TeacherForced> {
    let mut logits = Vec::new();
    for chunk in tokens[..prompt_len].chunks(chunk_tokens.max(1)) {
        logits = engine.model().forward(chunk, seq.kv.as_mut(), Logits::Last)?;
        seq.tokens.extend_from_slice(chunk);
    }
    let mut out = TeacherForced::default();
    for &t in &tokens[prompt_len..] {
        out.nll.push(-log_prob(&logits, t));
        out.top1.push(argmax(&logits));
        logits = engine.model().forward(&[t], seq.kv.as_mut(), Logits::Last)?;
        seq.tokens.push(t);
        after_step(seq);
    }
    Ok(out)
}
