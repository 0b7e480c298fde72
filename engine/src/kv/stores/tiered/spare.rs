//! The spare copy: while the machine has room for a sequence's whole cache on top of what it
//! leaves free for everyone else, a tiered store also keeps every token's K/V densely in
//! memory, as the full store does, and attends to all of them through it. Attention is then
//! exact, and there is nothing to rank, copy or read, which on a small CPU costs more than
//! attending to every token (docs/decisions/a-spare-copy-while-memory-is-free.md).
//!
//! The tiers are filled as always, so the copy is only a cache of them: once the measured
//! headroom no longer holds what the copy will still grow by, or memory pressure rises, it is
//! let go and the next step ranks and reads as usual, with nothing lost. A copy let go is not
//! taken again for the sequence: rebuilding it would read the whole cold pool.

use crate::headroom::{Headroom, HEADROOM_RESERVE_BYTES, PRESSURE_LIMIT_BP, REMEASURE_AFTER};
use crate::kv::stores::full::FullKvStore;
use crate::kv::{KvShape, KvStore};
use std::time::Instant;

pub struct SpareCopy {
    pub dense: FullKvStore,
    shape: KvShape,
    measured: Instant,
}

impl SpareCopy {
    /// A copy for `shape`, if the headroom measured now holds all of it at the store's
    /// maximum length.
    pub fn if_room(shape: KvShape) -> Option<Self> {
        let whole_bytes = (shape.max_tokens * shape.bytes_per_token()) as u64;
        let headroom = Headroom::measure();
        if !room_for(headroom, whole_bytes) {
            tracing::debug!(
                whole_mb = whole_bytes / 1_000_000,
                headroom_mb = headroom.bytes / 1_000_000,
                "no spare copy: memory is not spare"
            );
            return None;
        }
        tracing::info!(
            whole_mb = whole_bytes / 1_000_000,
            headroom_mb = headroom.bytes / 1_000_000,
            "memory is spare: the whole cache is also kept densely, and attended to in full"
        );
        Some(Self { dense: FullKvStore::new(shape), shape, measured: Instant::now() })
    }

    /// Whether the copy may stay: memory is measured again at most once per
    /// [`REMEASURE_AFTER`], against what the copy still grows by at the store's maximum length.
    pub fn may_stay(&mut self) -> bool {
        if self.measured.elapsed() < REMEASURE_AFTER {
            return true;
        }
        self.measured = Instant::now();
        let growth_bytes = ((self.shape.max_tokens - self.dense.len_tokens()) * self.shape.bytes_per_token()) as u64;
        let headroom = Headroom::measure();
        let stays = room_for(headroom, growth_bytes);
        if !stays {
            tracing::info!(
                headroom_mb = headroom.bytes / 1_000_000,
                growth_mb = growth_bytes / 1_000_000,
                pressure_bp = headroom.pressure_some_bp,
                "memory is no longer spare: the dense copy is let go, steps rank and read from the tiers"
            );
        }
        stays
    }

    /// The K/V bytes the copy holds.
    pub fn bytes(&self) -> usize {
        self.dense.len_tokens() * self.shape.bytes_per_token()
    }
}

/// Whether `headroom` holds `bytes` more above the reserve, with no memory pressure.
fn room_for(headroom: Headroom, bytes: u64) -> bool {
    headroom.pressure_some_bp < PRESSURE_LIMIT_BP && headroom.bytes.saturating_sub(HEADROOM_RESERVE_BYTES) >= bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_needs_its_growth_above_the_reserve_and_no_pressure() {
        let free =
            |mb: u64, pressure_some_bp: u32| Headroom { bytes: mb << 20, cgroup_limited: false, pressure_some_bp };
        assert!(room_for(free(256 + 200, 0), 200 << 20));
        assert!(!room_for(free(256 + 199, 0), 200 << 20), "the reserve is left alone");
        assert!(!room_for(free(100, 0), 1), "below the reserve nothing is spare");
        assert!(!room_for(free(8 << 10, PRESSURE_LIMIT_BP), 1), "under pressure nothing is spare");
        assert!(room_for(free(300, PRESSURE_LIMIT_BP - 1), 0));
    }
}
