//! The compute threads the kernels split their loops over.
//!
//! A decode step runs ~150 parallel loops (every product, every attention), each well under a
//! millisecond. A pool whose idle threads sleep pays a futex wake-up for each — a fifth of a
//! small model's step on a 2-core VM, measured. Here idle workers spin for a short while
//! ([`SPIN`]) before they sleep, so within a step (and between close steps) a loop starts as
//! soon as it is published; a pool left idle longer costs nothing.
//!
//! One loop runs at a time: a caller that finds the pool busy (two sequences forwarding at
//! once) runs its tasks on its own thread. A task that panics does not take a worker down: the
//! panic is caught and raised again in the caller once every task has finished.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next loop before it sleeps.
const SPIN: Duration = Duration::from_micros(300);

/// A published loop: `tasks` calls of `f`. The pointer's lifetime is erased; `run` keeps the
/// closure alive until every worker has left the loop.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// Bumped once per published loop; workers wait for it to move.
    generation: AtomicU64,
    /// Written only by the publisher between loops, while no worker reads it.
    job: UnsafeCell<Job>,
    next_task: AtomicUsize,
    /// Workers that have not finished the current loop.
    running: AtomicUsize,
    /// The first panic of the current loop, raised again in its caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the one thread holding `Pool::publish`, before `generation` moves
// and after `running` reaches 0, so no worker reads it concurrently; the closure it points to is
// `Sync`.
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
        let noop: &'static (dyn Fn(usize) + Sync) = &|_| {};
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job { f: noop, tasks: 0 }),
            next_task: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 0..workers {
            std::thread::Builder::new().name(format!("hillside-compute-{i}")).spawn(move || work(shared)).expect("spawning a compute thread");
        }
        Self { shared, workers, publish: Mutex::new(()) }
    }

    /// Threads a loop is split over (the caller included).
    pub fn threads(&self) -> usize {
        self.workers + 1
    }

    /// Calls `f(task)` for every task in `0..tasks`, spread over the pool; returns when all
    /// have returned. A panic in any task is raised here afterwards.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.publish.try_lock() {
            Ok(guard) if tasks > 1 && self.workers > 0 => guard,
            _ => return (0..tasks).for_each(f),
        };
        let shared = self.shared;
        // SAFETY: the lifetime is erased only while workers can see the job: this call returns
        // only after every worker has left it.
        let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        // SAFETY: no worker reads `job` now: `running` is 0 between loops.
        unsafe { *shared.job.get() = Job { f, tasks } };
        shared.next_task.store(0, SeqCst);
        shared.running.store(self.workers, SeqCst);
        shared.generation.fetch_add(1, SeqCst);
        if shared.sleepers.load(SeqCst) > 0 {
            let _lock = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        // SAFETY: the job was just published from `f`, alive for this call.
        take_tasks(shared, unsafe { &*f });
        // `take_tasks` catches panics, so this wait is always reached.
        while shared.running.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
        drop(guard);
        if let Some(payload) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(payload);
        }
    }
}

/// Claims and runs tasks of the current loop until none is left.
fn take_tasks(shared: &Shared, f: &(dyn Fn(usize) + Sync)) {
    // SAFETY: read after the generation moved and before `running` drops, while the job is fixed.
    let tasks = unsafe { (*shared.job.get()).tasks };
    loop {
        let task = shared.next_task.fetch_add(1, SeqCst);
        if task >= tasks {
            return;
        }
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(task))) {
            shared.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
        }
    }
}

fn work(shared: &'static Shared) {
    let mut seen = 0;
    loop {
        let idle_since = Instant::now();
        let mut polls = 0u32;
        while shared.generation.load(SeqCst) == seen {
            polls += 1;
            if !polls.is_multiple_of(64) || idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut lock = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            shared.sleepers.fetch_add(1, SeqCst);
            while shared.generation.load(SeqCst) == seen {
                lock = shared.wake.wait(lock).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleepers.fetch_sub(1, SeqCst);
        }
        seen = shared.generation.load(SeqCst);
        // SAFETY: the job of generation `seen` stays alive until `running` reaches 0.
        let f = unsafe { &*(*shared.job.get()).f };
        take_tasks(shared, f);
        shared.running.fetch_sub(1, SeqCst);
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
