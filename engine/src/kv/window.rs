//! The write-back window: the most recent tokens' K/V in host memory, per layer and KV head,
//! until a whole group of [`GROUP_TOKENS`] can go to the cold pool in one page-sized write
//! (HILOS' delayed write-back). Queries against these tokens read them from here.

use super::cold::{ColdPool, GROUP_TOKENS};
use super::placement::SpillOrder;
use crate::error::Result;
use half::f16;

pub struct RecentWindow {
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// First token the window holds (a multiple of GROUP_TOKENS; earlier ones are spilled).
    base: usize,
    /// Tokens each layer holds (including ones appended this step).
    lens: Vec<usize>,
    /// Token slots per (layer, head) in `k` and `v`.
    slots: usize,
    /// f16 bits, `[layer][head][slot][dim]`: one buffer each for K and V, so that the room a
    /// prompt chunk needed (a chunk's tokens for every layer) is given back in one piece once
    /// decoding needs only a group's worth, instead of lingering in 180 small heap blocks.
    k: Vec<u16>,
    v: Vec<u16>,
}

impl RecentWindow {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self { n_layers, n_kv_heads, head_dim, base: 0, lens: vec![0; n_layers], slots: 0, k: Vec::new(), v: Vec::new() }
    }

    /// First token held here; tokens before it are in the cold pool.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Tokens this layer's window holds (including ones appended this step).
    pub fn len(&self, layer: usize) -> usize {
        self.lens[layer]
    }

    /// Where (layer, head)'s slot `slot` starts in `k` and `v`.
    fn at(&self, layer: usize, head: usize, slot: usize) -> usize {
        self.at_in(self.slots, layer, head, slot)
    }

    /// The same, in buffers laid out for `slots` tokens per (layer, head).
    fn at_in(&self, slots: usize, layer: usize, head: usize, slot: usize) -> usize {
        ((layer * self.n_kv_heads + head) * slots + slot) * self.head_dim
    }

    /// Lays the buffers out for `slots` tokens per (layer, head), keeping what they hold.
    fn relayout(&mut self, slots: usize) {
        let len = self.n_layers * self.n_kv_heads * slots * self.head_dim;
        let (mut k, mut v) = (vec![0; len], vec![0; len]);
        for layer in 0..self.n_layers {
            let words = self.lens[layer] * self.head_dim;
            for head in 0..self.n_kv_heads {
                let (from, to) = (self.at(layer, head, 0), self.at_in(slots, layer, head, 0));
                k[to..][..words].copy_from_slice(&self.k[from..][..words]);
                v[to..][..words].copy_from_slice(&self.v[from..][..words]);
            }
        }
        (self.slots, self.k, self.v) = (slots, k, v);
    }

    /// Adds `n` tokens' K and V rows (`n × n_kv_heads·head_dim` f32) for one layer.
    pub fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let (hd, kv_dim) = (self.head_dim, self.n_kv_heads * self.head_dim);
        let n = k.len() / kv_dim;
        if self.lens[layer] + n > self.slots {
            self.relayout((self.lens[layer] + n).max(2 * self.slots).next_multiple_of(GROUP_TOKENS));
        }
        for (i, (row_k, row_v)) in k.chunks_exact(kv_dim).zip(v.chunks_exact(kv_dim)).enumerate() {
            for h in 0..self.n_kv_heads {
                let at = self.at(layer, h, self.lens[layer] + i);
                let bits = |dst: &mut [u16], src: &[f32]| dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f16::from_f32(x).to_bits());
                bits(&mut self.k[at..][..hd], &row_k[h * hd..][..hd]);
                bits(&mut self.v[at..][..hd], &row_v[h * hd..][..hd]);
            }
        }
        self.lens[layer] += n;
    }

    /// K (or V) row of `token` for one layer and head, as f16 bits.
    pub fn row(&self, layer: usize, head: usize, token: usize, values: bool) -> &[u16] {
        let rows = if values { &self.v } else { &self.k };
        &rows[self.at(layer, head, token - self.base)..][..self.head_dim]
    }

    /// Complete groups every layer holds: what the next spill writes.
    pub fn spillable_groups(&self) -> usize {
        self.lens.iter().copied().min().unwrap_or(0) / GROUP_TOKENS
    }

    /// Writes the first `groups` groups of every (layer, head) to `cold`, each slot holding the
    /// token `order` puts there (text order without one), changing nothing here: if a write
    /// fails, the window still holds every token and the groups already written lie past the
    /// cold pool's end (`base`), where nothing reads them, until a later spill overwrites them.
    pub fn write_groups(&self, cold: &ColdPool, groups: usize, order: Option<&SpillOrder>) -> Result<()> {
        // A lane's groups at once: a prompt chunk's spill is a few large writes per lane, not
        // one per 4 KiB group.
        let mut pages = cold.buffer(groups);
        let group_words = cold.layout().group_bytes() / 2;
        for layer in 0..self.n_layers {
            for head in 0..self.n_kv_heads {
                self.pack_groups(layer, head, groups, order, pages.as_u16_mut(), group_words);
                cold.write_groups(layer, head, self.base / GROUP_TOKENS, groups, pages.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Lays the first `groups` groups of (layer, head) out as the cold pool keeps them (each
    /// `group_words` long: K rows, then V rows), each slot holding the token `order` puts there
    /// (text order without one).
    pub fn pack_groups(&self, layer: usize, head: usize, groups: usize, order: Option<&SpillOrder>, dst: &mut [u16], group_words: usize) {
        let hd = self.head_dim;
        let lane = layer * self.n_kv_heads + head;
        for (g, page) in dst.chunks_exact_mut(group_words).take(groups).enumerate() {
            let (k, v) = page.split_at_mut(GROUP_TOKENS * hd);
            for row in 0..GROUP_TOKENS {
                let slot = g * GROUP_TOKENS + row;
                let token = order.map_or(self.base + slot, |o| o.token(lane, slot));
                k[row * hd..][..hd].copy_from_slice(self.row(layer, head, token, false));
                v[row * hd..][..hd].copy_from_slice(self.row(layer, head, token, true));
            }
        }
    }

    /// Drops the first `groups` groups, written by [`RecentWindow::write_groups`]: the cold
    /// pool now ends where the window starts.
    pub fn drop_groups(&mut self, groups: usize) {
        let spilled = groups * GROUP_TOKENS * self.head_dim;
        for layer in 0..self.n_layers {
            let kept = (self.lens[layer] - groups * GROUP_TOKENS) * self.head_dim;
            for head in 0..self.n_kv_heads {
                let start = self.at(layer, head, 0);
                self.k.copy_within(start + spilled..start + spilled + kept, start);
                self.v.copy_within(start + spilled..start + spilled + kept, start);
            }
            self.lens[layer] -= groups * GROUP_TOKENS;
        }
        self.base += groups * GROUP_TOKENS;
        self.shrink();
    }

    /// Gives back the room a prompt chunk needed once far fewer tokens are held.
    fn shrink(&mut self) {
        let needed = (self.lens.iter().copied().max().unwrap_or(0) + 1).next_multiple_of(GROUP_TOKENS).max(2 * GROUP_TOKENS);
        if self.slots > 2 * needed {
            self.relayout(needed);
        }
    }

    /// Keeps tokens `..n_tokens`. When that cuts into the cold pool, the window restarts at
    /// `restart` (a group boundary at or before the cut) and the tokens from there to the cut
    /// are read back from their slots (`slot(layer, head, token)`), every page that may hold
    /// them in one request per (layer, head). All or nothing: if a read fails, the window is as
    /// it was.
    pub fn truncate(&mut self, n_tokens: usize, restart: usize, cold: &ColdPool, slot: impl Fn(usize, usize, usize) -> usize) -> Result<()> {
        let hd = self.head_dim;
        if n_tokens >= self.base {
            self.lens.iter_mut().for_each(|len| *len = (*len).min(n_tokens - self.base));
            return Ok(());
        }
        debug_assert!(restart.is_multiple_of(GROUP_TOKENS) && restart <= n_tokens);
        let keep = n_tokens - restart;
        let lanes = self.n_layers * self.n_kv_heads;
        let first_group = restart / GROUP_TOKENS;
        // Pages from the restart to the last one holding a kept token, the same for every lane.
        let pages_per_lane = (0..lanes)
            .flat_map(|lane| (restart..n_tokens).map(move |t| (lane, t)))
            .map(|(lane, t)| slot(lane / self.n_kv_heads, lane % self.n_kv_heads, t) / GROUP_TOKENS + 1 - first_group)
            .max()
            .unwrap_or(0);
        let page_bytes = cold.layout().group_bytes();
        let mut pages = cold.buffer(lanes * pages_per_lane);
        if keep > 0 {
            for (lane, dst) in pages.as_bytes_mut().chunks_exact_mut(pages_per_lane * page_bytes).enumerate() {
                cold.read_groups(lane / self.n_kv_heads, lane % self.n_kv_heads, first_group, pages_per_lane, dst)?;
            }
        }
        self.restart_at(restart);
        if keep > 0 {
            if self.slots < keep {
                self.relayout(keep.next_multiple_of(GROUP_TOKENS));
            }
            let page_words = page_bytes / 2;
            for (lane, lane_pages) in pages.as_u16().chunks_exact(pages_per_lane * page_words).enumerate() {
                let (layer, head) = (lane / self.n_kv_heads, lane % self.n_kv_heads);
                for t in restart..n_tokens {
                    let s = slot(layer, head, t) - restart;
                    let page = &lane_pages[s / GROUP_TOKENS * page_words..][..page_words];
                    let (row, at) = (s % GROUP_TOKENS, self.at(layer, head, t - restart));
                    self.k[at..][..hd].copy_from_slice(&page[row * hd..][..hd]);
                    self.v[at..][..hd].copy_from_slice(&page[GROUP_TOKENS * hd + row * hd..][..hd]);
                }
            }
            self.lens.fill(keep);
        }
        Ok(())
    }

    /// Empties the window, which now starts at `token` (a group boundary): the cold pool holds
    /// exactly the tokens before it.
    pub fn restart_at(&mut self, token: usize) {
        debug_assert!(token.is_multiple_of(GROUP_TOKENS) && token <= self.base);
        self.base = token;
        self.lens.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::cold::ColdLayout;
    use super::*;

    #[test]
    fn rows_survive_spills_relayouts_and_truncation_into_the_cold_pool() {
        let (layers, heads, hd) = (2, 2, 4);
        let dir = std::env::temp_dir().join(format!("hillside-window-{}", std::process::id()));
        let cold = ColdPool::create(&dir, ColdLayout::f16(layers, heads, hd, 40)).unwrap();
        // Token t's K in (layer, head) is all t + 1000·layer + 100·head (f16-exact); V is its negation.
        let value = |layer: usize, head: usize, t: usize| (t + 1000 * layer + 100 * head) as f32;
        let rows = |layer: usize, tokens: std::ops::Range<usize>, sign: f32| -> Vec<f32> {
            tokens.flat_map(|t| (0..heads).flat_map(move |h| std::iter::repeat_n(sign * value(layer, h, t), hd))).collect()
        };
        let check = |w: &RecentWindow, tokens: std::ops::Range<usize>| {
            for t in tokens {
                for (layer, head) in (0..layers).flat_map(|l| (0..heads).map(move |h| (l, h))) {
                    let (k, v) = (w.row(layer, head, t, false), w.row(layer, head, t, true));
                    assert!(k.iter().all(|&x| f16::from_bits(x).to_f32() == value(layer, head, t)), "K of token {t}");
                    assert!(v.iter().all(|&x| f16::from_bits(x).to_f32() == -value(layer, head, t)), "V of token {t}");
                }
            }
        };
        let mut w = RecentWindow::new(layers, heads, hd);
        // A prompt chunk, then single tokens: the window grows, spills whole groups and shrinks.
        for layer in 0..layers {
            w.push(layer, &rows(layer, 0..300, 1.0), &rows(layer, 0..300, -1.0));
        }
        assert!(w.slots >= 300);
        check(&w, 0..300);
        let spill = |w: &mut RecentWindow| {
            let groups = w.spillable_groups();
            w.write_groups(&cold, groups, None).unwrap();
            w.drop_groups(groups);
            groups
        };
        assert_eq!(spill(&mut w), 300 / GROUP_TOKENS);
        assert_eq!((w.base(), w.len(0)), (288, 12));
        assert!(w.slots <= 2 * GROUP_TOKENS, "the chunk's room is given back: {} slots", w.slots);
        check(&w, 288..300);
        for t in 300..310 {
            for layer in 0..layers {
                w.push(layer, &rows(layer, t..t + 1, 1.0), &rows(layer, t..t + 1, -1.0));
            }
        }
        check(&w, 288..310);
        spill(&mut w);
        assert_eq!((w.base(), w.len(1)), (304, 6));
        // Back into the spilled part: the partial group is read back from the cold pool.
        w.truncate(250, 240, &cold, |_, _, t| t).unwrap();
        assert_eq!((w.base(), w.len(0)), (240, 10));
        check(&w, 240..250);
        drop(cold);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
