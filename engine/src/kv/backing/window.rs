//! The write-back window: the most recent tokens' K/V in host memory, per layer and KV head,
//! until a whole group of [`GROUP_TOKENS`] can go to the cold pool in one page-sized write
//! (HILOS' delayed write-back). Queries against these tokens read them from here. It holds
//! memory only: the disk backing packs its groups into the pool's pages and writes them, and
//! reads them back when a truncation cuts into the pool.

use crate::kv::cold::placement::SpillOrder;
use crate::kv::cold::GROUP_TOKENS;
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
        Self {
            n_layers,
            n_kv_heads,
            head_dim,
            base: 0,
            lens: vec![0; n_layers],
            slots: 0,
            k: Vec::new(),
            v: Vec::new(),
        }
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
                let bits = |dst: &mut [u16], src: &[f32]| {
                    dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f16::from_f32(x).to_bits())
                };
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

    /// Lays the first `groups` groups of (layer, head) out as the cold pool keeps them (each
    /// `group_words` long: K rows, then V rows), each slot holding the token `order` puts there
    /// (text order without one).
    pub fn pack_groups(
        &self,
        layer: usize,
        head: usize,
        groups: usize,
        order: Option<&SpillOrder>,
        dst: &mut [u16],
        group_words: usize,
    ) {
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

    /// Drops the first `groups` groups, once they are written to the cold pool: the pool now
    /// ends where the window starts.
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
        let needed =
            (self.lens.iter().copied().max().unwrap_or(0) + 1).next_multiple_of(GROUP_TOKENS).max(2 * GROUP_TOKENS);
        if self.slots > 2 * needed {
            self.relayout(needed);
        }
    }

    /// Keeps the tokens before `n_tokens` of those it holds; false (and nothing changed) when
    /// some of them lie before the window, in the cold pool: see [`RecentWindow::refill`].
    pub fn keep_up_to(&mut self, n_tokens: usize) -> bool {
        if n_tokens < self.base {
            return false;
        }
        self.lens.iter_mut().for_each(|len| *len = (*len).min(n_tokens - self.base));
        true
    }

    /// Empties the window, which now starts at `restart` (a group boundary, at or before its
    /// base), and fills it with the `keep` tokens from there: `rows(layer, head, token)` gives
    /// each one's K and V rows (read back from the cold pool).
    pub fn refill<'a>(
        &mut self,
        restart: usize,
        keep: usize,
        rows: impl Fn(usize, usize, usize) -> (&'a [u16], &'a [u16]),
    ) {
        let hd = self.head_dim;
        self.restart_at(restart);
        if keep == 0 {
            return;
        }
        if self.slots < keep {
            self.relayout(keep.next_multiple_of(GROUP_TOKENS));
        }
        for layer in 0..self.n_layers {
            for head in 0..self.n_kv_heads {
                for t in restart..restart + keep {
                    let (k, v) = rows(layer, head, t);
                    let at = self.at(layer, head, t - restart);
                    self.k[at..][..hd].copy_from_slice(k);
                    self.v[at..][..hd].copy_from_slice(v);
                }
            }
        }
        self.lens.fill(keep);
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
    use super::*;

    #[test]
    fn rows_survive_spills_relayouts_and_refills() {
        let (layers, heads, hd) = (2, 2, 4);
        // Token t's K in (layer, head) is all t + 1000·layer + 100·head (f16-exact); V is its negation.
        let value = |layer: usize, head: usize, t: usize| (t + 1000 * layer + 100 * head) as f32;
        let rows = |layer: usize, tokens: std::ops::Range<usize>, sign: f32| -> Vec<f32> {
            tokens
                .flat_map(|t| (0..heads).flat_map(move |h| std::iter::repeat_n(sign * value(layer, h, t), hd)))
                .collect()
        };
        let bits = |x: f32| vec![f16::from_f32(x).to_bits(); hd];
        let check = |w: &RecentWindow, tokens: std::ops::Range<usize>| {
            for t in tokens {
                for (layer, head) in (0..layers).flat_map(|l| (0..heads).map(move |h| (l, h))) {
                    assert_eq!(w.row(layer, head, t, false), &bits(value(layer, head, t))[..], "K of token {t}");
                    assert_eq!(w.row(layer, head, t, true), &bits(-value(layer, head, t))[..], "V of token {t}");
                }
            }
        };
        let mut w = RecentWindow::new(layers, heads, hd);
        // A prompt chunk, then single tokens: the window grows, lets whole groups go and shrinks.
        for layer in 0..layers {
            w.push(layer, &rows(layer, 0..300, 1.0), &rows(layer, 0..300, -1.0));
        }
        assert!(w.slots >= 300);
        check(&w, 0..300);
        // Packed as the pool keeps them: K rows, then V rows, per group.
        let group_words = 2 * GROUP_TOKENS * hd;
        let mut page = vec![0u16; group_words];
        w.pack_groups(1, 1, 1, None, &mut page, group_words);
        assert_eq!(&page[5 * hd..][..hd], &bits(value(1, 1, 5))[..]);
        assert_eq!(&page[GROUP_TOKENS * hd + 5 * hd..][..hd], &bits(-value(1, 1, 5))[..]);
        let groups = w.spillable_groups();
        w.drop_groups(groups);
        assert_eq!(groups, 300 / GROUP_TOKENS);
        assert_eq!((w.base(), w.len(0)), (288, 12));
        assert!(w.slots <= 2 * GROUP_TOKENS, "the chunk's room is given back: {} slots", w.slots);
        check(&w, 288..300);
        for t in 300..310 {
            for layer in 0..layers {
                w.push(layer, &rows(layer, t..t + 1, 1.0), &rows(layer, t..t + 1, -1.0));
            }
        }
        check(&w, 288..310);
        // Cut within the window: kept in place.
        assert!(w.keep_up_to(305));
        assert_eq!(w.len(0), 17);
        // Cut before it: nothing changes until the caller refills from the pool's rows.
        assert!(!w.keep_up_to(250));
        assert_eq!(w.base(), 288);
        type KeyValueBits = (Vec<u16>, Vec<u16>);
        let row_bits: Vec<Vec<Vec<KeyValueBits>>> = (0..layers)
            .map(|l| {
                (0..heads)
                    .map(|h| (240..250).map(|t| (bits(value(l, h, t)), bits(-value(l, h, t)))).collect())
                    .collect()
            })
            .collect();
        w.refill(240, 10, |l, h, t| (&row_bits[l][h][t - 240].0[..], &row_bits[l][h][t - 240].1[..]));
        assert_eq!((w.base(), w.len(0)), (240, 10));
        check(&w, 240..250);
    }
}
