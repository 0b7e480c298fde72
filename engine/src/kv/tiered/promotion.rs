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

/// Candidates may hold this share of the hot budget (a sixteenth: at 8K tokens 11.5K rows,
/// while a steady step promotes ~2.6K). Candidates are kept best first in the rebalance's own
/// order, so the cap changes nothing as long as a step promotes fewer rows than it holds.
const CANDIDATE_BUDGET_DIVISOR: usize = 16;

/// Freed hot slots worth more than this are given back to the allocator after a rebalance
/// (fewer are simply reused by the next step's promotions).
const COMPACT_FREE_BYTES: usize = 1 << 20;

/// A row's place in the rebalance's ranking, best highest: most hits, then already hot (a hot
/// row wins a tie, so equals do not swap places), then the newest token.
fn rank_key(hits: u32, hot: bool, token: u32) -> u64 {
    (u64::from(hits) << 33) | (u64::from(hot) << 32) | u64::from(token)
}

/// Where the ranking is cut to keep the best `capacity` rows: every row ranked above `key`, and
/// the first `ties` rows met that are ranked exactly `key` (rows of different lanes can be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    key: u64,
    ties: usize,
}

impl Cut {
    /// The cut that keeps the best `capacity` rows, given how many each level (a rank key's upper
    /// half: hits and hot) holds and, for one level, how many of its rows each token (the lower
    /// half) has; `None` when all rows fit. Found by counting, not sorting: both halves are
    /// small integers, so two histograms locate it without holding a list of the ~100K rows a
    /// long context has.
    fn find(levels: &[usize], tokens_at: impl FnOnce(usize) -> Vec<usize>, capacity: usize) -> Option<Cut> {
        let (level, left) = nth_from_top(levels, capacity)?;
        let (token, ties) = nth_from_top(&tokens_at(level), left).expect("the level holds the rows counted for it");
        Some(Cut { key: ((level as u64) << 32) | token as u64, ties })
    }

    /// Whether the next row, ranked `key`, is kept (rows must be offered in a fixed order).
    fn keeps(&mut self, key: u64) -> bool {
        if key == self.key && self.ties > 0 {
            self.ties -= 1;
            return true;
        }
        key > self.key
    }
}

/// A rank key's level: its hits and whether the row is hot.
fn level_of(key: u64) -> usize {
    (key >> 32) as usize
}

/// Counts one more `i` in a histogram.
fn count(counts: &mut Vec<usize>, i: usize) {
    if i >= counts.len() {
        counts.resize(i + 1, 0);
    }
    counts[i] += 1;
}

/// Walking `counts` from the highest index down, where the `n`-th item falls: its index and
/// how many items of that index are among the first `n`. `None` when fewer than `n + 1` items
/// are counted in all (every item fits in `n`). `n` = 0 keeps nothing: the top index is cut.
fn nth_from_top(counts: &[usize], n: usize) -> Option<(usize, usize)> {
    let mut above = 0;
    for (i, &c) in counts.iter().enumerate().rev() {
        if above + c > n {
            return Some((i, n - above));
        }
        above += c;
    }
    None
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
        let row_bytes = self.hot.row_bytes();
        let candidates = std::mem::take(&mut self.candidates);
        let candidate_keys = || candidates.rows.iter().map(|&(_, token, hits)| rank_key(hits, false, token));
        let cut = if self.hot_bytes() + candidates.len() * row_bytes <= self.settings.hot_budget_bytes {
            None // everything fits: rank nothing
        } else {
            // One walk counts the unpinned hot rows by level; their number is the sum.
            let mut levels = Vec::new();
            self.for_each_unpinned_hot_row(|_, _, key| count(&mut levels, level_of(key)));
            let unpinned_hot: usize = levels.iter().sum();
            candidate_keys().for_each(|key| count(&mut levels, level_of(key)));
            let fixed = self.hot_bytes() - unpinned_hot * row_bytes;
            let capacity = self.settings.hot_budget_bytes.saturating_sub(fixed) / row_bytes;
            let tokens_at = |level: usize| {
                let mut tokens = Vec::new();
                let mut count_token = |key: u64| {
                    if level_of(key) == level {
                        count(&mut tokens, key as u32 as usize);
                    }
                };
                self.for_each_unpinned_hot_row(|_, _, key| count_token(key));
                candidate_keys().for_each(count_token);
                tokens
            };
            Cut::find(&levels, tokens_at, capacity)
        };
        // No row with fewer hits than the cut's can win a place next step.
        let cutoff = cut.map_or(0, |c| (c.key >> 33) as u32);
        match cut {
            Some(mut cut) => {
                // Rows are offered in the order `find` counted them: hot rows, then candidates.
                let mut demoted = Vec::new();
                self.for_each_unpinned_hot_row(|lane, t, key| {
                    if !cut.keeps(key) {
                        demoted.push((lane, t));
                    }
                });
                // Demotions first, so that promotions reuse their slots.
                for &(lane, token) in &demoted {
                    self.hot.remove(lane, token);
                }
                self.tier.demotions += demoted.len() as u64;
                for (slot, key) in candidate_keys().enumerate() {
                    if cut.keeps(key) {
                        self.promote(&candidates, slot);
                    }
                }
            }
            None => (0..candidates.len()).for_each(|slot| self.promote(&candidates, slot)),
        }
        if self.hot.free_bytes() > COMPACT_FREE_BYTES {
            self.hot.compact();
        }
        self.candidates = Candidates { cutoff, ..candidates };
        self.candidates.clear();
    }

    /// Calls `f(lane, token, rank key)` for each unpinned hot row of the sparse layers, lane by
    /// lane, always in the same order. A plain loop: with a large pool the rebalance walks
    /// ~700K rows three times a step.
    fn for_each_unpinned_hot_row(&self, mut f: impl FnMut(usize, u32, u64)) {
        let sinks = self.settings.sink_tokens as u32;
        let recent = self.len.saturating_sub(self.settings.recent_tokens) as u32;
        for lane in self.settings.dense_layers * self.shape.n_kv_heads..self.hits.len() {
            let hits = &self.hits[lane];
            for t in self.hot.tokens(lane).filter(|&t| t >= sinks && t < recent) {
                f(lane, t, rank_key(hits.get(t as usize).map_or(0, |&h| u32::from(h)), true, t));
            }
        }
    }

    fn promote(&mut self, candidates: &Candidates, slot: usize) {
        let (lane, token, k, v) = candidates.row(slot);
        self.hot.insert(lane, token, k, v);
        self.tier.promotions += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_cuts_where_a_full_sort_would() {
        // Rows with few distinct hits and repeated tokens (the same token in several lanes).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let keys: Vec<u64> = (0..2000).map(|_| rank_key(next(6) as u32, next(2) == 1, next(300) as u32)).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut levels = Vec::new();
        keys.iter().for_each(|&k| count(&mut levels, level_of(k)));
        let tokens_at = |level: usize| {
            let mut tokens = Vec::new();
            keys.iter().filter(|&&k| level_of(k) == level).for_each(|&k| count(&mut tokens, k as u32 as usize));
            tokens
        };
        for capacity in [0, 1, 17, 999, 1000, 1999] {
            let mut cut = Cut::find(&levels, tokens_at, capacity).expect("not everything fits");
            let kept: Vec<u64> = keys.iter().copied().filter(|&k| cut.keeps(k)).collect();
            let mut kept_sorted = kept.clone();
            kept_sorted.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(kept_sorted, sorted[..capacity], "capacity {capacity}");
        }
        assert_eq!(Cut::find(&levels, tokens_at, 2000), None);
        assert_eq!(Cut::find(&[], |_| Vec::new(), 0), None);
    }

    #[test]
    fn candidates_keep_the_best_within_their_share_and_skip_hopeless_rows() {
        // One f16 word per K/V row: 4 bytes a row; a 128-byte budget allows 2 candidates.
        let mut c = Candidates::new(1, 128);
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
