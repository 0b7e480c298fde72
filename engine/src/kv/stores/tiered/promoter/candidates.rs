//! Promotion candidates: the cold rows a step read that may enter the hot pool.
//!
//! Their K/V must be kept until the step ends, because the read buffers are reused layer by
//! layer. At 8K tokens a step reads ~90K cold rows (23 MB), so [`Candidates`] keeps only those
//! that can still win a place, and at most a fixed share of the budget of them, best first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Candidates may hold this share of the hot budget, which sets it aside for them (a
/// thirty-second: at 8K tokens 5.7K rows and at 32K 12.3K, while a steady step promotes ~2.6K
/// at either). Candidates are kept best first in the rebalance's own order, so the cap changes
/// nothing as long as a step promotes fewer rows than it holds.
const CANDIDATE_BUDGET_DIVISOR: usize = 32;

/// A row's place in the rebalance's ranking, best highest: most hits, then already hot (a hot
/// row wins a tie, so equals do not swap places), then the later cold-pool slot (see
/// `hot_rank` in [`super`]).
pub(super) fn rank_key(hits: u32, hot: bool, slot: u32) -> u64 {
    (u64::from(hits) << 33) | (u64::from(hot) << 32) | u64::from(slot)
}

/// The hits a rank key was made with.
pub(super) fn level_hits(key: u64) -> u32 {
    (key >> 33) as u32
}

/// The cold rows one step read that may enter the hot pool, with their K and V rows.
#[derive(Default)]
pub(super) struct Candidates {
    row_words: usize,
    max_rows: usize,
    /// The hits of the weakest hot row when the last rebalance left the pool full (0 when it
    /// had room). A row with fewer cannot win a place: hits only grow, and a hot row wins a tie.
    cutoff: u32,
    /// `[slot]`: (lane, token, rank key).
    rows: Vec<(u32, u32, u64)>,
    k: Vec<u16>,
    v: Vec<u16>,
    /// The weakest candidate on top, by its rank key, with its slot.
    weakest: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Candidates {
    pub fn new(row_words: usize, hot_budget_bytes: usize) -> Self {
        let max_rows = hot_budget_bytes / CANDIDATE_BUDGET_DIVISOR / (2 * 2 * row_words);
        Self { row_words, max_rows, ..Self::default() }
    }

    /// Whether a row ranked `key` could be taken now: [`Candidates::offer`] turns away the
    /// rest at once, so they need not be offered. Once the candidates are full the bar only
    /// rises, so a row that fails it now would fail it later too: the step's readers ask this
    /// in parallel, and only the rows that pass reach the serial offers.
    pub fn may_take(&self, key: u64) -> bool {
        let room =
            self.rows.len() < self.max_rows || self.weakest.peek().is_some_and(|&Reverse((weakest, _))| key > weakest);
        self.max_rows > 0 && level_hits(key) >= self.cutoff && room
    }

    /// A cold row the step read, ranked `key` ([`rank_key`], with its hits counting this step).
    pub fn offer(&mut self, lane: usize, token: u32, key: u64, k: &[u16], v: &[u16]) {
        if !self.may_take(key) {
            return;
        }
        let rw = self.row_words;
        if self.rows.capacity() == 0 {
            // Once, exactly: grown by doubling, the buffers would settle at up to twice the
            // share of the budget they are allowed.
            self.rows.reserve_exact(self.max_rows);
            self.k.reserve_exact(self.max_rows * rw);
            self.v.reserve_exact(self.max_rows * rw);
            self.weakest.reserve_exact(self.max_rows);
        }
        let slot = if self.rows.len() < self.max_rows {
            self.rows.push((0, 0, 0));
            self.k.extend_from_slice(k);
            self.v.extend_from_slice(v);
            self.rows.len() - 1
        } else {
            // Full, and `may_take` found the weakest candidate below `key`: it makes room.
            let Reverse((_, slot)) = self.weakest.pop().expect("full candidates have a weakest");
            self.k[slot as usize * rw..][..rw].copy_from_slice(k);
            self.v[slot as usize * rw..][..rw].copy_from_slice(v);
            slot as usize
        };
        self.rows[slot] = (lane as u32, token, key);
        self.weakest.push(Reverse((key, slot as u32)));
    }

    pub fn bytes(&self) -> usize {
        self.rows.capacity() * self.bytes_per_row()
    }

    /// What they hold once the first is offered (their buffers are reserved then, for good).
    pub fn max_bytes(&self) -> usize {
        self.max_rows * self.bytes_per_row()
    }

    /// A row's K and V, its entry and its place in the heap.
    fn bytes_per_row(&self) -> usize {
        2 * 2 * self.row_words + std::mem::size_of::<(u32, u32, u64)>() + std::mem::size_of::<Reverse<(u64, u32)>>()
    }

    /// The candidates' slots, best first, with their rank keys.
    pub fn best_first(&self) -> Vec<(u64, usize)> {
        let mut slots: Vec<(u64, usize)> = self.rows.iter().enumerate().map(|(slot, &(.., key))| (key, slot)).collect();
        slots.sort_unstable_by(|a, b| b.cmp(a));
        slots
    }

    /// The lane, token, K and V of the candidate in `slot`.
    pub fn row(&self, slot: usize) -> (usize, u32, &[u16], &[u16]) {
        let rw = self.row_words;
        let (lane, token, _) = self.rows[slot];
        (lane as usize, token, &self.k[slot * rw..][..rw], &self.v[slot * rw..][..rw])
    }

    /// Forgets the candidates and the cutoff (the sequence was truncated).
    pub fn reset(&mut self) {
        self.clear();
        self.cutoff = 0;
    }

    #[cfg(test)]
    pub fn cutoff(&self) -> u32 {
        self.cutoff
    }

    /// Rows with fewer hits than `cutoff` cannot win a place next step (see `cutoff`).
    pub fn set_cutoff(&mut self, cutoff: u32) {
        self.cutoff = cutoff;
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.k.clear();
        self.v.clear();
        self.weakest.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_keep_the_best_within_their_share_and_skip_hopeless_rows() {
        // One f16 word per K/V row: 4 bytes a row; a 256-byte budget allows 2 candidates.
        let mut c = Candidates::new(1, 256);
        let key = |hits: u32, token: u32| rank_key(hits, false, token);
        c.offer(0, 10, key(3, 10), &[10], &[110]);
        c.offer(1, 11, key(5, 11), &[11], &[111]);
        c.offer(0, 12, key(1, 12), &[12], &[112]); // weaker than both: not kept
        c.offer(2, 13, key(4, 13), &[13], &[113]); // replaces token 10
        let mut held: Vec<_> = (0..c.rows.len()).map(|s| c.row(s)).map(|(l, t, k, v)| (l, t, k[0], v[0])).collect();
        held.sort_unstable();
        assert_eq!(held, vec![(1, 11, 11, 111), (2, 13, 13, 113)]);
        // The later slot wins a tie in hits.
        c.offer(3, 20, key(4, 20), &[20], &[120]);
        let mut tokens: Vec<u32> = (0..c.rows.len()).map(|s| c.row(s).1).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, vec![11, 20]);

        c.clear();
        c.cutoff = 4;
        c.offer(0, 30, key(3, 30), &[30], &[130]);
        assert_eq!(c.rows.len(), 0, "below the cutoff a row cannot win a place");
        c.offer(0, 31, key(4, 31), &[31], &[131]);
        assert_eq!(c.rows.len(), 1);
    }

    #[test]
    fn a_row_may_be_taken_exactly_when_an_offer_would_keep_it() {
        let mut c = Candidates::new(1, 256); // room for 2
        let key = |hits: u32, token: u32| rank_key(hits, false, token);
        for (hits, token) in [(3, 1), (5, 2), (1, 3), (4, 4), (4, 5), (6, 6), (2, 7)] {
            let before: Vec<u64> = c.rows.iter().map(|r| r.2).collect();
            let may = c.may_take(key(hits, token));
            c.offer(0, token, key(hits, token), &[0], &[0]);
            let kept = c.rows.iter().any(|r| r.1 == token);
            assert_eq!(may, kept, "token {token} with {hits} hits, candidates ranked {before:?}");
        }
    }
}
