//! The server's documents: the library and the kept K/V of its documents, in one data folder.

use crate::error::ApiError;
use crate::StartError;
use axum::http::StatusCode;
use hillside_documents::ingest::isolated::{IsolatedReader, ProcessLimits, ReaderMissing};
use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::{Library, Limits};
use serde::Serialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Serialize)]
pub struct DocumentsConfig {
    /// Holds `library.redb` and the `kv/` folder of kept K/V files.
    pub dir: PathBuf,
    /// Disk the kept K/V files may take; the least recently used go first.
    pub kv_quota_bytes: u64,
    /// The largest file a document may be.
    pub max_file_bytes: u64,
    /// Names the model the server starts with in the kept K/V's keys
    /// ([`hillside_documents::kv_cache::model_fingerprint`]).
    pub model_key: String,
    /// The local paths `POST /v1/hillside/documents` may read besides uploads: those the desktop
    /// app's user dropped on its window. `None` (`hillside serve`): none, as a client must not
    /// make the server read files it names.
    #[serde(skip)]
    pub chosen_paths: Option<Arc<ChosenPaths>>,
}

/// Files the user chose in the desktop app; a path is compared once its links are resolved, so
/// that `chosen/../other` or a link does not reach another file.
#[derive(Debug, Default)]
pub struct ChosenPaths(Mutex<HashSet<PathBuf>>);

impl ChosenPaths {
    pub fn choose(&self, path: &Path) {
        if let Ok(real) = path.canonicalize() {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(real);
        }
    }

    /// The chosen file `path` names (links resolved), if it is one.
    pub fn resolve(&self, path: &Path) -> Option<PathBuf> {
        path.canonicalize().ok().filter(|real| self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(real))
    }
}

pub struct Documents {
    pub library: Arc<Library>,
    pub kv: Arc<DocumentKvCache>,
    pub limits: Limits,
    pub chosen_paths: Option<Arc<ChosenPaths>>,
    /// Every file is read in a child process; `Err`: the reader is not installed, and documents
    /// cannot be added (said at start and on each upload).
    reader: Result<IsolatedReader, ReaderMissing>,
    /// Turns for adding a document, one per reader slot, taken before its bytes are read in.
    pub uploads: tokio::sync::Semaphore,
}

impl Documents {
    /// What reads uploaded and chosen files, each in a process of its own.
    pub fn reader(&self) -> Result<&IsolatedReader, ApiError> {
        self.reader.as_ref().map_err(|why| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("document_reader_missing"),
                format!("Documents cannot be added: {why}."),
            )
        })
    }

    pub fn open(config: &DocumentsConfig) -> Result<Self, StartError> {
        let library = Arc::new(Library::open(&config.dir.join("library.redb"))?);
        let kv_dir = config.dir.join("kv");
        let kv = DocumentKvCache::open(library.clone(), &kv_dir, config.kv_quota_bytes, &config.model_key)
            .map_err(|source| StartError::KvFolder { path: kv_dir.clone(), source })?;
        let process = ProcessLimits::default();
        let reader = IsolatedReader::locate(process);
        if let Err(why) = &reader {
            tracing::error!(%why, "documents cannot be added");
        }
        let limits = Limits { max_file_bytes: config.max_file_bytes, ..Limits::default() };
        let uploads = tokio::sync::Semaphore::new(process.concurrent.max(1));
        Ok(Self { library, kv, limits, chosen_paths: config.chosen_paths.clone(), reader, uploads })
    }
}
