//! The error of the app's small databases (the document library here, the conversations in the
//! server): which store failed and why, with the kinds a caller acts on (a full disk, a store
//! another process holds, a damaged record) kept rather than flattened to text.

use std::path::PathBuf;

/// A store that could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[error("{store}: {failure}")]
pub struct StoreError {
    /// Which store, as a user would name it ("document library").
    pub store: &'static str,
    pub failure: StoreFailure,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreFailure {
    #[error("cannot create {}: {source}", .path.display())]
    Create { path: PathBuf, source: std::io::Error },
    #[error("cannot open {}: {source}", .path.display())]
    Open { path: PathBuf, source: redb::DatabaseError },
    #[error(transparent)]
    Database(#[from] redb::Error),
    /// A record that no longer parses (or a value that cannot be written as one).
    #[error("a record is damaged: {0}")]
    Record(#[from] serde_json::Error),
}

// redb returns an error type per operation; each is one of redb::Error's kinds.
macro_rules! from_redb {
    ($($kind:ty),*) => {
        $(impl From<$kind> for StoreFailure {
            fn from(e: $kind) -> Self {
                Self::Database(e.into())
            }
        })*
    };
}
from_redb!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

impl StoreError {
    pub fn new(store: &'static str, failure: impl Into<StoreFailure>) -> Self {
        Self { store, failure: failure.into() }
    }

    /// The disk is full: the same request can succeed once space is freed.
    pub fn is_storage_full(&self) -> bool {
        let full = |e: &std::io::Error| hillside_engine::error::is_disk_full(e.kind());
        match &self.failure {
            StoreFailure::Create { source, .. } => full(source),
            StoreFailure::Open { source: redb::DatabaseError::Storage(redb::StorageError::Io(e)), .. } => full(e),
            StoreFailure::Database(redb::Error::Io(e)) => full(e),
            _ => false,
        }
    }

    /// Another process has the store open (a second Hillside on the same data folder).
    pub fn is_in_use(&self) -> bool {
        matches!(
            &self.failure,
            StoreFailure::Open { source: redb::DatabaseError::DatabaseAlreadyOpen, .. }
                | StoreFailure::Database(redb::Error::DatabaseAlreadyOpen)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_a_caller_acts_on_survive_the_conversion() {
        let io = |kind: std::io::ErrorKind| redb::StorageError::Io(kind.into());
        let full = StoreError::new("document library", io(std::io::ErrorKind::StorageFull));
        assert!(full.is_storage_full() && !full.is_in_use());
        assert!(full.to_string().starts_with("document library: "), "{full}");
        assert!(!StoreError::new("document library", io(std::io::ErrorKind::PermissionDenied)).is_storage_full());
        let scratch = tempfile::Builder::new().prefix("hillside-store-error-").tempdir().unwrap();
        let path = scratch.path().join("held.redb");
        let _held = redb::Database::create(&path).unwrap();
        let second = redb::Database::create(&path).map_err(|source| StoreFailure::Open { path: path.clone(), source });
        let in_use = StoreError::new("conversation store", second.expect_err("a second open is refused"));
        assert!(in_use.is_in_use() && !in_use.is_storage_full(), "{in_use}");
        assert!(in_use.to_string().contains("held.redb"), "{in_use}");
    }
}
