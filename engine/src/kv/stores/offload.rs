//! FlexGen-style offloading, the baseline the tiered store is measured against: every token's
//! K/V lives in the cold pool, and every step of every layer reads all of it back (one large
//! direct-I/O read per KV head), then attends exactly.

use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::kv::backing::DiskBacking;
use crate::kv::cold::format::ColdType;
use crate::kv::cold::placement::PlacementKind;
use crate::kv::cold::GROUP_TOKENS;
use crate::kv::view::ViewBuffers;
use crate::kv::{HeadsPart, KvShape, KvStats, KvStore, KvView, Queries, Selection};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

pub struct OffloadKvStore {
    shape: KvShape,
    backing: DiskBacking,
    view: ViewBuffers,
    read_buf: AlignedBuf,
}

impl OffloadKvStore {
    pub fn new(shape: KvShape, cold_dirs: &[PathBuf], cold_type: ColdType) -> Result<Self> {
        let backing = DiskBacking::new(shape, cold_dirs, 0, PlacementKind::Position, cold_type)?;
        let read_buf = backing.cold().buffer(shape.max_tokens.div_ceil(GROUP_TOKENS));
        Ok(Self { shape, backing, view: ViewBuffers::new(shape.head_dim), read_buf })
    }
}

impl OffloadKvStore {
    /// The cold pool and write-back window.
    pub(super) fn backing(&self) -> &DiskBacking {
        &self.backing
    }
}

impl KvStore for OffloadKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.backing.len()
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.backing.append(layer, k, v)
    }

    fn select(&mut self, _layer: usize, _queries: &Queries<'_>) -> Result<Selection> {
        Ok(Selection::All)
    }

    fn parts(&self, _selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        // Every step reads the whole cache: a head at a time holds a third as much.
        HeadsPart::each_head(self.shape.n_kv_heads, cached_tokens, None)
    }

    fn gather(&mut self, layer: usize, _selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        let total = self.backing.held(layer);
        let spilled_groups = self.backing.cold_end() / GROUP_TOKENS;
        let cold = self.backing.cold();
        let page_words = cold.layout().group_bytes() / 2;
        self.view.reset(heads.len(), total);
        for (at, head) in heads.enumerate() {
            if spilled_groups > 0 {
                cold.read_groups(layer, head, 0, spilled_groups, self.read_buf.as_bytes_mut())?;
                let words = self.read_buf.as_u16();
                for g in 0..spilled_groups {
                    self.view.set_group(g * GROUP_TOKENS, at, &words[g * page_words..][..page_words]);
                }
            }
            for token in self.backing.cold_end()..total {
                self.view.set_token(
                    token,
                    at,
                    self.backing.row(layer, head, token, false),
                    self.backing.row(layer, head, token, true),
                );
            }
        }
        Ok(self.view.view(total, None))
    }

    fn observe(&mut self, _layer: usize, _selection: &Selection) {}

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.view.end_step();
        self.backing.commit(n_tokens, |_, _, _, _, _| {})
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        self.backing.truncate(n_tokens)
    }

    fn stats(&self) -> KvStats {
        let (cold_lanes_cached, cold_lanes, cold_bytes_read_cached) = self.backing.cached_reads();
        let cold_bytes_read = self.backing.cold().stats.bytes_read.load(Ordering::Relaxed);
        KvStats {
            tokens: self.backing.len(),
            resident_bytes: self.view.bytes() + self.read_buf.len(),
            cold_bytes: self.backing.cold_bytes(),
            cold_bytes_read,
            cold_reads: self.backing.cold().stats.reads.load(Ordering::Relaxed),
            cold_bytes_read_per_dir: self.backing.cold().bytes_read_per_dir(),
            cold_bytes_read_cached,
            cold_lanes_cached,
            cold_lanes,
            bytes_to_host: cold_bytes_read,
            tier: None,
            ..KvStats::default()
        }
    }
}
