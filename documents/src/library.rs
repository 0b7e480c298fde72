//! The document library: what the user added, in one redb database file (ACID, crash-safe: a
//! killed process leaves every committed document whole and nothing half-written). A document
//! is known by a hash of its bytes, so adding the same file twice finds the first entry.

use crate::ingest::{Document, Format, Part};
use crate::sources::Point;
use crate::store_error::{StoreError, StoreFailure};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// id → the entry, as JSON.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("documents");
/// id → the document's text.
const TEXTS: TableDefinition<&str, &str> = TableDefinition::new("texts");
/// key → a [`KeptKv`], as JSON: the catalogue of documents' K/V files.
const KEPT_KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kept_kv");
/// id → a [`SummaryCheckpoint`], as JSON: the finished steps of a summary under way.
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("summary_checkpoints");

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
    /// The last summary's points, with their sources.
    pub summary: Option<Vec<Point>>,
    pub created_s: u64,
    pub used_s: u64,
}

/// A file holding the K/V of a prompt prefix that starts with documents (see
/// [`crate::kv_cache`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptKv {
    /// Hex of the hash of (model, prefix tokens); the file is named after it.
    pub key: String,
    /// The documents the prefix holds (deleting one forgets the file).
    pub documents: Vec<String>,
    pub tokens: usize,
    pub bytes: u64,
    pub used_s: u64,
}

/// The steps of a summary that finished, kept as each one does, so that a summary stopped by a
/// crash, a kill or the user resumes where it stopped (see [`crate::summarize::Checkpoints`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryCheckpoint {
    /// What the notes were written for (the model, the plan, the prompts): another plan's
    /// notes are never reused.
    pub plan_key: String,
    /// Chunks of the plan.
    pub chunks: usize,
    /// Step ("chunk 3", "merge 1.0") → its note.
    pub notes: std::collections::BTreeMap<String, String>,
}

impl SummaryCheckpoint {
    /// Chunk notes kept.
    pub fn chunks_done(&self) -> usize {
        self.notes.keys().filter(|k| k.starts_with("chunk ")).count()
    }
}

fn err(e: impl Into<StoreFailure>) -> StoreError {
    StoreError::new("document library", e)
}

pub struct Library {
    db: Database,
}

/// What [`Library::add`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    pub entry: Entry,
    /// Whether the bytes were new (else the entry was there already).
    pub created: bool,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Library {
    /// Opens the library at `path`, creating it (and its folder) if missing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            hillside_engine::private_files::create_dir(dir)
                .map_err(|source| err(StoreFailure::Create { path: dir.to_path_buf(), source }))?;
        }
        hillside_engine::private_files::ensure(path)
            .map_err(|source| err(StoreFailure::Create { path: path.to_path_buf(), source }))?;
        let db =
            Database::create(path).map_err(|source| err(StoreFailure::Open { path: path.to_path_buf(), source }))?;
        // Both tables exist from the start, so readers never meet a missing one.
        let txn = db.begin_write().map_err(err)?;
        txn.open_table(ENTRIES).map_err(err)?;
        txn.open_table(TEXTS).map_err(err)?;
        txn.open_table(KEPT_KV).map_err(err)?;
        txn.open_table(CHECKPOINTS).map_err(err)?;
        txn.commit().map_err(err)?;
        Ok(Self { db })
    }

    /// Adds a document read from `bytes`, or finds the entry the same bytes already have (its
    /// name and use time refreshed). The entry is read, and entry and text are written, in one
    /// transaction: a summary stored meanwhile by another request is kept, not overwritten.
    pub fn add(&self, doc: &Document, bytes: &[u8]) -> Result<Added, StoreError> {
        let sha256 = sha256_hex(bytes);
        let id = sha256[..16].to_string();
        let now = now_s();
        let txn = self.db.begin_write().map_err(err)?;
        let added = {
            let mut entries = txn.open_table(ENTRIES).map_err(err)?;
            let known = entries
                .get(id.as_str())
                .map_err(err)?
                .map(|v| serde_json::from_slice::<Entry>(v.value()))
                .transpose()
                .map_err(err)?;
            let created = known.is_none();
            let entry = match known {
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
            entries.insert(id.as_str(), serde_json::to_vec(&entry).map_err(err)?.as_slice()).map_err(err)?;
            if created {
                txn.open_table(TEXTS).map_err(err)?.insert(id.as_str(), doc.text.as_str()).map_err(err)?;
            }
            Added { entry, created }
        };
        txn.commit().map_err(err)?;
        Ok(added)
    }

    /// The id the document read from `bytes` has (or would have) here.
    pub fn id_of(bytes: &[u8]) -> String {
        sha256_hex(bytes)[..16].to_string()
    }

    pub fn get(&self, id: &str) -> Result<Option<Entry>, StoreError> {
        self.read_json(ENTRIES, id)
    }

    /// The value under `key` in a table of JSON values.
    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(table).map_err(err)?;
        let found = table.get(key).map_err(err)?;
        found.map(|v| serde_json::from_slice(v.value()).map_err(err)).transpose()
    }

    pub fn text(&self, id: &str) -> Result<Option<String>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(TEXTS).map_err(err)?;
        Ok(table.get(id).map_err(err)?.map(|v| v.value().to_string()))
    }

    /// The entry and the document (its text and parts) as it was read.
    pub fn document(&self, id: &str) -> Result<Option<(Entry, Document)>, StoreError> {
        let (Some(entry), Some(text)) = (self.get(id)?, self.text(id)?) else { return Ok(None) };
        let doc = Document { name: entry.name.clone(), format: entry.format, text, parts: entry.parts.clone() };
        Ok(Some((entry, doc)))
    }

    /// Every entry, the most recently used first.
    pub fn list(&self) -> Result<Vec<Entry>, StoreError> {
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
    pub fn update(&self, id: &str, change: impl FnOnce(&mut Entry)) -> Result<Option<Entry>, StoreError> {
        self.change_entry(id, change, |_| Ok(()))
    }

    /// Reads entry `id`, changes it and writes it back, doing `also` in the same transaction;
    /// `None`, with nothing written, if there is no such entry.
    fn change_entry(
        &self,
        id: &str,
        change: impl FnOnce(&mut Entry),
        also: impl FnOnce(&redb::WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<Option<Entry>, StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        let entry = {
            let mut table = txn.open_table(ENTRIES).map_err(err)?;
            let Some(mut entry) = table
                .get(id)
                .map_err(err)?
                .map(|v| serde_json::from_slice::<Entry>(v.value()))
                .transpose()
                .map_err(err)?
            else {
                return Ok(None);
            };
            change(&mut entry);
            table.insert(id, serde_json::to_vec(&entry).map_err(err)?.as_slice()).map_err(err)?;
            entry
        };
        also(&txn)?;
        txn.commit().map_err(err)?;
        Ok(Some(entry))
    }

    /// Forgets a document; whether there was one.
    pub fn remove(&self, id: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        let removed = {
            let removed = txn.open_table(ENTRIES).map_err(err)?.remove(id).map_err(err)?.is_some();
            txn.open_table(TEXTS).map_err(err)?.remove(id).map_err(err)?;
            txn.open_table(CHECKPOINTS).map_err(err)?.remove(id).map_err(err)?;
            removed
        };
        txn.commit().map_err(err)?;
        Ok(removed)
    }

    pub fn kept_kv(&self, key: &str) -> Result<Option<KeptKv>, StoreError> {
        self.read_json(KEPT_KV, key)
    }

    /// Every kept K/V file, least recently used first.
    pub fn kept_kvs(&self) -> Result<Vec<KeptKv>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(KEPT_KV).map_err(err)?;
        let mut kept = Vec::new();
        for row in table.iter().map_err(err)? {
            kept.push(serde_json::from_slice::<KeptKv>(row.map_err(err)?.1.value()).map_err(err)?);
        }
        kept.sort_by(|a, b| a.used_s.cmp(&b.used_s).then_with(|| a.key.cmp(&b.key)));
        Ok(kept)
    }

    /// Records (or refreshes) a kept K/V file.
    pub fn keep_kv(&self, kept: &KeptKv) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        txn.open_table(KEPT_KV)
            .map_err(err)?
            .insert(kept.key.as_str(), serde_json::to_vec(kept).map_err(err)?.as_slice())
            .map_err(err)?;
        txn.commit().map_err(err)
    }

    /// Forgets a kept K/V file (the caller removes it); whether there was one.
    pub fn forget_kv(&self, key: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        let removed = txn.open_table(KEPT_KV).map_err(err)?.remove(key).map_err(err)?.is_some();
        txn.commit().map_err(err)?;
        Ok(removed)
    }

    /// The summary under way for document `id`, if any step of one has finished.
    pub fn checkpoint(&self, id: &str) -> Result<Option<SummaryCheckpoint>, StoreError> {
        self.read_json(CHECKPOINTS, id)
    }

    /// Keeps a finished step's `note` of the summary of `id` planned as `plan_key` (of
    /// `chunks` chunks), in one transaction; notes kept for another plan are dropped, and
    /// nothing is kept for a document removed meanwhile.
    pub fn keep_step(&self, id: &str, plan_key: &str, chunks: usize, step: &str, note: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        if txn.open_table(ENTRIES).map_err(err)?.get(id).map_err(err)?.is_none() {
            return Ok(());
        }
        {
            let mut table = txn.open_table(CHECKPOINTS).map_err(err)?;
            let known = table
                .get(id)
                .map_err(err)?
                .map(|v| serde_json::from_slice::<SummaryCheckpoint>(v.value()))
                .transpose()
                .map_err(err)?;
            let mut checkpoint = known.filter(|c| c.plan_key == plan_key).unwrap_or_else(|| SummaryCheckpoint {
                plan_key: plan_key.to_string(),
                chunks,
                ..Default::default()
            });
            checkpoint.notes.insert(step.to_string(), note.to_string());
            table.insert(id, serde_json::to_vec(&checkpoint).map_err(err)?.as_slice()).map_err(err)?;
        }
        txn.commit().map_err(err)
    }

    /// Stores a finished summary's points (and the document's tokens) and forgets its
    /// checkpoint, in one transaction; `None` if there is no document `id`.
    pub fn finish_summary(&self, id: &str, points: Vec<Point>, tokens: usize) -> Result<Option<Entry>, StoreError> {
        let summarized = |entry: &mut Entry| {
            entry.summary = Some(points);
            entry.tokens = Some(tokens);
            entry.used_s = now_s();
        };
        self.change_entry(id, summarized, |txn| {
            txn.open_table(CHECKPOINTS).map_err(err)?.remove(id).map_err(err)?;
            Ok(())
        })
    }
}
