//! The thread a storage-side evaluator scores on: requests go in over a channel, and each
//! request's score blocks come back over a bounded channel of its own, so the worker runs at
//! most a few blocks ahead of the host's merge.

use super::ScoreBlock;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

/// Score blocks that may wait in a reply channel; the worker blocks when the host falls behind.
/// Room for a whole layer's cold scan at 8K tokens (~22 blocks, 4 KiB each): with only two, the
/// worker and the host took turns, a thread wake-up per block (8K: the cold scan took 15.8 ms
/// per step instead of 10.6).
pub(super) const BLOCKS_IN_FLIGHT: usize = 32;

pub(super) struct Worker<R: Send + 'static> {
    requests: Option<Sender<R>>,
    thread: Option<JoinHandle<()>>,
}

impl<R: Send + 'static> Worker<R> {
    /// Starts a thread that runs `serve` over the requests until the worker is dropped.
    pub fn spawn(name: &str, serve: impl FnOnce(Receiver<R>) + Send + 'static) -> std::io::Result<Self> {
        let (requests, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || serve(inbox))?;
        Ok(Self { requests: Some(requests), thread: Some(thread) })
    }

    /// A request's reply channel.
    pub fn reply_channel() -> (SyncSender<ScoreBlock>, Receiver<ScoreBlock>) {
        mpsc::sync_channel(BLOCKS_IN_FLIGHT)
    }

    /// Hands `request` to the thread. A dead thread drops it, which closes its reply channel:
    /// the caller then sees no blocks.
    pub fn send(&self, request: R) {
        if let Some(requests) = &self.requests {
            let _ = requests.send(request);
        }
    }
}

impl<R: Send + 'static> Drop for Worker<R> {
    fn drop(&mut self) {
        self.requests.take(); // ends the thread's request loop
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
