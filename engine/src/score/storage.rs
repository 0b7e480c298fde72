//! The storage-side evaluator: a worker thread that scores the cold pool's tokens chunk by
//! chunk and sends each chunk's score block up the moment it is done (HillInfer's HIE), over a
//! bounded channel, so the host merges blocks while the scan is still running. Without a
//! SmartSSD it scores the DRAM scoring copy of the cold keys, with the device's arithmetic
//! ([`DeviceQuery`]); the XRT evaluator runs the same protocol on the drive's FPGA.

use super::device::DeviceQuery;
use super::keys::ScoringKeys;
use super::topk::ScoreBlock;
use super::SCORE_BLOCK_TOKENS;
use super::worker::Worker;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, RwLock};

struct Request {
    keys: Arc<RwLock<ScoringKeys>>,
    query: Arc<DeviceQuery>,
    tokens: Vec<u32>,
    reply: SyncSender<ScoreBlock>,
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
                for chunk in req.tokens.chunks(SCORE_BLOCK_TOKENS) {
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

    /// Starts scoring `tokens` against `query`; blocks arrive on the returned channel in order,
    /// and it closes when the scan is done.
    pub fn score(&self, keys: Arc<RwLock<ScoringKeys>>, query: Arc<DeviceQuery>, tokens: Vec<u32>) -> Receiver<ScoreBlock> {
        let (reply, blocks) = Worker::<Request>::reply_channel();
        self.worker.send(Request { keys, query, tokens, reply });
        blocks
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
        let blocks = evaluator.score(keys.clone(), query.clone(), tokens.clone());
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
        assert!(ahead <= (BLOCKS_IN_FLIGHT + 2) * SCORE_BLOCK_TOKENS, "first block merged only after {ahead} of {n} tokens were scored");

        let mut exact = ScoreBlock::new(tokens, heads);
        query.score(&keys.read().unwrap(), &exact.tokens, &mut exact.scores);
        let mut all = HeadsTopK::new(heads, 100);
        all.merge(&exact);
        assert_eq!(top.into_tokens(), all.into_tokens());
    }
}
