//! Fidelity measurements shared by `hillside eval` and the tests: teacher-forced decoding of a
//! real text, token by token, so that sparse stores select exactly as they would in generation.

use hillside_engine::kv::{HeadsPart, KvShape, KvStats, KvStore, KvView, Queries, Selection};
use hillside_engine::model::Logits;
use hillside_engine::sampling::argmax;
use hillside_engine::Result;
use hillside_engine::{Engine, Sequence};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

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

/// log p(`token`) under the softmax of a row of `logits`.
pub fn log_prob(logits: &[f32], token: u32) -> f64 {
    logits[token as usize] as f64 - log_normalizer(logits)
}

/// log Σ exp of a row of logits, summed in f64: a token's log-probability is its logit less this.
fn log_normalizer(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().map(|l| ((l - max) as f64).exp()).sum::<f64>().ln() + max as f64
}

/// KL(p ‖ q) of the next-token distributions two rows of logits give.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let (zp, zq) = (log_normalizer(p), log_normalizer(q));
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            let (lp, lq) = (a as f64 - zp, b as f64 - zq);
            lp.exp() * (lp - lq)
        })
        .sum()
}

/// The lead of a row's top logit over its second: how clear the next token is.
pub fn top_margin(logits: &[f32]) -> f32 {
    let top = argmax(logits) as usize;
    let second =
        logits.iter().enumerate().filter(|&(i, _)| i != top).map(|(_, &l)| l).fold(f32::NEG_INFINITY, f32::max);
    logits[top] - second
}

/// The largest difference in log-probability between two rows over `p`'s 20 likeliest tokens
/// that it gives 1% or more: how far two paths are apart on the tokens that can come next (the
/// tail is left to [`kl_divergence`], where summation order alone moves a 0.1% token a lot).
pub fn likely_deviation(p: &[f32], q: &[f32]) -> f64 {
    let (zp, zq) = (log_normalizer(p), log_normalizer(q));
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.select_nth_unstable_by(19.min(p.len() - 1), |&a, &b| p[b].total_cmp(&p[a]));
    order[..20.min(p.len())]
        .iter()
        .map(|&i| (p[i] as f64 - zp, q[i] as f64 - zq))
        .filter(|(lp, _)| *lp >= 0.01f64.ln())
        .map(|(lp, lq)| (lp - lq).abs())
        .fold(0.0, f64::max)
}

/// Prefills `tokens[..prompt_len]` in chunks, then feeds the rest one token at a time, scoring
/// each against the logits that preceded it. `after_step` sees the sequence after every step.
pub fn teacher_forced(
    engine: &Engine,
    seq: &mut Sequence,
    tokens: &[u32],
    prompt_len: usize,
    chunk_tokens: usize,
    after_step: impl FnMut(&Sequence),
) -> Result<TeacherForced> {
    let mut logits = Vec::new();
    for chunk in tokens[..prompt_len].chunks(chunk_tokens.max(1)) {
        logits = engine.model().forward(chunk, seq.kv.as_mut(), Logits::Last)?;
        seq.tokens.extend_from_slice(chunk);
    }
    teacher_forced_from(engine, seq, logits, &tokens[prompt_len..], after_step)
}

/// [`teacher_forced`] over a prompt already fed: scores `tokens` from the prompt's last
/// `logits` on.
pub fn teacher_forced_from(
    engine: &Engine,
    seq: &mut Sequence,
    mut logits: Vec<f32>,
    tokens: &[u32],
    mut after_step: impl FnMut(&Sequence),
) -> Result<TeacherForced> {
    let mut out = TeacherForced::default();
    for &t in tokens {
        out.nll.push(-log_prob(&logits, t));
        out.top1.push(argmax(&logits));
        logits = engine.model().forward(&[t], seq.kv.as_mut(), Logits::Last)?;
        seq.tokens.push(t);
        after_step(seq);
    }
    Ok(out)
}

/// How much of the full attention the selected tokens captured, per decode step.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AttentionMass {
    /// Per decode step with a sparse selection: the share of the exact softmax mass that fell
    /// on the selected tokens, averaged over sparse layers and query heads.
    pub per_step: Vec<f64>,
    /// Per step, the worst (layer, query head).
    pub worst_per_step: Vec<f64>,
}

impl AttentionMass {
    pub fn mean(&self) -> f64 {
        self.per_step.iter().sum::<f64>() / self.per_step.len().max(1) as f64
    }

    pub fn min(&self) -> f64 {
        self.per_step.iter().copied().fold(1.0, f64::min)
    }

    /// Mean over steps of the worst (layer, head) in each.
    pub fn mean_worst(&self) -> f64 {
        self.worst_per_step.iter().sum::<f64>() / self.worst_per_step.len().max(1) as f64
    }
}

/// Watches a store's selections against exact f32 copies of every key, and may replace them:
/// the measuring and the ideal selection of `hillside eval`, and the tests' recorders.
pub trait SelectionWatch: Send {
    /// Sees the inner store's `selection` for queries `q` at `q_positions` and returns the one
    /// to use; `keys` holds every key so far, this step's included.
    fn select(
        &mut self,
        keys: &ExactKeys,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        selection: Selection,
    ) -> Selection;

    /// Every layer has run the step.
    fn commit(&mut self) {}

    /// Tokens were forgotten: what the step in progress saw no longer counts.
    fn truncate(&mut self) {}
}

/// A store with exact f32 copies of its keys beside it and a [`SelectionWatch`] on its
/// selections. For evaluation and tests only: it holds every key in f32.
pub struct Watched<W> {
    inner: Box<dyn KvStore>,
    keys: ExactKeys,
    pub watch: W,
}

impl<W: SelectionWatch> Watched<W> {
    pub fn new(inner: Box<dyn KvStore>, watch: W) -> Self {
        Self { keys: ExactKeys::new(inner.shape()), inner, watch }
    }

    pub fn keys(&self) -> &ExactKeys {
        &self.keys
    }
}

impl<W: SelectionWatch> KvStore for Watched<W> {
    fn shape(&self) -> KvShape {
        self.inner.shape()
    }

    fn len_tokens(&self) -> usize {
        self.inner.len_tokens()
    }

    fn append_input(&mut self, layer: usize, x: &[f32]) -> Result<()> {
        self.inner.append_input(layer, x)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.inner.append(layer, k, v)?;
        self.keys.append(layer, k);
        Ok(())
    }

    fn attend(&mut self, layer: usize, queries: &Queries<'_>, out: &mut [f32]) -> Option<Result<()>> {
        self.inner.attend(layer, queries, out)
    }

    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection> {
        let selection = self.inner.select(layer, queries)?;
        Ok(self.watch.select(&self.keys, layer, queries.q, queries.positions, selection))
    }

    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        self.inner.parts(selection, cached_tokens)
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        self.inner.gather(layer, selection, heads)
    }

    fn observe(&mut self, layer: usize, selection: &Selection) {
        self.inner.observe(layer, selection)
    }

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.inner.commit(n_tokens)?;
        self.watch.commit();
        Ok(())
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        let kept = self.inner.truncate(n_tokens);
        self.keys.truncate(kept);
        self.watch.truncate();
        kept
    }

    fn stats(&self) -> KvStats {
        self.inner.stats()
    }

    fn trim(&mut self) {
        self.inner.trim()
    }
}

/// Every key of every layer in f32 (RoPE applied), kept beside a store so that attention can
/// be computed exactly.
pub struct ExactKeys {
    shape: KvShape,
    /// `[layer]`, `tokens × kv_dim`.
    layers: Vec<Vec<f32>>,
}

impl ExactKeys {
    fn new(shape: KvShape) -> Self {
        Self { shape, layers: vec![Vec::new(); shape.n_layers] }
    }

    fn append(&mut self, layer: usize, k: &[f32]) {
        self.layers[layer].extend_from_slice(k);
    }

    fn truncate(&mut self, n_tokens: usize) {
        let kv_dim = self.shape.kv_dim();
        self.layers.iter_mut().for_each(|keys| keys.truncate(n_tokens * kv_dim));
    }

    /// Keys of `layer` so far (`tokens × kv_dim`), including any appended this step.
    pub fn layer(&self, layer: usize) -> &[f32] {
        &self.layers[layer]
    }

    /// How many tokens' keys `layer` holds.
    pub fn tokens(&self, layer: usize) -> usize {
        self.layers[layer].len() / self.shape.kv_dim()
    }

    /// One query head's exact attention over every key of `layer`: the softmax of q·k/√d, in f64.
    pub fn attention(&self, layer: usize, kv_head: usize, q: &[f32]) -> Vec<f64> {
        let hd = self.shape.head_dim;
        let scale = 1.0 / (hd as f64).sqrt();
        let logits: Vec<f64> = self.layers[layer]
            .chunks_exact(self.shape.kv_dim())
            .map(|row| f64::from(row[kv_head * hd..][..hd].iter().zip(q).map(|(k, q)| k * q).sum::<f32>()) * scale)
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = logits.iter().map(|l| (l - max).exp()).sum();
        logits.iter().map(|l| (l - max).exp() / total).collect()
    }
}

/// Measures the share of each decode query's exact attention mass that the store's selection
/// captured (it scores every key each step).
pub struct AttentionMassProbe {
    /// `[layer][query head]` mass of the step in progress.
    step: Vec<Vec<f64>>,
    result: Arc<Mutex<AttentionMass>>,
}

impl AttentionMassProbe {
    /// Wraps `inner`; the measurements accumulate in the returned handle.
    pub fn wrap(inner: Box<dyn KvStore>) -> (Watched<Self>, Arc<Mutex<AttentionMass>>) {
        let result = Arc::new(Mutex::new(AttentionMass::default()));
        let probe = Self { step: vec![Vec::new(); inner.shape().n_layers], result: result.clone() };
        (Watched::new(inner, probe), result)
    }
}

impl SelectionWatch for AttentionMassProbe {
    fn select(
        &mut self,
        keys: &ExactKeys,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        selection: Selection,
    ) -> Selection {
        if q_positions.len() != 1 || matches!(selection, Selection::All) {
            return selection;
        }
        let hd = keys.shape.head_dim;
        let group = q.len() / hd / keys.shape.n_kv_heads;
        self.step[layer] = (0..q.len() / hd)
            .into_par_iter()
            .map(|head| {
                let attention = keys.attention(layer, head / group, &q[head * hd..][..hd]);
                let chosen = selection.head(head / group).expect("a token selection");
                chosen.iter().map(|&t| attention[t as usize]).sum::<f64>()
            })
            .collect();
        selection
    }

    fn commit(&mut self) {
        let masses: Vec<f64> = self.step.iter_mut().flat_map(std::mem::take).collect();
        if !masses.is_empty() {
            let mut result = self.result.lock().unwrap_or_else(|p| p.into_inner());
            result.per_step.push(masses.iter().sum::<f64>() / masses.len() as f64);
            result.worst_per_step.push(masses.iter().copied().fold(1.0, f64::min));
        }
    }

    fn truncate(&mut self) {
        self.step.iter_mut().for_each(Vec::clear);
    }
}

/// The ideal selector, for evaluation: wherever the inner store attends to a subset, each KV
/// head attends instead to as many tokens, chosen with perfect knowledge — the sinks and recent
/// tokens the inner store pins, plus the other tokens with the most exact attention (softmax
/// probability from f32 keys, summed over the head's query heads). What it scores is the
/// ceiling of any selector at the inner store's α. The inner store must gather any selection
/// (a tiered store whose budget holds every row does).
pub struct IdealSelector {
    sink_tokens: usize,
    recent_tokens: usize,
}

impl IdealSelector {
    pub fn wrap(inner: Box<dyn KvStore>, sink_tokens: usize, recent_tokens: usize) -> Watched<Self> {
        Watched::new(inner, Self { sink_tokens, recent_tokens })
    }
}

impl SelectionWatch for IdealSelector {
    fn select(
        &mut self,
        keys: &ExactKeys,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        selection: Selection,
    ) -> Selection {
        let per_head = match selection {
            Selection::Tokens { per_head, .. } if q_positions.len() == 1 => per_head,
            selection => return selection,
        };
        let (hd, n_kv) = (keys.shape.head_dim, keys.shape.n_kv_heads);
        let group = q.len() / hd / n_kv;
        let n = keys.tokens(layer);
        let (sinks, recent_from) = (self.sink_tokens.min(n), n.saturating_sub(self.recent_tokens));
        let sets: Vec<Vec<u32>> = (0..n_kv)
            .into_par_iter()
            .map(|kv_head| {
                let mut mass = vec![0f64; n];
                for g in 0..group {
                    let attention = keys.attention(layer, kv_head, &q[(kv_head * group + g) * hd..][..hd]);
                    mass.iter_mut().zip(attention).for_each(|(m, a)| *m += a);
                }
                let mut middle: Vec<u32> = (sinks as u32..recent_from as u32).collect();
                let take = per_head.saturating_sub(sinks + (n - recent_from)).min(middle.len());
                if take < middle.len() {
                    middle.select_nth_unstable_by(take, |&a, &b| mass[b as usize].total_cmp(&mass[a as usize]));
                    middle.truncate(take);
                }
                middle.sort_unstable();
                (0..sinks as u32).chain(middle).chain(recent_from as u32..n as u32).collect()
            })
            .collect();
        Selection::per_head(&sets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergences_of_two_rows_are_those_of_their_softmaxes() {
        // Two tokens at 3:1 against 1:1: KL = 0.75 ln 1.5 + 0.25 ln 0.5.
        let (p, q) = ([3f32.ln(), 0.0], [5.0f32, 5.0]);
        assert!((kl_divergence(&p, &q) - (0.75 * 1.5f64.ln() + 0.25 * 0.5f64.ln())).abs() < 1e-6);
        let shifted: Vec<f32> = p.iter().map(|l| l + 7.0).collect();
        assert!(kl_divergence(&p, &shifted).abs() < 1e-6, "a row's offset changes no probability");
        assert!((log_prob(&p, 0) - 0.75f64.ln()).abs() < 1e-6);

        // 30 tokens, two likely ones: a 0.1% token's move is left out; a likely one's counts.
        let mut p = vec![-10f32; 30];
        (p[4], p[7], p[9]) = (0.0, 0.0, -6.0);
        let mut q = p.clone();
        q[9] = -3.0;
        assert!(likely_deviation(&p, &q) < 0.1, "{}", likely_deviation(&p, &q));
        q[4] = -3.0;
        let moved = |t: u32| (log_prob(&p, t) - log_prob(&q, t)).abs();
        let expected = moved(4).max(moved(7));
        assert!(expected > 2.0 && (likely_deviation(&p, &q) - expected).abs() < 1e-9, "{expected}");
    }
}
