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

/// Candidates may hold this share of the hot budget (an eighth: at 8K tokens 23K rows, while
/// a steady step promotes ~6K).
const CANDIDATE_BUDGET_DIVISOR: usize = 8;

/// Freed hot slots worth more than this are given back to the allocator after a rebalance
/// (fewer are simply reused by the next step's promotions).
const COMPACT_FREE_BYTES: usize = 1 << 20;

/// A row competing for the hot pool after a step: hot already, or a candidate.
pub(super) struct RowCandidate {
    /// Decode steps that selected it.
    hits: u32,
    hot: bool,
    token: u32,
    lane: u32,
    /// For a candidate, its slot in [`Candidates`].
    slot: u32,
}

/// The cold rows one step read that may enter the hot pool, with their K and V rows.
#[derive(Default)]
pub(super) struct Candidates {
    row_words: usize,
    max_rows: usize,
    /// The fewest hits among the rows the last rebalance kept when the pool was full (0 when
    /// everything fit). A row with fewer cannot win a place: hits only grow, and a hot row
    /// wins a tie.
    cutoff: u32,
    /// `[slot]`: (lane, token, hits).
    rows: Vec<(u32, u32, u32)>,
    k: Vec<u16>,
    v: Vec<u16>,
    /// The weakest candidate on top, by the rebalance's order (hits, then the newer token).
    weakest: BinaryHeap<Reverse<(u32, u32, u32)>>,
}

impl Candidates {
    pub fn new(row_words: usize, hot_budget_bytes: usize) -> Self {
        let max_rows = hot_budget_bytes / CANDIDATE_BUDGET_DIVISOR / (2 * 2 * row_words);
        Self { row_words, max_rows, ..Self::default() }
    }

    /// A cold row the step read, with its hits counting this step.
    pub fn offer(&mut self, lane: usize, token: u32, hits: u32, k: &[u16], v: &[u16]) {
        if hits < self.cutoff || self.max_rows == 0 {
            return;
        }
        let rw = self.row_words;
        let slot = if self.rows.len() < self.max_rows {
            self.rows.push((0, 0, 0));
            self.k.extend_from_slice(k);
            self.v.extend_from_slice(v);
            self.rows.len() - 1
        } else {
            match self.weakest.peek() {
                Some(&Reverse((h, t, slot))) if (hits, token) > (h, t) => {
                    self.weakest.pop();
                    self.k[slot as usize * rw..][..rw].copy_from_slice(k);
                    self.v[slot as usize * rw..][..rw].copy_from_slice(v);
                    slot as usize
                }
                _ => return,
            }
        };
        self.rows[slot] = (lane as u32, token, hits);
        self.weakest.push(Reverse((hits, token, slot as u32)));
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u32, u32, u32)>();
        2 * (self.k.capacity() + self.v.capacity()) + (self.rows.capacity() + self.weakest.capacity()) * entry
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
    /// Decides which rows the hot pool keeps after a step: of the unpinned hot rows and the
    /// candidates, the most-selected ones that fit the budget (a hot row wins a tie, so equals
    /// do not swap places). A candidate that does not make the cut is not promoted, and a hot
    /// row that falls out is demoted; demotion needs no I/O, as every row is already on the
    /// SSD. Ranking promotions against the hot rows, instead of promoting every fetched row
    /// and evicting others for it, is what keeps the pools from ping-ponging.
    pub(super) fn rebalance(&mut self) {
        let n_kv = self.shape.n_kv_heads;
        let row_bytes = self.hot.row_bytes();
        let candidates = std::mem::take(&mut self.candidates);
        if self.hot_bytes() + candidates.len() * row_bytes <= self.settings.hot_budget_bytes {
            // Everything fits: promote all, rank nothing.
            for slot in 0..candidates.len() {
                let (lane, token, k, v) = candidates.row(slot);
                self.hot.insert(lane, token, k, v);
            }
            self.tier.promotions += candidates.len() as u64;
            self.candidates = Candidates { cutoff: 0, ..candidates };
            self.candidates.clear();
            return;
        }
        // Reused across steps: at 8K tokens this holds ~100K rows, too big to allocate per step.
        let mut rows = std::mem::take(&mut self.rebalance_rows);
        rows.clear();
        for lane in self.settings.dense_layers * n_kv..self.hits.len() {
            let layer = lane / n_kv;
            let hits = |t: u32| self.hits[lane].get(t as usize).copied().unwrap_or(0);
            let (lane_id, pinned) = (lane as u32, |t: u32| self.is_pinned(layer, t));
            rows.extend(self.hot.tokens(lane).filter(|&t| !pinned(t)).map(|t| RowCandidate { hits: hits(t), hot: true, token: t, lane: lane_id, slot: 0 }));
        }
        rows.extend(candidates.rows.iter().enumerate().map(|(slot, &(lane, token, hits))| RowCandidate { hits, hot: false, token, lane, slot: slot as u32 }));
        let unpinned_hot = rows.len() - candidates.len();
        let fixed = self.hot_bytes() - unpinned_hot * row_bytes;
        let capacity = self.settings.hot_budget_bytes.saturating_sub(fixed) / row_bytes;
        if rows.len() > capacity {
            // Best first: most hits, then already hot, then the newest token.
            rows.select_nth_unstable_by_key(capacity, |r| Reverse((r.hits, r.hot, r.token)));
        }
        let (kept, dropped) = rows.split_at(capacity.min(rows.len()));
        let cutoff = if dropped.is_empty() { 0 } else { kept.iter().map(|r| r.hits).min().unwrap_or(0) };
        // Demotions first, so that promotions reuse their slots.
        for r in dropped.iter().filter(|r| r.hot) {
            self.hot.remove(r.lane as usize, r.token);
            self.tier.demotions += 1;
        }
        for r in kept.iter().filter(|r| !r.hot) {
            let (lane, token, k, v) = candidates.row(r.slot as usize);
            self.hot.insert(lane, token, k, v);
            self.tier.promotions += 1;
        }
        if self.hot.free_bytes() > COMPACT_FREE_BYTES {
            self.hot.compact();
        }
        self.rebalance_rows = rows;
        self.candidates = Candidates { cutoff, ..candidates };
        self.candidates.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_keep_the_best_within_their_share_and_skip_hopeless_rows() {
        // One f16 word per K/V row: 4 bytes a row; a 64-byte budget allows 2 candidates.
        let mut c = Candidates::new(1, 64);
        c.offer(0, 10, 3, &[10], &[110]);
        c.offer(1, 11, 5, &[11], &[111]);
        c.offer(0, 12, 1, &[12], &[112]); // weaker than both: not kept
        c.offer(2, 13, 4, &[13], &[113]); // replaces token 10
        let mut held: Vec<_> = (0..c.len()).map(|s| c.row(s)).map(|(l, t, k, v)| (l, t, k[0], v[0])).collect();
        held.sort_unstable();
        assert_eq!(held, vec![(1, 11, 11, 111), (2, 13, 13, 113)]);
        // The newer token wins a tie in hits.
        c.offer(3, 20, 4, &[20], &[120]);
        let mut tokens: Vec<u32> = (0..c.len()).map(|s| c.row(s).1).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, vec![11, 20]);

        c.clear();
        c.cutoff = 4;
        c.offer(0, 30, 3, &[30], &[130]);
        assert_eq!(c.len(), 0, "below the cutoff a row cannot win a place");
        c.offer(0, 31, 4, &[31], &[131]);
        assert_eq!(c.len(), 1);
    }
}
