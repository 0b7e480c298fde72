//! Assembling a layer's view for attention: rows from the write-back window and the hot pool
//! are copied while the cold groups a decode step needs are still being read, and the cold
//! rows are filled in once the reads land.

use super::reads::{PendingRead, Prefetched, Staged};
use super::{TieredKvStore, PREFETCH_ROWS_AHEAD};
use crate::kv::cold::GROUP_TOKENS;

/// A view slot whose row must come from the cold pool.
pub(super) struct ColdRow {
    slot: u32,
    head: u32,
    token: u32,
}

impl TieredKvStore {
    /// Starts reading the cold groups that each head's `tokens(head)` need and that the
    /// read-ahead (`ahead`) did not bring; `None` when there are none.
    pub(super) fn start_cold_read<'t>(&mut self, layer: usize, tokens: &impl Fn(usize) -> &'t [u32], ahead: Option<&Prefetched>) -> Option<PendingRead> {
        let mut groups = self.cold_groups(layer, tokens);
        if let Some(ahead) = ahead {
            let mut used = 0;
            for (head, g) in groups.iter_mut().enumerate() {
                let before = g.len();
                g.retain(|&g| !ahead.staged.contains(head, g));
                used += before - g.len();
            }
            self.tier.read_ahead_used += used as u64;
        }
        if groups.iter().all(Vec::is_empty) {
            return None;
        }
        let buf = std::mem::replace(&mut self.staging, crate::kv::aligned::AlignedBuf::zeroed(0));
        Some(PendingRead::start(&self.cold, layer, groups, buf))
    }

    /// Copies each head's (or `only_head`'s) rows that are in the write-back window or the hot
    /// pool into the view, and returns the slots left for cold rows. `decode` counts hot hits.
    pub(super) fn copy_resident_rows<'t>(&mut self, layer: usize, tokens: &impl Fn(usize) -> &'t [u32], only_head: Option<usize>, decode: bool) -> Vec<ColdRow> {
        let base = self.window.base();
        let mut cold = Vec::new();
        for head in (0..self.shape.n_kv_heads).filter(|&h| only_head.is_none_or(|o| o == h)) {
            let lane = self.lane(layer, head);
            let tokens = tokens(head);
            for (slot, &t) in tokens.iter().enumerate() {
                if let Some(&ahead) = tokens.get(slot + PREFETCH_ROWS_AHEAD) {
                    self.hot.prefetch(lane, ahead);
                }
                if t as usize >= base {
                    let (k, v) = (self.window.row(layer, head, t as usize, false), self.window.row(layer, head, t as usize, true));
                    self.view.set_token(slot, head, k, v);
                } else if let Some((k, v)) = self.hot.get(lane, t) {
                    self.view.set_token(slot, head, k, v);
                    self.tier.hot_hits += u64::from(decode);
                } else {
                    cold.push(ColdRow { slot: slot as u32, head: head as u32, token: t });
                }
            }
        }
        cold
    }

    /// Fills the cold slots from the groups read now (`staged`, in the staging buffer) or ahead
    /// of time. `decode` counts cold hits and offers the rows for promotion.
    pub(super) fn copy_cold_rows(&mut self, layer: usize, rows: &[ColdRow], staged: &Staged, ahead: Option<&Prefetched>, decode: bool) {
        let hd = self.shape.head_dim;
        let gb_words = self.cold.layout().group_bytes() / 2;
        for &ColdRow { slot, head, token } in rows {
            let (head, tu) = (head as usize, token as usize);
            let group = tu / GROUP_TOKENS;
            let page = staged
                .group(&self.staging, head, group, gb_words)
                .or_else(|| ahead.and_then(|a| a.staged.group(&a.buf, head, group, gb_words)))
                .expect("every cold group a selection needs is read");
            let row = tu % GROUP_TOKENS;
            let (k, v) = (&page[row * hd..][..hd], &page[GROUP_TOKENS * hd + row * hd..][..hd]);
            self.view.set_token(slot as usize, head, k, v);
            if decode {
                self.tier.cold_hits += 1;
                let lane = self.lane(layer, head);
                // With this step's hit, which `observe` counts after attention.
                let hits = self.hits[lane].get(tu).map_or(1, |h| h + 1);
                self.candidates.offer(lane, token, hits, k, v);
            }
        }
    }
}
