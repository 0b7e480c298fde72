//! Finished sequences kept for their prompt prefix. A chat client sends the whole conversation
//! every turn, and a follow-up question about a long document starts with that document: a new
//! request takes the kept sequence that shares the longest prefix with its prompt, and only the
//! rest of the prompt is run (the generation rolls the cache back to the shared prefix first).

use crate::generate::Sequence;

pub(super) struct PrefixCache {
    /// Least recently used first.
    idle: Vec<Sequence>,
    capacity: usize,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        Self { idle: Vec::new(), capacity }
    }

    /// The kept sequence sharing the longest prefix with `prompt`, taken out of the cache. Only
    /// a sequence that `prompt` mostly continues (at least half of its tokens shared) is taken:
    /// every chat shares a few template tokens, and an unrelated request must not cut a long
    /// cached conversation down to them.
    pub fn take(&mut self, prompt: &[u32]) -> Option<Sequence> {
        let shared = |seq: &Sequence| super::shared_prefix(&seq.tokens, prompt);
        let (best, _) = self
            .idle
            .iter()
            .enumerate()
            .map(|(i, s)| (i, shared(s)))
            .filter(|&(i, n)| n > 0 && 2 * n >= self.idle[i].tokens.len())
            .max_by_key(|&(_, n)| n)?;
        Some(self.idle.remove(best))
    }

    /// Keeps `seq`, dropping the least recently used beyond the capacity (with its memory and
    /// any cold-pool file).
    pub fn put(&mut self, seq: Sequence) {
        if self.capacity == 0 {
            return;
        }
        if self.idle.len() == self.capacity {
            self.idle.remove(0);
        }
        self.idle.push(seq);
    }

    pub fn sequences(&self) -> &[Sequence] {
        &self.idle
    }

    /// Each idle sequence's store lets go of what it keeps only for speed, if memory is short.
    pub fn trim(&mut self) {
        self.idle.iter_mut().for_each(|seq| seq.kv.trim());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{FullKvStore, KvShape};

    fn seq(tokens: &[u32]) -> Sequence {
        let shape = KvShape { n_layers: 1, n_kv_heads: 1, head_dim: 4, max_tokens: 16 };
        Sequence { kv: Box::new(FullKvStore::new(shape)), tokens: tokens.to_vec() }
    }

    #[test]
    fn the_longest_shared_prefix_wins_and_the_oldest_goes_first() {
        let mut cache = PrefixCache::new(2);
        cache.put(seq(&[1, 2, 3]));
        cache.put(seq(&[1, 2, 9, 9]));
        assert!(cache.take(&[7, 1, 2]).is_none(), "no shared prefix, nothing to reuse");
        cache.put(seq(&[1, 5, 6, 7, 8]));
        assert!(cache.take(&[1, 9]).is_none(), "one shared token of five does not make a continuation");
        assert_eq!(cache.take(&[1, 2, 9, 5]).unwrap().tokens, [1, 2, 9, 9]);
        cache.put(seq(&[4]));
        cache.put(seq(&[5])); // over capacity: the least recently kept go
        assert!(cache.take(&[1, 2, 3]).is_none() && cache.take(&[1, 5, 6, 7, 8]).is_none());
        assert_eq!(cache.sequences().len(), 2);
        assert!(PrefixCache::new(0).take(&[1]).is_none());
    }
}
