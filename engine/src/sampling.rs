//! Choosing the next token from logits: penalties, then temperature, top-k, top-p and min-p
//! filtering, then a seeded draw (or argmax when the temperature is zero).

use crate::error::{Error, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// llama.cpp-style: positive logits divided, negative multiplied. 1 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// OpenAI-style: subtracted once from the logit of any token already generated.
    pub presence_penalty: f32,
    /// OpenAI-style: subtracted per occurrence.
    pub frequency_penalty: f32,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.1,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, repeat_penalty: 1.0, ..Self::default() }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidParameter(m.to_string()));
        if !(0.0..=100.0).contains(&self.temperature) || self.temperature.is_nan() {
            return bad("temperature must be between 0 and 100");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad("repeat_penalty must be positive");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) || !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("presence_penalty and frequency_penalty must be between -2 and 2");
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Ok(Self { params, rng })
    }

    /// Picks a token. `recent` holds the tokens penalties apply to (prompt tail and output);
    /// `generated` the output alone (presence/frequency penalties).
    pub fn sample(&mut self, logits: &mut [f32], recent: &[u32], generated: &[u32]) -> u32 {
        self.apply_penalties(logits, recent, generated);
        if self.params.temperature == 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        let best_first = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        if self.params.top_k > 0 && self.params.top_k < candidates.len() {
            // Partition out the top k first: sorting the whole vocabulary costs more than the
            // rest of a small model's decode step.
            candidates.select_nth_unstable_by(self.params.top_k - 1, best_first);
            candidates.truncate(self.params.top_k);
        }
        candidates.sort_unstable_by(best_first);
        // Softmax at the temperature over the survivors.
        let max = candidates[0].1;
        let mut probs: Vec<f32> = candidates.iter().map(|c| ((c.1 - max) / self.params.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut keep = probs.len();
        if self.params.top_p < 1.0 {
            let mut cumulative = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cumulative += p;
                if cumulative >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.params.min_p > 0.0 {
            let floor = probs[0] * self.params.min_p;
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        let total: f32 = probs[..keep].iter().sum();
        let mut draw = self.rng.random::<f32>() * total;
        for (i, p) in probs[..keep].iter().enumerate() {
            draw -= p;
            if draw <= 0.0 {
                return candidates[i].0;
            }
        }
        candidates[keep - 1].0
    }

    fn apply_penalties(&self, logits: &mut [f32], recent: &[u32], generated: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty != 1.0 {
            let window = &recent[recent.len().saturating_sub(p.repeat_last_n)..];
            let mut seen = std::collections::HashSet::new();
            for &t in window {
                if seen.insert(t) {
                    if let Some(l) = logits.get_mut(t as usize) {
                        *l = if *l > 0.0 { *l / p.repeat_penalty } else { *l * p.repeat_penalty };
                    }
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts: HashMap<u32, usize> = HashMap::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &l)| if l > best.1 { (i, l) } else { best }).0
        as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[], &[]), 1);
    }

    #[test]
    fn same_seed_same_draws_and_filters_hold() {
        let params =
            SamplingParams { temperature: 1.0, top_k: 2, seed: Some(7), repeat_penalty: 1.0, ..Default::default() };
        let draw = |params: &SamplingParams| {
            let mut s = Sampler::new(params.clone()).unwrap();
            (0..50).map(|_| s.sample(&mut [1.0, 0.9, 0.8, 5.0], &[], &[])).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().all(|&t| t == 3 || t == 0), "top-k 2 keeps only the two best: {a:?}");
        // min-p 0.5 relative to a dominant token leaves only that token
        let strict = SamplingParams { min_p: 0.5, top_k: 0, ..params };
        assert!(draw(&strict).iter().all(|&t| t == 3));
    }

    #[test]
    fn penalties_push_repeated_tokens_down() {
        let params = SamplingParams { presence_penalty: 2.0, ..SamplingParams::greedy() };
        let mut s = Sampler::new(params).unwrap();
        assert_eq!(s.sample(&mut [1.0, 2.0], &[], &[1]), 0);
        let params = SamplingParams { repeat_penalty: 3.0, ..SamplingParams::greedy() };
        let mut s = Sampler::new(params).unwrap();
        assert_eq!(s.sample(&mut [1.0, 2.0], &[1], &[]), 0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        for bad in [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { presence_penalty: 3.0, ..Default::default() },
        ] {
            assert!(Sampler::new(bad).is_err());
        }
    }
}
