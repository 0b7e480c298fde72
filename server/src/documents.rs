//! The server's documents: the library and the kept K/V of its documents, in one data folder.

use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::{Library, Limits};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, Serialize)]
pub struct DocumentsConfig {
    /// Holds `library.redb` and the `kv/` folder of kept K/V files.
    pub dir: PathBuf,
    /// Disk the kept K/V files may take; the least recently used go first.
    pub kv_quota_bytes: u64,
    /// The largest file a document may be.
    pub max_file_bytes: u64,
    /// Names the model in the kept K/V's keys ([`hillside_documents::kv_cache::model_fingerprint`]).
    pub model_key: String,
    /// Whether `POST /v1/hillside/documents` takes a local path (the desktop app, whose user
    /// chose the file) besides an upload. Off for `hillside serve`: a client must not make the
    /// server read files it names.
    pub local_paths: bool,
}

pub struct Documents {
    pub library: Arc<Library>,
    pub kv: Arc<DocumentKvCache>,
    pub limits: Limits,
    pub local_paths: bool,
}

impl Documents {
    pub fn open(config: &DocumentsConfig) -> Result<Self, String> {
        let library = Arc::new(Library::open(&config.dir.join("library.redb")).map_err(|e| e.to_string())?);
        let kv = DocumentKvCache::open(library.clone(), &config.dir.join("kv"), config.kv_quota_bytes, &config.model_key)
            .map_err(|e| format!("document K/V folder {}: {e}", config.dir.join("kv").display()))?;
        Ok(Self { library, kv, limits: Limits { max_file_bytes: config.max_file_bytes }, local_paths: config.local_paths })
    }
}
