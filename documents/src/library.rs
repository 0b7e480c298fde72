//! The document library: what the user added, in one redb database file (ACID, crash-safe: a
//! killed process leaves every committed document whole and nothing half-written). A document
//! is known by a hash of its bytes, so adding the same file twice finds the first entry.

use crate::ingest::{Document, Format, Part};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// id → the entry, as JSON.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("documents");
/// id → the document's text.
const TEXTS: TableDefinition<&str, &str> = TableDefinition::new("texts");

/// What the library knows of a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The first 16 hex digits of the SHA-256 of its bytes.
    pub id: String,
    pub name: String,
    pub size_bytes: u64,
    pub format: Format,
    /// The SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Its tokens for the model it was last read with, once tokenized.
    pub tokens: Option<usize>,
    /// Pages or sections.
    pub parts: Vec<Part>,
    pub summary: Option<String>,
    pub created_s: u64,
    pub used_s: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("document library: {0}")]
pub struct LibraryError(String);

fn err(e: impl std::fmt::Display) -> LibraryError {
    LibraryError(e.to_string())
}

pub struct Library {
    db: Database,
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Library {
    /// Opens the library at `path`, creating it (and its folder) if missing.
    pub fn open(path: &Path) -> Result<Self, LibraryError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
        let db = Database::create(path).map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        // Both tables exist from the start, so readers never meet a missing one.
        let txn = db.begin_write().map_err(err)?;
        txn.open_table(ENTRIES).map_err(err)?;
        txn.open_table(TEXTS).map_err(err)?;
        txn.commit().map_err(err)?;
        Ok(Self { db })
    }

    /// Adds a document read from `bytes`, or finds the entry the same bytes already have (its
    /// name and use time refreshed). Entry and text are written in one transaction.
    pub fn add(&self, doc: &Document, bytes: &[u8]) -> Result<Entry, LibraryError> {
        let sha256: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        let id = sha256[..16].to_string();
        let now = now_s();
        let entry = match self.get(&id)? {
            Some(known) => Entry { name: doc.name.clone(), used_s: now, ..known },
            None => Entry {
                id: id.clone(),
                name: doc.name.clone(),
                size_bytes: bytes.len() as u64,
                format: doc.format,
                sha256,
                tokens: None,
                parts: doc.parts.clone(),
                summary: None,
                created_s: now,
                used_s: now,
            },
        };
        let txn = self.db.begin_write().map_err(err)?;
        {
            txn.open_table(ENTRIES).map_err(err)?.insert(id.as_str(), serde_json::to_vec(&entry).map_err(err)?.as_slice()).map_err(err)?;
            txn.open_table(TEXTS).map_err(err)?.insert(id.as_str(), doc.text.as_str()).map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(entry)
    }

    pub fn get(&self, id: &str) -> Result<Option<Entry>, LibraryError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(ENTRIES).map_err(err)?;
        let found = table.get(id).map_err(err)?;
        found.map(|v| serde_json::from_slice(v.value()).map_err(err)).transpose()
    }

    pub fn text(&self, id: &str) -> Result<Option<String>, LibraryError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(TEXTS).map_err(err)?;
        Ok(table.get(id).map_err(err)?.map(|v| v.value().to_string()))
    }

    /// Every entry, the most recently used first.
    pub fn list(&self) -> Result<Vec<Entry>, LibraryError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(ENTRIES).map_err(err)?;
        let mut entries = Vec::new();
        for row in table.iter().map_err(err)? {
            let (_, value) = row.map_err(err)?;
            entries.push(serde_json::from_slice::<Entry>(value.value()).map_err(err)?);
        }
        entries.sort_by(|a, b| b.used_s.cmp(&a.used_s).then_with(|| a.name.cmp(&b.name)));
        Ok(entries)
    }

    /// Changes an entry in one transaction; `None` if there is none with that id.
    pub fn update(&self, id: &str, change: impl FnOnce(&mut Entry)) -> Result<Option<Entry>, LibraryError> {
        let txn = self.db.begin_write().map_err(err)?;
        let entry = {
            let mut table = txn.open_table(ENTRIES).map_err(err)?;
            let Some(mut entry) = table.get(id).map_err(err)?.map(|v| serde_json::from_slice::<Entry>(v.value())).transpose().map_err(err)? else {
                return Ok(None);
            };
            change(&mut entry);
            table.insert(id, serde_json::to_vec(&entry).map_err(err)?.as_slice()).map_err(err)?;
            entry
        };
        txn.commit().map_err(err)?;
        Ok(Some(entry))
    }

    /// Forgets a document; whether there was one.
    pub fn remove(&self, id: &str) -> Result<bool, LibraryError> {
        let txn = self.db.begin_write().map_err(err)?;
        let removed = {
            let removed = txn.open_table(ENTRIES).map_err(err)?.remove(id).map_err(err)?.is_some();
            txn.open_table(TEXTS).map_err(err)?.remove(id).map_err(err)?;
            removed
        };
        txn.commit().map_err(err)?;
        Ok(removed)
    }
}
