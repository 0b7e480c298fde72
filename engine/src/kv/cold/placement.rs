//! Where each token's K/V row sits in the cold pool (after ClusterKV: recall by semantic
//! cluster, not by text position).
//!
//! A decode step reads whole 16-token pages, so a page read for one selected token carries
//! fifteen others with it. Selected by position, a head's top α is scattered over most pages.
//! Placed by key similarity, the tokens of a page tend to be selected together: when the
//! write-back window spills a batch, each (layer, KV head)'s tokens are grouped into pages by
//! their keys (balanced recursive bisection along the keys' principal direction), and a small
//! map says which slot each token went to. Selection stays token-exact: only the layout moves.
//!
//! Keys predict what is selected together only weakly; what decode steps selected predicts it
//! better (consecutive steps share ~80% of their tokens). With placement `hits` the tiered
//! store re-places the cold pool a few decode steps after a prompt, and now and then after:
//! each block's tokens in the order of how often they were selected ([`Placement::apply_block`]
//! records a block the backing rewrote).
//!
//! Tokens move only inside an aligned block of [`BLOCK_TOKENS`], so a slot is stored in one
//! byte, as its offset in the block.
//! Each spill's part of a block is one *span*; a truncation that cuts into a span must read the
//! whole span's pages back (the tokens before the cut are anywhere in it), so the store keeps
//! the spans it permuted.

use super::{BLOCK_GROUPS, GROUP_TOKENS};
use half::f16;
use std::ops::Range;

/// Tokens inside which a token may move: its slot is within the same block (one block of the
/// cold pool's groups, which [`super::ColdPool::relocate_block`] rewrites whole).
pub const BLOCK_TOKENS: usize = BLOCK_GROUPS * GROUP_TOKENS;

/// How the cold pool orders a spilled batch's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementKind {
    /// In text order: token t in slot t.
    Position,
    /// Grouped into pages by the similarity of their keys, per (layer, KV head).
    #[default]
    Keys,
    /// By key as they spill, then, once decoding has run a few steps, each block's tokens
    /// ordered by how often decode steps selected them (the tiered store re-places them).
    Hits,
}

named_choices!(PlacementKind, "placement", { Position => "position", Keys => "keys", Hits => "hits" });

/// The slots of one spill, decided before its pages are written and applied once all are.
pub struct SpillOrder {
    tokens: Range<usize>,
    /// `[lane][i]`: how far the token written to slot `tokens.start + i` is from that slot
    /// (less than a block either way, whatever the spill's length).
    order: Vec<Vec<i16>>,
}

impl SpillOrder {
    /// The token that slot `tokens.start + i` of `lane` holds.
    pub fn token(&self, lane: usize, i: usize) -> usize {
        (self.tokens.start + i).wrapping_add_signed(isize::from(self.order[lane][i]))
    }
}

/// Every lane's (a layer's KV head: `layer * n_kv_heads + head`) token-to-slot map.
pub struct Placement {
    kind: PlacementKind,
    /// `[lane][token]`: the token's slot, as its offset in the token's block; tokens past the
    /// end sit in their own slot. (A byte, not the two of a distance: at 32K tokens, 3 MB
    /// less for a 24-layer model's 48 lanes.)
    moves: Vec<Vec<u8>>,
    /// `[lane][slot]`: the inverse, the offset in the block of the token in the slot (page-wise
    /// selection reads a page's tokens from it).
    holders: Vec<Vec<u8>>,
    /// Spans whose tokens were permuted, ascending.
    spans: Vec<Range<usize>>,
}

impl Placement {
    pub fn new(kind: PlacementKind, lanes: usize) -> Self {
        Self { kind, moves: vec![Vec::new(); lanes], holders: vec![Vec::new(); lanes], spans: Vec::new() }
    }

    /// The token in `slot` of `lane` (the inverse of [`Placement::slot`]).
    pub fn token(&self, lane: usize, slot: usize) -> usize {
        match self.holders[lane].get(slot) {
            Some(&offset) => in_block(slot, offset),
            None => slot,
        }
    }

    /// The slot of `token` in `lane`.
    pub fn slot(&self, lane: usize, token: usize) -> usize {
        match self.moves[lane].get(token) {
            Some(&offset) => in_block(token, offset),
            None => token,
        }
    }

    /// The slots for spilling `tokens` (whole groups from a group boundary), given each lane's
    /// keys (`keys(lane, token)`, f16 bits); `None` where they stay in text order.
    pub fn plan<'k>(
        &self,
        tokens: Range<usize>,
        head_dim: usize,
        keys: impl Fn(usize, usize) -> &'k [u16] + Sync,
    ) -> Option<SpillOrder> {
        if self.kind == PlacementKind::Position || spans(tokens.clone()).all(|s| s.len() <= GROUP_TOKENS) {
            return None;
        }
        use rayon::prelude::*;
        let order = (0..self.moves.len())
            .into_par_iter()
            .map(|lane| {
                let mut order = Vec::with_capacity(tokens.len());
                for span in spans(tokens.clone()) {
                    let rows: Vec<f32> =
                        span.clone().flat_map(|t| keys(lane, t).iter().map(|&b| f16::from_bits(b).to_f32())).collect();
                    let mut idx: Vec<u32> = (0..span.len() as u32).collect();
                    similarity_order(&rows, head_dim, &mut idx);
                    // Slot `span.start + s` holds token `span.start + idx[s]`.
                    order.extend(idx.iter().enumerate().map(|(s, &i)| (i as isize - s as isize) as i16));
                }
                order
            })
            .collect();
        Some(SpillOrder { tokens, order })
    }

    /// Records where a spill put its tokens, once every page of it is written.
    pub fn apply(&mut self, spill: &SpillOrder) {
        for (lane, order) in spill.order.iter().enumerate() {
            let (moves, holders) = (&mut self.moves[lane], &mut self.holders[lane]);
            extend_in_place(moves, spill.tokens.end);
            extend_in_place(holders, spill.tokens.end);
            for i in 0..order.len() {
                let (slot, token) = (spill.tokens.start + i, spill.token(lane, i));
                moves[token] = (slot % BLOCK_TOKENS) as u8;
                holders[slot] = (token % BLOCK_TOKENS) as u8;
            }
        }
        self.spans.extend(spans(spill.tokens.clone()).filter(|s| s.len() > GROUP_TOKENS));
    }

    /// Records that block `block` of `lane` now holds its tokens in `order` (slot
    /// `block · BLOCK_TOKENS + s` holds token `block · BLOCK_TOKENS + order[s]`), once the block
    /// is written that way.
    pub fn apply_block(&mut self, lane: usize, block: usize, order: &[u16]) {
        let start = block * BLOCK_TOKENS;
        let (moves, holders) = (&mut self.moves[lane], &mut self.holders[lane]);
        extend_in_place(moves, start + BLOCK_TOKENS);
        extend_in_place(holders, start + BLOCK_TOKENS);
        for (s, &t) in order.iter().enumerate() {
            moves[start + usize::from(t)] = s as u8;
            holders[start + s] = t as u8;
        }
        // The whole block is one permuted span now.
        let whole = start..start + BLOCK_TOKENS;
        self.spans.retain(|s| s.end <= whole.start || s.start >= whole.end);
        let at = self.spans.partition_point(|s| s.end <= whole.start);
        self.spans.insert(at, whole);
    }

    /// Where a cold pool cut at `n_tokens` must restart: the first token of the permuted span
    /// that holds `n_tokens` (the tokens before the cut may sit in any of its slots), or else
    /// the start of its group.
    pub fn restart(&self, n_tokens: usize) -> usize {
        match self.spans.iter().find(|s| s.start < n_tokens && n_tokens < s.end) {
            Some(span) => span.start,
            None => n_tokens / GROUP_TOKENS * GROUP_TOKENS,
        }
    }

    /// The cold pool now ends at `restart` (a value [`Placement::restart`] gave): later tokens
    /// will be placed again when they spill.
    pub fn truncate(&mut self, restart: usize) {
        self.spans.retain(|s| s.end <= restart);
        for map in self.moves.iter_mut().chain(&mut self.holders) {
            map.truncate(restart);
        }
    }

    /// DRAM the maps take.
    pub fn bytes(&self) -> usize {
        self.moves.iter().chain(&self.holders).map(Vec::capacity).sum()
    }
}

/// The position `offset` in the block of `at`.
fn in_block(at: usize, offset: u8) -> usize {
    // LLVM 21's x86 backend compiles the block's start plus (or OR) a zero-extended byte to
    // the byte alone, and `every_token_keeps_one_slot_across_spills_and_cuts` then fails: the
    // barrier keeps it from seeing that the byte fits in the start's zero bits.
    at - at % BLOCK_TOKENS + std::hint::black_box(usize::from(offset))
}

/// Grows a map to `len` entries, each new one in its own place (offset = its own).
fn extend_in_place(map: &mut Vec<u8>, len: usize) {
    let from = map.len();
    map.extend((from..len.max(from)).map(|i| (i % BLOCK_TOKENS) as u8));
}

/// `tokens` cut at block boundaries.
fn spans(tokens: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let mut start = tokens.start;
    std::iter::from_fn(move || {
        (start < tokens.end).then(|| {
            let end = ((start / BLOCK_TOKENS + 1) * BLOCK_TOKENS).min(tokens.end);
            let span = start..end;
            start = end;
            span
        })
    })
}

/// Orders `idx` (rows of `keys`, `head_dim` each; a whole number of groups) so that each
/// consecutive [`GROUP_TOKENS`] hold similar keys: split along the rows' principal direction
/// at the group boundary nearest the middle, and the same within each half.
fn similarity_order(keys: &[f32], head_dim: usize, idx: &mut [u32]) {
    if idx.len() <= GROUP_TOKENS {
        return;
    }
    let row = |i: u32| &keys[i as usize * head_dim..][..head_dim];
    let n = idx.len() as f32;
    let mut mean = vec![0f32; head_dim];
    for &i in idx.iter() {
        mean.iter_mut().zip(row(i)).for_each(|(m, x)| *m += x / n);
    }
    let direction = principal_direction(idx.iter().map(|&i| row(i)), &mean);
    let along = |i: u32| row(i).iter().zip(&mean).zip(&direction).map(|((x, m), d)| (x - m) * d).sum::<f32>();
    let left = idx.len() / GROUP_TOKENS / 2 * GROUP_TOKENS;
    idx.select_nth_unstable_by(left, |&a, &b| along(a).total_cmp(&along(b)));
    let (low, high) = idx.split_at_mut(left);
    similarity_order(keys, head_dim, low);
    similarity_order(keys, head_dim, high);
}

/// The direction of largest variance of `rows` about `mean`, by power iteration from the
/// direction of the row farthest from the mean.
fn principal_direction<'a>(rows: impl Iterator<Item = &'a [f32]> + Clone, mean: &[f32]) -> Vec<f32> {
    let centered = |r: &'a [f32]| r.iter().zip(mean).map(|(x, m)| x - m);
    let start = rows
        .clone()
        .max_by(|a, b| centered(a).map(|x| x * x).sum::<f32>().total_cmp(&centered(b).map(|x| x * x).sum::<f32>()));
    let mut direction: Vec<f32> = start.map_or_else(Vec::new, |r| centered(r).collect());
    for _ in 0..POWER_ITERATIONS {
        let norm = direction.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm == 0.0 {
            break;
        }
        direction.iter_mut().for_each(|x| *x /= norm);
        let mut next = vec![0f32; mean.len()];
        for r in rows.clone() {
            let along: f32 = centered(r).zip(&direction).map(|(x, d)| x * d).sum();
            next.iter_mut().zip(centered(r)).for_each(|(n, x)| *n += along * x);
        }
        direction = next;
    }
    direction
}

/// Power iterations per split: enough to separate the dominant direction from the next.
const POWER_ITERATIONS: usize = 6;

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn tokens_of_one_cluster_share_pages() {
        // Four clusters of 64 keys, interleaved in text order: bisection gives each page one
        // cluster's keys only.
        let (d, n) = (8, 256);
        let mut seed = 3;
        let centers: Vec<Vec<f32>> = (0..4).map(|_| (0..d).map(|_| 10.0 * lcg(&mut seed)).collect()).collect();
        let keys: Vec<f32> = (0..n).flat_map(|t| centers[t % 4].clone()).map(|c| c + 0.1 * lcg(&mut seed)).collect();
        let mut idx: Vec<u32> = (0..n as u32).collect();
        similarity_order(&keys, d, &mut idx);
        let mut sorted = idx.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>(), "a permutation");
        for page in idx.chunks(GROUP_TOKENS) {
            assert!(page.iter().all(|&t| t % 4 == page[0] % 4), "a page mixes clusters: {page:?}");
        }
    }

    #[test]
    fn every_token_keeps_one_slot_across_spills_and_cuts() {
        let (lanes, d) = (2, 4);
        let mut seed = 11;
        let keys: Vec<u16> = (0..lanes * 1024 * d).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
        let key = |lane: usize, t: usize| &keys[(lane * 1024 + t) * d..][..d];
        let mut p = Placement::new(PlacementKind::Keys, lanes);
        let check = |p: &Placement, end: usize| {
            for lane in 0..lanes {
                let mut slots: Vec<usize> = (0..end).map(|t| p.slot(lane, t)).collect();
                assert!((0..end).all(|t| p.slot(lane, t) / BLOCK_TOKENS == t / BLOCK_TOKENS), "a token left its block");
                assert!(
                    (0..end).all(|t| p.token(lane, p.slot(lane, t)) == t),
                    "lane {lane}: a slot names another token"
                );
                slots.sort_unstable();
                assert_eq!(slots, (0..end).collect::<Vec<_>>(), "lane {lane}: slots are a permutation of 0..{end}");
            }
        };
        // A prompt chunk across a block boundary, single groups, then a batch again.
        for tokens in [0..400, 400..416, 416..432, 432..800] {
            let order = p.plan(tokens.clone(), d, key);
            assert_eq!(order.is_some(), tokens.len() > GROUP_TOKENS, "{tokens:?}");
            if let Some(order) = order {
                p.apply(&order);
                for lane in 0..lanes {
                    for i in 0..tokens.len() {
                        let token = order.token(lane, i);
                        assert_eq!(p.slot(lane, token), tokens.start + i, "{tokens:?} lane {lane}: token {token}");
                    }
                }
            }
            check(&p, tokens.end);
        }
        assert_ne!(
            (0..400).map(|t| p.slot(0, t)).collect::<Vec<_>>(),
            (0..400).collect::<Vec<_>>(),
            "the batch was reordered"
        );
        // A cut inside a permuted span restarts at the span; one in a positional group at the group.
        assert_eq!((p.restart(300), p.restart(420), p.restart(256), p.restart(600)), (256, 416, 256, 512));
        p.truncate(p.restart(600));
        check(&p, 512);
        assert_eq!(p.restart(600), 592, "the cut span is gone");
        let again = p.plan(512..800, d, key).unwrap();
        p.apply(&again);
        check(&p, 800);
        // A block rewritten in a new order (a re-placement by hits).
        let reversed: Vec<u16> = (0..BLOCK_TOKENS as u16).rev().collect();
        p.apply_block(1, 2, &reversed);
        check(&p, 800);
        assert_eq!((p.slot(1, 512), p.token(1, 512)), (767, 767));
        // A spill longer than a u16 can count (a long prompt prefilled in one chunk).
        let long_keys: Vec<u16> =
            (0..70_000 * d).map(|i| f16::from_f32(((i * 7919) % 997) as f32 / 997.0).to_bits()).collect();
        let mut long = Placement::new(PlacementKind::Keys, 1);
        let order = long.plan(0..70_000, d, |_, t| &long_keys[t * d..][..d]).unwrap();
        long.apply(&order);
        assert!(
            (0..70_000).all(|i| long.slot(0, order.token(0, i)) == i),
            "every slot holds the token the order put there"
        );
        // Text order never moves a token.
        let positional = Placement::new(PlacementKind::Position, lanes);
        assert!(positional.plan(0..256, d, key).is_none() && positional.slot(1, 77) == 77);
    }
}
