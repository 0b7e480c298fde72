//! The server's downloads: each runs on a thread of its own, whoever started it, and outlives the
//! page that asked (a reloaded page sees it still going); every change is published so that
//! pages follow it as server-sent events. The bytes themselves go through the shelf's pull, which
//! keeps the part on disk: a download cut by a restart resumes at the next pull.

use crate::shelf::{ModelShelf, PullProgress, PullRequest, ShelfError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use utoipa::ToSchema;

/// Finished downloads stay listed (so a page sees how one ended) until this many are.
const FINISHED_KEPT: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DownloadState {
    Running,
    Done,
    Failed,
    Cancelled,
}

/// One download as pages see it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DownloadStatus {
    /// The model (or the repository's file) being fetched.
    pub name: String,
    pub state: DownloadState,
    pub done_bytes: u64,
    pub total_bytes: Option<u64>,
    pub bytes_per_s: f64,
    /// At the current rate; `None` until both the size and a rate are known.
    pub seconds_left: Option<f64>,
    /// Why it failed, or what was kept when it was cancelled.
    pub error: Option<String>,
    /// When it started, in seconds since the Unix epoch (the list's order).
    pub started_s: u64,
}

struct Tracked {
    status: DownloadStatus,
    cancel: Arc<AtomicBool>,
}

#[derive(Clone)]
pub struct Downloads {
    inner: Arc<Mutex<BTreeMap<String, Tracked>>>,
    /// Bumped on every change; pages wait on it.
    changed: watch::Sender<u64>,
}

impl Default for Downloads {
    fn default() -> Self {
        Self { inner: Arc::default(), changed: watch::channel(0).0 }
    }
}

impl Downloads {
    /// Every download, the most recent first.
    pub fn list(&self) -> Vec<DownloadStatus> {
        let mut all: Vec<DownloadStatus> = self.lock().values().map(|t| t.status.clone()).collect();
        all.sort_by(|a, b| b.started_s.cmp(&a.started_s).then_with(|| a.name.cmp(&b.name)));
        all
    }

    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Starts fetching `what` on a thread of its own; `Err` with the running one's status if it
    /// is being fetched already.
    pub fn start(&self, shelf: Arc<dyn ModelShelf>, what: PullRequest) -> Result<DownloadStatus, DownloadStatus> {
        let name = what.name();
        let cancel = Arc::new(AtomicBool::new(false));
        let status = {
            let mut all = self.lock();
            if let Some(running) = all.get(&name).filter(|t| t.status.state == DownloadState::Running) {
                return Err(running.status.clone());
            }
            let status = DownloadStatus {
                name: name.clone(),
                state: DownloadState::Running,
                done_bytes: 0,
                total_bytes: None,
                bytes_per_s: 0.0,
                seconds_left: None,
                error: None,
                started_s: crate::unix_now_s(),
            };
            all.insert(name.clone(), Tracked { status: status.clone(), cancel: cancel.clone() });
            forget_oldest_finished(&mut all);
            status
        };
        self.publish();
        let (downloads, thread_name) = (self.clone(), name.clone());
        let spawned = std::thread::Builder::new().name(format!("download {name}")).spawn(move || {
            // A bug in the pull ends this download with its error, never one listed as running.
            let pull = || shelf.pull(&what, &cancel, &mut |p| downloads.progress(&thread_name, p));
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(pull)).unwrap_or_else(|_| {
                let message = "the download stopped on an internal error (see the log); the part is kept".to_string();
                Err(ShelfError::Download { message, network: false })
            });
            downloads.finish(&thread_name, result);
        });
        if let Err(e) = spawned {
            let message = format!("cannot start the download: {e}");
            self.finish(&name, Err(ShelfError::Download { message, network: false }));
        }
        Ok(status)
    }

    /// Asks the download `name` to stop; `false` if none is running.
    pub fn cancel(&self, name: &str) -> bool {
        let all = self.lock();
        match all.get(name).filter(|t| t.status.state == DownloadState::Running) {
            Some(t) => {
                t.cancel.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Whether `name` is being fetched now.
    pub fn is_running(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|t| t.status.state == DownloadState::Running)
    }

    fn progress(&self, name: &str, p: PullProgress) {
        if let Some(t) = self.lock().get_mut(name) {
            let s = &mut t.status;
            s.done_bytes = p.done_bytes;
            s.total_bytes = p.total_bytes;
            s.bytes_per_s = p.bytes_per_s;
            s.seconds_left = p
                .total_bytes
                .filter(|_| p.bytes_per_s > 0.0)
                .map(|total| total.saturating_sub(p.done_bytes) as f64 / p.bytes_per_s);
        }
        self.publish();
    }

    fn finish(&self, name: &str, result: Result<(), ShelfError>) {
        if let Some(t) = self.lock().get_mut(name) {
            let s = &mut t.status;
            s.seconds_left = None;
            match result {
                Ok(()) => {
                    s.state = DownloadState::Done;
                    if let Some(total) = s.total_bytes {
                        s.done_bytes = total;
                    }
                }
                Err(e) => {
                    s.state =
                        if t.cancel.load(Ordering::Relaxed) { DownloadState::Cancelled } else { DownloadState::Failed };
                    s.error = Some(e.to_string());
                }
            }
            tracing::info!(download = name, state = ?s.state, error = s.error.as_deref(), "download ended");
        }
        self.publish();
    }

    fn publish(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Tracked>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn forget_oldest_finished(all: &mut BTreeMap<String, Tracked>) {
    let mut finished: Vec<(u64, String)> = all
        .iter()
        .filter(|(_, t)| t.status.state != DownloadState::Running)
        .map(|(name, t)| (t.status.started_s, name.clone()))
        .collect();
    if finished.len() > FINISHED_KEPT {
        finished.sort();
        for (_, name) in &finished[..finished.len() - FINISHED_KEPT] {
            all.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shelf::{LoadedModel, ShelfModel};
    use std::path::{Path, PathBuf};

    /// A shelf whose pull reports some progress, then panics: a bug in the middle of a download.
    struct PanickingPull;

    impl ModelShelf for PanickingPull {
        fn catalogue(&self, _: usize) -> Vec<ShelfModel> {
            Vec::new()
        }
        fn installed(&self) -> Vec<String> {
            Vec::new()
        }
        fn load(&self, name: &str) -> Result<LoadedModel, ShelfError> {
            Err(ShelfError::NotFound(name.into()))
        }
        fn check_pull(&self, _: &PullRequest) -> Result<(), ShelfError> {
            Ok(())
        }
        fn pull(
            &self,
            _: &PullRequest,
            _: &AtomicBool,
            progress: &mut dyn FnMut(PullProgress),
        ) -> Result<(), ShelfError> {
            progress(PullProgress { done_bytes: 1 << 20, total_bytes: Some(4 << 20), bytes_per_s: 1e6 });
            panic!("a bug in the pull");
        }
        fn remove(&self, name: &str) -> Result<(), ShelfError> {
            Err(ShelfError::NotFound(name.into()))
        }
        fn models_dir(&self) -> PathBuf {
            PathBuf::new()
        }
        fn disk_free_bytes(&self) -> Option<u64> {
            None
        }
        fn import(&self, _: &Path, name: &str, _: bool) -> Result<String, ShelfError> {
            Err(ShelfError::Refused(name.into()))
        }
    }

    #[test]
    fn a_pull_that_panics_ends_as_failed_and_can_be_started_again() {
        let downloads = Downloads::default();
        let what = PullRequest { model: "some-model".into(), file: None, sha256: None };
        assert!(downloads.start(Arc::new(PanickingPull), what.clone()).is_ok());
        let started = std::time::Instant::now();
        while downloads.is_running("some-model") {
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "still listed as running");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let ended = &downloads.list()[0];
        assert_eq!(ended.state, DownloadState::Failed);
        assert!(ended.error.as_deref().is_some_and(|e| e.contains("internal error")), "{ended:?}");
        assert!(downloads.start(Arc::new(PanickingPull), what).is_ok(), "a new try is allowed");
    }
}
