//! The write-back window: the most recent tokens' K/V in host memory, per layer and KV head,
//! until a whole group of [`GROUP_TOKENS`] can go to the cold pool in one page-sized write
//! (HILOS' delayed write-back). Queries against these tokens read them from here.

use super::cold::{ColdPool, GROUP_TOKENS};
use crate::error::Result;
use half::f16;

pub struct RecentWindow {
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// First token the window holds (a multiple of GROUP_TOKENS; earlier ones are spilled).
    base: usize,
    /// Tokens each layer holds (including ones appended this step).
    lens: Vec<usize>,
    /// Token slots per (layer, head) in `k` and `v`.
    slots: usize,
    /// f16 bits, `[layer][head][slot][dim]`: one buffer each for K and V, so that the room a
    /// prompt chunk needed (a chunk's tokens for every layer) is given back in one piece once
    /// decoding needs only a group's worth, instead of lingering in 180 small heap blocks.
    k: Vec<u16>,
    v: Vec<u16>,
}

impl RecentWindow {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self { n_layers, n_kv_heads, head_dim, base: 0, lens: vec![0; n_layers], slots: 0, k: Vec::new(), v: Vec::new() }
    }

    /// First token held here; tokens before it are in the cold pool.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Tokens this layer's window holds (including ones appended this step).
    pub fn len(&self, layer: usize) -> usize {
        self.lens[layer]
    }

    /// Where (layer, head)'s slot `slot` starts in `k` and `v`.
    fn at(&self, layer: usize, head: usize, slot: usize) -> usize {
        ((layer * self.n_kv_heads + head) * self.slots + slot) * self.head_dim
    }

    /// Lays the buffers out for `slots` tokens per (layer, head), keeping what they hold.
    fn relayout(&mut self, slots: usize) {
        let len = self.n_layers * self.n_kv_heads * slots * self.head_dim;
        let (mut k, mut v) = (vec![0; len], vec![0; len]);
        for layer in 0..self.n_layers {
            let words = self.lens[layer] * self.head_dim;
            for head in 0..self.n_kv_heads {
                let (from, to) = (self.at(layer, head, 0), (layer * self.n_kv_heads + head) * slots * self.head_dim);
                k[to..][..words].copy_from_slice(&self.k[from..][..words]);
                v[to..][..words].copy_from_slice(&self.v[from..][..words]);
            }
        }
        (self.slots, self.k, self.v) = (slots, k, v);
    }

    /// Adds `n` tokens' K and V rows (`n × n_kv_heads·head_dim` f32) for one layer.
    pub fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let (hd, kv_dim) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let n = k.len() / kv_dim;
        if self.lens[layer] + n > self.slots {
            self.relayout((self.lens[layer] + n).max(2 * self.slots).next_multiple_of(GROUP_TOKENS));
        }
        for (i, (row_k, row_v)) in k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim)).enumerate() {
            for h in 0..self.n_kv_heads {
                let at = self.at(layer, h, self.lens[layer] + i);
                let bits = |dst: &mut [u16], src: &[f32]| dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f16::from_f32(x).to_bits());
                bits(&mut self.k[at..][..hd], &row_k[h * hd..][..hd]);
                bits(&mut self.v[at..][..hd], &row_v[h * hd..][..hd]);
            }
        }
        self.lens[layer] += n;
    }

    /// K (or V) row of `token` for one layer and head, as f16 bits.
    pub fn row(&self, layer: usize, head: usize, token: usize, values: bool) -> &[u16] {
        let rows = if values { &self.v } else { &self.k };
        &rows[self.at(layer, head, token - self.base)..][..self.head_dim]
    }

    /// Writes every complete group to `cold` and drops it from the window.
    pub fn spill(&mut self, cold: &ColdPool) -> Result<usize> {
        let groups = (0..self.n_layers).map(|l| self.len(l)).min().unwrap_or(0) / GROUP_TOKENS;
        if groups == 0 {
            return Ok(0);
        }
        let values_per_group = GROUP_TOKENS * self.head_dim;
        let mut page = cold.buffer(1);
        for layer in 0..self.n_layers {
            let kept = (self.lens[layer] - groups * GROUP_TOKENS) * self.head_dim;
            for head in 0..self.n_kv_heads {
                let start = self.at(layer, head, 0);
                for g in 0..groups {
                    let words = page.as_u16_mut();
                    words[..values_per_group].copy_from_slice(&self.k[start + g * values_per_group..][..values_per_group]);
                    words[values_per_group..2 * values_per_group].copy_from_slice(&self.v[start + g * values_per_group..][..values_per_group]);
                    cold.write_group(layer, head, self.base / GROUP_TOKENS + g, &page)?;
                }
                let spilled = start + groups * values_per_group;
                self.k.copy_within(spilled..spilled + kept, start);
                self.v.copy_within(spilled..spilled + kept, start);
            }
            self.lens[layer] -= groups * GROUP_TOKENS;
        }
        self.base += groups * GROUP_TOKENS;
        self.shrink();
        Ok(groups)
    }

    /// Gives back the room a prompt chunk needed once far fewer tokens are held.
    fn shrink(&mut self) {
        let needed = (self.lens.iter().copied().max().unwrap_or(0) + 1).next_multiple_of(GROUP_TOKENS).max(2 * GROUP_TOKENS);
        if self.slots > 2 * needed {
            self.relayout(needed);
        }
    }

    /// Keeps tokens `..n_tokens`. Tokens that were already spilled past `n_tokens`' group are
    /// read back from `cold`, so the window again starts at a group boundary.
    pub fn truncate(&mut self, n_tokens: usize, cold: &ColdPool) -> Result<()> {
        let hd = self.head_dim;
        if n_tokens >= self.base {
            self.lens.iter_mut().for_each(|len| *len = (*len).min(n_tokens - self.base));
            return Ok(());
        }
        let group = n_tokens / GROUP_TOKENS;
        let keep = n_tokens % GROUP_TOKENS;
        if self.slots < keep {
            self.relayout(GROUP_TOKENS);
        }
        let mut page = cold.buffer(1);
        for layer in 0..self.n_layers {
            for head in 0..self.n_kv_heads {
                if keep > 0 {
                    cold.read_groups(layer, head, group, 1, page.as_bytes_mut())?;
                    let (words, at) = (page.as_u16(), self.at(layer, head, 0));
                    self.k[at..][..keep * hd].copy_from_slice(&words[..keep * hd]);
                    self.v[at..][..keep * hd].copy_from_slice(&words[GROUP_TOKENS * hd..][..keep * hd]);
                }
            }
            self.lens[layer] = keep;
        }
        self.base = group * GROUP_TOKENS;
        Ok(())
    }
}
