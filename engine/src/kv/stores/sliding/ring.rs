//! One sliding-window layer's recent K/V: a ring of token slots in memory, position `p` in
//! slot `p % capacity`. Its queries see only the last `window` positions, so the ring keeps
//! those, room for the tokens a step appends, and a little slack for rolling back a few tokens
//! (a chat's next turn often re-renders the end of the last one). A checkpoint keeps the
//! window before one marked position (a document's end), so a sequence can go back there from
//! anywhere after it.

use crate::kernels::attention::k_tile_index;
use crate::kv::{KvView, KV_TILE};
use half::f16;
use half::slice::HalfBitsSliceExt;

/// Positions kept beyond the window and a step's tokens, so a truncation by up to this many
/// keeps the cache (llama.cpp keeps a batch's worth for the same reason).
const SLACK_TOKENS: usize = 64;

/// A slot that never held a token (the ring grew): its position is after every query's, so
/// attention masks it.
const EMPTY: u32 = u32::MAX;

pub struct SlidingRing {
    window: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Token slots per head (a multiple of [`KV_TILE`]).
    capacity: usize,
    /// f16 bits, `[kv_head][tile][dim][lane]`.
    k: Vec<u16>,
    /// f16 bits, `[kv_head][slot][dim]`.
    v: Vec<u16>,
    /// Each slot's position, `[kv_head][slot]` (the same for every head), as views name them.
    positions: Vec<u32>,
    /// Positions `first..end` are held (`end` includes what this step appended).
    first: usize,
    end: usize,
    checkpoint: Option<Checkpoint>,
}

/// The window before position `at`: positions `at - rows..at`, each `[kv_head][dim]` f16 bits.
struct Checkpoint {
    at: usize,
    k: Vec<u16>,
    v: Vec<u16>,
}

impl SlidingRing {
    pub fn new(window: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        let mut ring = Self {
            window,
            n_kv_heads,
            head_dim,
            capacity: 0,
            k: Vec::new(),
            v: Vec::new(),
            positions: Vec::new(),
            first: 0,
            end: 0,
            checkpoint: None,
        };
        ring.grow_for(1);
        ring
    }

    /// Appends K/V rows (`n × n_kv_heads·head_dim`) of the positions from `end` on. The ring
    /// grows first if the oldest query of the step would otherwise lose a key of its window.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        let kv_dim = self.n_kv_heads * self.head_dim;
        let n = k.len() / kv_dim;
        if self.window - 1 + n > self.capacity {
            self.grow_for(n);
        }
        let (mut k_bits, mut v_bits) = (Vec::with_capacity(kv_dim), Vec::with_capacity(kv_dim));
        for (t, (k_row, v_row)) in k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim)).enumerate() {
            for (bits, row) in [(&mut k_bits, k_row), (&mut v_bits, v_row)] {
                bits.clear();
                bits.extend(row.iter().map(|&x| f16::from_f32(x).to_bits()));
            }
            self.put(self.end + t, &k_bits, &v_bits);
        }
        self.end += n;
        self.first = self.first.max(self.end.saturating_sub(self.capacity));
    }

    /// Writes position `position`'s rows (`[kv_head][dim]` f16 bits) into its slot.
    fn put(&mut self, position: usize, k_row: &[u16], v_row: &[u16]) {
        let (hd, stride, slot) = (self.head_dim, self.capacity * self.head_dim, position % self.capacity);
        for h in 0..self.n_kv_heads {
            let k_head = &mut self.k[h * stride..][..stride];
            for (d, &x) in k_row[h * hd..][..hd].iter().enumerate() {
                k_head[k_tile_index(slot, d, hd)] = x;
            }
            self.v[h * stride + slot * hd..][..hd].copy_from_slice(&v_row[h * hd..][..hd]);
            self.positions[h * self.capacity + slot] = position as u32;
        }
    }

    /// Appends position `position`'s rows (`[kv_head][dim]` f16 bits) to `k_row` and `v_row`.
    fn read(&self, position: usize, k_row: &mut Vec<u16>, v_row: &mut Vec<u16>) {
        let (hd, stride, slot) = (self.head_dim, self.capacity * self.head_dim, position % self.capacity);
        for h in 0..self.n_kv_heads {
            k_row.extend((0..hd).map(|d| self.k[h * stride + k_tile_index(slot, d, hd)]));
            v_row.extend_from_slice(&self.v[h * stride + slot * hd..][..hd]);
        }
    }

    /// Whether slot `j` holds position `j` for every held token: then the view names no
    /// positions and attention reads only the window's tiles.
    fn in_order(&self) -> bool {
        self.first == 0 && self.end <= self.capacity
    }

    /// The held tokens of KV heads `heads` as a view (windowing it is the model's part).
    pub fn view(&self, heads: std::ops::Range<usize>) -> KvView<'_> {
        let stride = self.capacity * self.head_dim;
        let (n_tokens, positions) = match self.in_order() {
            true => (self.end, None),
            false => (self.capacity, Some(&self.positions[heads.start * self.capacity..heads.end * self.capacity])),
        };
        KvView {
            n_tokens,
            n_kv_heads: heads.len(),
            head_dim: self.head_dim,
            head_stride_tokens: self.capacity,
            k: self.k[heads.start * stride..heads.end * stride].reinterpret_cast(),
            v: self.v[heads.start * stride..heads.end * stride].reinterpret_cast(),
            positions,
            window_tokens: None,
        }
    }

    /// Positions of the window before `n_tokens` (those its next query sees besides itself).
    fn window_before(&self, n_tokens: usize) -> std::ops::Range<usize> {
        (n_tokens + 1).saturating_sub(self.window)..n_tokens
    }

    /// Whether the ring holds what a query at position `n_tokens` sees before itself (nothing,
    /// at 0).
    fn holds_window_before(&self, n_tokens: usize) -> bool {
        n_tokens == 0 || self.window_before(n_tokens).start >= self.first
    }

    /// Keeps the window before position `at` aside, if the ring holds it, for a later
    /// [`Self::truncate`] to `at`; it replaces the last checkpoint.
    pub fn checkpoint(&mut self, at: usize) {
        if at > self.end || !self.holds_window_before(at) {
            return;
        }
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for p in self.window_before(at) {
            self.read(p, &mut k, &mut v);
        }
        self.checkpoint = Some(Checkpoint { at, k, v });
    }

    /// The most of the first `n_tokens` positions this ring can serve the next query from: all
    /// of them if it still holds the window before `n_tokens`, else the checkpoint's, else none.
    pub fn keepable(&self, n_tokens: usize) -> usize {
        let n = n_tokens.min(self.end);
        if self.holds_window_before(n) {
            n
        } else {
            self.checkpoint.as_ref().filter(|c| c.at <= n).map_or(0, |c| c.at)
        }
    }

    /// Forgets the positions from `n_tokens` on; `n_tokens` must be [`Self::keepable`]. The
    /// forgotten slots keep their old positions: each is written again before any query at or
    /// after its position can see it.
    pub fn truncate(&mut self, n_tokens: usize) {
        debug_assert_eq!(self.keepable(n_tokens), n_tokens.min(self.end));
        if self.checkpoint.as_ref().is_some_and(|c| c.at > n_tokens) {
            self.checkpoint = None;
        }
        if self.holds_window_before(n_tokens.min(self.end)) {
            self.end = self.end.min(n_tokens);
        } else if let Some(c) = self.checkpoint.take() {
            let window = self.window_before(c.at);
            let row = self.n_kv_heads * self.head_dim;
            for (i, p) in window.clone().enumerate() {
                self.put(p, &c.k[i * row..][..row], &c.v[i * row..][..row]);
            }
            (self.first, self.end) = (window.start, c.at);
            self.checkpoint = Some(c);
        }
        if self.end == 0 {
            self.first = 0;
        }
    }

    /// Bytes of K/V the ring and its checkpoint hold in memory.
    pub fn bytes(&self) -> usize {
        2 * (self.k.len() + self.v.len()) + self.checkpoint.as_ref().map_or(0, |c| 2 * (c.k.len() + c.v.len()))
    }

    /// Makes room for the window plus a step of `n_tokens` (and the slack), keeping every held
    /// token.
    fn grow_for(&mut self, n_tokens: usize) {
        let capacity = (self.window - 1 + n_tokens + SLACK_TOKENS).div_ceil(KV_TILE) * KV_TILE;
        let words = self.n_kv_heads * capacity * self.head_dim;
        let mut grown = Self {
            capacity,
            k: vec![0; words],
            v: vec![0; words],
            positions: vec![EMPTY; self.n_kv_heads * capacity],
            checkpoint: self.checkpoint.take(),
            ..*self
        };
        let (mut k_row, mut v_row) = (Vec::new(), Vec::new());
        for p in self.first..self.end {
            k_row.clear();
            v_row.clear();
            self.read(p, &mut k_row, &mut v_row);
            grown.put(p, &k_row, &v_row);
        }
        *self = grown;
    }
}
