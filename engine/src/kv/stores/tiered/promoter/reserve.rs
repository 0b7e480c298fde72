//! Where demotions come from: the weakest unpinned hot rows, set aside a batch at a time.
//!
//! A full pool demotes rows every step (each step's token leaves the recent window in every
//! lane, and each promotion needs a place), and finding the lowest-ranked of ~700K hot rows
//! (8K tokens, a pool that holds nearly all) takes walks over all of them: ~3 ms a step. So one
//! set of walks puts the weakest few percent aside in a [`WeakestRows`] reserve, and the steps
//! after take from it until it runs out.
//!
//! That needs no re-check of the rows left out, because ranks only rise: hits only grow, a hot
//! row stays hot until it is demoted, and its cold-pool slot (which breaks ties) stays put once
//! it is unpinned (a re-placement of the cold pool moves it, and resets the reserve). The
//! reserve keeps every unpinned hot row ranked at or below its `bar` (the highest rank it was filled with): rows that join the unpinned hot rows
//! later (leaving the recent window, or promoted) join it if they rank that low, and a row whose
//! rank rose past the bar leaves it. Every row outside ranks at least as high as the bar, so the
//! reserve's weakest row is the pool's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The share of the unpinned hot rows one refill sets aside (a thirty-second: at 8K tokens with
/// the whole cache hot ~22K rows, against ~170 demotions a step), and the least it sets aside.
const RESERVE_DIVISOR: usize = 32;
const MIN_RESERVE_ROWS: usize = 4096;

/// The weakest unpinned hot rows, weakest first (see the module's comment).
#[derive(Default)]
pub(super) struct WeakestRows {
    /// (rank key when it was set aside, lane, token); a key may have risen since.
    heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// The highest rank key set aside by the last refill; `None` before the first.
    bar: Option<u64>,
}

impl WeakestRows {
    /// Forgets the reserve (the sequence was truncated): the next demotion refills it.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// A row that joined the unpinned hot rows, ranked `key`.
    pub fn offer(&mut self, key: u64, lane: usize, token: u32) {
        if self.bar.is_some_and(|bar| key <= bar) {
            self.heap.push(Reverse((key, lane as u32, token)));
        }
    }

    /// The weakest row set aside, as (key, lane, token) by its rank now; `rank_now(lane, token)`
    /// gives that rank, or `None` for a row no longer hot. Rows whose rank rose are re-ranked,
    /// or leave the reserve once past its bar.
    pub fn weakest(&mut self, rank_now: impl Fn(usize, u32) -> Option<u64>) -> Option<(u64, usize, u32)> {
        while let Some(&Reverse((key, lane, token))) = self.heap.peek() {
            let now = rank_now(lane as usize, token);
            if now == Some(key) {
                return Some((key, lane as usize, token));
            }
            self.heap.pop();
            if let Some(now) = now.filter(|&now| self.bar.is_some_and(|bar| now <= bar)) {
                self.heap.push(Reverse((now, lane, token)));
            }
        }
        None
    }

    /// Takes the row [`WeakestRows::weakest`] returned out of the reserve.
    pub fn take_weakest(&mut self) {
        self.heap.pop();
    }

    pub fn bytes(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<Reverse<(u64, u32, u32)>>()
    }
}

impl WeakestRows {
    /// Sets aside the weakest few percent of the unpinned hot rows, found by counting (three
    /// walks over them) rather than sorting. `for_each_row(f)` calls `f(lane, token, rank key)`
    /// for every unpinned hot row, always in the same order.
    pub fn refill(&mut self, for_each_row: impl Fn(&mut dyn FnMut(usize, u32, u64))) {
        let mut levels = Vec::new();
        for_each_row(&mut |_, _, key| count(&mut levels, level_of(key)));
        let unpinned: usize = levels.iter().sum();
        let reserve = (unpinned / RESERVE_DIVISOR).max(MIN_RESERVE_ROWS);
        let slots_at = |level: usize| {
            let mut slots = Vec::new();
            for_each_row(&mut |_, _, key| {
                if level_of(key) == level {
                    count(&mut slots, key as u32 as usize);
                }
            });
            slots
        };
        // The rows the cut does not keep among the best `unpinned - reserve` are the reserve.
        let Some(mut cut) = Cut::find(&levels, slots_at, unpinned.saturating_sub(reserve)) else { return };
        let mut set_aside = Vec::new();
        for_each_row(&mut |lane, token, key| {
            if !cut.keeps(key) {
                set_aside.push(Reverse((key, lane as u32, token)));
            }
        });
        self.bar = set_aside.iter().map(|r| r.0 .0).max();
        self.heap = BinaryHeap::from(set_aside);
    }
}

/// Where a ranking is cut to keep the best `capacity` rows: every row ranked above `key`, and
/// the first `ties` rows met that are ranked exactly `key` (rows of different lanes can be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    key: u64,
    ties: usize,
}

impl Cut {
    /// The cut that keeps the best `capacity` rows, given how many each level (a rank key's upper
    /// half: hits and hot) holds and, for one level, how many of its rows each slot (the lower
    /// half) has; `None` when all rows fit. Found by counting, not sorting: both halves are
    /// small integers, so two histograms locate it without holding a list of the ~100K rows a
    /// long context has.
    fn find(levels: &[usize], slots_at: impl FnOnce(usize) -> Vec<usize>, capacity: usize) -> Option<Cut> {
        let (level, left) = nth_from_top(levels, capacity)?;
        let (slot, ties) = nth_from_top(&slots_at(level), left).expect("the level holds the rows counted for it");
        Some(Cut { key: ((level as u64) << 32) | slot as u64, ties })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::stores::tiered::promoter::candidates::rank_key;

    fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut state = seed;
        move |n| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        }
    }

    #[test]
    fn counting_cuts_where_a_full_sort_would() {
        // Rows with few distinct hits and repeated tokens (the same token in several lanes).
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
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
    fn the_reserve_yields_the_weakest_row_as_ranks_rise_and_rows_join() {
        // 500 rows in 5 lanes with random hits; the reserve is filled with the weakest half, so
        // that rows rise within it as well as past its bar.
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut hits: Vec<Vec<u32>> = (0..5).map(|_| (0..100).map(|_| next(8) as u32).collect()).collect();
        let mut hot: Vec<Vec<bool>> = vec![vec![true; 100]; 5];
        let rank = |hits: &[Vec<u32>], lane: usize, t: u32| rank_key(hits[lane][t as usize], true, t);
        let mut all: Vec<(u64, usize, u32)> =
            (0..5).flat_map(|l| (0..100u32).map(move |t| (l, t))).map(|(l, t)| (rank(&hits, l, t), l, t)).collect();
        all.sort_unstable();
        let mut reserve = WeakestRows {
            bar: Some(all[249].0),
            heap: all[..250].iter().map(|&(k, l, t)| Reverse((k, l as u32, t))).collect(),
        };
        // Rows not yet hot join later (as if promoted or newly unpinned).
        hot[4][90..].fill(false);
        let mut demoted = 0;
        for step in 0.. {
            // Some rows are selected again: their rank rises.
            for _ in 0..20 {
                let (l, t) = (next(5) as usize, next(100) as usize);
                hits[l][t] += 1;
            }
            if step < 10 {
                let t = 90 + step as u32;
                hot[4][t as usize] = true;
                reserve.offer(rank(&hits, 4, t), 4, t);
            }
            let rank_now = |l: usize, t: u32| hot[l][t as usize].then(|| rank(&hits, l, t));
            let expected = (0..5)
                .flat_map(|l| (0..100u32).map(move |t| (l, t)))
                .filter_map(|(l, t)| rank_now(l, t).map(|k| (k, l, t)))
                .min();
            let Some(row) = reserve.weakest(rank_now) else {
                // Run out: every row left ranks at least as high as the bar.
                assert!(expected.unwrap().0 >= reserve.bar.unwrap(), "step {step}");
                break;
            };
            assert_eq!(Some(row), expected, "step {step}");
            reserve.take_weakest();
            hot[row.1][row.2 as usize] = false; // demoted
            demoted += 1;
        }
        // Rows rose past the bar and left: fewer than the 250 set aside and 10 offered.
        assert!((50..260).contains(&demoted), "{demoted} demoted");
    }
}
