//! Buffers that hold one layer's gathered K/V in the layout attention reads ([`KvView`]): K in
//! dimension-major tiles of [`KV_TILE`] tokens, V token-major. Stores that do not keep the
//! whole cache in that layout (offloaded, tiered) assemble each step's working set here.
//!
//! The buffers are laid out afresh for each gather, sized to its heads and slots: a prompt's
//! view holds every token of one head, a decode step's the selected fifth of every head, and
//! memory follows what the last step asked rather than the longest prompt so far.

use crate::kernels::attention::{k_tile_index, write_k_tile};
use crate::kv::cold::GROUP_TOKENS;
use crate::kv::{KvView, KV_TILE};
use half::slice::HalfBitsSliceExt;

pub struct ViewBuffers {
    /// Heads laid out by the last `reset`.
    n_kv_heads: usize,
    head_dim: usize,
    /// Token slots per head (a multiple of KV_TILE), as laid out by the last `reset`.
    stride_tokens: usize,
    k: Vec<u16>,
    v: Vec<u16>,
    /// The most values (of K, and of V) a view laid out since the last `end_step` held.
    step_need: usize,
}

impl ViewBuffers {
    pub fn new(head_dim: usize) -> Self {
        Self { n_kv_heads: 0, head_dim, stride_tokens: 0, k: Vec::new(), v: Vec::new(), step_need: 0 }
    }

    /// Lays the buffers out for `n_heads` heads of `n_slots` tokens; what they held is lost.
    pub fn reset(&mut self, n_heads: usize, n_slots: usize) {
        self.n_kv_heads = n_heads;
        self.stride_tokens = n_slots.next_multiple_of(KV_TILE);
        let len = self.n_kv_heads * self.stride_tokens * self.head_dim;
        self.step_need = self.step_need.max(len);
        for buf in [&mut self.k, &mut self.v] {
            // Grown by a sixteenth past the need, not doubled as `resize` would: a decode
            // step's view grows a little with the cache, and doubling left half of it unused
            // (3.4 MB at 32K tokens).
            if len > buf.capacity() {
                buf.reserve_exact(len + len / 16 - buf.len());
            }
            buf.resize(len, 0);
        }
    }

    /// The step is over (the store commits it): memory beyond twice the most any of its views
    /// needed is given back (the first decode step after a long prompt). Given back at each
    /// `reset` instead, a step whose layers need views of different sizes (a dense layer's
    /// every token, then the sparse layers' selections) would free the large buffers and fault
    /// them in again every step (at 32K, a fifth of a tiered step's gathering).
    pub fn end_step(&mut self) {
        let need = std::mem::take(&mut self.step_need);
        for buf in [&mut self.k, &mut self.v] {
            if 2 * need < buf.capacity() {
                buf.truncate(need);
                buf.shrink_to(need);
            }
        }
    }

    pub fn bytes(&self) -> usize {
        2 * (self.k.capacity() + self.v.capacity())
    }

    /// Puts one token's K and V rows (f16 bits) of `head` in `slot`.
    pub fn set_token(&mut self, slot: usize, head: usize, k_row: &[u16], v_row: &[u16]) {
        let head_words = self.stride_tokens * self.head_dim;
        let (k, v) = (&mut self.k[head * head_words..][..head_words], &mut self.v[head * head_words..][..head_words]);
        put_token(k, v, self.head_dim, slot, k_row, v_row);
    }

    /// Each head in `heads`, its first `n_slots` slots cut into runs of `run_slots` (a multiple
    /// of [`KV_TILE`]) that do not overlap, so that they can be filled in parallel.
    pub fn runs_mut(&mut self, heads: std::ops::Range<usize>, n_slots: usize, run_slots: usize) -> Vec<SlotRun<'_>> {
        assert!(run_slots > 0 && run_slots.is_multiple_of(KV_TILE) && n_slots <= self.stride_tokens);
        let (hd, head_words) = (self.head_dim, self.stride_tokens * self.head_dim);
        let mut runs = Vec::new();
        let heads_k = self.k.chunks_mut(head_words).zip(self.v.chunks_mut(head_words)).enumerate();
        for (head, (k, v)) in heads_k.skip(heads.start).take(heads.len()) {
            // K is tiled, so a run's K spans whole tiles: the last one's slots past n_slots
            // are never read.
            let (k, v) = (&mut k[..n_slots.next_multiple_of(KV_TILE) * hd], &mut v[..n_slots * hd]);
            for (i, (k, v)) in k.chunks_mut(run_slots * hd).zip(v.chunks_mut(run_slots * hd)).enumerate() {
                runs.push(SlotRun { head, first_slot: i * run_slots, head_dim: hd, k, v });
            }
        }
        runs
    }

    /// Each head in `heads`, all of its slots as one run, so that heads can be filled in
    /// parallel.
    pub fn heads_mut(&mut self, heads: std::ops::Range<usize>) -> Vec<SlotRun<'_>> {
        self.slot_runs_mut(heads, usize::MAX)
    }

    /// Each head in `heads`, all of its slots cut into runs of at most `run_slots` (a multiple
    /// of [`KV_TILE`]), so that heads and runs can be filled in parallel.
    pub fn slot_runs_mut(&mut self, heads: std::ops::Range<usize>, run_slots: usize) -> Vec<SlotRun<'_>> {
        match self.stride_tokens {
            0 => Vec::new(),
            all => self.runs_mut(heads, all, run_slots.min(all)),
        }
    }

    /// Puts `rows` in their slots of `head`'s tile `tile`.
    pub fn put_tile(&mut self, head: usize, tile: usize, rows: &TileRows<'_>) {
        let head_words = self.stride_tokens * self.head_dim;
        let (k, v) = (&mut self.k[head * head_words..][..head_words], &mut self.v[head * head_words..][..head_words]);
        rows.write(k, v, self.head_dim, tile);
    }

    /// Puts a cold-pool group (K then V, token-major, GROUP_TOKENS rows each) at `first_slot`.
    pub fn set_group(&mut self, first_slot: usize, head: usize, page: &[u16]) {
        let hd = self.head_dim;
        let (k, v) = page.split_at(GROUP_TOKENS * hd);
        let mut rows = TileRows::default();
        for t in 0..GROUP_TOKENS {
            let slot = first_slot + t;
            rows.put(slot % KV_TILE, &k[t * hd..][..hd], &v[t * hd..][..hd]);
            if slot % KV_TILE == KV_TILE - 1 || t == GROUP_TOKENS - 1 {
                self.put_tile(head, slot / KV_TILE, &rows);
                rows = TileRows::default();
            }
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
            window_tokens: None,
        }
    }
}

/// Consecutive slots of one head's part of a [`ViewBuffers`], starting at a tile boundary.
pub struct SlotRun<'a> {
    pub head: usize,
    pub first_slot: usize,
    head_dim: usize,
    k: &'a mut [u16],
    v: &'a mut [u16],
}

impl SlotRun<'_> {
    /// Slots in the run.
    pub fn len(&self) -> usize {
        self.v.len() / self.head_dim
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Puts `rows` in their slots of the run's tile `tile` (counted from the run's start).
    pub fn put_tile(&mut self, tile: usize, rows: &TileRows<'_>) {
        rows.write(self.k, self.v, self.head_dim, tile);
    }

    /// Fills the run's slots a tile at a time: slot `i` gets `row(i)`'s K and V rows (f16
    /// bits), or keeps what it holds where that is `None`.
    pub fn fill<'r>(&mut self, mut row: impl FnMut(usize) -> Option<(&'r [u16], &'r [u16])>) {
        let len = self.len();
        for (tile, first) in (0..len).step_by(KV_TILE).enumerate() {
            let mut rows = TileRows::default();
            for lane in 0..KV_TILE.min(len - first) {
                if let Some((k, v)) = row(first + lane) {
                    rows.put(lane, k, v);
                }
            }
            self.put_tile(tile, &rows);
        }
    }
}

/// The rows bound for some slots of one K tile, gathered so that K is written a tile at a
/// time (see [`write_k_tile`]).
#[derive(Default)]
pub struct TileRows<'r> {
    /// Bit `l`: the tile's slot `l` has a row here.
    lanes: u16,
    k: [&'r [u16]; KV_TILE],
    v: [&'r [u16]; KV_TILE],
}

impl<'r> TileRows<'r> {
    /// Gives the tile's slot `lane` the K and V rows (f16 bits).
    pub fn put(&mut self, lane: usize, k_row: &'r [u16], v_row: &'r [u16]) {
        self.lanes |= 1 << lane;
        self.k[lane] = k_row;
        self.v[lane] = v_row;
    }

    /// Writes the rows into tile `tile` of a head's K tiles and V rows (or of a run of them).
    fn write(&self, k: &mut [u16], v: &mut [u16], head_dim: usize, tile: usize) {
        if self.lanes == 0 {
            return;
        }
        write_k_tile(&mut k[tile * head_dim * KV_TILE..][..head_dim * KV_TILE], &self.k, self.lanes);
        for lane in (0..KV_TILE).filter(|l| self.lanes >> l & 1 == 1) {
            v[(tile * KV_TILE + lane) * head_dim..][..head_dim].copy_from_slice(self.v[lane]);
        }
    }
}

/// Writes one token's rows into `slot` of a head's K tiles and V rows (or of a run of them
/// starting at a tile boundary).
fn put_token(k: &mut [u16], v: &mut [u16], head_dim: usize, slot: usize, k_row: &[u16], v_row: &[u16]) {
    // The token's lane of its tile: every KV_TILE-th element from its offset (k_tile_index).
    let tile = &mut k[k_tile_index(slot - slot % KV_TILE, 0, head_dim)..][..head_dim * KV_TILE];
    for (lane, &x) in tile[slot % KV_TILE..].iter_mut().step_by(KV_TILE).zip(k_row) {
        *lane = x;
    }
    v[slot * head_dim..][..head_dim].copy_from_slice(v_row);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_that_needs_less_than_half_the_view_gives_the_rest_back() {
        let bytes = |heads: usize, slots: usize| 2 * 2 * heads * slots * 64;
        let mut view = ViewBuffers::new(64);
        view.reset(3, 8000);
        view.end_step();
        // Grown by a sixteenth past the need (a decode step's view grows with the cache), so
        // the next tiles fit where they are; not doubled.
        assert_eq!(view.bytes(), bytes(3, 8000) + bytes(3, 8000) / 16);
        let k_at = view.k.as_ptr();
        view.reset(3, 8400);
        assert_eq!(view.k.as_ptr(), k_at);
        view.reset(3, 8608);
        assert_eq!(view.bytes(), bytes(3, 8608) + bytes(3, 8608) / 16);
        view.end_step();
        // A third of that (a prompt's head at a time): the rest is given back.
        view.reset(1, 8000);
        view.end_step();
        assert_eq!(view.bytes(), bytes(1, 8000));
        // Decode steps after it (every head, a fifth of the tokens) fit in what is there.
        view.reset(3, 1600);
        view.end_step();
        assert_eq!(view.bytes(), bytes(1, 8000));
        // Within a step, a small view after a large one keeps the memory for the next large one.
        for _ in 0..3 {
            view.reset(1, 8000);
            let k_at = view.k.as_ptr();
            view.reset(3, 1000);
            view.reset(1, 8000);
            assert_eq!((view.bytes(), view.k.as_ptr()), (bytes(1, 8000), k_at));
            view.end_step();
        }
    }

    #[test]
    fn runs_tiles_and_groups_fill_the_same_slots_as_single_tokens() {
        let (heads, hd, n) = (3, 16, 70);
        let row = |h: usize, t: usize, off: u16| -> Vec<u16> {
            (0..hd).map(|d| (h * 1000 + t * 10 + d) as u16 + off).collect()
        };
        let mut one_by_one = ViewBuffers::new(hd);
        one_by_one.reset(heads, 100);
        for h in 0..heads {
            for t in 0..n {
                one_by_one.set_token(t, h, &row(h, t, 0), &row(h, t, 5));
            }
        }
        let mut by_runs = ViewBuffers::new(hd);
        by_runs.reset(heads, 100);
        let runs = by_runs.runs_mut(1..3, n, 32);
        assert_eq!(runs.iter().map(SlotRun::len).collect::<Vec<_>>(), vec![32, 32, 6, 32, 32, 6]);
        for mut run in runs {
            let (h, first) = (run.head, run.first_slot);
            let rows: Vec<(Vec<u16>, Vec<u16>)> =
                (0..run.len()).map(|i| (row(h, first + i, 0), row(h, first + i, 5))).collect();
            // Every third slot is left as it is, for a tile of its own below.
            run.fill(|i| ((first + i) % 3 != 0).then(|| (&rows[i].0[..], &rows[i].1[..])));
        }
        // Head 1's through the buffers, head 2's through its run of `heads_mut`.
        let tile_of = |h: usize, tile: usize| -> Vec<(usize, Vec<u16>, Vec<u16>)> {
            (tile * KV_TILE..n.min(tile * KV_TILE + KV_TILE))
                .filter(|t| t % 3 == 0)
                .map(|t| (t, row(h, t, 0), row(h, t, 5)))
                .collect()
        };
        for tile in 0..n.div_ceil(KV_TILE) {
            let rows = tile_of(1, tile);
            let mut put = TileRows::default();
            rows.iter().for_each(|(t, k, v)| put.put(t % KV_TILE, k, v));
            by_runs.put_tile(1, tile, &put);
        }
        let mut whole_heads = by_runs.heads_mut(2..3);
        assert_eq!((whole_heads.len(), whole_heads[0].head, whole_heads[0].len()), (1, 2, 112));
        for tile in 0..n.div_ceil(KV_TILE) {
            let rows = tile_of(2, tile);
            let mut put = TileRows::default();
            rows.iter().for_each(|(t, k, v)| put.put(t % KV_TILE, k, v));
            whole_heads[0].put_tile(tile, &put);
        }
        drop(whole_heads);
        // Head 0 as cold-pool groups, the first one straddling two tiles.
        for first in [6, 22, 38, 54] {
            let mut page: Vec<u16> = (first..first + GROUP_TOKENS).flat_map(|t| row(0, t, 0)).collect();
            page.extend((first..first + GROUP_TOKENS).flat_map(|t| row(0, t, 5)));
            by_runs.set_group(first, 0, &page);
        }
        for t in 0..6 {
            by_runs.set_token(t, 0, &row(0, t, 0), &row(0, t, 5));
        }
        let (a, b) = (one_by_one.view(n, None), by_runs.view(n, None));
        for h in 0..heads {
            let part = |x: &[half::f16]| x[h * 112 * hd..][..n * hd].to_vec();
            assert!(part(a.k) == part(b.k) && part(a.v) == part(b.v), "head {h}");
        }
    }
}
