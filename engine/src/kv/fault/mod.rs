//! Faults injected into cold pools, for the tests of failure paths that a healthy disk never
//! takes: a test registers a plan for a directory, and the pools created there afterwards
//! follow it ([`plans`]).
//!
//! Only builds with debug assertions (the ones tests run) and unit tests have plans. A release
//! build, the one users run, has no way to register one: a pool's faults are an uninhabited
//! type there, so every check at an I/O compiles away.

#[cfg(any(test, debug_assertions))]
mod plans;

#[cfg(not(any(test, debug_assertions)))]
pub(super) use compiled_out::{for_new_pool, PoolFaults};
#[cfg(any(test, debug_assertions))]
pub use plans::{clear, inject, ColdFaults, FailingRead, FailingWrite};
#[cfg(any(test, debug_assertions))]
pub(super) use plans::{for_new_pool, PoolFaults};

#[cfg(not(any(test, debug_assertions)))]
mod compiled_out {
    use std::path::Path;

    /// No pool of a release build has faults.
    #[derive(Debug)]
    pub enum PoolFaults {}

    impl PoolFaults {
        pub fn on_write(&self, _layer: usize, _group: usize) -> Option<std::io::Error> {
            match *self {}
        }

        pub fn on_read_done(&self, _layer: usize) -> Option<std::io::Error> {
            match *self {}
        }

        pub fn on_read(&self, _layer: usize, _head: usize, _group: usize) {
            match *self {}
        }
    }

    pub fn for_new_pool(_dir: &Path) -> Option<PoolFaults> {
        None
    }
}
