//! FlexGen-style offloading, the baseline the tiered store is measured against: every token's
//! K/V lives in the cold pool, and every step of every layer reads all of it back (one large
//! direct-I/O read per KV head), then attends exactly.

use super::aligned::AlignedBuf;
use super::cold::{ColdLayout, ColdPool, GROUP_TOKENS};
use super::view::ViewBuffers;
use super::window::RecentWindow;
use super::{KvShape, KvStats, KvStore, KvView, Selection};
use crate::error::Result;
use std::path::Path;
use std::sync::atomic::Ordering;

pub struct OffloadKvStore {
    shape: KvShape,
    cold: ColdPool,
    window: RecentWindow,
    view: ViewBuffers,
    read_buf: AlignedBuf,
    len: usize,
    /// Tokens appended this step, per layer.
    pending: Vec<usize>,
}

impl OffloadKvStore {
    pub fn new(shape: KvShape, cold_dir: &Path) -> Result<Self> {
        let max_groups = shape.max_tokens.div_ceil(GROUP_TOKENS);
        let layout = ColdLayout { n_layers: shape.n_layers, n_kv_heads: shape.n_kv_heads, head_dim: shape.head_dim, max_groups };
        let cold = ColdPool::create(cold_dir, layout)?;
        let read_buf = cold.buffer(max_groups);
        Ok(Self {
            shape,
            window: RecentWindow::new(shape.n_layers, shape.n_kv_heads, shape.head_dim),
            view: ViewBuffers::new(shape.head_dim),
            read_buf,
            cold,
            len: 0,
            pending: vec![0; shape.n_layers],
        })
    }
}

impl KvStore for OffloadKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let n = self.shape.tokens_to_append(self.len, k, v)?;
        self.window.push(layer, k, v);
        self.pending[layer] = n;
        Ok(())
    }

    fn select(&mut self, _layer: usize, _q: &[f32], _q_positions: &[usize]) -> Result<Selection> {
        Ok(Selection::All)
    }

    fn heads_per_gather(&self, _selection: &Selection) -> usize {
        1 // every step reads the whole cache: a head at a time holds a third as much
    }

    fn gather(&mut self, layer: usize, _selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        let total = self.len + self.pending[layer];
        let spilled_groups = self.window.base() / GROUP_TOKENS;
        let page_words = self.cold.layout().group_bytes() / 2;
        self.view.reset(heads.len(), total);
        for (at, head) in heads.enumerate() {
            if spilled_groups > 0 {
                self.cold.read_groups(layer, head, 0, spilled_groups, self.read_buf.as_bytes_mut())?;
                let words = self.read_buf.as_u16();
                for g in 0..spilled_groups {
                    self.view.set_group(g * GROUP_TOKENS, at, &words[g * page_words..][..page_words]);
                }
            }
            for token in self.window.base()..total {
                self.view.set_token(token, at, self.window.row(layer, head, token, false), self.window.row(layer, head, token, true));
            }
        }
        Ok(self.view.view(total, None))
    }

    fn observe(&mut self, _layer: usize, _selection: &Selection) {}

    fn commit(&mut self, n_tokens: usize) {
        self.len += n_tokens;
        self.pending.fill(0);
        // A failed spill keeps the tokens in the window, where attention still finds them; the
        // next commit tries again.
        if let Err(e) = self.window.spill(&self.cold) {
            tracing::error!(error = %e, "cold pool write failed; keeping tokens in memory");
        }
    }

    fn truncate(&mut self, n_tokens: usize) {
        self.pending.fill(0);
        if n_tokens < self.len {
            if let Err(e) = self.window.truncate(n_tokens, &self.cold) {
                // The cold copy is unreadable: start the sequence over rather than attend to garbage.
                tracing::error!(error = %e, "cold pool read failed while truncating; dropping the cache");
                self.window = RecentWindow::new(self.shape.n_layers, self.shape.n_kv_heads, self.shape.head_dim);
                self.len = 0;
                return;
            }
            self.len = n_tokens;
        } else {
            let committed = self.len;
            // Drop uncommitted rows appended by a failed step.
            let _ = self.window.truncate(committed, &self.cold);
        }
    }

    fn stats(&self) -> KvStats {
        KvStats {
            tokens: self.len,
            resident_bytes: self.view.bytes() + self.read_buf.len(),
            cold_bytes: self.window.base() * self.shape.bytes_per_token(),
            cold_bytes_read: self.cold.stats.bytes_read.load(Ordering::Relaxed),
            tier: None,
        }
    }
}
