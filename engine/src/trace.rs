//! Where a forward pass's time goes, phase by phase: `HILLSIDE_TRACE=step` turns it on, and
//! `hillside bench decode` prints each phase's share of a decode step.
//!
//! The math never sees it: a phase is a guard around a call ([`span`]), which costs one
//! relaxed load while tracing is off. Phases nest (a store's reads inside its gather), and each
//! one's time includes its children's. Times are wall-clock on the thread that runs the step,
//! summed over every sequence and step until [`take`]: work a phase hands to the compute
//! threads counts as the time the step waited for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Instant;

/// A part of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The whole pass, embedding to logits.
    Forward,
    /// Norm, the Q/K/V product and RoPE.
    Projections,
    /// `KvStore::append`.
    Append,
    /// `KvStore::prepare`: choosing the tokens and planning the views.
    Prepare,
    /// Tiered: scoring the tokens in memory and merging every score block as it comes.
    RankScore,
    /// Tiered: waiting for the storage evaluator's last cold score blocks.
    RankColdWait,
    /// Tiered: turning the merged ranking into a selection (guard, riders, pages).
    RankPick,
    /// `KvStore::gather`.
    Gather,
    /// Tiered: finding the selected cold groups and starting their reads.
    ReadIssue,
    /// Tiered: copying the selected rows that are in memory into the view.
    CopyResident,
    /// Tiered: waiting for cold reads (read ahead, and the layer's own).
    ReadWait,
    /// Tiered: checking and copying the rows that were read into the view.
    CopyCold,
    /// Tiered: starting the next layer's read-ahead.
    ReadAhead,
    /// Attention over the gathered view.
    Attention,
    /// `KvStore::observe`.
    Observe,
    /// The attention output product and the feed-forward block.
    Mlp,
    /// `KvStore::commit`.
    Commit,
    /// Tiered: tokens leaving the write-back window for the cold pool.
    Spill,
    /// Tiered: promotions and demotions between the hot pool and the cold pool.
    Rebalance,
    /// The output norm and head.
    Output,
}

impl Phase {
    pub const ALL: [Phase; 20] = [
        Phase::Forward,
        Phase::Projections,
        Phase::Append,
        Phase::Prepare,
        Phase::RankScore,
        Phase::RankColdWait,
        Phase::RankPick,
        Phase::Gather,
        Phase::ReadIssue,
        Phase::CopyResident,
        Phase::ReadWait,
        Phase::CopyCold,
        Phase::ReadAhead,
        Phase::Attention,
        Phase::Observe,
        Phase::Mlp,
        Phase::Commit,
        Phase::Spill,
        Phase::Rebalance,
        Phase::Output,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Projections => "projections",
            Phase::Append => "kv append",
            Phase::Prepare => "kv prepare",
            Phase::RankScore => "score in memory, merge",
            Phase::RankColdWait => "wait for cold scores",
            Phase::RankPick => "pick",
            Phase::Gather => "kv gather",
            Phase::ReadIssue => "issue reads",
            Phase::CopyResident => "copy resident rows",
            Phase::ReadWait => "wait for reads",
            Phase::CopyCold => "copy read rows",
            Phase::ReadAhead => "read ahead",
            Phase::Attention => "attention",
            Phase::Observe => "kv observe",
            Phase::Mlp => "output product, MLP",
            Phase::Commit => "kv commit",
            Phase::Spill => "spill",
            Phase::Rebalance => "rebalance",
            Phase::Output => "output head",
        }
    }

    /// The phase this one runs inside.
    pub fn parent(self) -> Option<Phase> {
        match self {
            Phase::Forward => None,
            Phase::RankScore | Phase::RankColdWait | Phase::RankPick => Some(Phase::Prepare),
            Phase::ReadIssue | Phase::CopyResident | Phase::ReadWait | Phase::CopyCold | Phase::ReadAhead => {
                Some(Phase::Gather)
            }
            Phase::Spill | Phase::Rebalance => Some(Phase::Commit),
            _ => Some(Phase::Forward),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The variable that turns tracing on, and the value that does.
pub const TRACE_VARIABLE: &str = "HILLSIDE_TRACE";
const STEP: &str = "step";

static ON: AtomicBool = AtomicBool::new(false);
static READ_ENV: Once = Once::new();
static NS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];
static CALLS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];

/// Whether phases are timed (read from the environment once).
pub fn enabled() -> bool {
    READ_ENV.call_once(|| {
        if std::env::var(TRACE_VARIABLE).is_ok_and(|v| v.split(',').any(|v| v.trim() == STEP)) {
            ON.store(true, Ordering::Relaxed);
        }
    });
    ON.load(Ordering::Relaxed)
}

/// Turns timing on or off, whatever the environment says (for benchmarks and tests).
pub fn set_enabled(on: bool) {
    READ_ENV.call_once(|| {});
    ON.store(on, Ordering::Relaxed);
}

/// Times `phase` until the guard is dropped.
#[must_use = "the phase ends when the guard is dropped"]
pub fn span(phase: Phase) -> Span {
    Span { phase, started: enabled().then(Instant::now) }
}

/// Runs `f` as `phase`.
pub fn timed<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let _span = span(phase);
    f()
}

pub struct Span {
    phase: Phase,
    started: Option<Instant>,
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(started) = self.started {
            let i = self.phase.index();
            NS[i].fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            CALLS[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One phase's total since the last [`take`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseTotal {
    pub phase: Phase,
    pub ns: u64,
    pub calls: u64,
}

/// Every phase that ran since the last call, in [`Phase::ALL`]'s order, and starts afresh.
pub fn take() -> Vec<PhaseTotal> {
    Phase::ALL
        .iter()
        .map(|&phase| PhaseTotal {
            phase,
            ns: NS[phase.index()].swap(0, Ordering::Relaxed),
            calls: CALLS[phase.index()].swap(0, Ordering::Relaxed),
        })
        .filter(|t| t.calls > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_listed_in_order_and_nest_inside_listed_ones() {
        for (i, phase) in Phase::ALL.iter().enumerate() {
            assert_eq!(phase.index(), i, "{phase:?}");
            if let Some(parent) = phase.parent() {
                assert!(parent.index() < i, "{phase:?} is listed after its parent");
            }
        }
    }

    #[test]
    fn a_span_counts_only_while_tracing_is_on() {
        set_enabled(false);
        drop(span(Phase::Output));
        set_enabled(true);
        timed(Phase::Output, || std::thread::sleep(std::time::Duration::from_millis(2)));
        let totals = take();
        set_enabled(false);
        let output = totals.iter().find(|t| t.phase == Phase::Output).expect("timed");
        // Other tests' passes may run meanwhile; this one's call is among those counted.
        assert!(output.calls >= 1 && output.ns >= 2_000_000, "{output:?}");
    }
}
