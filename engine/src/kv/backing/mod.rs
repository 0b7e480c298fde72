//! The disk backing shared by every store that keeps K/V in a cold pool: the pool file, the
//! write-back window in front of it, and the count of tokens held. It owns the invariants that
//! tie them together, so the stores built on it keep only what they decide (which tokens to
//! read, which rows stay hot):
//!
//! - every token before the window's base is in the cold pool, under a valid checksum; every
//!   token from the base to `len` (plus what a layer appended this step) is in the window;
//! - a spill writes every group first and moves the window only once all writes succeeded, so a
//!   failed write loses nothing and never shifts one layer's rows against another's (in text
//!   order, each layer's groups are written as it appends them, while the next layers compute:
//!   [`layer_spill`]);
//! - a truncation keeps what it can read back and says how much that is.

mod layer_spill;
mod window;

use crate::error::Result;
use crate::headroom::{Headroom, HEADROOM_RESERVE_BYTES, PRESSURE_LIMIT_BP, REMEASURE_AFTER};
use crate::kv::cold::format::ColdType;
use crate::kv::cold::placement::{Placement, PlacementKind, SpillOrder, BLOCK_TOKENS};
use crate::kv::cold::{ColdLayout, ColdPool, BLOCK_GROUPS, GROUP_TOKENS};
use crate::kv::KvShape;
use layer_spill::LayerSpills;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use window::RecentWindow;

pub struct DiskBacking {
    shape: KvShape,
    /// Shared with readers that work ahead of a layer's turn (read-ahead, the SmartSSD).
    cold: Arc<ColdPool>,
    window: RecentWindow,
    /// Which slot of the cold pool holds each token.
    placement: Placement,
    /// Each layer's groups on their way to the cold pool, for spills in text order.
    spills: Option<LayerSpills>,
    /// Committed tokens.
    len: usize,
    /// Tokens each layer appended this step, not yet committed.
    pending: Vec<usize>,
    /// When the read path was last chosen from the memory headroom.
    read_path_chosen: Option<Instant>,
}

impl DiskBacking {
    /// A backing for up to `shape.max_tokens` tokens, its pool files in `cold_dirs` (the KV
    /// heads dealt across them), with room for
    /// the SmartSSD's scoring-key chunks of `key_chunk_bytes` (0 for none), spilled tokens
    /// placed as `placement` says.
    pub fn new(
        shape: KvShape,
        cold_dirs: &[PathBuf],
        key_chunk_bytes: usize,
        placement: PlacementKind,
        cold_type: ColdType,
    ) -> Result<Self> {
        let max_groups = shape.max_tokens.div_ceil(GROUP_TOKENS);
        let layout = ColdLayout {
            n_layers: shape.n_layers,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            max_groups,
            cold_type,
        };
        Ok(Self {
            cold: Arc::new(ColdPool::create_in(cold_dirs, layout, key_chunk_bytes)?),
            window: RecentWindow::new(shape.n_layers, shape.n_kv_heads, shape.head_dim),
            spills: (placement == PlacementKind::Position).then(|| LayerSpills::new(shape.n_layers)),
            placement: Placement::new(placement, shape.n_layers * shape.n_kv_heads),
            shape,
            len: 0,
            pending: vec![0; shape.n_layers],
            read_path_chosen: None,
        })
    }

    pub fn cold(&self) -> &Arc<ColdPool> {
        &self.cold
    }

    /// Committed tokens.
    #[allow(clippy::len_without_is_empty)] // a store is never asked whether it is empty
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

    /// The cold-pool slot of `token` (before [`DiskBacking::cold_end`]) for one layer and KV
    /// head: its group is `slot / GROUP_TOKENS`, its row in the group `slot % GROUP_TOKENS`.
    pub fn slot(&self, layer: usize, head: usize, token: usize) -> usize {
        self.lane_slot(layer * self.shape.n_kv_heads + head, token)
    }

    /// [`DiskBacking::slot`] for a lane, `layer * n_kv_heads + head`.
    pub fn lane_slot(&self, lane: usize, token: usize) -> usize {
        self.placement.slot(lane, token)
    }

    /// The token in cold-pool `slot` of one layer and KV head (the inverse of
    /// [`DiskBacking::slot`]); past [`DiskBacking::cold_end`], slot and token are the same.
    pub fn token(&self, layer: usize, head: usize, slot: usize) -> usize {
        self.placement.token(layer * self.shape.n_kv_heads + head, slot)
    }

    /// DRAM the placement map takes.
    pub fn placement_bytes(&self) -> usize {
        self.placement.bytes()
    }

    /// K (or V) row of a token at or past [`DiskBacking::cold_end`], as f16 bits.
    pub fn row(&self, layer: usize, head: usize, token: usize, values: bool) -> &[u16] {
        self.window.row(layer, head, token, values)
    }

    /// Appends `layer`'s K/V rows of the step's tokens.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.pending[layer] = self.shape.tokens_to_append(self.len, k, v)?;
        self.window.push(layer, k, v);
        if let Some(spills) = &mut self.spills {
            spills.start(&self.cold, &self.window, layer);
        }
        Ok(())
    }

    /// Chooses, at most once per [`REMEASURE_AFTER`], which (layer, KV head) regions of the
    /// cold pool are read through the page cache: as many as half the measured headroom holds,
    /// at the pool's current size.
    fn choose_read_path(&mut self) {
        if self.read_path_chosen.is_some_and(|at| at.elapsed() < REMEASURE_AFTER) {
            return;
        }
        self.read_path_chosen = Some(Instant::now());
        let lanes = self.shape.n_layers * self.shape.n_kv_heads;
        let lane_bytes = (self.window.base() / GROUP_TOKENS) as u64 * self.cold.layout().disk_group_bytes() as u64;
        let headroom = Headroom::measure();
        let cached = cached_lanes(headroom, lane_bytes, lanes);
        if cached != self.cold.cached_lanes() {
            tracing::info!(
                cached,
                lanes,
                headroom_mb = headroom.bytes / 1_000_000,
                cgroup_limited = headroom.cgroup_limited,
                pressure_bp = headroom.pressure_some_bp,
                "cold pool read path"
            );
        }
        self.cold.set_cached_lanes(cached);
    }

    /// The step's `n_tokens` join the committed ones, and every complete group goes to the cold
    /// pool. `on_spilled(layer, head, token, k, v)` sees each spilled row once all writes
    /// succeeded, before the window lets it go. On a write error the tokens stay committed in
    /// the window, where attention still finds them, and the error is returned: nothing moved.
    pub fn commit(
        &mut self,
        n_tokens: usize,
        mut on_spilled: impl FnMut(usize, usize, usize, &[u16], &[u16]),
    ) -> Result<()> {
        self.len += n_tokens;
        self.pending.fill(0);
        self.choose_read_path();
        let groups = self.window.spillable_groups();
        // Each layer's groups went out as it appended them, unless one did not start.
        let written_ahead = match &mut self.spills {
            Some(spills) => spills.finish(groups)?,
            None => false,
        };
        if groups == 0 {
            return Ok(());
        }
        let (base, end) = (self.window.base(), self.window.base() + groups * GROUP_TOKENS);
        let n_kv = self.shape.n_kv_heads;
        let window = &self.window;
        let order = self
            .placement
            .plan(base..end, self.shape.head_dim, |lane, t| window.row(lane / n_kv, lane % n_kv, t, false));
        if !written_ahead {
            self.write_window_groups(groups, order.as_ref())?;
        }
        if let Some(order) = &order {
            self.placement.apply(order);
        }
        for layer in 0..self.shape.n_layers {
            for head in 0..self.shape.n_kv_heads {
                for t in base..end {
                    on_spilled(
                        layer,
                        head,
                        t,
                        self.window.row(layer, head, t, false),
                        self.window.row(layer, head, t, true),
                    );
                }
            }
        }
        self.window.drop_groups(groups);
        Ok(())
    }

    /// Orders the tokens of every whole block in the cold pool, in each lane (`layer ·
    /// n_kv_heads + head`) of `lanes`, by `rank(lane, token)`, highest first (ties keep their
    /// order), so that tokens ranked alike share pages. A block is read, reordered and written
    /// whole into its region's spare block ([`ColdPool::relocate_block`]); one already in that
    /// order is left alone. Returns how many blocks were rewritten. On an error the blocks
    /// rewritten before it keep their new order, the others their old one, and every token reads
    /// back as before.
    pub fn relayout(&mut self, lanes: Range<usize>, rank: impl Fn(usize, usize) -> u32 + Sync) -> Result<usize> {
        use rayon::prelude::*;
        let (n_kv, hd) = (self.shape.n_kv_heads, self.shape.head_dim);
        let blocks = self.window.base() / BLOCK_TOKENS;
        let (cold, placement) = (&self.cold, &self.placement);
        let group_words = cold.layout().group_bytes() / 2;
        // Per lane: the blocks it relaid with their new slot order, and the error that stopped it.
        type RelaidLane = (usize, Vec<(usize, Vec<u16>)>, Result<()>);
        let relaid: Vec<RelaidLane> = lanes
            .into_par_iter()
            .map(|lane| {
                let (layer, head) = (lane / n_kv, lane % n_kv);
                let (mut old, mut new) = (cold.buffer(BLOCK_GROUPS), cold.buffer(BLOCK_GROUPS));
                let mut done = Vec::new();
                for block in 0..blocks {
                    let start = block * BLOCK_TOKENS;
                    let slot = |i: u16| placement.slot(lane, start + usize::from(i)) - start;
                    let mut order: Vec<u16> = (0..BLOCK_TOKENS as u16).collect();
                    order.sort_by_key(|&i| (std::cmp::Reverse(rank(lane, start + usize::from(i))), slot(i)));
                    if order.iter().enumerate().all(|(s, &i)| slot(i) == s) {
                        continue;
                    }
                    if let Err(e) =
                        cold.read_groups(layer, head, block * BLOCK_GROUPS, BLOCK_GROUPS, old.as_bytes_mut())
                    {
                        return (lane, done, Err(e));
                    }
                    let (from, to) = (old.as_u16(), new.as_u16_mut());
                    for (s, &i) in order.iter().enumerate() {
                        let at = |slot: usize, values: bool| {
                            slot / GROUP_TOKENS * group_words
                                + usize::from(values) * GROUP_TOKENS * hd
                                + slot % GROUP_TOKENS * hd
                        };
                        for values in [false, true] {
                            to[at(s, values)..][..hd].copy_from_slice(&from[at(slot(i), values)..][..hd]);
                        }
                    }
                    if let Err(e) = cold.relocate_block(layer, head, block, new.as_bytes()) {
                        return (lane, done, Err(e));
                    }
                    done.push((block, order));
                }
                (lane, done, Ok(()))
            })
            .collect();
        let mut rewritten = 0;
        let mut first_error = Ok(());
        for (lane, done, result) in relaid {
            for (block, order) in done {
                self.placement.apply_block(lane, block, &order);
                rewritten += 1;
            }
            if first_error.is_ok() {
                first_error = result;
            }
        }
        first_error.map(|()| rewritten)
    }

    /// Keeps tokens `..n_tokens` (and drops anything appended but not committed); returns how
    /// many it kept. That is `n_tokens` (or `len`, if fewer) unless the cold pages to cut in
    /// cannot be read back: then it keeps the tokens before the cut's group (or, where spilled
    /// tokens were placed by key, before the span they were placed in), which need no read, and
    /// the caller must run the tokens after them again.
    pub fn truncate(&mut self, n_tokens: usize) -> usize {
        if let Some(spills) = &mut self.spills {
            spills.abandon();
        }
        self.pending.fill(0);
        let keep = n_tokens.min(self.len);
        let restart = self.placement.restart(keep);
        let kept = match self.window.keep_up_to(keep) {
            true => Ok(()),
            false => self.read_back(restart, keep),
        };
        match kept {
            Ok(()) => self.len = keep,
            Err(e) => {
                self.len = restart;
                tracing::warn!(error = %e, asked = keep, kept = self.len, "cold pages could not be read back while truncating; keeping the tokens before them");
                self.window.restart_at(self.len);
            }
        }
        // Tokens past the cold pool's end will be placed again when they spill.
        self.placement.truncate(self.window.base());
        self.len
    }

    /// Writes the window's first `groups` groups of every (layer, head) to the cold pool, each
    /// slot holding the token `order` puts there (text order without one), changing nothing in
    /// the window: if a write fails, the window still holds every token and the groups already
    /// written lie past the pool's end, where nothing reads them, until a later spill overwrites
    /// them.
    fn write_window_groups(&self, groups: usize, order: Option<&SpillOrder>) -> Result<()> {
        // A lane's groups at once: a prompt chunk's spill is a few large writes per lane, not
        // one per 4 KiB group.
        let mut pages = self.cold.buffer(groups);
        let group_words = self.cold.layout().group_bytes() / 2;
        let first = self.window.base() / GROUP_TOKENS;
        for layer in 0..self.shape.n_layers {
            for head in 0..self.shape.n_kv_heads {
                self.window.pack_groups(layer, head, groups, order, pages.as_u16_mut(), group_words);
                self.cold.write_groups(layer, head, first, groups, pages.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Empties the window and refills it from `restart` (a group boundary in the cold pool) up
    /// to `keep` with the tokens read back from the pool's pages: the same pages for every lane,
    /// from the restart's to the last one holding a kept token.
    fn read_back(&mut self, restart: usize, keep: usize) -> Result<()> {
        let (n_kv, hd) = (self.shape.n_kv_heads, self.shape.head_dim);
        let lanes = self.shape.n_layers * n_kv;
        let first_group = restart / GROUP_TOKENS;
        let placement = &self.placement;
        let pages_per_lane = (0..lanes)
            .flat_map(|lane| (restart..keep).map(move |t| placement.slot(lane, t) / GROUP_TOKENS + 1 - first_group))
            .max()
            .unwrap_or(0);
        let page_bytes = self.cold.layout().group_bytes();
        let mut pages = self.cold.buffer(lanes * pages_per_lane);
        if keep > restart {
            for (lane, dst) in pages.as_bytes_mut().chunks_exact_mut(pages_per_lane * page_bytes).enumerate() {
                self.cold.read_groups(lane / n_kv, lane % n_kv, first_group, pages_per_lane, dst)?;
            }
        }
        let (page_words, pages) = (page_bytes / 2, pages.as_u16());
        self.window.refill(restart, keep - restart, |layer, head, t| {
            let lane = layer * n_kv + head;
            let s = placement.slot(lane, t) - restart;
            let page = &pages[(lane * pages_per_lane + s / GROUP_TOKENS) * page_words..][..page_words];
            let row = s % GROUP_TOKENS;
            (&page[row * hd..][..hd], &page[GROUP_TOKENS * hd + row * hd..][..hd])
        });
        Ok(())
    }

    /// Regions read through the page cache, of all, and the bytes read that way so far.
    pub fn cached_reads(&self) -> (usize, usize, u64) {
        let lanes = self.shape.n_layers * self.shape.n_kv_heads;
        (
            self.cold.cached_lanes().min(lanes),
            lanes,
            self.cold.stats.bytes_read_cached.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Bytes of K/V in the cold pool, as it keeps them (f16, or fewer in 8 bits; without the
    /// padding of groups to whole pages or sectors).
    pub fn cold_bytes(&self) -> usize {
        let layout = self.cold.layout();
        let per_group = layout.cold_type.bytes(2 * layout.group_values(), layout.head_dim);
        self.window.base() / GROUP_TOKENS * self.shape.n_layers * self.shape.n_kv_heads * per_group
    }
}

/// Of `lanes` regions of `lane_bytes` each, how many the page cache may serve: as many as fit
/// in half of what the headroom leaves above the reserve, none under memory pressure.
fn cached_lanes(headroom: Headroom, lane_bytes: u64, lanes: usize) -> usize {
    if headroom.pressure_some_bp >= PRESSURE_LIMIT_BP {
        return 0;
    }
    let budget = headroom.bytes.saturating_sub(HEADROOM_RESERVE_BYTES) / 2;
    if lane_bytes == 0 {
        return if budget > 0 { lanes } else { 0 };
    }
    (budget / lane_bytes).min(lanes as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::fault::{self, ColdFaults, FailingWrite};
    use half::f16;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SHAPE: KvShape = KvShape { n_layers: 2, n_kv_heads: 2, head_dim: 8, max_tokens: 1024 };

    /// Token t's V row in (layer, head): every value t (f16-exact below 2048), so a row read
    /// back from the lane's pages names the token it belongs to.
    fn v_row(_layer: usize, _head: usize, t: usize) -> f32 {
        t as f32
    }

    /// Appends and commits `tokens`, with keys from `key(layer, head, t, dim)`.
    fn push(
        b: &mut DiskBacking,
        tokens: std::ops::Range<usize>,
        key: &dyn Fn(usize, usize, usize, usize) -> f32,
    ) -> Result<()> {
        let hd = SHAPE.head_dim;
        for layer in 0..SHAPE.n_layers {
            let rows = |f: &dyn Fn(usize, usize, usize) -> f32| -> Vec<f32> {
                tokens
                    .clone()
                    .flat_map(|t| (0..SHAPE.n_kv_heads).flat_map(move |h| (0..hd).map(move |d| (t, h, d))))
                    .map(|(t, h, d)| f(t, h, d))
                    .collect()
            };
            let (k, v) = (rows(&|t, h, d| key(layer, h, t, d)), rows(&|t, h, _| v_row(layer, h, t)));
            b.append(layer, &k, &v)?;
        }
        b.commit(tokens.len(), |_, _, _, _, _| {})
    }

    /// Every token before the cold end reads back, from its slot, as itself.
    fn check_readable(b: &DiskBacking) {
        let hd = SHAPE.head_dim;
        let mut page = b.cold().buffer(1);
        for (layer, head) in (0..SHAPE.n_layers).flat_map(|l| (0..SHAPE.n_kv_heads).map(move |h| (l, h))) {
            for t in 0..b.cold_end() {
                let slot = b.slot(layer, head, t);
                b.cold().read_groups(layer, head, slot / GROUP_TOKENS, 1, page.as_bytes_mut()).unwrap();
                let v = &page.as_u16()[GROUP_TOKENS * hd + slot % GROUP_TOKENS * hd..][..hd];
                assert!(
                    v.iter().all(|&x| f16::from_bits(x).to_f32() == v_row(layer, head, t)),
                    "layer {layer} head {head} token {t} (slot {slot}) reads {}",
                    f16::from_bits(v[0]).to_f32()
                );
            }
        }
    }

    #[test]
    fn the_page_cache_serves_what_half_the_headroom_holds_and_nothing_under_pressure() {
        let room =
            |mb: u64, pressure_some_bp: u32| Headroom { bytes: mb << 20, cgroup_limited: false, pressure_some_bp };
        assert_eq!(cached_lanes(room(256 + 200, 0), 10 << 20, 90), 10, "100 MB of budget holds ten 10 MB regions");
        assert_eq!(cached_lanes(room(64_000, 0), 10 << 20, 90), 90);
        assert_eq!(cached_lanes(room(200, 0), 10 << 20, 90), 0, "below the reserve");
        assert_eq!(cached_lanes(room(64_000, 1500), 10 << 20, 90), 0, "memory pressure");
        assert_eq!(cached_lanes(room(64_000, 0), 0, 90), 90, "an empty pool");
    }

    #[test]
    fn tokens_placed_by_key_read_back_at_their_true_position() {
        let lcg = |x: usize| ((x.wrapping_mul(2654435761) >> 7) % 1000) as f32 / 100.0 - 5.0;
        type KeyAt<'a> = &'a dyn Fn(usize, usize, usize, usize) -> f32;
        let key_sets: [(&str, KeyAt); 4] = [
            ("random", &|l, h, t, d| lcg(((l * 7 + h) * 4096 + t) * 16 + d)),
            ("identical", &|_, _, _, _| 1.0),
            ("two far clusters", &|_, _, t, d| if t % 2 == 0 { 1e4 } else { -1e4 } + d as f32),
            ("huge and tiny", &|_, _, t, d| if t % 7 == 0 { 6e4 } else { 1e-6 * (t * d) as f32 }),
        ];
        for (name, key) in key_sets {
            let scratch = tempfile::Builder::new()
                .prefix(&format!("hillside-backing-{}-", name.replace(' ', "-")))
                .tempdir()
                .unwrap();
            let dir = scratch.path().to_path_buf();
            let mut b =
                DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Keys, ColdType::F16).unwrap();
            // A prompt chunk, another across a block boundary, then tokens one at a time.
            push(&mut b, 0..256, key).unwrap();
            push(&mut b, 256..600, key).unwrap();
            for t in 600..650 {
                push(&mut b, t..t + 1, key).unwrap();
            }
            check_readable(&b);
            // Back into a permuted span: the window reads it back and the rest is placed again.
            assert_eq!(b.truncate(300), 300, "{name}");
            assert_eq!(b.cold_end(), 256, "{name}: the cut span is read back into the window");
            push(&mut b, 300..700, key).unwrap();
            check_readable(&b);
            drop(b);
        }
    }

    #[test]
    fn blocks_re_placed_by_rank_read_back_at_their_true_position_and_a_failed_one_loses_nothing() {
        let scratch = tempfile::Builder::new().prefix("hillside-backing-relayout-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        // Armed below: the rewrite of layer 1's group 20 (block 1) fails once.
        let faults = fault::inject(
            &dir,
            ColdFaults {
                failing_write: Some(FailingWrite { layer: 1, group: 20, errno: libc::EIO, times: AtomicUsize::new(0) }),
                ..Default::default()
            },
        );
        let key = |l: usize, h: usize, t: usize, d: usize| ((t * 31 + d * 7 + l * 3 + h) % 17) as f32;
        let lanes = SHAPE.n_layers * SHAPE.n_kv_heads;
        let mut b = DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Hits, ColdType::F16).unwrap();
        push(&mut b, 0..600, &key).unwrap();
        for t in 600..700 {
            push(&mut b, t..t + 1, &key).unwrap();
        }
        assert_eq!(b.cold_end(), 688);
        // A rank that puts every third token first, and one that reverses the text.
        let thirds = |lane: usize, t: usize| u32::from((t + lane).is_multiple_of(3));
        assert_eq!(b.relayout(0..lanes, thirds).unwrap(), lanes * 2, "both whole blocks of every lane");
        check_readable(&b);
        for lane in 0..lanes {
            let firsts: Vec<usize> =
                (0..256).filter(|t| (t + lane) % 3 == 0).map(|t| b.slot(lane / 2, lane % 2, t)).collect();
            assert!(
                firsts.iter().all(|&s| s < firsts.len()),
                "lane {lane}: the tokens ranked first fill the first pages"
            );
        }
        assert_eq!(b.relayout(0..lanes, thirds).unwrap(), 0, "already in that order");
        faults.failing_write.as_ref().unwrap().times.store(1, Ordering::Relaxed);
        let block_1 = |b: &DiskBacking, head: usize| (256..512).map(|t| b.slot(1, head, t)).collect::<Vec<_>>();
        let before = [block_1(&b, 0), block_1(&b, 1)];
        let err = b.relayout(0..lanes, |_, t| t as u32).unwrap_err().to_string();
        assert!(err.contains("write failed"), "{err}");
        // The write failed for one of layer 1's heads (whichever came first): its block keeps
        // its layout, and every block rewritten before the error has its new one.
        assert!(block_1(&b, 0) == before[0] || block_1(&b, 1) == before[1], "the failed block keeps its layout");
        assert_eq!(b.slot(0, 0, 0), 255, "layer 0 was rewritten in reverse");
        check_readable(&b);
        // A truncation into a re-placed block reads the block back; spills go on after it.
        assert_eq!(b.truncate(300), 300);
        assert_eq!(b.cold_end(), 256);
        push(&mut b, 300..720, &key).unwrap();
        check_readable(&b);
        assert!(b.relayout(0..lanes, |_, t| (t * 7919 % 1000) as u32).unwrap() > 0);
        check_readable(&b);
        fault::clear(&dir);
        drop(b);
    }

    #[test]
    fn in_text_order_each_layer_spills_as_it_appends_and_a_failed_write_fails_the_commit() {
        let scratch = tempfile::Builder::new().prefix("hillside-backing-layer-spill-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let faults = fault::inject(
            &dir,
            ColdFaults {
                failing_write: Some(FailingWrite { layer: 1, group: 6, errno: libc::EIO, times: AtomicUsize::new(0) }),
                ..Default::default()
            },
        );
        let key = |l: usize, h: usize, t: usize, d: usize| ((t * 31 + d * 7 + l * 3 + h) % 17) as f32;
        let mut b =
            DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Position, ColdType::F16).unwrap();
        let written = |b: &DiskBacking| b.cold().stats.bytes_written.load(Ordering::Relaxed);
        let group_bytes = b.cold().layout().group_bytes() as u64;
        push(&mut b, 0..40, &key).unwrap();
        assert_eq!(
            (b.cold_end(), written(&b)),
            (32, 2 * 2 * 2 * group_bytes),
            "two groups of 2 layers × 2 heads, each written once"
        );
        // Layer 0 of the next step: its groups are on their way before the step commits.
        let rows = |n: usize, x: f32| vec![x; n * SHAPE.kv_dim()];
        b.append(0, &rows(60, 1.0), &rows(60, 2.0)).unwrap();
        assert_eq!(b.cold_end(), 32, "nothing reads them yet");
        // A rollback waits for the writes in flight; they lie past the pool's end.
        assert_eq!(b.truncate(40), 40);
        assert_eq!(
            written(&b),
            (8 + 2 * 4) * group_bytes,
            "layer 0's four groups (tokens 32..96) went out at its append"
        );
        // A write that fails on its I/O thread fails the commit; the tokens stay in the window.
        faults.failing_write.as_ref().unwrap().times.store(1, Ordering::Relaxed);
        let err = push(&mut b, 40..120, &key).unwrap_err().to_string();
        assert!(err.contains("write failed"), "{err}");
        assert_eq!((b.len(), b.cold_end()), (120, 32));
        push(&mut b, 120..130, &key).unwrap();
        assert_eq!(b.cold_end(), 128);
        check_readable(&b);
        fault::clear(&dir);
        drop(b);
    }

    #[test]
    fn a_spill_that_fails_midway_leaves_no_page_in_use_and_a_retry_places_every_token() {
        let scratch = tempfile::Builder::new().prefix("hillside-backing-failed-spill-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        // The write of layer 1's group 5 fails once: the spill has written some pages by then.
        fault::inject(
            &dir,
            ColdFaults {
                failing_write: Some(FailingWrite { layer: 1, group: 5, errno: libc::EIO, times: AtomicUsize::new(1) }),
                ..Default::default()
            },
        );
        let key = |l: usize, h: usize, t: usize, d: usize| ((t * 31 + d * 7 + l * 3 + h) % 17) as f32;
        let mut b = DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Keys, ColdType::F16).unwrap();
        push(&mut b, 0..64, &key).unwrap();
        let err = push(&mut b, 64..256, &key).unwrap_err().to_string();
        assert!(err.contains("write failed"), "{err}");
        assert_eq!((b.len(), b.cold_end()), (256, 64), "the tokens stay committed in the window");
        // Nothing points into the pages the failed spill wrote: every spilled token reads back
        // from where it was, and the window serves the rest.
        check_readable(&b);
        assert!((64..256).all(|t| b.slot(1, 0, t) == t));
        for t in 64..256 {
            assert_eq!(f16::from_bits(b.row(1, 1, t, true)[0]).to_f32(), v_row(1, 1, t));
        }
        // The next commit spills them again, placed by key, and all are readable.
        push(&mut b, 256..272, &key).unwrap();
        assert_eq!(b.cold_end(), 272);
        assert!((64..256).any(|t| b.slot(1, 0, t) != t), "placed by key on the retry");
        check_readable(&b);
        fault::clear(&dir);
        drop(b);
    }
}
