//! Assembling a layer's view for attention: rows from the write-back window and the hot pool,
//! and cold rows read ahead of the layer's turn, are copied while the cold groups the read-ahead
//! missed are still being read; their rows are filled in once the reads land.

use super::TieredKvStore;
use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::kernels::attention::KV_TILE;
use crate::kernels::parallel::map_items;
use crate::kv::cold::staged::{HeadPages, Staged};
use crate::kv::cold::GROUP_TOKENS;
use crate::kv::view::{SlotRun, TileRows};
use std::ops::Range;

/// Slots one parallel task copies: a few tiles, enough to amortize the hand-off.
const RUN_SLOTS: usize = 128;

/// A view slot whose row must come from the cold pool.
#[derive(Clone, Copy)]
pub(super) struct ColdRow {
    slot: u32,
    head: u32,
    token: u32,
}

impl TieredKvStore {
    /// Copies the rows of `heads` (the view's) that are in the write-back window or the hot pool
    /// into the view, in parallel runs of slots, and returns the slots left for cold rows.
    /// `decode` counts hot hits.
    pub(super) fn copy_resident_rows<'t>(
        &mut self,
        layer: usize,
        tokens: &(impl Fn(usize) -> &'t [u32] + Sync),
        heads: Range<usize>,
        decode: bool,
    ) -> Vec<ColdRow> {
        let n_slots = tokens(heads.start).len();
        let (hot, window, lane0) = (self.hot.pool(), &self.backing, self.lane(layer, 0));
        let first_head = heads.start;
        let runs = self.view.runs_mut(0..heads.len(), n_slots, RUN_SLOTS);
        let copied: Vec<(u64, Vec<ColdRow>)> = map_items(runs, |mut run| {
            let head = first_head + run.head;
            let lane = lane0 + head;
            let tokens = &tokens(head)[run.first_slot..][..run.len()];
            let (mut hot_hits, mut cold) = (0, Vec::with_capacity(tokens.len()));
            // The run's rows are looked up (and their loads started) before any is copied.
            let mut rows = [None; RUN_SLOTS];
            for (i, (&t, rows)) in tokens.iter().zip(&mut rows).enumerate() {
                *rows = if t as usize >= window.cold_end() {
                    Some((window.row(layer, head, t as usize, false), window.row(layer, head, t as usize, true)))
                } else {
                    let hot_rows = hot.get_prefetched(lane, t);
                    match hot_rows {
                        Some(_) => hot_hits += 1,
                        None => cold.push(ColdRow { slot: (run.first_slot + i) as u32, head: head as u32, token: t }),
                    }
                    hot_rows
                };
            }
            run.fill(|i| rows[i]);
            (hot_hits, cold)
        });
        if decode {
            self.tier.hot_hits += copied.iter().map(|c| c.0).sum::<u64>();
        }
        copied.into_iter().flat_map(|c| c.1).collect()
    }

    /// Reads the groups of the cold slots `rows` (of the view holding `heads`) still lacks, at
    /// once, and fills them.
    pub(super) fn read_missing_rows(
        &mut self,
        layer: usize,
        rows: &mut Vec<ColdRow>,
        heads: Range<usize>,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut groups = vec![Vec::new(); self.shape.n_kv_heads];
        for row in rows.iter() {
            groups[row.head as usize]
                .push(self.backing.slot(layer, row.head as usize, row.token as usize) / GROUP_TOKENS);
        }
        groups.iter_mut().for_each(|g| {
            g.sort_unstable();
            g.dedup();
        });
        self.read_cold_rows(layer, rows, groups, heads, true)?;
        assert!(rows.is_empty(), "every cold group a selection needs is read");
        Ok(())
    }

    /// Reads `groups` (per head, ascending) of `layer` on this thread, piece after piece, and
    /// fills the cold slots `rows` whose groups each piece holds (see
    /// [`TieredKvStore::copy_cold_rows`]).
    pub(super) fn read_cold_rows(
        &mut self,
        layer: usize,
        rows: &mut Vec<ColdRow>,
        groups: Vec<Vec<usize>>,
        heads: Range<usize>,
        decode: bool,
    ) -> Result<()> {
        let (reader, at) = self.reader_at();
        for piece in reader.plan_pieces(at, layer, groups) {
            let (reader, at) = self.reader_at();
            let (staged, buf) = reader.read_now(at, layer, piece)?;
            let copied = self.copy_cold_rows(layer, rows, &staged, &buf, heads.clone(), decode);
            self.reader.recycle(buf);
            copied?;
        }
        Ok(())
    }

    /// Fills the cold slots (`rows`, of the view holding `heads`, in slot order head by head)
    /// whose groups `staged` holds in `buf`, decoding each row as it is copied, in parallel runs
    /// of slots on the compute threads (a head per task left most of 16 cores idle), and keeps
    /// in `rows` those it could not. `decode` counts cold hits and offers the rows for promotion.
    /// A group that fails its checksum fails the copy, which then counts and offers nothing.
    pub(super) fn copy_cold_rows(
        &mut self,
        layer: usize,
        rows: &mut Vec<ColdRow>,
        staged: &Staged,
        buf: &AlignedBuf,
        heads: Range<usize>,
        decode: bool,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (hd, lane0) = (self.shape.head_dim, self.lane(layer, 0));
        let (backing, hot) = (&self.backing, &self.hot);
        let cold_type = backing.cold().layout().cold_type;
        let pages: Vec<HeadPages<'_>> =
            heads.clone().map(|head| staged.head_pages(backing.cold(), buf, head)).collect();
        let tasks: Vec<_> = self
            .view
            .slot_runs_mut(0..heads.len(), RUN_SLOTS)
            .into_iter()
            .map(|run| {
                let (head, slots) =
                    ((heads.start + run.head) as u32, run.first_slot as u32..(run.first_slot + run.len()) as u32);
                let in_run = |r: &ColdRow| (r.head, r.slot) < (head, slots.end);
                let first = rows.partition_point(|r| (r.head, r.slot) < (head, slots.start));
                (run, &rows[first..first + rows[first..].partition_point(in_run)])
            })
            .filter(|(_, rows)| !rows.is_empty())
            .collect();
        let copied = map_items(tasks, |(mut run, rows)| -> Result<RunCopy<'_>> {
            let head = heads.start + run.head;
            let lane = lane0 + head;
            let pages = &pages[run.head];
            let mut copy = RunCopy { lane, copied: 0, missing: Vec::new(), offers: Vec::new() };
            // The rows come in slot order: those of one tile are decoded side by side, K then
            // V per slot of the tile, and written together.
            let mut tile_rows = vec![0u16; KV_TILE * 2 * hd];
            let (mut tile, mut filled) = (0, 0u32);
            // The run's rows are found (and their loads started) before any is decoded.
            let mut found = [None; RUN_SLOTS];
            for (row, found) in rows.iter().zip(&mut found) {
                let cold_slot = backing.lane_slot(lane, row.token as usize);
                *found = pages.get(cold_slot / GROUP_TOKENS)?.map(|page| {
                    cold_type.prefetch_row(page, hd, cold_slot % GROUP_TOKENS);
                    (page, cold_slot)
                });
            }
            for (&row, found) in rows.iter().zip(found) {
                let Some((page, cold_slot)) = found else {
                    copy.missing.push(row);
                    continue;
                };
                let within = cold_slot % GROUP_TOKENS;
                let slot = row.slot as usize - run.first_slot;
                if slot / KV_TILE != tile {
                    put_tile(&mut run, tile, &tile_rows, std::mem::take(&mut filled), hd);
                    tile = slot / KV_TILE;
                }
                let (k, v) = tile_rows[slot % KV_TILE * 2 * hd..][..2 * hd].split_at_mut(hd);
                cold_type.decode_row(page, hd, within, k, v);
                filled |= 1 << (slot % KV_TILE);
                copy.copied += 1;
                if decode {
                    if let Some(key) = hot.candidate_key(lane, row.token, cold_slot as u32) {
                        copy.offers.push(Offer { token: row.token, key, page, within });
                    }
                }
            }
            put_tile(&mut run, tile, &tile_rows, filled, hd);
            Ok(copy)
        });
        let copied = copied.into_iter().collect::<Result<Vec<_>>>()?;
        rows.clear();
        let mut row = vec![0u16; 2 * hd];
        for copy in copied {
            if decode {
                self.tier.cold_hits += copy.copied;
                for offer in copy.offers {
                    let (k, v) = row.split_at_mut(hd);
                    cold_type.decode_row(offer.page, hd, offer.within, k, v);
                    self.hot.offer(copy.lane, offer.token, offer.key, k, v);
                }
            }
            rows.extend(copy.missing);
        }
        Ok(())
    }
}

/// Writes the rows decoded into `tile_rows` (K then V per slot of the tile) for the slots set
/// in `filled` into tile `tile` of a head's run.
fn put_tile(run: &mut SlotRun<'_>, tile: usize, tile_rows: &[u16], filled: u32, hd: usize) {
    let mut rows = TileRows::default();
    for lane in (0..KV_TILE).filter(|l| filled >> l & 1 == 1) {
        let (k, v) = tile_rows[lane * 2 * hd..][..2 * hd].split_at(hd);
        rows.put(lane, k, v);
    }
    run.put_tile(tile, &rows);
}

/// A copied cold row that may be promoted: decoded again from its staged group once the
/// copying tasks are done, rather than kept decoded meanwhile.
struct Offer<'a> {
    token: u32,
    /// Its rank key.
    key: u64,
    page: &'a [u8],
    within: usize,
}

/// What one run's task of [`TieredKvStore::copy_cold_rows`] did: the rows it copied, those
/// it found no group for, and the copied rows that may be promoted.
struct RunCopy<'a> {
    lane: usize,
    copied: u64,
    missing: Vec<ColdRow>,
    offers: Vec<Offer<'a>>,
}
