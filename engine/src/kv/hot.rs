//! The hot pool: full-precision (f16) K/V rows of the tokens kept in DRAM, per layer, in
//! reusable slots. Which tokens belong here is the owning store's decision (tiered: the hot
//! tier; drop: everything it has not discarded).

use std::collections::HashMap;

struct LayerPool {
    slot_of: HashMap<u32, u32>,
    /// f16 bits, `[slot][kv_head][dim]`
    k: Vec<u16>,
    v: Vec<u16>,
    free: Vec<u32>,
}

pub struct HotPool {
    /// f16 values per token row (all KV heads).
    row_words: usize,
    layers: Vec<LayerPool>,
}

impl HotPool {
    pub fn new(n_layers: usize, row_words: usize) -> Self {
        let layer = || LayerPool { slot_of: HashMap::new(), k: Vec::new(), v: Vec::new(), free: Vec::new() };
        Self { row_words, layers: (0..n_layers).map(|_| layer()).collect() }
    }

    /// Bytes of K and V one token occupies in one layer.
    pub fn row_bytes(&self) -> usize {
        2 * 2 * self.row_words
    }

    pub fn len(&self, layer: usize) -> usize {
        self.layers[layer].slot_of.len()
    }

    /// Bytes held for tokens across all layers (freed slots are reused, not counted).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.slot_of.len()).sum::<usize>() * self.row_bytes()
    }

    pub fn contains(&self, layer: usize, token: u32) -> bool {
        self.layers[layer].slot_of.contains_key(&token)
    }

    /// K and V rows (all heads) of a hot token.
    pub fn get(&self, layer: usize, token: u32) -> Option<(&[u16], &[u16])> {
        let l = &self.layers[layer];
        let slot = *l.slot_of.get(&token)? as usize * self.row_words;
        Some((&l.k[slot..][..self.row_words], &l.v[slot..][..self.row_words]))
    }

    /// Stores (or overwrites) a token's rows.
    pub fn insert(&mut self, layer: usize, token: u32, k: &[u16], v: &[u16]) {
        let rw = self.row_words;
        let l = &mut self.layers[layer];
        let slot = match l.slot_of.get(&token) {
            Some(&s) => s,
            None => {
                let s = l.free.pop().unwrap_or_else(|| {
                    l.k.resize(l.k.len() + rw, 0);
                    l.v.resize(l.v.len() + rw, 0);
                    (l.k.len() / rw - 1) as u32
                });
                l.slot_of.insert(token, s);
                s
            }
        } as usize;
        l.k[slot * rw..][..rw].copy_from_slice(k);
        l.v[slot * rw..][..rw].copy_from_slice(v);
    }

    pub fn remove(&mut self, layer: usize, token: u32) {
        let l = &mut self.layers[layer];
        if let Some(slot) = l.slot_of.remove(&token) {
            l.free.push(slot);
        }
    }

    /// Drops every token at or after `n_tokens`.
    pub fn truncate(&mut self, n_tokens: usize) {
        for l in &mut self.layers {
            let gone: Vec<u32> = l.slot_of.keys().copied().filter(|&t| t as usize >= n_tokens).collect();
            for t in gone {
                if let Some(slot) = l.slot_of.remove(&t) {
                    l.free.push(slot);
                }
            }
        }
    }

    /// Hot tokens of a layer (any order).
    pub fn tokens(&self, layer: usize) -> impl Iterator<Item = u32> + '_ {
        self.layers[layer].slot_of.keys().copied()
    }
}
