//! The compute threads the kernels split their loops over.
//!
//! A decode step runs ~150 parallel loops (every product, every attention), each well under a
//! millisecond, and a pool whose idle threads sleep pays a futex wake-up for each. Here idle
//! workers spin for a short while ([`SPIN`]) before they sleep, so within a step (and between
//! close steps) a loop starts as soon as it is published; a pool left idle longer costs nothing.
//! While they spin they yield their core between polls: the tiered store's reader threads and
//! storage worker need it during the host's serial work (docs/decisions/tiered-step-on-two-cores.md).
//!
//! One loop runs at a time: a caller that finds the pool busy (two sequences forwarding at
//! once) runs its tasks on its own thread. A task that panics does not take a worker down: the
//! panic is caught and raised again in the caller once every task has finished.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next loop (yielding between polls) before it sleeps.
const SPIN: Duration = Duration::from_micros(300);

/// The closure of the published loop. The pointer's lifetime is erased; `run` keeps the closure
/// alive until every task has returned.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
}

/// The published loop's state in one word, so that a thread claims a task of the loop it saw
/// or of none: the loop's generation (16 bits, wrapping), its task count and the next task to
/// claim (24 bits each).
#[derive(Clone, Copy)]
struct LoopState(u64);

impl LoopState {
    const TASK_BITS: u32 = 24;
    const MAX_TASKS: usize = 1 << Self::TASK_BITS;

    fn new(generation: u16, tasks: usize) -> Self {
        Self(u64::from(generation) << (2 * Self::TASK_BITS) | (tasks as u64) << Self::TASK_BITS)
    }

    fn generation(self) -> u16 {
        (self.0 >> (2 * Self::TASK_BITS)) as u16
    }

    fn tasks(self) -> usize {
        (self.0 >> Self::TASK_BITS) as usize & (Self::MAX_TASKS - 1)
    }

    fn next_task(self) -> usize {
        self.0 as usize & (Self::MAX_TASKS - 1)
    }
}

struct Shared {
    /// A [`LoopState`].
    state: AtomicU64,
    /// Written only by the publisher between loops, while no task is claimed.
    job: UnsafeCell<Job>,
    /// Tasks of the current loop that have returned.
    done: AtomicUsize,
    /// The first panic of the current loop, raised again in its caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the one thread holding `Pool::publish`, before the loop's state is
// published and after all of the previous loop's tasks have returned; a thread reads it only
// after claiming a task of the loop, which cannot end before that task returns. The closure it
// points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: &'static Shared,
    workers: usize,
    publish: Mutex<()>,
}

/// The pool: as many threads as rayon's global pool (the CLI's `--threads`), the caller being one.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(rayon::current_num_threads().max(1) - 1))
}

impl Pool {
    fn new(workers: usize) -> Self {
        let pool = Self::unstarted(workers);
        for i in 0..workers {
            let shared = pool.shared;
            std::thread::Builder::new()
                .name(format!("hillside-compute-{i}"))
                .spawn(move || work(shared))
                .expect("spawning a compute thread");
        }
        pool
    }

    /// A pool of `workers` whose threads are not started yet.
    fn unstarted(workers: usize) -> Self {
        let noop: &'static (dyn Fn(usize) + Sync) = &|_| {};
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(LoopState::new(0, 0).0),
            job: UnsafeCell::new(Job { f: noop }),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        }));
        Self { shared, workers, publish: Mutex::new(()) }
    }

    /// Threads a loop is split over (the caller included).
    pub fn threads(&self) -> usize {
        self.workers + 1
    }

    /// Calls `f(task)` for every task in `0..tasks`, spread over the pool; returns when all
    /// have returned. A panic in any task is raised here afterwards.
    ///
    /// The caller waits for tasks, not for workers: a worker that was not running when the
    /// loop was published (the OS gave its core to another thread) finds the loop done and
    /// no task left, and nobody waited for it.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.publish.try_lock() {
            Ok(guard) if tasks > 1 && tasks < LoopState::MAX_TASKS && self.workers > 0 => guard,
            _ => return (0..tasks).for_each(f),
        };
        let shared = self.shared;
        // SAFETY: the lifetime is erased only while the loop runs: this call returns only
        // after every task has returned, and no thread reads the job without a task claimed.
        let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        // SAFETY: no task is claimed now: the last loop's have all returned, and its state has
        // none left to claim.
        unsafe { *shared.job.get() = Job { f } };
        shared.done.store(0, SeqCst);
        let generation = LoopState(shared.state.load(SeqCst)).generation().wrapping_add(1);
        shared.state.store(LoopState::new(generation, tasks).0, SeqCst);
        if shared.sleepers.load(SeqCst) > 0 {
            let _lock = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        take_tasks(shared, generation);
        // `take_tasks` catches panics, so every claimed task counts itself done. Waiting for the
        // workers' last tasks, the caller yields its core between polls too: a worker the OS
        // took off its core mid-task (for a reader thread, on 2 cores) then gets this one back
        // sooner.
        let mut polls = 0u32;
        while shared.done.load(SeqCst) < tasks {
            polls += 1;
            match polls.is_multiple_of(64) {
                true => std::thread::yield_now(),
                false => std::hint::spin_loop(),
            }
        }
        drop(guard);
        if let Some(payload) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(payload);
        }
    }
}

/// Claims and runs tasks of loop `generation` until none is left (or another loop is up).
fn take_tasks(shared: &Shared, generation: u16) {
    loop {
        let state = LoopState(shared.state.load(SeqCst));
        if state.generation() != generation || state.next_task() >= state.tasks() {
            return;
        }
        if shared.state.compare_exchange(state.0, state.0 + 1, SeqCst, SeqCst).is_err() {
            continue;
        }
        // SAFETY: a task of the loop is claimed, so the loop (and its job) lasts until it returns.
        let f = unsafe { &*(*shared.job.get()).f };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(state.next_task()))) {
            shared.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
        }
        shared.done.fetch_add(1, SeqCst);
    }
}

fn work(shared: &'static Shared) {
    let generation = || LoopState(shared.state.load(SeqCst)).generation();
    let mut seen = generation();
    loop {
        let idle_since = Instant::now();
        let mut polls = 0u32;
        while generation() == seen {
            polls += 1;
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            if idle_since.elapsed() < SPIN {
                std::thread::yield_now();
                continue;
            }
            let mut lock = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            shared.sleepers.fetch_add(1, SeqCst);
            while generation() == seen {
                lock = shared.wake.wait(lock).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleepers.fetch_sub(1, SeqCst);
        }
        seen = generation();
        take_tasks(shared, seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_across_many_loops() {
        let pool = Pool::new(2);
        for tasks in [0, 1, 2, 7, 64] {
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..200 {
                pool.run(tasks, &|t| {
                    counts[t].fetch_add(1, SeqCst);
                });
            }
            assert!(counts.iter().all(|c| c.load(SeqCst) == 200), "{tasks} tasks");
        }
    }

    #[test]
    fn a_loop_ends_when_its_tasks_do_whether_or_not_the_workers_ran() {
        // Workers that never get a core (here: never started) have no task of the loop, so
        // the caller does not wait for them.
        let pool = Pool::unstarted(3);
        let done = AtomicUsize::new(0);
        for _ in 0..3 {
            pool.run(16, &|_| {
                done.fetch_add(1, SeqCst);
            });
        }
        assert_eq!(done.load(SeqCst), 48);
    }

    #[test]
    fn a_panicking_task_is_raised_in_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2);
        let caught = catch_unwind(AssertUnwindSafe(|| pool.run(8, &|t| assert!(t != 5, "task 5 fails")))).unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"task 5 fails"), "the task's own panic");
        let done = AtomicUsize::new(0);
        pool.run(8, &|_| {
            done.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 8);
    }

    #[test]
    fn workers_asleep_wake_for_the_next_loop() {
        let pool = Pool::new(1);
        std::thread::sleep(SPIN * 20);
        let done = AtomicUsize::new(0);
        pool.run(4, &|_| {
            done.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 4);
    }

    #[test]
    fn a_second_caller_runs_its_loop_itself() {
        let pool = Pool::new(1);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..100 {
                        let done = AtomicUsize::new(0);
                        pool.run(5, &|_| {
                            done.fetch_add(1, SeqCst);
                        });
                        assert_eq!(done.load(SeqCst), 5);
                    }
                });
            }
        });
    }
}
