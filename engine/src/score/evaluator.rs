//! Who scores a tiered store's cold tokens: a worker on the host over the DRAM copy of the keys
//! (the storage evaluator), or a SmartSSD's FPGA (the XRT evaluator). Both stream score blocks
//! of the same arithmetic, so the host merges either the same way.

use super::device::DeviceQuery;
use super::xrt::XrtEvaluator;
use super::{ScoreBlock, ScoringKeys, StorageEvaluator};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, RwLock};

pub enum ColdEvaluator {
    Storage(StorageEvaluator),
    Xrt(XrtEvaluator),
}

impl ColdEvaluator {
    /// Starts scoring `tokens` (ascending) of `layer`; see [`StorageEvaluator::score`].
    pub fn score(&self, layer: usize, keys: Arc<RwLock<ScoringKeys>>, query: Arc<DeviceQuery>, tokens: Vec<u32>) -> Receiver<ScoreBlock> {
        match self {
            Self::Storage(e) => e.score(keys, query, tokens),
            Self::Xrt(e) => e.score(layer, keys, query, tokens),
        }
    }
}
