//! What the tiered store needs to know of the machine, found once at start-up: the β planner's
//! rates for the cold directory and whether a SmartSSD can score.

use super::{EvaluatorKind, KvConfig, StoreKind};
use crate::kv::stores::tiered::planner::{self, Profile};
use crate::score::xrt;
use crate::score::KeyBits;
use std::sync::Arc;

/// What the tiered store needs to know about the machine, found once when a program starts
/// (profiling the disk and CPU takes about a second, looking for a SmartSSD up to a minute),
/// so that no sequence's first step pays for it while others stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvStartup {
    /// The β planner's rates for the cold directory, for each key precision the configuration
    /// may use (none if profiling failed: the hot pool then gets a quarter of the cache).
    pub profiles: Vec<(KeyBits, Profile)>,
    /// Evaluator `xrt`: why the card cannot score (`None` when it can).
    pub xrt_problem: Option<String>,
}

impl KvConfig {
    /// Does the start-up work this configuration needs — the β planner's profile of the cold
    /// directory (a tiered store without a fixed hot budget) and the SmartSSD probe (evaluator
    /// `xrt`) — now, and keeps the results for every store built from it. A server calls this
    /// before it serves; a configuration built without it does the work at its first tiered
    /// store.
    pub fn start_up(mut self) -> Self {
        self.startup = Some(Arc::new(self.find_startup()));
        self
    }

    fn find_startup(&self) -> KvStartup {
        if self.store != StoreKind::Tiered {
            return KvStartup::default();
        }
        let profiles = match self.hot_budget_bytes {
            Some(_) => Vec::new(),
            None => self
                .key_bits
                .candidates()
                .iter()
                .map_while(|&bits| {
                    planner::profile(&self.cold_dir, bits)
                        .inspect_err(|e| tracing::warn!(error = %e, "could not profile the cold pool; the hot pool gets a quarter of the cache"))
                        .ok()
                        .map(|p| (bits, p))
                })
                .collect(),
        };
        let xrt_problem =
            (self.evaluator == EvaluatorKind::Xrt).then(|| xrt::probe(&self.xrt_options()).problem).flatten();
        KvStartup { profiles, xrt_problem }
    }

    pub(super) fn startup(&self) -> Arc<KvStartup> {
        self.startup.clone().unwrap_or_else(|| Arc::new(self.find_startup()))
    }
}
