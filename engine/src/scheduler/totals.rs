//! Counters summed over every sequence the scheduler has run, so that rates over time (tokens
//! per second, cold bytes per token, hot hit rate, score blocks per second) can be taken from
//! two readings however many sequences came and went in between. Each live sequence's growth is
//! added once per round, and its last growth as it leaves.

use super::SequenceStats;
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub generated_tokens: u64,
    pub cold_bytes_read: u64,
    /// Selected (token, KV head) rows found hot / read from the cold pool (tiered stores).
    pub hot_hits: u64,
    pub cold_hits: u64,
    /// Cold-token score blocks the storage evaluator streamed up and the host merged.
    pub score_blocks: u64,
}

impl Totals {
    /// One sequence's own counters so far.
    pub(super) fn of(stats: &SequenceStats) -> Self {
        let kv = stats.kv.as_ref();
        let tier = kv.and_then(|kv| kv.tier.as_ref());
        Self {
            generated_tokens: stats.generated_tokens as u64,
            cold_bytes_read: kv.map_or(0, |kv| kv.cold_bytes_read),
            hot_hits: tier.map_or(0, |t| t.hot_hits),
            cold_hits: tier.map_or(0, |t| t.cold_hits),
            score_blocks: tier.map_or(0, |t| t.score_blocks),
        }
    }

    /// Adds what a sequence's counters grew by since `then`, and returns `now` as its new mark.
    pub(super) fn add_growth(&mut self, then: Totals, now: Totals) -> Totals {
        self.generated_tokens += now.generated_tokens.saturating_sub(then.generated_tokens);
        self.cold_bytes_read += now.cold_bytes_read.saturating_sub(then.cold_bytes_read);
        self.hot_hits += now.hot_hits.saturating_sub(then.hot_hits);
        self.cold_hits += now.cold_hits.saturating_sub(then.cold_hits);
        self.score_blocks += now.score_blocks.saturating_sub(then.score_blocks);
        now
    }
}
