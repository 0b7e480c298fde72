//! The tiered store's ranker: a compact scoring copy of every token's key, the evaluator that
//! scores the cold tokens beside the pool (a storage worker, or a SmartSSD), and the fidelity
//! guard.
//!
//! Every candidate is ranked with the storage side's arithmetic, hot or cold, so where a token
//! lives never changes its rank. Cold tokens go to the evaluator, which streams score blocks
//! back while the compute threads score the tokens in memory; every block, of either kind,
//! merges into one top-k per head as it comes.

use super::{EvaluatorKind, KvShape, TierStats, TieredSettings};
use crate::kernels::parallel::map_items;
use crate::kernels::spin_pool::pool;
use crate::kv::cold::ColdPool;
use crate::score::contract::{DeviceQuery, KeyChunkLayout};
use crate::score::xrt::XrtEvaluator;
use crate::score::{
    BlockMerge, ColdEvaluator, HeadsMass, HeadsTopK, ScoreBlock, ScoringKeys, StorageEvaluator, SCORE_BLOCK_TOKENS,
};
use crate::trace::{self, Phase};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// What a tiered store does when the SmartSSD it was asked for cannot score.
const FALLBACK: &str = "the storage evaluator scores the cold pool instead";

/// The evaluator a store asked for, after the start-up probe had its say: asked for the card
/// but there is none, the storage worker scores instead, and this says why once.
pub(super) fn evaluator_in_use(asked: EvaluatorKind, xrt_problem: Option<String>) -> EvaluatorKind {
    match (asked, xrt_problem) {
        (EvaluatorKind::Xrt, Some(problem)) => {
            tracing::warn!("{problem}; {FALLBACK}");
            EvaluatorKind::Storage
        }
        (asked, _) => asked,
    }
}

/// One layer's ranking: each head's best candidates, the estimated attention mass when the
/// guard is on, and the pinned tokens' scores (needed only by the guard).
pub(super) struct Ranking {
    pub top: HeadsTopK,
    pub mass: Option<HeadsMass>,
    pub pinned: ScoreBlock,
}

pub(super) struct Ranker {
    /// Per layer; shared with the storage evaluator's worker while it scans.
    keys: Vec<Arc<RwLock<ScoringKeys>>>,
    evaluator: Option<ColdEvaluator>,
    head_dim: usize,
    n_kv_heads: usize,
    guard_mass: f32,
    stats: TierStats,
}

impl Ranker {
    /// A ranker whose evaluator is `evaluator` ([`evaluator_in_use`]); a SmartSSD's reaches only
    /// the `cold` pool's scoring-key chunks.
    pub fn new(shape: KvShape, settings: &TieredSettings, evaluator: EvaluatorKind, cold: &Arc<ColdPool>) -> Self {
        let keys = (0..shape.n_layers)
            .map(|_| Arc::new(RwLock::new(ScoringKeys::new(settings.key_bits, shape.n_kv_heads, shape.head_dim))))
            .collect();
        let evaluator = match evaluator {
            EvaluatorKind::Host => None,
            EvaluatorKind::Storage => Some(ColdEvaluator::Storage(StorageEvaluator::new())),
            EvaluatorKind::Xrt => Some(
                match XrtEvaluator::open(&settings.xrt, Arc::new(cold.key_chunks()), key_chunks(shape, settings)) {
                    Ok(card) => {
                        tracing::info!(card = card.description(), "the SmartSSD scores the cold pool");
                        ColdEvaluator::Xrt(card)
                    }
                    Err(e) => {
                        tracing::warn!("{e}; {FALLBACK}");
                        ColdEvaluator::Storage(StorageEvaluator::new())
                    }
                },
            ),
        };
        Self {
            keys,
            evaluator,
            head_dim: shape.head_dim,
            n_kv_heads: shape.n_kv_heads,
            guard_mass: settings.guard_mass,
            stats: TierStats::default(),
        }
    }

    /// Whether cold tokens are scored beside the pool (else the host scores every token).
    pub fn scores_beside_the_pool(&self) -> bool {
        self.evaluator.is_some()
    }

    pub fn guards(&self) -> bool {
        self.guard_mass > 0.0
    }

    /// Keeps the scoring copy of `layer`'s new keys (`n × kv_dim`).
    pub fn push(&mut self, layer: usize, k: &[f32]) {
        self.keys[layer].write().unwrap_or_else(|p| p.into_inner()).push(k);
    }

    /// Ranks `layer`'s `hot` and `cold` candidates against `query` (a summed query per KV head),
    /// keeping each head's best `keep`; with the guard on, the `pinned` tokens are scored too and
    /// every score adds to each head's estimated attention mass (`mass_scale` turns a summed
    /// query's scores into logits).
    #[allow(clippy::too_many_arguments)]
    pub fn rank(
        &mut self,
        layer: usize,
        query: &[f32],
        mass_scale: f32,
        hot: Vec<u32>,
        cold: Vec<u32>,
        pinned: Vec<u32>,
        keep: usize,
    ) -> Ranking {
        let (n_kv, guard) = (self.n_kv_heads, self.guards());
        let started = Instant::now();
        let scoring = trace::span(Phase::RankScore);
        let query = Arc::new(DeviceQuery::new(query, self.head_dim));
        let (cold_blocks, shared_scan) = match self.evaluator.as_ref().filter(|_| !cold.is_empty()) {
            Some(e) => {
                let (blocks, scan) = e.score(layer, self.keys[layer].clone(), query.clone(), cold);
                (Some(blocks), scan)
            }
            None => (None, None),
        };
        let new_merge = || BlockMerge::new(HeadsTopK::new(n_kv, keep), guard.then(|| HeadsMass::new(n_kv, mass_scale)));
        let mut pinned = ScoreBlock::new(pinned, n_kv);
        let keys = self.keys[layer].read().unwrap_or_else(|p| p.into_inner());
        if guard {
            query.score(&keys, &pinned.tokens, &mut pinned.scores);
        }
        // The hot tokens are scored on the compute threads, each merging its own blocks and,
        // between them, any cold blocks that have arrived; then each claims cold blocks the
        // storage worker has not (when it is a host thread), and the rest of the worker's blocks
        // are merged once they are done. (No thread waits on the worker while there is work.)
        let cold_feed = cold_blocks.map(|blocks| Mutex::new(ColdFeed { blocks, received: 0, wait_ns: 0 }));
        let take_arrived = |merged: &mut BlockMerge| {
            if let Some(mut feed) = cold_feed.as_ref().and_then(|f| f.try_lock().ok()) {
                while let Ok(block) = feed.blocks.try_recv() {
                    feed.tally(&block);
                    merged.merge(&block);
                }
            }
        };
        // A span of blocks per thread. Newest first: recent tokens tend to score highest, so
        // the top-k's floor rises early and most older tokens' scores are dropped on arrival.
        let threads = pool().threads();
        let span = hot.len().div_ceil(SCORE_BLOCK_TOKENS).div_ceil(threads).max(1) * SCORE_BLOCK_TOKENS;
        let mut spans: Vec<&[u32]> = hot.rchunks(span).collect();
        if shared_scan.is_some() {
            spans.resize(spans.len().max(threads), &[]); // a task per thread to share the scan
        }
        let host_cold_blocks = AtomicU64::new(0);
        let merges = map_items(spans, |span| {
            let mut merged = new_merge();
            let mut score = |chunk: &[u32]| {
                let mut block = ScoreBlock::new(chunk.to_vec(), n_kv);
                query.score(&keys, chunk, &mut block.scores);
                merged.merge(&block);
                take_arrived(&mut merged);
            };
            span.rchunks(SCORE_BLOCK_TOKENS).for_each(&mut score);
            while let Some(chunk) = shared_scan.as_ref().and_then(|scan| scan.claim()) {
                score(chunk);
                host_cold_blocks.fetch_add(1, Ordering::Relaxed);
            }
            merged
        });
        let mut merged = merges
            .into_iter()
            .reduce(|mut a, b| {
                a.absorb(b);
                a
            })
            .unwrap_or_else(new_merge);
        drop(keys);
        drop(scoring);
        if let Some(feed) = cold_feed {
            let _waiting = trace::span(Phase::RankColdWait);
            let mut feed = feed.into_inner().unwrap_or_else(|p| p.into_inner());
            while let Ok(block) = feed.blocks.recv() {
                feed.tally(&block);
                merged.merge(&block);
            }
            self.stats.score_blocks += feed.received + host_cold_blocks.into_inner();
            self.stats.score_block_wait_ns += feed.wait_ns;
            self.stats.cold_scan_ns += started.elapsed().as_nanos() as u64;
        }
        Ranking { top: merged.top, mass: merged.mass, pinned }
    }

    /// `tokens`' scores against `query` on this thread (a prompt's last query, which seeds the
    /// hit tables).
    pub fn scores(&self, layer: usize, query: &[f32], tokens: Vec<u32>) -> ScoreBlock {
        let mut block = ScoreBlock::new(tokens, self.n_kv_heads);
        self.keys[layer].read().unwrap_or_else(|p| p.into_inner()).score(query, &block.tokens, &mut block.scores);
        block.produced = Instant::now();
        block
    }

    /// The fidelity guard: how many of each head's `ranked` tokens (best first) to take —
    /// `take`, or, when the best `take` hold too little of some head's estimated attention
    /// (`mass`, with the pinned tokens' scores and the heads' `sink_logits`), just enough more
    /// that every head's reach the threshold, at most all of them (twice as many). Every head
    /// takes as many, so the neediest head sets the count.
    pub fn guard(
        &mut self,
        ranked: &[Vec<(f32, u32)>],
        mut mass: HeadsMass,
        pinned: &ScoreBlock,
        sink_logits: Option<&[f32]>,
        take: usize,
    ) -> usize {
        mass.merge(pinned);
        for (h, &logit) in sink_logits.unwrap_or_default().iter().enumerate() {
            mass.add_sink(h, logit);
        }
        let needed = tokens_for_mass(ranked, &mass, pinned, take, f64::from(self.guard_mass));
        self.stats.guard_checks += 1;
        if needed > take {
            self.stats.guard_widened += 1;
        }
        needed.max(take)
    }

    /// The SmartSSD scores from key chunks in the cold pool: writes those of the `layers` for
    /// the `cold_tokens` now there. A failure is logged; unwritten chunks are scored on the host
    /// and the next spill tries again.
    pub fn store_key_chunks(&mut self, layers: std::ops::Range<usize>, cold_tokens: usize) {
        if let Some(ColdEvaluator::Xrt(xrt)) = &mut self.evaluator {
            if let Err(e) = xrt.store_chunks(&self.keys, layers, cold_tokens) {
                tracing::error!(error = %e, "writing scoring keys for the SmartSSD failed");
            }
        }
    }

    pub fn truncate(&mut self, n_tokens: usize) {
        if let Some(ColdEvaluator::Xrt(xrt)) = &mut self.evaluator {
            xrt.truncate(n_tokens);
        }
        for keys in &self.keys {
            keys.write().unwrap_or_else(|p| p.into_inner()).truncate(n_tokens);
        }
    }

    /// The scoring copies' memory, counted against the hot budget.
    pub fn key_bytes(&self) -> usize {
        self.keys.iter().map(|k| k.read().unwrap_or_else(|p| p.into_inner()).bytes()).sum()
    }

    /// Writes the ranker's counters into `tier`.
    pub fn report(&self, tier: &mut TierStats) {
        let s = &self.stats;
        (tier.score_blocks, tier.score_block_wait_ns, tier.cold_scan_ns) =
            (s.score_blocks, s.score_block_wait_ns, s.cold_scan_ns);
        (tier.guard_checks, tier.guard_widened) = (s.guard_checks, s.guard_widened);
        if let Some(ColdEvaluator::Xrt(xrt)) = &self.evaluator {
            let c = xrt.counters();
            tier.device_tokens = c.device_tokens.load(Ordering::Relaxed);
            tier.device_runs = c.runs.load(Ordering::Relaxed);
            tier.device_failed = c.failed.load(Ordering::Relaxed);
        }
    }
}

/// How many of each head's `ranked` tokens (best first) the neediest head must take, from
/// `take` on, for its estimated share (with its `pinned` tokens and its sink) to reach
/// `threshold`: `usize::MAX` where all of its ranked tokens hold too little.
fn tokens_for_mass(
    ranked: &[Vec<(f32, u32)>],
    mass: &HeadsMass,
    pinned: &ScoreBlock,
    take: usize,
    threshold: f64,
) -> usize {
    let needed = |h: usize| {
        let head = &ranked[h];
        let mut count = take.min(head.len());
        let mut captured = mass.share(h, head[..count].iter().map(|r| r.0).chain(pinned.head(h).iter().copied()));
        while captured < threshold && count < head.len() {
            captured += mass.share_of(h, head[count].0);
            count += 1;
        }
        if captured < threshold {
            usize::MAX
        } else {
            count
        }
    };
    (0..ranked.len()).map(needed).max().unwrap_or(take)
}

/// How the SmartSSD's key chunks are laid out in the cold pool.
pub(super) fn key_chunks(shape: KvShape, settings: &TieredSettings) -> KeyChunkLayout {
    KeyChunkLayout { bits: settings.key_bits, n_heads: shape.n_kv_heads, head_dim: shape.head_dim }
}

/// The storage evaluator's blocks for one layer, and a tally of those merged so far.
struct ColdFeed {
    blocks: Receiver<ScoreBlock>,
    received: u64,
    /// Summed time blocks waited between being produced and being merged.
    wait_ns: u64,
}

impl ColdFeed {
    fn tally(&mut self, block: &ScoreBlock) {
        self.received += 1;
        self.wait_ns += block.produced.elapsed().as_nanos() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two heads ranked over the same five tokens (no pinned ones), the mass of each the exact
    /// softmax of its scores.
    fn two_heads() -> (Vec<Vec<(f32, u32)>>, HeadsMass, ScoreBlock) {
        let heads: [[f32; 5]; 2] = [[8.0, 1.0, 0.5, 0.2, 0.1], [2.0, 1.9, 1.8, 1.7, 1.6]];
        let mut block = ScoreBlock::new((0..5).collect(), 2);
        block.scores = heads.iter().flatten().copied().collect();
        let mut mass = HeadsMass::new(2, 1.0);
        mass.merge(&block);
        let ranked = heads.iter().map(|h| h.iter().enumerate().map(|(t, &s)| (s, t as u32)).collect()).collect();
        (ranked, mass, ScoreBlock::new(Vec::new(), 2))
    }

    #[test]
    fn the_guard_widens_just_enough_for_the_neediest_head() {
        let (ranked, mass, pinned) = two_heads();
        // Head 0's best token holds 99.7% of it; head 1's attention is spread evenly.
        assert_eq!(tokens_for_mass(&ranked, &mass, &pinned, 1, 0.1), 1, "both heads hold enough");
        assert_eq!(tokens_for_mass(&ranked, &mass, &pinned, 1, 0.5), 3, "head 1 needs three of five");
        assert_eq!(tokens_for_mass(&ranked, &mass, &pinned, 4, 0.5), 4, "never fewer than asked");
        assert_eq!(tokens_for_mass(&ranked, &mass, &pinned, 1, 1.5), usize::MAX, "no share reaches 1.5");
    }
}
