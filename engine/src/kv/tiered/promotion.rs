//! Promotion and demotion: after each decode step the hot pool keeps the most-selected of its
//! unpinned rows and of the cold rows the step read, within the byte budget.
//!
//! The cold rows read in a step are the promotion candidates; their K/V must be kept until the
//! step ends, because the read buffers are reused layer by layer. At 8K tokens a step reads
//! ~90K cold rows (23 MB), so [`Candidates`] keeps only those that can still win a place, and
//! at most a fixed share of the budget of them, best first.

use super::TieredKvStore;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Candidates may hold this share of the hot budget (a thirty-second: at 8K tokens 5.7K rows
/// and at 32K 12.3K, while a steady step promotes ~2.6K at either). Candidates are kept best
/// first in the rebalance's own order, so the cap changes nothing as long as a step promotes
/// fewer rows than it holds.
const CANDIDATE_BUDGET_DIVISOR: usize = 32;

/// Freed hot slots worth more than this are given back to the allocator after a rebalance
/// (fewer are simply reused by the next step's promotions).
const COMPACT_FREE_BYTES: usize = 1 << 20;

/// A row's place in the rebalance's ranking, best highest: most hits, then already hot (a hot
/// row wins a tie, so equals do not swap places), then the later cold-pool slot (see
/// [`TieredKvStore::hot_rank`]).
pub(super) fn rank_key(hits: u32, hot: bool, slot: u32) -> u64 {
    (u64::from(hits) << 33) | (u64::from(hot) << 32) | u64::from(slot)
}

/// The hits a rank key was made with.
fn level_hits(key: u64) -> u32 {
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

    /// Whether a row ranked `key` could be taken: [`Candidates::offer`] turns away the rest
    /// at once, so they need not be offered.
    pub fn may_take(&self, key: u64) -> bool {
        self.max_rows > 0 && level_hits(key) >= self.cutoff
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
            match self.weakest.peek() {
                Some(&Reverse((weakest, slot))) if key > weakest => {
                    self.weakest.pop();
                    self.k[slot as usize * rw..][..rw].copy_from_slice(k);
                    self.v[slot as usize * rw..][..rw].copy_from_slice(v);
                    slot as usize
                }
                _ => return,
            }
        };
        self.rows[slot] = (lane as u32, token, key);
        self.weakest.push(Reverse((key, slot as u32)));
    }

    pub fn bytes(&self) -> usize {
        let (row, heap_entry) = (std::mem::size_of::<(u32, u32, u64)>(), std::mem::size_of::<Reverse<(u64, u32)>>());
        2 * (self.k.capacity() + self.v.capacity()) + self.rows.capacity() * row + self.weakest.capacity() * heap_entry
    }

    fn row(&self, slot: usize) -> (usize, u32, &[u16], &[u16]) {
        let rw = self.row_words;
        let (lane, token, _) = self.rows[slot];
        (lane as usize, token, &self.k[slot * rw..][..rw], &self.v[slot * rw..][..rw])
    }

    /// Forgets the candidates and the cutoff (the sequence was truncated).
    pub fn reset(&mut self) {
        self.clear();
        self.cutoff = 0;
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.k.clear();
        self.v.clear();
        self.weakest.clear();
    }
}

impl TieredKvStore {
    /// The rank key of hot `token`'s row in `lane` ([`rank_key`]). Equals are ordered by
    /// cold-pool slot, not by token: tokens that share a page then rise and fall together, so
    /// the hot pool holds whole pages rather than some rows of each, and a page whose rows are
    /// all hot is never read (slots keep the order of the 256-token blocks, so newer blocks
    /// still win).
    pub(super) fn hot_rank(&self, lane: usize, token: u32) -> u64 {
        rank_key(self.hits_of(lane, token), true, self.backing.lane_slot(lane, token as usize) as u32)
    }

    /// Decides which rows the hot pool keeps after a step: of the unpinned hot rows and the
    /// candidates, the most-selected ones that fit the budget (a hot row wins a tie, so equals
    /// do not swap places). Candidates go best first into free room, then into the places of
    /// weaker hot rows, which are demoted (the weakest first, from the reserve in
    /// [`super::demotion`]); demotion needs no I/O, as every row is already on the SSD.
    /// Ranking promotions against the hot rows, instead of promoting every fetched row and
    /// evicting others for it, is what keeps the pools from ping-ponging.
    pub(super) fn rebalance(&mut self) {
        let (row_bytes, budget) = (self.hot.row_bytes(), self.settings.hot_budget_bytes);
        self.offer_newly_unpinned_rows();
        // Scoring keys and the write-back window: what the rows share the budget with.
        let fixed = self.hot_bytes() - self.hot.bytes();
        // The pinned rows grew (this step's tokens): make room for them first.
        while fixed + self.hot.bytes() > budget && self.demote_weakest_below(u64::MAX) {}
        let candidates = std::mem::take(&mut self.candidates);
        let mut best_first: Vec<(u64, usize)> = candidates.rows.iter().enumerate().map(|(slot, &(.., key))| (key, slot)).collect();
        best_first.sort_unstable_by(|a, b| b.cmp(a));
        for (key, slot) in best_first {
            if fixed + self.hot.bytes() + row_bytes > budget && !self.demote_weakest_below(key) {
                break; // every hot row outranks this candidate, and so the ones after it
            }
            self.promote(&candidates, slot);
        }
        // No row with fewer hits than the weakest hot row can win a place next step.
        let full = fixed + self.hot.bytes() + row_bytes > budget;
        let cutoff = if full { self.weakest_hot_row().map_or(0, |(key, ..)| level_hits(key)) } else { 0 };
        if self.hot.free_bytes() > COMPACT_FREE_BYTES {
            self.hot.compact();
        }
        self.candidates = Candidates { cutoff, ..candidates };
        self.candidates.clear();
    }

    /// Offers the demotion reserve the hot rows that left the recent window since the last
    /// rebalance (rows in the write-back window are not hot yet: they are offered once spilled).
    fn offer_newly_unpinned_rows(&mut self) {
        let unpinned = self.unpinned_tokens();
        let end = unpinned.end.min(self.backing.cold_end() as u32);
        let start = (self.unpinned_end as u32).max(unpinned.start).min(end);
        for lane in self.sparse_lanes() {
            for t in start..end {
                if self.hot.contains(lane, t) {
                    self.weakest.offer(self.hot_rank(lane, t), lane, t);
                }
            }
        }
        self.unpinned_end = end as usize;
    }

    /// Demotes the weakest unpinned hot row if it ranks below `key`; false when none does.
    fn demote_weakest_below(&mut self, key: u64) -> bool {
        match self.weakest_hot_row() {
            Some((weakest, lane, token)) if weakest < key => {
                self.weakest.take_weakest();
                self.hot.remove(lane, token);
                self.tier.demotions += 1;
                true
            }
            _ => false,
        }
    }

    fn promote(&mut self, candidates: &Candidates, slot: usize) {
        let (lane, token, k, v) = candidates.row(slot);
        self.hot.insert(lane, token, k, v);
        self.weakest.offer(self.hot_rank(lane, token), lane, token);
        self.tier.promotions += 1;
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
}
