//! Layer-wise spill (InstInfer's layer-wise K/V transfer): once a layer has appended a step's
//! tokens, its whole groups go to the cold pool on an I/O thread while the next layers compute,
//! and the commit only waits for them. Only for spills in text order: a placement by key
//! similarity plans every lane's order at the commit.
//!
//! The groups are written past the cold pool's end, where nothing reads them until the commit
//! moves the end over them; a step that fails before its commit leaves them there, and the next
//! spill overwrites them (after waiting for these writes, so that two never race).

use super::window::RecentWindow;
use crate::aligned::AlignedBuf;
use crate::error::{Error, Result};
use crate::kv::cold::staged::io_pool;
use crate::kv::cold::{ColdPool, GROUP_TOKENS};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};

/// The writes in flight, per layer.
pub struct LayerSpills {
    pending: Vec<Option<Pending>>,
}

struct Pending {
    groups: usize,
    /// In a mutex only so that the backing stays `Sync` (readers share it); never contended.
    done: Mutex<Receiver<Result<()>>>,
}

impl Pending {
    fn wait(self) -> Result<()> {
        let done = self.done.into_inner().unwrap_or_else(|p| p.into_inner());
        done.recv().unwrap_or_else(|_| Err(Error::Internal("a cold-pool write thread stopped".into())))
    }
}

impl LayerSpills {
    pub fn new(n_layers: usize) -> Self {
        Self { pending: (0..n_layers).map(|_| None).collect() }
    }

    /// Starts writing `layer`'s whole groups from the window's base on: copied from the window
    /// now, written on an I/O thread.
    pub fn start(&mut self, cold: &Arc<ColdPool>, window: &RecentWindow, layer: usize) {
        self.wait(layer);
        let groups = window.len(layer) / GROUP_TOKENS;
        if groups == 0 {
            return;
        }
        let n_kv = cold.layout().n_kv_heads;
        let lane_bytes = groups * cold.layout().group_bytes();
        let mut pages = AlignedBuf::zeroed(n_kv * lane_bytes);
        for (head, lane) in pages.as_u16_mut().chunks_exact_mut(lane_bytes / 2).enumerate() {
            window.pack_groups(layer, head, groups, None, lane, cold.layout().group_bytes() / 2);
        }
        let (tx, done) = mpsc::channel();
        let (cold, first) = (cold.clone(), window.base() / GROUP_TOKENS);
        io_pool().spawn(move || {
            let mut lanes = pages.as_bytes().chunks_exact(lane_bytes).enumerate();
            let written = lanes.try_for_each(|(head, bytes)| cold.write_groups(layer, head, first, groups, bytes));
            let _ = tx.send(written); // the store may be gone; the pool file goes with the last reference
        });
        self.pending[layer] = Some(Pending { groups, done: Mutex::new(done) });
    }

    /// Waits for every layer's writes. `Ok(true)` when each layer wrote exactly `groups`
    /// groups, so the spill is done; `Ok(false)` when some layer did not (the caller writes
    /// them itself); the first failed write's error otherwise.
    pub fn finish(&mut self, groups: usize) -> Result<bool> {
        let mut all = true;
        let mut first_error = Ok(());
        for layer in 0..self.pending.len() {
            match self.pending[layer].take() {
                Some(p) => {
                    all &= p.groups == groups;
                    let written = p.wait();
                    if first_error.is_ok() {
                        first_error = written;
                    }
                }
                None => all = false,
            }
        }
        first_error.map(|()| all)
    }

    /// Waits for the writes in flight and forgets them (a truncation, or a step rolled back).
    pub fn abandon(&mut self) {
        for layer in 0..self.pending.len() {
            self.wait(layer);
        }
    }

    fn wait(&mut self, layer: usize) {
        if let Some(p) = self.pending[layer].take() {
            let _ = p.wait();
        }
    }
}
