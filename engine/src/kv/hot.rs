//! The hot pool: full-precision (f16) K/V rows of the tokens kept in DRAM, per lane (a layer,
//! or a layer's KV head), in reusable slots. Which tokens belong here is the owning store's
//! decision (tiered: the hot tier; drop: everything it has not discarded).
//!
//! Each lane maps tokens to slots with a dense table indexed by token, not a hash map: the
//! tiered store asks "is this token hot?" for every candidate of every lane each step.

const ABSENT: u32 = u32::MAX;

#[derive(Default)]
struct LanePool {
    /// `slot_of[token]`, or ABSENT.
    slot_of: Vec<u32>,
    /// Tokens held, in slot order of insertion (for iteration); `token_at[slot]`.
    token_at: Vec<u32>,
    /// f16 bits, `[slot][dim]`
    k: Vec<u16>,
    v: Vec<u16>,
    free: Vec<u32>,
    len: usize,
}

pub struct HotPool {
    /// f16 values per row.
    row_words: usize,
    lanes: Vec<LanePool>,
}

impl HotPool {
    pub fn new(n_lanes: usize, row_words: usize) -> Self {
        Self { row_words, lanes: (0..n_lanes).map(|_| LanePool::default()).collect() }
    }

    /// Bytes of K and V one row occupies.
    pub fn row_bytes(&self) -> usize {
        2 * 2 * self.row_words
    }

    pub fn len(&self, lane: usize) -> usize {
        self.lanes[lane].len
    }

    /// Bytes held for rows across all lanes (freed slots are reused, not counted).
    pub fn bytes(&self) -> usize {
        self.lanes.iter().map(|l| l.len).sum::<usize>() * self.row_bytes()
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
        let l = &self.lanes[lane];
        Some((&l.k[at..][..self.row_words], &l.v[at..][..self.row_words]))
    }

    /// Stores (or overwrites) a token's rows.
    pub fn insert(&mut self, lane: usize, token: u32, k: &[u16], v: &[u16]) {
        let rw = self.row_words;
        let slot = match self.slot(lane, token) {
            Some(s) => s,
            None => {
                let l = &mut self.lanes[lane];
                let s = l.free.pop().unwrap_or_else(|| {
                    l.k.resize(l.k.len() + rw, 0);
                    l.v.resize(l.v.len() + rw, 0);
                    l.token_at.push(ABSENT);
                    (l.token_at.len() - 1) as u32
                });
                if l.slot_of.len() <= token as usize {
                    l.slot_of.resize(token as usize + 1, ABSENT);
                }
                l.slot_of[token as usize] = s;
                l.token_at[s as usize] = token;
                l.len += 1;
                s as usize
            }
        };
        let l = &mut self.lanes[lane];
        l.k[slot * rw..][..rw].copy_from_slice(k);
        l.v[slot * rw..][..rw].copy_from_slice(v);
    }

    pub fn remove(&mut self, lane: usize, token: u32) {
        if let Some(slot) = self.slot(lane, token) {
            let l = &mut self.lanes[lane];
            l.slot_of[token as usize] = ABSENT;
            l.token_at[slot] = ABSENT;
            l.free.push(slot as u32);
            l.len -= 1;
        }
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
        self.lanes[lane].token_at.iter().copied().filter(|&t| t != ABSENT)
    }
}
