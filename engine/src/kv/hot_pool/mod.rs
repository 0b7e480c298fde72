//! The hot pool: full-precision (f16) K/V rows of the tokens kept in DRAM, per lane (a layer,
//! or a layer's KV head), in reusable slots. Which tokens belong here is the owning store's
//! decision (tiered: its promoter; drop: everything it has not discarded).
//!
//! Each lane finds a token's slot through a hash map of the tokens it holds, and answers "is
//! this token hot?" from a bitmap of every token it has seen: the tiered store asks that of
//! every candidate of every lane each step, and reads slots only for the rows it selected. A
//! dense slot table (four bytes per token and lane) would cost more than the map wherever
//! fewer than about 30% of a lane's tokens are hot, which is the tiered store's case at
//! long contexts (6 MB against 3 at 32K on Qwen2.5-0.5B).

mod slab;

use slab::RowSlab;
use std::collections::HashMap;

/// One lane's index into the shared slots.
#[derive(Default)]
struct Lane {
    /// The slot of each token the lane holds.
    slot_of: HashMap<u32, u32, ahash::RandomState>,
    /// The same membership as a bitmap (bit `t % 64` of word `t / 64`), so that a whole
    /// range of tokens can be checked against several lanes a word at a time.
    bits: Vec<u64>,
}

impl Lane {
    fn set_bit(&mut self, token: u32, hot: bool) {
        let (word, bit) = (token as usize / 64, 1u64 << (token % 64));
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        if hot {
            self.bits[word] |= bit;
        } else {
            self.bits[word] &= !bit;
        }
    }

    /// Bytes the slot map holds: hashbrown keeps buckets for 8/7 of its capacity, each an
    /// entry and a control byte.
    fn map_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u32, u32)>() + 1;
        self.slot_of.capacity() * 8 / 7 * entry
    }
}

/// Rows live in one slab of slots shared by every lane, so memory follows the rows held in all
/// lanes together: with a slab per lane, each would keep the most rows it ever held, and as the
/// hot set moves between lanes their sum drifts far above the budget.
pub struct HotPool {
    /// f16 values per row, of K and of V.
    row_words: usize,
    lanes: Vec<Lane>,
    /// `[slot]`: the K row then the V row (f16 bits), side by side so one read brings both.
    slots: RowSlab,
    free: Vec<u32>,
}

impl HotPool {
    /// A pool for `n_lanes` lanes, with address space set aside for `expected_rows` rows (it
    /// grows past them if it must).
    pub fn new(n_lanes: usize, row_words: usize, expected_rows: usize) -> Self {
        Self {
            row_words,
            lanes: (0..n_lanes).map(|_| Lane::default()).collect(),
            slots: RowSlab::new(2 * row_words, expected_rows),
            free: Vec::new(),
        }
    }

    /// Bytes of K and V one row occupies.
    pub fn row_bytes(&self) -> usize {
        2 * 2 * self.row_words
    }

    pub fn len(&self, lane: usize) -> usize {
        self.lanes[lane].slot_of.len()
    }

    /// Bytes held for rows across all lanes (freed slots are reused, not counted).
    pub fn bytes(&self) -> usize {
        (self.slots.len() - self.free.len()) * self.row_bytes()
    }

    /// Bytes of the index beside the rows: each lane's slot map and bitmap, and the free
    /// slots. It grows with the rows held, and by a bit per token the lanes have seen.
    pub fn index_bytes(&self) -> usize {
        let lanes: usize = self.lanes.iter().map(|l| l.map_bytes() + 8 * l.bits.capacity()).sum();
        lanes + 4 * self.free.capacity()
    }

    fn slot(&self, lane: usize, token: u32) -> Option<usize> {
        // Most tokens a step asks about are cold: a bit test answers those without hashing.
        if !self.contains(lane, token) {
            return None;
        }
        self.lanes[lane].slot_of.get(&token).map(|&s| s as usize)
    }

    /// Whether the lane holds `token` (through the bitmap: a step asks this of thousands of
    /// tokens per lane, and a bit test costs less than a map lookup).
    pub fn contains(&self, lane: usize, token: u32) -> bool {
        self.lanes[lane].bits.get(token as usize / 64).is_some_and(|w| w & (1 << (token % 64)) != 0)
    }

    /// The lane's hot tokens as a bitmap: bit `t % 64` of word `t / 64` (words past the end
    /// hold none).
    pub fn bitmap(&self, lane: usize) -> &[u64] {
        &self.lanes[lane].bits
    }

    /// K and V rows of a hot token.
    pub fn get(&self, lane: usize, token: u32) -> Option<(&[u16], &[u16])> {
        Some(self.slots.row(self.slot(lane, token)?).split_at(self.row_words))
    }

    /// [`HotPool::get`], with the CPU asked to start loading the rows: a step looks a run of
    /// rows up first and copies them after, so that each copy finds its row on its way in
    /// instead of waiting out a cache miss of its own.
    pub fn get_prefetched(&self, lane: usize, token: u32) -> Option<(&[u16], &[u16])> {
        let slot = self.slot(lane, token)?;
        let row = self.slots.row(slot);
        crate::kernels::prefetch_lines(row);
        Some(row.split_at(self.row_words))
    }

    /// Stores (or overwrites) a token's rows.
    pub fn insert(&mut self, lane: usize, token: u32, k: &[u16], v: &[u16]) {
        let rw = self.row_words;
        let slot = match self.slot(lane, token) {
            Some(s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s as usize,
                    None => self.slots.push(),
                };
                let l = &mut self.lanes[lane];
                l.slot_of.insert(token, s as u32);
                l.set_bit(token, true);
                s
            }
        };
        let (k_row, v_row) = self.slots.row_mut(slot).split_at_mut(rw);
        k_row.copy_from_slice(k);
        v_row.copy_from_slice(v);
    }

    pub fn remove(&mut self, lane: usize, token: u32) {
        let l = &mut self.lanes[lane];
        let Some(slot) = l.slot_of.remove(&token) else { return };
        l.set_bit(token, false);
        self.free.push(slot);
    }

    /// Moves the rows held in the last slots into the freed ones below them and gives the
    /// emptied tail back to the kernel. Freed slots are reused by later inserts, but a pool
    /// that shrinks for good (a long prompt fills it before the scoring keys grow into their
    /// share of the budget) would otherwise keep its high-water mark in memory.
    pub fn compact(&mut self) {
        let Self { lanes, slots, free, .. } = self;
        let held = slots.len() - free.len();
        // As many slots below `held` are free as rows lie at or above it.
        let mut holes: Vec<u32> = free.iter().copied().filter(|&s| (s as usize) < held).collect();
        for lane in lanes.iter_mut() {
            for slot in lane.slot_of.values_mut().filter(|s| **s as usize >= held) {
                let to = holes.pop().expect("a free slot below the rows held for each row above them");
                slots.copy_row(*slot as usize, to as usize);
                *slot = to;
            }
            lane.slot_of.shrink_to_fit();
        }
        slots.truncate(held);
        free.clear();
    }

    /// Bytes of freed slots not yet reused.
    pub fn free_bytes(&self) -> usize {
        self.free.len() * self.row_bytes()
    }

    /// Drops every token at or after `n_tokens`.
    pub fn truncate(&mut self, n_tokens: usize) {
        for lane in 0..self.lanes.len() {
            let gone: Vec<u32> = self.tokens(lane).filter(|&t| t as usize >= n_tokens).collect();
            for t in gone {
                self.remove(lane, t);
            }
            self.lanes[lane].bits.truncate(n_tokens.div_ceil(64));
        }
    }

    /// Hot tokens of a lane (any order).
    pub fn tokens(&self, lane: usize) -> impl Iterator<Item = u32> + '_ {
        self.lanes[lane].slot_of.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_share_slots_so_memory_follows_the_rows_held() {
        let mut pool = HotPool::new(3, 2, 10);
        let row = |t: u32| [t as u16, t as u16 + 1];
        for t in 0..10 {
            pool.insert(0, t, &row(t), &row(t + 100));
        }
        for t in 0..10 {
            pool.remove(0, t);
        }
        // Lane 2 reuses lane 0's slots: no new memory.
        for t in 20..30 {
            pool.insert(2, t, &row(t), &row(t + 100));
        }
        assert_eq!(pool.slots.len(), 10);
        assert_eq!(pool.bytes(), 10 * pool.row_bytes());
        pool.remove(2, 22);
        pool.remove(2, 29);
        let mut held: Vec<u32> = pool.tokens(2).collect();
        held.sort_unstable();
        assert_eq!(held, vec![20, 21, 23, 24, 25, 26, 27, 28]);
        assert_eq!(pool.get(2, 27), Some((&row(27)[..], &row(127)[..])));
        assert!(!pool.contains(2, 22) && !pool.contains(0, 5) && pool.len(0) == 0 && pool.len(2) == 8);
        pool.truncate(25);
        let mut held: Vec<u32> = pool.tokens(2).collect();
        held.sort_unstable();
        assert_eq!(held, vec![20, 21, 23, 24]);
        assert_eq!(pool.bytes(), 4 * pool.row_bytes());
        assert_eq!(pool.bitmap(2), [0b1_1011 << 20]);
        assert!(pool.bitmap(0).iter().all(|&w| w == 0));
    }

    #[test]
    fn the_index_grows_with_the_rows_held_and_a_bit_per_token_seen() {
        let mut pool = HotPool::new(2, 2, 4);
        let empty = pool.index_bytes();
        pool.insert(1, 9_999, &[1, 2], &[3, 4]);
        // One row: a map entry, and a bit for each token up to it.
        let one = pool.index_bytes() - empty;
        assert!((10_000 / 8..10_000 / 8 + 200).contains(&one), "{one}");
        assert_eq!(pool.bytes(), pool.row_bytes());
        for t in 0..1_000 {
            pool.insert(0, t, &[1, 2], &[3, 4]);
        }
        // A thousand more rows: 9 bytes each in a map between half and seven-eighths full, and
        // their bits.
        let more = pool.index_bytes() - empty - one;
        assert!((9_000..19_000).contains(&more), "{more}");
    }

    #[test]
    fn compacting_keeps_every_row_and_frees_the_tail() {
        let mut pool = HotPool::new(2, 3, 40);
        let row = |t: u32, lane: u16| [t as u16, lane, 7];
        for t in 0..40 {
            pool.insert((t % 2) as usize, t, &row(t, (t % 2) as u16), &row(t + 1000, 9));
        }
        for t in (0..40).filter(|t| t % 3 != 0) {
            pool.remove((t % 2) as usize, t);
        }
        assert_eq!(pool.free_bytes(), 26 * pool.row_bytes());
        pool.compact();
        assert_eq!((pool.slots.len(), pool.free_bytes()), (14, 0));
        for t in 0..40 {
            let lane = (t % 2) as usize;
            let expect = (t % 3 == 0).then(|| (row(t, lane as u16), row(t + 1000, 9)));
            assert_eq!(
                pool.get(lane, t).map(|(k, v)| (k.to_vec(), v.to_vec())),
                expect.map(|(k, v)| (k.to_vec(), v.to_vec())),
                "token {t}"
            );
        }
        // Removing after a compaction still finds each row's place in its lane.
        pool.remove(1, 33);
        pool.remove(0, 0);
        assert!(
            !pool.contains(1, 33) && !pool.contains(0, 0) && pool.contains(1, 39) && pool.len(0) + pool.len(1) == 12
        );
    }
}
