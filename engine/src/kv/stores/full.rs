//! The whole cache in memory: f16 K and V for every token of every layer, preallocated for the
//! store's maximum length (pages are only touched as tokens arrive).

use crate::error::{KvMisuse, Result};
use crate::kernels::attention::k_tile_index;
use crate::kv::{KvShape, KvStats, KvStore, KvView, Queries, Selection, KV_TILE};
use half::f16;
use half::slice::HalfBitsSliceExt;

pub struct FullKvStore {
    shape: KvShape,
    /// Token slots per head, rounded up to whole K tiles.
    stride_tokens: usize,
    /// f16 bits, `[layer][kv_head][tile][dim][lane]` (zero-allocated, so untouched pages cost nothing)
    k: Vec<u16>,
    /// f16 bits, `[layer][kv_head][token][dim]`
    v: Vec<u16>,
    len: usize,
    /// Tokens appended this step, per layer.
    pending: Vec<usize>,
}

impl FullKvStore {
    pub fn new(shape: KvShape) -> Self {
        let stride_tokens = shape.max_tokens.div_ceil(KV_TILE) * KV_TILE;
        let per_layer = shape.n_kv_heads * stride_tokens * shape.head_dim;
        Self {
            shape,
            stride_tokens,
            k: vec![0u16; shape.n_layers * per_layer],
            v: vec![0u16; shape.n_layers * per_layer],
            len: 0,
            pending: vec![0; shape.n_layers],
        }
    }

    fn layer_len(&self) -> usize {
        self.shape.n_kv_heads * self.stride_tokens * self.shape.head_dim
    }
}

impl KvStore for FullKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (hd, kv_dim) = (self.shape.head_dim, self.shape.kv_dim());
        let n = self.shape.tokens_to_append(self.len, k, v)?;
        let layer_len = self.layer_len();
        let (k_layer, v_layer) =
            (&mut self.k[layer * layer_len..][..layer_len], &mut self.v[layer * layer_len..][..layer_len]);
        for t in 0..n {
            let token = self.len + t;
            for h in 0..self.shape.n_kv_heads {
                let head = h * self.stride_tokens * hd;
                let src_k = &k[t * kv_dim + h * hd..][..hd];
                let src_v = &v[t * kv_dim + h * hd..][..hd];
                for d in 0..hd {
                    k_layer[head + k_tile_index(token, d, hd)] = f16::from_f32(src_k[d]).to_bits();
                }
                let dst_v = &mut v_layer[head + token * hd..][..hd];
                for (dst, &x) in dst_v.iter_mut().zip(src_v) {
                    *dst = f16::from_f32(x).to_bits();
                }
            }
        }
        self.pending[layer] = n;
        Ok(())
    }

    fn select(&mut self, _layer: usize, _queries: &Queries<'_>) -> Result<Selection> {
        Ok(Selection::All)
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        if *selection != Selection::All {
            return Err(KvMisuse::PartialSelection.into());
        }
        let head_len = self.stride_tokens * self.shape.head_dim;
        let part = layer * self.layer_len() + heads.start * head_len..layer * self.layer_len() + heads.end * head_len;
        Ok(KvView {
            n_tokens: self.len + self.pending[layer],
            n_kv_heads: heads.len(),
            head_dim: self.shape.head_dim,
            head_stride_tokens: self.stride_tokens,
            k: self.k[part.clone()].reinterpret_cast(),
            v: self.v[part].reinterpret_cast(),
            positions: None,
            window_tokens: None,
        })
    }

    fn observe(&mut self, _layer: usize, _selection: &Selection) {}

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        debug_assert!(self.pending.iter().all(|&p| p == n_tokens));
        self.len += n_tokens;
        self.pending.fill(0);
        Ok(())
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        self.len = self.len.min(n_tokens);
        self.pending.fill(0);
        self.len
    }

    fn stats(&self) -> KvStats {
        KvStats { tokens: self.len, resident_bytes: self.len * self.shape.bytes_per_token(), ..KvStats::default() }
    }
}
