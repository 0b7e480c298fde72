//! Buffers that hold one layer's gathered K/V in the layout attention reads ([`KvView`]): K in
//! dimension-major tiles of [`KV_TILE`] tokens, V token-major. Stores that do not keep the
//! whole cache in that layout (offloaded, tiered) assemble each step's working set here.

use super::cold::GROUP_TOKENS;
use super::{KvView, KV_TILE};
use crate::kernels::attention::k_tile_index;
use half::slice::HalfBitsSliceExt;

pub struct ViewBuffers {
    n_kv_heads: usize,
    head_dim: usize,
    /// Token slots per head (a multiple of KV_TILE).
    stride_tokens: usize,
    k: Vec<u16>,
    v: Vec<u16>,
}

impl ViewBuffers {
    pub fn new(n_kv_heads: usize, head_dim: usize, max_tokens: usize) -> Self {
        let stride_tokens = max_tokens.div_ceil(KV_TILE) * KV_TILE;
        let len = n_kv_heads * stride_tokens * head_dim;
        Self { n_kv_heads, head_dim, stride_tokens, k: vec![0; len], v: vec![0; len] }
    }

    pub fn bytes(&self) -> usize {
        2 * (self.k.len() + self.v.len())
    }

    /// Puts one token's K and V rows (f16 bits) of `head` in `slot`.
    pub fn set_token(&mut self, slot: usize, head: usize, k_row: &[u16], v_row: &[u16]) {
        let hd = self.head_dim;
        let base = head * self.stride_tokens * hd;
        for (d, &x) in k_row.iter().enumerate() {
            self.k[base + k_tile_index(slot, d, hd)] = x;
        }
        self.v[base + slot * hd..][..hd].copy_from_slice(v_row);
    }

    /// Puts a cold-pool group (K then V, token-major, GROUP_TOKENS rows each) at `first_slot`.
    pub fn set_group(&mut self, first_slot: usize, head: usize, page: &[u16]) {
        let hd = self.head_dim;
        let (k, v) = page.split_at(GROUP_TOKENS * hd);
        for t in 0..GROUP_TOKENS {
            self.set_token(first_slot + t, head, &k[t * hd..][..hd], &v[t * hd..][..hd]);
        }
    }

    /// The first `n_tokens` slots as a view; `positions` names each slot's token position.
    pub fn view<'a>(&'a self, n_tokens: usize, positions: Option<&'a [u32]>) -> KvView<'a> {
        debug_assert!(n_tokens <= self.stride_tokens);
        KvView {
            n_tokens,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            head_stride_tokens: self.stride_tokens,
            k: self.k.reinterpret_cast(),
            v: self.v.reinterpret_cast(),
            positions,
        }
    }
}
