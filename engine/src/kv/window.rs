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
    /// f16 bits, `[layer][head][token - base][dim]`, for K and V.
    k: Vec<Vec<Vec<u16>>>,
    v: Vec<Vec<Vec<u16>>>,
}

impl RecentWindow {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        let empty = || vec![vec![Vec::new(); n_kv_heads]; n_layers];
        Self { n_layers, n_kv_heads, head_dim, base: 0, k: empty(), v: empty() }
    }

    /// First token held here; tokens before it are in the cold pool.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Tokens this layer's window holds (including ones appended this step).
    pub fn len(&self, layer: usize) -> usize {
        self.k[layer][0].len() / self.head_dim
    }

    /// Adds `n` tokens' K and V rows (`n × n_kv_heads·head_dim` f32) for one layer.
    pub fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let (hd, kv_dim) = (self.head_dim, self.n_kv_heads * self.head_dim);
        for (row_k, row_v) in k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim)) {
            for h in 0..self.n_kv_heads {
                self.k[layer][h].extend(row_k[h * hd..][..hd].iter().map(|&x| f16::from_f32(x).to_bits()));
                self.v[layer][h].extend(row_v[h * hd..][..hd].iter().map(|&x| f16::from_f32(x).to_bits()));
            }
        }
    }

    /// K (or V) row of `token` for one layer and head, as f16 bits.
    pub fn row(&self, layer: usize, head: usize, token: usize, values: bool) -> &[u16] {
        let rows = if values { &self.v[layer][head] } else { &self.k[layer][head] };
        &rows[(token - self.base) * self.head_dim..][..self.head_dim]
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
            for head in 0..self.n_kv_heads {
                for g in 0..groups {
                    let words = page.as_u16_mut();
                    words[..values_per_group].copy_from_slice(&self.k[layer][head][g * values_per_group..][..values_per_group]);
                    words[values_per_group..2 * values_per_group]
                        .copy_from_slice(&self.v[layer][head][g * values_per_group..][..values_per_group]);
                    cold.write_group(layer, head, self.base / GROUP_TOKENS + g, &page)?;
                }
                self.k[layer][head].drain(..groups * values_per_group);
                self.v[layer][head].drain(..groups * values_per_group);
            }
        }
        self.base += groups * GROUP_TOKENS;
        Ok(groups)
    }

    /// Keeps tokens `..n_tokens`. Tokens that were already spilled past `n_tokens`' group are
    /// read back from `cold`, so the window again starts at a group boundary.
    pub fn truncate(&mut self, n_tokens: usize, cold: &ColdPool) -> Result<()> {
        let hd = self.head_dim;
        if n_tokens >= self.base {
            for layer in 0..self.n_layers {
                for head in 0..self.n_kv_heads {
                    self.k[layer][head].truncate((n_tokens - self.base) * hd);
                    self.v[layer][head].truncate((n_tokens - self.base) * hd);
                }
            }
            return Ok(());
        }
        let group = n_tokens / GROUP_TOKENS;
        let keep = n_tokens % GROUP_TOKENS;
        let mut page = cold.buffer(1);
        for layer in 0..self.n_layers {
            for head in 0..self.n_kv_heads {
                self.k[layer][head].clear();
                self.v[layer][head].clear();
                if keep > 0 {
                    cold.read_groups(layer, head, group, 1, page.as_bytes_mut())?;
                    let words = page.as_u16();
                    self.k[layer][head].extend_from_slice(&words[..keep * hd]);
                    self.v[layer][head].extend_from_slice(&words[GROUP_TOKENS * hd..][..keep * hd]);
                }
            }
        }
        self.base = group * GROUP_TOKENS;
        Ok(())
    }
}
