//! The server's documents: the library's service ([`DocumentService`]), and which local files the
//! server may read.

use crate::StartError;
use hillside_documents::ingest::isolated::ProcessLimits;
use hillside_documents::{DocumentService, DocumentsConfig};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// The documents routes' state: the library's service, the files the desktop app's user chose,
/// and the turns uploads wait for.
pub struct Documents {
    pub service: DocumentService,
    /// The local paths `POST /v1/hillside/documents` may read besides uploads: those the desktop
    /// app's user dropped on its window. `None` (`hillside serve`): none, as a client must not
    /// make the server read files it names.
    pub chosen_paths: Option<Arc<ChosenPaths>>,
    /// Turns for adding a document, one per reader slot, taken before its bytes are read in.
    pub uploads: tokio::sync::Semaphore,
}

impl Documents {
    pub fn open(config: &DocumentsConfig, chosen_paths: Option<Arc<ChosenPaths>>) -> Result<Self, StartError> {
        let process = ProcessLimits::default();
        let service = DocumentService::open(config, process)?;
        let uploads = tokio::sync::Semaphore::new(process.concurrent.max(1));
        Ok(Self { service, chosen_paths, uploads })
    }
}
