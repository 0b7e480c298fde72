//! The registered plans, and the faults of each pool created where one applies.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What goes wrong in the pools of one directory.
#[derive(Debug, Default)]
pub struct ColdFaults {
    /// Writes of this layer's group fail with this OS error (`libc::EIO`, `libc::ENOSPC`, …),
    /// for every KV head, this many times in all.
    pub failing_write: Option<FailingWrite>,
    /// The pool created `n`-th in the directory (from 0) panics on every read, as a bug in one
    /// sequence's store would.
    pub panicking_pool: Option<usize>,
    /// Reads of this layer fail with this OS error, this many times in all (a count the test
    /// can raise later, to fail reads from a chosen step on).
    pub failing_read: Option<FailingRead>,
}

#[derive(Debug)]
pub struct FailingRead {
    pub layer: usize,
    pub errno: i32,
    pub times: AtomicUsize,
}

#[derive(Debug)]
pub struct FailingWrite {
    pub layer: usize,
    pub group: usize,
    pub errno: i32,
    pub times: AtomicUsize,
}

/// The faults of one pool.
#[derive(Debug)]
pub(in crate::kv) struct PoolFaults {
    plan: Arc<ColdFaults>,
    panics: bool,
}

impl PoolFaults {
    /// The error the write of (`layer`, `group`) meets, if the plan has one left for it.
    pub fn on_write(&self, layer: usize, group: usize) -> Option<std::io::Error> {
        let failing = self.plan.failing_write.as_ref().filter(|f| f.layer == layer && f.group == group)?;
        one_of(&failing.times, failing.errno)
    }

    /// The error a finished read of `layer` meets, if the plan has one left for it.
    pub fn on_read_done(&self, layer: usize) -> Option<std::io::Error> {
        let failing = self.plan.failing_read.as_ref().filter(|f| f.layer == layer)?;
        one_of(&failing.times, failing.errno)
    }

    pub fn on_read(&self, layer: usize, head: usize, group: usize) {
        if self.panics {
            panic!("injected fault: cold pool read of layer {layer}, head {head}, group {group}");
        }
    }
}

/// The error `errno`, if `times` has one left (taking it).
fn one_of(times: &AtomicUsize, errno: i32) -> Option<std::io::Error> {
    let left = times.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    left.is_ok().then(|| std::io::Error::from_raw_os_error(errno))
}

/// Each registered plan: its directory, and how many pools were created there since.
static PLANS: Mutex<Vec<(PathBuf, Arc<ColdFaults>, usize)>> = Mutex::new(Vec::new());

/// Pools created in `dir` from now on follow `plan` (replacing any plan `dir` had).
pub fn inject(dir: &Path, plan: ColdFaults) -> Arc<ColdFaults> {
    let plan = Arc::new(plan);
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    plans.retain(|(d, ..)| d != dir);
    plans.push((dir.to_path_buf(), plan.clone(), 0));
    plan
}

/// Pools created in `dir` from now on are healthy.
pub fn clear(dir: &Path) {
    PLANS.lock().unwrap_or_else(|p| p.into_inner()).retain(|(d, ..)| d != dir);
}

/// The faults of a pool being created in `dir`, if a plan names it.
pub(in crate::kv) fn for_new_pool(dir: &Path) -> Option<PoolFaults> {
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    let (_, plan, created) = plans.iter_mut().find(|(d, ..)| d == dir)?;
    *created += 1;
    Some(PoolFaults { panics: plan.panicking_pool == Some(*created - 1), plan: plan.clone() })
}
