//! Merging score blocks into the global top-k as they arrive, without waiting for the rest.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// (position, score) pairs for a chunk of tokens, as an evaluator emits them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreBlock {
    pub tokens: Vec<u32>,
    pub scores: Vec<f32>,
}

/// A score with a total order (NaN sorts lowest), for the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ranked(f32);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let key = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
        key(self.0).total_cmp(&key(other.0))
    }
}

/// The k best tokens seen so far (a min-heap of size k).
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<(Ranked, u32)>>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self { k, heap: BinaryHeap::with_capacity(k + 1) }
    }

    pub fn merge(&mut self, block: &ScoreBlock) {
        if self.k == 0 {
            return;
        }
        for (&t, &s) in block.tokens.iter().zip(&block.scores) {
            let entry = Reverse((Ranked(s), t));
            if self.heap.len() < self.k {
                self.heap.push(entry);
            } else if self.heap.peek().is_some_and(|worst| entry < *worst) {
                self.heap.pop();
                self.heap.push(entry);
            }
        }
    }

    /// The chosen tokens, ascending.
    pub fn into_tokens(self) -> Vec<u32> {
        let mut tokens: Vec<u32> = self.heap.into_iter().map(|Reverse((_, t))| t).collect();
        tokens.sort_unstable();
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_in_any_order_give_the_global_top_k() {
        let scores: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1009) as f32).collect();
        let mut want: Vec<u32> = (0..1000u32).collect();
        want.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        let mut want = want[..50].to_vec();
        want.sort_unstable();
        let mut top = TopK::new(50);
        for (start, end) in [(700, 1000), (0, 256), (256, 512), (512, 700)] {
            top.merge(&ScoreBlock { tokens: (start as u32..end as u32).collect(), scores: scores[start..end].to_vec() });
        }
        assert_eq!(top.into_tokens(), want);
    }
}
