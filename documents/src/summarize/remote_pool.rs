//! A summary's requests on a remote engine: a few worker threads, as many as the remote's
//! concurrency setting, take the requests in order and stream each reply back, so the remote
//! batches them without being flooded. Stopping the pool ends every reply at its next piece.

use hillside_engine::scheduler::Update;
use hillside_engine::{Event, GenerateParams};
use hillside_front::RemotePrompt;
use hillside_remote::{RemoteEngine, RemoteError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// What a worker reports for request `i`.
pub(super) enum Reply {
    Update(Update),
    Failed(RemoteError),
}

/// Requests in flight on a remote engine; dropping it stops them.
pub(super) struct RemotePool {
    stop: Arc<AtomicBool>,
}

impl RemotePool {
    /// Starts `requests` ((index, prompt) pairs) on `remote`, each reply's updates sent to
    /// `tx` with its index.
    pub(super) fn start(
        remote: &Arc<RemoteEngine>,
        requests: Vec<(usize, RemotePrompt)>,
        params: GenerateParams,
        tx: mpsc::Sender<(usize, Reply)>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = remote.concurrency().min(requests.len());
        let queue = Arc::new(Mutex::new(VecDeque::from(requests)));
        for _ in 0..workers {
            let (remote, queue, stop, tx, params) =
                (remote.clone(), queue.clone(), stop.clone(), tx.clone(), params.clone());
            std::thread::spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let Some((i, prompt)) = next.filter(|_| !stop.load(Ordering::Relaxed)) else { return };
                let mut sink = |text: &str| {
                    !stop.load(Ordering::Relaxed)
                        && tx.send((i, Reply::Update(Update::Event(Event::Text(text.to_string()))))).is_ok()
                };
                let reply = match prompt.run(&remote, &params, &mut sink) {
                    Ok(summary) => Reply::Update(Update::Done(Ok(summary))),
                    Err(e) => Reply::Failed(e),
                };
                if tx.send((i, reply)).is_err() {
                    return;
                }
            });
        }
        Self { stop }
    }
}

impl Drop for RemotePool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
