//! How far a long summary has come and how long the rest should take: steps (chunk notes and
//! merges) done of the steps planned, and the time left at the pace of the steps this run did
//! (steps resumed from a checkpoint took no time now, so they do not count towards the pace).

use std::time::Instant;

pub(super) struct Pace {
    started: Instant,
    /// Steps in all: the chunks, and the merges the plan expects (revised as levels start).
    steps: usize,
    done: usize,
    /// Of `done`, those this run did.
    ran: usize,
}

impl Pace {
    pub fn new(steps: usize) -> Self {
        Self { started: Instant::now(), steps, done: 0, ran: 0 }
    }

    pub fn step_done(&mut self) {
        self.done += 1;
        self.ran += 1;
    }

    /// A step kept from an earlier run.
    pub fn step_kept(&mut self) {
        self.done += 1;
    }

    /// The steps still to come are `left` (a level's groups are known once it starts).
    pub fn steps_left(&mut self, left: usize) {
        self.steps = self.done + left;
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Seconds left at this run's pace; `None` before its first step.
    pub fn eta_s(&self) -> Option<f64> {
        (self.ran > 0).then(|| self.elapsed_s() / self.ran as f64 * self.steps.saturating_sub(self.done) as f64)
    }
}
