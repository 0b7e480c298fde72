//! The storage-side evaluator: a worker thread that scores the cold pool's tokens chunk by
//! chunk and sends each chunk's score block up the moment it is done (HillInfer's HIE), over a
//! bounded channel, so the host merges blocks while the scan is still running. Without a
//! SmartSSD it scores the DRAM scoring copy of the cold keys, with the device's arithmetic
//! ([`DeviceQuery`]); the XRT evaluator runs the same protocol on the drive's FPGA.
//!
//! Here the worker is a host thread like any other, so the scan is shared ([`ColdScan`]): the
//! worker and, once their own tokens are scored, the compute threads each claim the next block,
//! instead of the compute threads waiting for one thread to finish the scan.

use super::contract::DeviceQuery;
use super::keys::ScoringKeys;
use super::topk::ScoreBlock;
use super::worker::Worker;
use super::SCORE_BLOCK_TOKENS;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, RwLock};

struct Request {
    keys: Arc<RwLock<ScoringKeys>>,
    query: Arc<DeviceQuery>,
    scan: Arc<ColdScan>,
    reply: SyncSender<ScoreBlock>,
}

/// One layer's cold tokens, cut into score blocks that whoever is free claims in turn.
pub struct ColdScan {
    tokens: Vec<u32>,
    next_block: AtomicUsize,
}

impl ColdScan {
    fn new(tokens: Vec<u32>) -> Self {
        Self { tokens, next_block: AtomicUsize::new(0) }
    }

    /// The tokens of the next block nobody has claimed yet.
    pub fn claim(&self) -> Option<&[u32]> {
        let i = self.next_block.fetch_add(1, Ordering::Relaxed);
        self.tokens.chunks(SCORE_BLOCK_TOKENS).nth(i)
    }
}

pub struct StorageEvaluator {
    worker: Worker<Request>,
    /// Tokens scored since the evaluator started (for tests and stats).
    scored: Arc<AtomicUsize>,
}

impl Default for StorageEvaluator {
    fn default() -> Self {
        Self::new()
    }
}

impl StorageEvaluator {
    pub fn new() -> Self {
        let scored = Arc::new(AtomicUsize::new(0));
        let counter = scored.clone();
        let worker = Worker::spawn("hillside-storage-eval", move |inbox: Receiver<Request>| {
            for req in inbox {
                let keys = req.keys.read().unwrap_or_else(|p| p.into_inner());
                while let Some(chunk) = req.scan.claim() {
                    counter.fetch_add(chunk.len(), Ordering::Relaxed);
                    if req.reply.send(score_on_host(&keys, &req.query, chunk)).is_err() {
                        break; // the host stopped listening
                    }
                }
            }
        })
        .expect("starting the storage evaluator thread");
        Self { worker, scored }
    }

    /// Starts scoring `tokens` against `query`: the blocks the worker scores arrive on the
    /// returned channel, which closes when no block is left to claim; the caller may claim
    /// blocks from the returned scan and score them itself.
    pub fn score(
        &self,
        keys: Arc<RwLock<ScoringKeys>>,
        query: Arc<DeviceQuery>,
        tokens: Vec<u32>,
    ) -> (Receiver<ScoreBlock>, Arc<ColdScan>) {
        let (reply, blocks) = Worker::<Request>::reply_channel();
        let scan = Arc::new(ColdScan::new(tokens));
        self.worker.send(Request { keys, query, scan: Arc::clone(&scan), reply });
        (blocks, scan)
    }

    pub fn tokens_scored(&self) -> usize {
        self.scored.load(Ordering::Relaxed)
    }
}

/// One score block of `tokens`, scored from the DRAM copy as the device would score them.
pub(super) fn score_on_host(keys: &ScoringKeys, query: &DeviceQuery, tokens: &[u32]) -> ScoreBlock {
    let mut block = ScoreBlock::new(tokens.to_vec(), keys.n_kv_heads());
    query.score(keys, tokens, &mut block.scores);
    block.produced = std::time::Instant::now();
    block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::worker::BLOCKS_IN_FLIGHT;
    use crate::score::{HeadsTopK, KeyBits};

    #[test]
    fn blocks_are_merged_while_the_scan_is_still_running() {
        let (heads, hd, n) = (3, 64, 4 * BLOCKS_IN_FLIGHT * SCORE_BLOCK_TOKENS);
        let mut keys = ScoringKeys::new(KeyBits::Int8, heads, hd);
        keys.push(&(0..n * heads * hd).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect::<Vec<_>>());
        let keys = Arc::new(RwLock::new(keys));
        let query: Vec<f32> = (0..heads * hd).map(|i| (i % 7) as f32 - 3.0).collect();
        let tokens: Vec<u32> = (0..n as u32).collect();

        let evaluator = StorageEvaluator::new();
        let query = Arc::new(DeviceQuery::new(&query, hd));
        let (blocks, _) = evaluator.score(keys.clone(), query.clone(), tokens.clone());
        let mut top = HeadsTopK::new(heads, 100);
        let mut scored_at_first_merge = None;
        let mut received = 0;
        for block in blocks {
            top.merge(&block);
            scored_at_first_merge.get_or_insert(evaluator.tokens_scored());
            received += block.tokens.len();
        }
        assert_eq!(received, n);
        // The bounded channel lets the worker run at most a few blocks ahead of the merge.
        let ahead = scored_at_first_merge.unwrap();
        assert!(
            ahead <= (BLOCKS_IN_FLIGHT + 2) * SCORE_BLOCK_TOKENS,
            "first block merged only after {ahead} of {n} tokens were scored"
        );

        let mut exact = ScoreBlock::new(tokens, heads);
        query.score(&keys.read().unwrap(), &exact.tokens, &mut exact.scores);
        let mut all = HeadsTopK::new(heads, 100);
        all.merge(&exact);
        assert_eq!(top.into_tokens(), all.into_tokens());
    }

    #[test]
    fn a_shared_scan_gives_each_block_once_to_the_worker_or_the_host() {
        let (heads, hd, n) = (3, 64, 40 * SCORE_BLOCK_TOKENS + 17);
        let mut keys = ScoringKeys::new(KeyBits::Int8, heads, hd);
        keys.push(&(0..n * heads * hd).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect::<Vec<_>>());
        let keys = Arc::new(RwLock::new(keys));
        let query = Arc::new(DeviceQuery::new(&(0..heads * hd).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<_>>(), hd));
        let evaluator = StorageEvaluator::new();
        let (blocks, scan) = evaluator.score(keys, query, (0..n as u32).collect());
        let mut by_host = Vec::new();
        while let Some(chunk) = scan.claim() {
            by_host.extend_from_slice(chunk);
        }
        let mut seen: Vec<u32> = blocks.into_iter().flat_map(|b| b.tokens).collect();
        let by_worker = seen.len();
        seen.extend(by_host);
        seen.sort_unstable();
        assert_eq!(seen, (0..n as u32).collect::<Vec<_>>(), "every token once ({by_worker} by the worker)");
    }
}
