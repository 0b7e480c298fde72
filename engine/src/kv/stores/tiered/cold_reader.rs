//! The tiered store's cold reader: which cold groups a layer's selection needs, its reads (at
//! the layer's turn, and ahead of it from what the layer selected last step), and how well the
//! placement packed what was selected.
//!
//! It owns no rows and no file: where a row lives (the hot pool, the write-back window, a slot
//! of the cold pool) it learns from a [`Residence`], and the bytes come through the pool's
//! staged reads ([`super::reads`]).

use super::reads::{LayerReads, Prefetched, Prefetcher, READ_AHEAD_BYTES, READ_PIECE_BYTES};
use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::kernels::parallel::map_items;
use crate::kv::backing::DiskBacking;
use crate::kv::cold::staged::{read_heads, ReadPlan, Staged};
use crate::kv::cold::{ColdPool, GROUP_TOKENS};
use crate::kv::hot_pool::HotPool;
use crate::kv::TierStats;
use std::sync::Arc;
use std::time::Instant;

/// Layers whose likely cold groups are read ahead of their turn.
const READ_AHEAD_LAYERS: usize = 1;

/// Where a layer's rows live: in the write-back window (from the cold pool's end on), in the
/// hot pool, or in a slot of the cold pool.
#[derive(Clone, Copy)]
pub(super) struct Residence<'a> {
    pub backing: &'a DiskBacking,
    pub hot: &'a HotPool,
    pub n_kv_heads: usize,
}

impl<'a> Residence<'a> {
    /// Whether a token's K/V row of one of `layer`'s heads (`(head, token)`) is in memory: hot,
    /// or still in the write-back window. The compute threads may share it.
    pub fn in_memory(self, layer: usize) -> impl Fn(usize, u32) -> bool + Sync + 'a {
        let (base, hot, lane0) = (self.backing.cold_end(), self.hot, layer * self.n_kv_heads);
        move |head, t| t as usize >= base || hot.contains(lane0 + head, t)
    }

    /// For each head of `layer`, the cold groups (ascending) holding those of `tokens(head)`
    /// that are neither hot nor in the window.
    pub fn cold_groups<'t>(self, layer: usize, tokens: impl Fn(usize) -> &'t [u32] + Sync) -> Vec<Vec<usize>> {
        self.selected_groups(layer, tokens).into_iter().map(|head| head.cold).collect()
    }

    /// For each head of `layer`, the cold-pool groups `tokens(head)` touch. (Asked for every
    /// layer each step, over thousands of tokens per head: the groups are marked in bitmaps,
    /// not sorted, and the heads go to the compute threads.)
    pub fn selected_groups<'t>(self, layer: usize, tokens: impl Fn(usize) -> &'t [u32] + Sync) -> Vec<HeadGroups> {
        let (held, backing, lane0) = (self.in_memory(layer), self.backing, layer * self.n_kv_heads);
        let base = backing.cold_end();
        let words = base.div_ceil(GROUP_TOKENS).div_ceil(64);
        map_items((0..self.n_kv_heads).collect(), |head| {
            let lane = lane0 + head;
            let (mut touched, mut cold) = (vec![0u64; words], vec![0u64; words]);
            for &t in tokens(head).iter().filter(|&&t| (t as usize) < base) {
                let g = backing.lane_slot(lane, t as usize) / GROUP_TOKENS;
                touched[g / 64] |= 1 << (g % 64);
                if !held(head, t) {
                    cold[g / 64] |= 1 << (g % 64);
                }
            }
            HeadGroups { cold: marked_groups(&cold), touched: touched.iter().map(|w| w.count_ones() as usize).sum() }
        })
    }
}

/// The cold-pool groups one head's selection touches.
pub(super) struct HeadGroups {
    /// Those holding a selected token that is not hot: the groups to read (ascending).
    pub cold: Vec<usize>,
    /// How many hold a selected token, hot or not.
    pub touched: usize,
}

pub(super) struct ColdReader {
    prefetch: Prefetcher,
    /// `[layer]`: per head, the cold groups (ascending) the layer's last decode step needed,
    /// which predict what it reads next.
    last_cold_groups: Vec<Option<Vec<Vec<usize>>>>,
    /// Layers below this attend densely: nothing of theirs is read ahead.
    dense_layers: usize,
    stats: TierStats,
}

impl ColdReader {
    /// A reader for `n_layers` layers, each of which takes `layer_bytes` in the cold pool.
    pub fn new(n_layers: usize, dense_layers: usize, layer_bytes: usize) -> Self {
        Self {
            prefetch: Prefetcher::new(layer_bytes),
            last_cold_groups: vec![None; n_layers],
            dense_layers,
            stats: TierStats::default(),
        }
    }

    /// A decode step's selection of `layer` (`tokens(head)`): remembers the cold groups it
    /// needs and starts reading those the read-ahead is not already reading for the layer;
    /// `None` when there are none. (Found once, here, for both.)
    pub fn start<'t>(
        &mut self,
        at: Residence<'_>,
        layer: usize,
        tokens: &(impl Fn(usize) -> &'t [u32] + Sync),
    ) -> Option<LayerReads> {
        let mut groups = self.remember(layer, at.selected_groups(layer, tokens));
        if let Some(ahead) = self.prefetch.issued(layer) {
            let mut used = 0;
            for (head, g) in groups.iter_mut().enumerate() {
                let before = g.len();
                g.retain(|&g| !ahead.covers(head, g));
                used += before - g.len();
            }
            self.stats.read_ahead_used += used as u64;
        }
        let cold = at.backing.cold();
        let plan = ReadPlan::new(cold, layer, groups);
        if plan.is_empty() {
            return None;
        }
        Some(LayerReads::start(cold, layer, plan, &mut self.prefetch))
    }

    /// What was read ahead for `layer`, once it has landed.
    pub fn claim_ahead(&mut self, layer: usize) -> Option<Prefetched> {
        let waiting = Instant::now();
        let ahead = self.prefetch.take(layer);
        self.stats.cold_read_wait_ns += waiting.elapsed().as_nanos() as u64;
        ahead
    }

    /// Waits for the next piece of the reads [`ColdReader::start`] began (starting those the
    /// buffers handed back since make room for); `None` once all have landed.
    pub fn next_landed(
        &mut self,
        cold: &Arc<ColdPool>,
        reads: &mut LayerReads,
    ) -> Option<(Result<Staged>, AlignedBuf)> {
        reads.top_up(cold, &mut self.prefetch);
        let reading = reads.next()?;
        let waiting = Instant::now();
        let landed = reading.wait();
        self.stats.cold_read_wait_ns += waiting.elapsed().as_nanos() as u64;
        Some(landed)
    }

    /// The reads of `groups` (per head, ascending) of `layer`, in pieces of bounded staging,
    /// for [`ColdReader::read_now`] one after the other.
    pub fn plan_pieces(&self, at: Residence<'_>, layer: usize, groups: Vec<Vec<usize>>) -> Vec<ReadPlan> {
        ReadPlan::new(at.backing.cold(), layer, groups).into_pieces(at.backing.cold(), READ_PIECE_BYTES)
    }

    /// Reads one piece of [`ColdReader::plan_pieces`] on this thread.
    pub fn read_now(&mut self, at: Residence<'_>, layer: usize, plan: ReadPlan) -> Result<(Staged, AlignedBuf)> {
        let mut buf = self.prefetch.piece_buffer();
        match read_heads(at.backing.cold(), layer, plan, &mut buf) {
            Ok(staged) => Ok((staged, buf)),
            Err(e) => {
                self.prefetch.recycle_piece(buf);
                Err(e)
            }
        }
    }

    /// A piece's buffer, done with, for the next reads.
    pub fn recycle(&mut self, buf: AlignedBuf) {
        self.prefetch.recycle_piece(buf);
    }

    /// A read-ahead's buffer, done with, for the next layer's.
    pub fn recycle_ahead(&mut self, buf: AlignedBuf) {
        self.prefetch.recycle_ahead(buf);
    }

    /// Starts reading, for the next [`READ_AHEAD_LAYERS`] layers after `layer`, the cold
    /// groups that their last decode step needed (up to [`READ_AHEAD_BYTES`] of them), so the
    /// reads run while this layer computes; those the layer selects that were not read ahead
    /// are read at its turn. (Reading ahead only what the last two selections both needed read
    /// fewer bytes but left more requests for the step to wait on;
    /// docs/decisions/tiered-step-on-two-cores.md.) The groups are
    /// those the layer's last [`ColdReader::start`] found, before the last commit moved rows
    /// between the tiers: finding them again here cost more than the few it misses or reads for
    /// nothing.
    pub fn read_ahead(&mut self, cold: &Arc<ColdPool>, layer: usize) {
        for next in layer + 1..(layer + 1 + READ_AHEAD_LAYERS).min(self.last_cold_groups.len()) {
            if next < self.dense_layers || self.prefetch.is_issued(next) {
                continue;
            }
            let Some(groups) = &self.last_cold_groups[next] else { continue };
            let plan = ReadPlan::new(cold, next, groups.clone()).truncated(cold, READ_AHEAD_BYTES);
            if !plan.is_empty() {
                self.stats.read_ahead_groups += plan.groups() as u64;
                self.prefetch.issue(cold, next, plan);
            }
        }
    }

    /// The groups a decode step's selection of `layer` touches: keeps the cold ones, which
    /// predict what the layer reads next step, and counts them all (see
    /// [`TierStats::selections`]); returns the cold ones.
    fn remember(&mut self, layer: usize, selected: Vec<HeadGroups>) -> Vec<Vec<usize>> {
        let cold: Vec<Vec<usize>> = selected
            .into_iter()
            .map(|head| {
                self.stats.selections += 1;
                self.stats.selected_groups += head.touched as u64;
                self.stats.selected_cold_groups += head.cold.len() as u64;
                head.cold
            })
            .collect();
        self.last_cold_groups[layer] = Some(cold.clone());
        cold
    }

    /// The step is over: reads ahead that no layer claimed are dropped (normally there are none).
    pub fn end_step(&mut self) {
        self.prefetch.clear();
    }

    /// The cache was cut: nothing read or selected before predicts what comes next.
    pub fn reset(&mut self) {
        self.prefetch.clear();
        self.last_cold_groups.fill(None);
    }

    /// Memory its read buffers hold (at most [`super::reads::staging_bound_bytes`]).
    pub fn staging_bytes(&self) -> usize {
        self.prefetch.bytes()
    }

    /// Memory its remembered selections hold.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.last_cold_groups.iter().flatten().flatten().map(|g| 8 * g.capacity()).sum()
    }

    /// Writes the reader's counters into `tier`.
    pub fn report(&self, tier: &mut TierStats) {
        let s = &self.stats;
        (tier.read_ahead_groups, tier.read_ahead_used, tier.cold_read_wait_ns) =
            (s.read_ahead_groups, s.read_ahead_used, s.cold_read_wait_ns);
        (tier.selections, tier.selected_groups, tier.selected_cold_groups) =
            (s.selections, s.selected_groups, s.selected_cold_groups);
    }
}

/// The groups marked in `marked` (bit `g % 64` of word `g / 64`), ascending.
fn marked_groups(marked: &[u64]) -> Vec<usize> {
    let mut out = Vec::new();
    for (w, &word) in marked.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            out.push(w * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
    out
}
