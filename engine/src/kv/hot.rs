//! The hot pool: full-precision (f16) K/V rows of the tokens kept in DRAM, per lane (a layer,
//! or a layer's KV head), in reusable slots. Which tokens belong here is the owning store's
//! decision (tiered: the hot tier; drop: everything it has not discarded).
//!
//! Each lane maps tokens to slots with a dense table indexed by token, not a hash map: the
//! tiered store asks "is this token hot?" for every candidate of every lane each step.

const ABSENT: u32 = u32::MAX;

/// One lane's index into the shared slots.
#[derive(Default)]
struct Lane {
    /// `slot_of[token]`, or ABSENT.
    slot_of: Vec<u32>,
    /// The lane's tokens, unordered.
    tokens: Vec<u32>,
}

/// Rows live in one slab of slots shared by every lane, so memory follows the rows held in all
/// lanes together: with a slab per lane, each would keep the most rows it ever held, and as the
/// hot set moves between lanes their sum drifts far above the budget.
pub struct HotPool {
    /// f16 values per row.
    row_words: usize,
    lanes: Vec<Lane>,
    /// f16 bits, `[slot][dim]`.
    k: Vec<u16>,
    v: Vec<u16>,
    /// `[slot]`: where the slot's token sits in its lane's `tokens`.
    member_at: Vec<u32>,
    free: Vec<u32>,
}

impl HotPool {
    pub fn new(n_lanes: usize, row_words: usize) -> Self {
        Self {
            row_words,
            lanes: (0..n_lanes).map(|_| Lane::default()).collect(),
            k: Vec::new(),
            v: Vec::new(),
            member_at: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Bytes of K and V one row occupies.
    pub fn row_bytes(&self) -> usize {
        2 * 2 * self.row_words
    }

    pub fn len(&self, lane: usize) -> usize {
        self.lanes[lane].tokens.len()
    }

    /// Bytes held for rows across all lanes (freed slots are reused, not counted).
    pub fn bytes(&self) -> usize {
        (self.member_at.len() - self.free.len()) * self.row_bytes()
    }

    fn slot(&self, lane: usize, token: u32) -> Option<usize> {
        match self.lanes[lane].slot_of.get(token as usize) {
            Some(&s) if s != ABSENT => Some(s as usize),
            _ => None,
        }
    }

    pub fn contains(&self, lane: usize, token: u32) -> bool {
        self.slot(lane, token).is_some()
    }

    /// K and V rows of a hot token.
    pub fn get(&self, lane: usize, token: u32) -> Option<(&[u16], &[u16])> {
        let at = self.slot(lane, token)? * self.row_words;
        Some((&self.k[at..][..self.row_words], &self.v[at..][..self.row_words]))
    }

    /// Stores (or overwrites) a token's rows.
    pub fn insert(&mut self, lane: usize, token: u32, k: &[u16], v: &[u16]) {
        let rw = self.row_words;
        let slot = match self.slot(lane, token) {
            Some(s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s as usize,
                    None => {
                        self.k.resize(self.k.len() + rw, 0);
                        self.v.resize(self.v.len() + rw, 0);
                        self.member_at.push(0);
                        self.member_at.len() - 1
                    }
                };
                let l = &mut self.lanes[lane];
                if l.slot_of.len() <= token as usize {
                    l.slot_of.resize(token as usize + 1, ABSENT);
                }
                l.slot_of[token as usize] = s as u32;
                self.member_at[s] = l.tokens.len() as u32;
                l.tokens.push(token);
                s
            }
        };
        self.k[slot * rw..][..rw].copy_from_slice(k);
        self.v[slot * rw..][..rw].copy_from_slice(v);
    }

    pub fn remove(&mut self, lane: usize, token: u32) {
        let Some(slot) = self.slot(lane, token) else { return };
        let l = &mut self.lanes[lane];
        l.slot_of[token as usize] = ABSENT;
        let at = self.member_at[slot] as usize;
        l.tokens.swap_remove(at);
        if let Some(&moved) = l.tokens.get(at) {
            self.member_at[l.slot_of[moved as usize] as usize] = at as u32;
        }
        self.free.push(slot as u32);
    }

    /// Drops every token at or after `n_tokens`.
    pub fn truncate(&mut self, n_tokens: usize) {
        for lane in 0..self.lanes.len() {
            let gone: Vec<u32> = self.tokens(lane).filter(|&t| t as usize >= n_tokens).collect();
            for t in gone {
                self.remove(lane, t);
            }
            self.lanes[lane].slot_of.truncate(n_tokens);
        }
    }

    /// Hot tokens of a lane (any order).
    pub fn tokens(&self, lane: usize) -> impl Iterator<Item = u32> + '_ {
        self.lanes[lane].tokens.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_share_slots_so_memory_follows_the_rows_held() {
        let mut pool = HotPool::new(3, 2);
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
        assert_eq!(pool.member_at.len(), 10);
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
    }
}
