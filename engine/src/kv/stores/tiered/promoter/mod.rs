//! The tiered store's promoter: which rows its hot pool keeps in DRAM, from how often each token
//! was selected, and the moves that bring rows in and out (the pool itself only holds rows).
//!
//! After each decode step the hot pool keeps the most-selected of its unpinned rows and of the
//! cold rows the step read ([`candidates`]), within the byte budget; demotions come from a
//! reserve of the weakest rows ([`reserve`]). Pinned rows (dense layers, sinks, the recent
//! window) enter as they leave the write-back window and are never demoted while pinned.
//!
//! The promoter owns no file: what it needs to know of the cold pool (a row's slot there, which
//! orders equal ranks; where the pool ends; which tokens are pinned) comes in a [`Standing`].

mod candidates;
mod reserve;

use crate::kv::hot_pool::HotPool;
use candidates::{level_hits, rank_key, Candidates};
use reserve::WeakestRows;
use std::ops::Range;

/// Freed hot slots worth more than this are given back to the allocator after a rebalance
/// (fewer are simply reused by the next step's promotions).
const COMPACT_FREE_BYTES: usize = 1 << 20;

/// Where the rest of the store stands, as the promoter.s ranking needs it.
pub(super) struct Standing<'a> {
    /// A token's slot in its lane of the cold pool.
    pub slot: &'a dyn Fn(usize, u32) -> u32,
    /// Tokens whose rows are not pinned: past the sinks, before the recent window.
    pub unpinned: Range<u32>,
    /// Tokens from here on are still in the write-back window, not in the cold pool.
    pub cold_end: u32,
}

/// Promotions and demotions so far.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Moves {
    pub promotions: u64,
    pub demotions: u64,
}

pub(super) struct Promoter {
    /// Hot rows per lane (a layer's KV head: `layer * n_kv_heads + head`): heads select their
    /// own tokens, so each keeps its own.
    pool: HotPool,
    /// `[lane][token]`: how many decode steps selected the token (saturating: past 65,535
    /// steps a token's rank no longer needs the exact count).
    hits: Vec<Vec<u16>>,
    /// The hits of the step under way, `(lane, tokens)`, counted once it commits: a step that
    /// fails leaves the tables, and so every later ranking, as they were.
    step_hits: Vec<(usize, Vec<u32>)>,
    /// Cold rows read this step that may enter the hot pool.
    candidates: Candidates,
    /// The weakest unpinned hot rows, where demotions come from.
    weakest: WeakestRows,
    /// Tokens below this had left the recent window (and the write-back window) at the last
    /// rebalance: their hot rows have been offered to `weakest`.
    unpinned_end: u32,
    /// Lanes of the layers that select tokens (the dense ones keep every row hot).
    sparse_lanes: Range<usize>,
    moves: Moves,
}

impl Promoter {
    /// A promoter for `lanes` lanes of `row_words`-word rows, of which `sparse_lanes` select tokens,
    /// holding at most `budget_bytes` of rows.
    pub fn new(
        lanes: usize,
        sparse_lanes: Range<usize>,
        row_words: usize,
        budget_bytes: usize,
        max_tokens: usize,
    ) -> Self {
        Self {
            pool: HotPool::new(lanes, row_words, (budget_bytes / (4 * row_words)).min(lanes * max_tokens)),
            hits: vec![Vec::new(); lanes],
            step_hits: Vec::new(),
            candidates: Candidates::new(row_words, budget_bytes),
            weakest: WeakestRows::default(),
            unpinned_end: 0,
            sparse_lanes,
            moves: Moves::default(),
        }
    }

    /// The rows held, for reading.
    pub fn pool(&self) -> &HotPool {
        &self.pool
    }

    pub fn moves(&self) -> Moves {
        self.moves
    }

    /// A pinned row leaving the write-back window for the cold pool: it stays hot.
    pub fn keep_pinned(&mut self, lane: usize, token: u32, k: &[u16], v: &[u16]) {
        self.pool.insert(lane, token, k, v);
    }

    /// Every lane's hit table, `[lane][token]`.
    pub fn hits(&self) -> &[Vec<u16>] {
        &self.hits
    }

    /// A hit in `lane` for each of `tokens`, counted when the step commits.
    pub fn count_hits(&mut self, lane: usize, tokens: &[u32]) {
        self.step_hits.push((lane, tokens.to_vec()));
    }

    /// The step committed: its hits count, and every hit table holds `n_tokens` tokens (the
    /// step's new ones with none).
    pub fn commit_hits(&mut self, n_tokens: usize) {
        for hits in &mut self.hits {
            hits.resize(n_tokens, 0);
        }
        for (lane, tokens) in self.step_hits.drain(..) {
            let hits = &mut self.hits[lane];
            for t in tokens {
                hits[t as usize] = hits[t as usize].saturating_add(1);
            }
        }
    }

    /// The rank key of a cold row of `lane` just read, at cold-pool `slot`, counting this
    /// step's hit (which is observed after attention); `None` when it cannot win a place, so
    /// that it need not be offered. The compute threads may share it.
    pub fn candidate_key(&self, lane: usize, token: u32, slot: u32) -> Option<u64> {
        let hits = self.hits[lane].get(token as usize).map_or(1, |&h| u32::from(h) + 1);
        let key = rank_key(hits, false, slot);
        self.candidates.may_take(key).then_some(key)
    }

    /// A cold row the step read, ranked `key` by [`Promoter::candidate_key`].
    pub fn offer(&mut self, lane: usize, token: u32, key: u64, k: &[u16], v: &[u16]) {
        self.candidates.offer(lane, token, key, k, v);
    }

    /// Decides which rows the pool keeps after a step: of the unpinned hot rows and the
    /// candidates, the most-selected ones that fit `budget_bytes` beside `fixed_bytes` of other
    /// memory and the candidates' share (a hot row wins a tie, so equals do not swap places). Candidates go best first into
    /// free room, then into the places of weaker hot rows, which are demoted (the weakest first,
    /// from the reserve); demotion needs no I/O, as every row is already in the cold pool.
    /// Ranking promotions against the hot rows, instead of promoting every fetched row and
    /// evicting others for it, is what keeps the tiers from ping-ponging.
    pub fn rebalance(&mut self, standing: &Standing<'_>, budget_bytes: usize, fixed_bytes: usize) {
        let row_bytes = self.pool.row_bytes();
        // The candidates' share is set aside whether or not this step filled it.
        let fixed_bytes = fixed_bytes + self.candidates.max_bytes();
        self.offer_newly_unpinned_rows(standing);
        // The pinned rows grew (this step's tokens): make room for them first.
        while fixed_bytes + self.pool.bytes() > budget_bytes && self.demote_weakest_below(standing, u64::MAX) {}
        let candidates = std::mem::take(&mut self.candidates);
        for (key, slot) in candidates.best_first() {
            if fixed_bytes + self.pool.bytes() + row_bytes > budget_bytes && !self.demote_weakest_below(standing, key) {
                break; // every hot row outranks this candidate, and so the ones after it
            }
            let (lane, token, k, v) = candidates.row(slot);
            self.pool.insert(lane, token, k, v);
            self.weakest.offer(hot_rank(&self.hits, standing, lane, token), lane, token);
            self.moves.promotions += 1;
        }
        // No row with fewer hits than the weakest hot row can win a place next step.
        let full = fixed_bytes + self.pool.bytes() + row_bytes > budget_bytes;
        let cutoff = if full { self.weakest_hot_row(standing).map_or(0, |(key, ..)| level_hits(key)) } else { 0 };
        if self.pool.free_bytes() > COMPACT_FREE_BYTES {
            self.pool.compact();
        }
        self.candidates = candidates;
        self.candidates.clear();
        self.candidates.set_cutoff(cutoff);
    }

    /// The cold pool was re-placed: rows moved to other slots, which order equal ranks, so the
    /// reserve is ranked anew.
    pub fn slots_moved(&mut self) {
        self.weakest.reset();
    }

    /// Cuts the promoter to `n_tokens` tokens and forgets the step's hits and candidates. A failed
    /// step cuts nothing it had committed: then the promoter is exactly as that step found it.
    pub fn truncate(&mut self, n_tokens: usize) {
        self.step_hits.clear();
        if self.hits.first().is_none_or(|hits| n_tokens >= hits.len()) {
            self.candidates.clear();
            // Rows a failed commit kept as they left the window, if its spill failed late.
            self.pool.truncate(n_tokens);
            return;
        }
        self.candidates.reset();
        self.weakest.reset();
        self.unpinned_end = self.unpinned_end.min(n_tokens as u32);
        for hits in &mut self.hits {
            hits.truncate(n_tokens);
        }
        self.pool.truncate(n_tokens);
        self.pool.compact();
    }

    /// Memory for the rows and the candidates, counted against the budget.
    pub fn bytes(&self) -> usize {
        self.pool.bytes() + self.candidates.bytes()
    }

    /// Memory beside them: the pool's index, the hit tables and the reserve.
    pub fn bookkeeping_bytes(&self) -> usize {
        let hits: usize = self.hits.iter().map(|h| 2 * h.capacity()).sum();
        self.pool.index_bytes() + hits + self.weakest.bytes()
    }

    /// Offers the demotion reserve the hot rows that left the recent window since the last
    /// rebalance (rows in the write-back window are not hot yet: they are offered once spilled).
    fn offer_newly_unpinned_rows(&mut self, standing: &Standing<'_>) {
        let end = standing.unpinned.end.min(standing.cold_end);
        let start = self.unpinned_end.max(standing.unpinned.start).min(end);
        for lane in self.sparse_lanes.clone() {
            for t in start..end {
                if self.pool.contains(lane, t) {
                    self.weakest.offer(hot_rank(&self.hits, standing, lane, t), lane, t);
                }
            }
        }
        self.unpinned_end = end;
    }

    /// Demotes the weakest unpinned hot row if it ranks below `key`; false when none does.
    fn demote_weakest_below(&mut self, standing: &Standing<'_>, key: u64) -> bool {
        match self.weakest_hot_row(standing) {
            Some((weakest, lane, token)) if weakest < key => {
                self.weakest.take_weakest();
                self.pool.remove(lane, token);
                self.moves.demotions += 1;
                true
            }
            _ => false,
        }
    }

    /// The weakest unpinned hot row (key, lane, token), refilling the reserve if it ran out.
    fn weakest_hot_row(&mut self, standing: &Standing<'_>) -> Option<(u64, usize, u32)> {
        for refill in [false, true] {
            if refill {
                let (pool, hits, lanes) = (&self.pool, &self.hits, self.sparse_lanes.clone());
                // A plain loop: with a large pool a refill walks ~700K rows three times.
                self.weakest.refill(|f| {
                    for lane in lanes.clone() {
                        for t in pool.tokens(lane).filter(|t| standing.unpinned.contains(t)) {
                            f(lane, t, hot_rank(hits, standing, lane, t));
                        }
                    }
                });
            }
            let (pool, hits) = (&self.pool, &self.hits);
            let rank_now = |lane: usize, t: u32| pool.contains(lane, t).then(|| hot_rank(hits, standing, lane, t));
            if let Some(row) = self.weakest.weakest(rank_now) {
                return Some(row);
            }
        }
        None
    }
}

/// The rank key of hot `token`'s row in `lane` ([`rank_key`]), from the `hits` tables. Equals
/// are ordered by cold-pool slot, not by token: tokens that share a page then rise and fall
/// together, so the hot pool holds whole pages rather than some rows of each, and a page whose
/// rows are all hot is never read (slots keep the order of the 256-token blocks, so newer blocks
/// still win).
fn hot_rank(hits: &[Vec<u16>], standing: &Standing<'_>, lane: usize, token: u32) -> u64 {
    rank_key(hits_at(&hits[lane], token), true, (standing.slot)(lane, token))
}

/// A token's hits in one lane's hit table (tokens past its end have none yet).
fn hits_at(hits: &[u16], token: u32) -> u32 {
    hits.get(token as usize).map_or(0, |&h| u32::from(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_leaves_the_hits_and_the_cutoff_as_they_were() {
        let standing = |n: u32| (move |_: usize, t: u32| t, 0..n, n);
        // Two lanes of one-word rows (4 bytes each); room for eight candidates, and the
        // rebalance's budget holds two hot rows beside the candidates' share.
        let mut promoter = Promoter::new(2, 0..2, 1, 8 * 32 * 4, 64);
        let rebalance = |promoter: &mut Promoter, n: u32| {
            let (slot, unpinned, cold_end) = standing(n);
            let budget = 2 * 4 + promoter.candidates.max_bytes();
            promoter.rebalance(&Standing { slot: &slot, unpinned, cold_end }, budget, 0);
        };
        for token in 0..3u32 {
            promoter.count_hits(0, &[token, token, token][..token as usize + 1]);
        }
        promoter.commit_hits(8);
        for token in 0..3u32 {
            promoter.offer(0, token, rank_key(token + 1, false, token), &[token as u16], &[0]);
        }
        rebalance(&mut promoter, 8);
        let (hits, cutoff) = (promoter.hits().to_vec(), promoter.candidates.cutoff());
        assert!(cutoff > 0, "the pool is full, so weaker rows cannot win a place");

        // A step counts hits and offers rows, then fails: nothing it did may remain.
        promoter.count_hits(0, &[1, 2]);
        promoter.count_hits(1, &[5]);
        promoter.offer(1, 5, rank_key(9, false, 5), &[5], &[0]);
        promoter.truncate(8);
        promoter.commit_hits(8);
        assert_eq!(promoter.hits(), &hits[..], "the failed step's hits were counted");
        assert_eq!(promoter.candidates.cutoff(), cutoff, "the failed step reset the cutoff");
        assert!(promoter.candidates.best_first().is_empty(), "the failed step's candidates stayed");

        // Cutting committed tokens is a different matter: the promoter starts that part afresh.
        promoter.truncate(2);
        assert_eq!(promoter.candidates.cutoff(), 0);
        assert!(promoter.hits().iter().all(|h| h.len() <= 2));
    }
}
