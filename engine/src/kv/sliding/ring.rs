//! One sliding-window layer's recent K/V: a ring of token slots in memory, position `p` in
//! slot `p % capacity`. Its queries see only the last `window` positions, so the ring keeps
//! those, room for the tokens a step appends, and a little slack for rolling back a few tokens
//! (a chat's next turn often re-renders the end of the last one).

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
        };
        ring.grow_for(1);
        ring
    }

    /// Appends K/V rows (`n × n_kv_heads·head_dim`) of the positions from `end` on. The ring
    /// grows first if the oldest query of the step would otherwise lose a key of its window.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        let (hd, kv_dim) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let n = k.len() / kv_dim;
        if self.window - 1 + n > self.capacity {
            self.grow_for(n);
        }
        let stride = self.capacity * hd;
        for (t, (k_row, v_row)) in k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim)).enumerate() {
            let position = self.end + t;
            let slot = position % self.capacity;
            for h in 0..self.n_kv_heads {
                let k_head = &mut self.k[h * stride..][..stride];
                for (d, &x) in k_row[h * hd..][..hd].iter().enumerate() {
                    k_head[k_tile_index(slot, d, hd)] = f16::from_f32(x).to_bits();
                }
                let v_slot = &mut self.v[h * stride + slot * hd..][..hd];
                for (dst, &x) in v_slot.iter_mut().zip(&v_row[h * hd..][..hd]) {
                    *dst = f16::from_f32(x).to_bits();
                }
                self.positions[h * self.capacity + slot] = position as u32;
            }
        }
        self.end += n;
        self.first = self.first.max(self.end.saturating_sub(self.capacity));
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

    /// The most of the first `n_tokens` positions this ring can serve the next query from: all
    /// of them if it still holds the window before `n_tokens`, else none.
    pub fn keepable(&self, n_tokens: usize) -> usize {
        let n = n_tokens.min(self.end);
        if (n + 1).saturating_sub(self.window) >= self.first {
            n
        } else {
            0
        }
    }

    /// Forgets the positions from `n_tokens` on; `n_tokens` must be [`Self::keepable`]. The
    /// forgotten slots keep their old positions: each is written again before any query at or
    /// after its position can see it.
    pub fn truncate(&mut self, n_tokens: usize) {
        debug_assert_eq!(self.keepable(n_tokens), n_tokens.min(self.end));
        self.end = self.end.min(n_tokens);
        if self.end == 0 {
            self.first = 0;
        }
    }

    /// Bytes of K/V the ring holds in memory.
    pub fn bytes(&self) -> usize {
        2 * 2 * self.k.len()
    }

    /// Makes room for the window plus a step of `n_tokens` (and the slack), keeping every held
    /// token.
    fn grow_for(&mut self, n_tokens: usize) {
        let capacity = (self.window - 1 + n_tokens + SLACK_TOKENS).div_ceil(KV_TILE) * KV_TILE;
        let (hd, words) = (self.head_dim, self.n_kv_heads * capacity * self.head_dim);
        let mut grown = Self {
            capacity,
            k: vec![0; words],
            v: vec![0; words],
            positions: vec![EMPTY; self.n_kv_heads * capacity],
            first: self.first,
            end: self.first,
            ..*self
        };
        for p in self.first..self.end {
            let (from, to) = (p % self.capacity, p % capacity);
            for h in 0..self.n_kv_heads {
                let (old, new) = (h * self.capacity * hd, h * capacity * hd);
                for d in 0..hd {
                    grown.k[new + k_tile_index(to, d, hd)] = self.k[old + k_tile_index(from, d, hd)];
                }
                grown.v[new + to * hd..][..hd].copy_from_slice(&self.v[old + from * hd..][..hd]);
                grown.positions[h * capacity + to] = p as u32;
            }
        }
        grown.end = self.end;
        *self = grown;
    }
}
