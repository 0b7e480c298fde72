//! The disk backing shared by every store that keeps K/V in a cold pool: the pool file, the
//! write-back window in front of it, and the count of tokens held. It owns the invariants that
//! tie them together, so the stores built on it keep only what they decide (which tokens to
//! read, which rows stay hot):
//!
//! - every token before the window's base is in the cold pool, under a valid checksum; every
//!   token from the base to `len` (plus what a layer appended this step) is in the window;
//! - a spill writes every group first and moves the window only once all writes succeeded, so a
//!   failed write loses nothing and never shifts one layer's rows against another's;
//! - a truncation keeps what it can read back and says how much that is.

use super::cold::{ColdLayout, ColdPool, GROUP_TOKENS};
use super::window::RecentWindow;
use super::KvShape;
use crate::error::Result;
use std::path::Path;
use std::sync::Arc;

pub struct DiskBacking {
    shape: KvShape,
    /// Shared with readers that work ahead of a layer's turn (read-ahead, the SmartSSD).
    cold: Arc<ColdPool>,
    window: RecentWindow,
    /// Committed tokens.
    len: usize,
    /// Tokens each layer appended this step, not yet committed.
    pending: Vec<usize>,
}

impl DiskBacking {
    /// A backing for up to `shape.max_tokens` tokens, its pool file in `cold_dir`, with room for
    /// the SmartSSD's scoring-key chunks of `key_chunk_bytes` (0 for none).
    pub fn new(shape: KvShape, cold_dir: &Path, key_chunk_bytes: usize) -> Result<Self> {
        let max_groups = shape.max_tokens.div_ceil(GROUP_TOKENS);
        let layout = ColdLayout { n_layers: shape.n_layers, n_kv_heads: shape.n_kv_heads, head_dim: shape.head_dim, max_groups };
        Ok(Self {
            cold: Arc::new(ColdPool::create_with_key_chunks(cold_dir, layout, key_chunk_bytes)?),
            window: RecentWindow::new(shape.n_layers, shape.n_kv_heads, shape.head_dim),
            shape,
            len: 0,
            pending: vec![0; shape.n_layers],
        })
    }

    pub fn cold(&self) -> &Arc<ColdPool> {
        &self.cold
    }

    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Tokens `layer` holds now: the committed ones and those it appended this step.
    pub fn held(&self, layer: usize) -> usize {
        self.len + self.pending[layer]
    }

    /// Tokens appended this step by `layer`.
    pub fn pending(&self, layer: usize) -> usize {
        self.pending[layer]
    }

    /// Tokens before this are in the cold pool; the rest are in the write-back window.
    pub fn cold_end(&self) -> usize {
        self.window.base()
    }

    /// Token rows the write-back window holds, over all layers (each `n_kv_heads` K and V rows).
    pub fn window_tokens(&self) -> usize {
        (0..self.shape.n_layers).map(|l| self.window.len(l)).sum()
    }

    /// K (or V) row of a token at or past [`DiskBacking::cold_end`], as f16 bits.
    pub fn row(&self, layer: usize, head: usize, token: usize, values: bool) -> &[u16] {
        self.window.row(layer, head, token, values)
    }

    /// Appends `layer`'s K/V rows of the step's tokens.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.pending[layer] = self.shape.tokens_to_append(self.len, k, v)?;
        self.window.push(layer, k, v);
        Ok(())
    }

    /// The step's `n_tokens` join the committed ones, and every complete group goes to the cold
    /// pool. `on_spilled(layer, head, token, k, v)` sees each spilled row once all writes
    /// succeeded, before the window lets it go. On a write error the tokens stay committed in
    /// the window, where attention still finds them, and the error is returned: nothing moved.
    pub fn commit(&mut self, n_tokens: usize, mut on_spilled: impl FnMut(usize, usize, usize, &[u16], &[u16])) -> Result<()> {
        self.len += n_tokens;
        self.pending.fill(0);
        let groups = self.window.spillable_groups();
        if groups == 0 {
            return Ok(());
        }
        self.window.write_groups(&self.cold, groups)?;
        let (base, end) = (self.window.base(), self.window.base() + groups * GROUP_TOKENS);
        for layer in 0..self.shape.n_layers {
            for head in 0..self.shape.n_kv_heads {
                for t in base..end {
                    on_spilled(layer, head, t, self.window.row(layer, head, t, false), self.window.row(layer, head, t, true));
                }
            }
        }
        self.window.drop_groups(groups);
        Ok(())
    }

    /// Keeps tokens `..n_tokens` (and drops anything appended but not committed); returns how
    /// many it kept. That is `n_tokens` (or `len`, if fewer) unless the cold group to cut in
    /// cannot be read back: then it keeps the whole groups before it, which need no read, and
    /// the caller must run the tokens after them again.
    pub fn truncate(&mut self, n_tokens: usize) -> usize {
        self.pending.fill(0);
        let keep = n_tokens.min(self.len);
        match self.window.truncate(keep, &self.cold) {
            Ok(()) => self.len = keep,
            Err(e) => {
                self.len = keep / GROUP_TOKENS * GROUP_TOKENS;
                tracing::warn!(error = %e, asked = keep, kept = self.len, "a cold group could not be read back while truncating; keeping the whole groups before it");
                self.window.restart_at(self.len);
            }
        }
        self.len
    }

    /// Bytes of K/V in the cold pool.
    pub fn cold_bytes(&self) -> usize {
        self.window.base() * self.shape.bytes_per_token()
    }
}
