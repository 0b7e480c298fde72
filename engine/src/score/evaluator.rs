//! Who scores a tiered store's cold tokens: a worker on the host over the DRAM copy of the keys
//! (the storage evaluator), or a SmartSSD's FPGA (the XRT evaluator). Both stream score blocks
//! of the same arithmetic, so the host merges either the same way.

use super::contract::DeviceQuery;
use super::storage::ColdScan;
use super::xrt::XrtEvaluator;
use super::{ScoreBlock, ScoringKeys, StorageEvaluator};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, RwLock};

pub enum ColdEvaluator {
    Storage(StorageEvaluator),
    Xrt(XrtEvaluator),
}

impl ColdEvaluator {
    /// Starts scoring `tokens` (ascending) of `layer`; see [`StorageEvaluator::score`]. The scan
    /// comes back where the host may share it (a storage worker is a host thread; a card's
    /// blocks are its own).
    pub fn score(
        &self,
        layer: usize,
        keys: Arc<RwLock<ScoringKeys>>,
        query: Arc<DeviceQuery>,
        tokens: Vec<u32>,
    ) -> (Receiver<ScoreBlock>, Option<Arc<ColdScan>>) {
        match self {
            Self::Storage(e) => {
                let (blocks, scan) = e.score(keys, query, tokens);
                (blocks, Some(scan))
            }
            Self::Xrt(e) => (e.score(layer, keys, query, tokens), None),
        }
    }
}
