//! Documents' K/V kept on disk: after a summary, the prompt prefix that holds a document stays
//! in a file ([`hillside_engine::kv::snapshot`]: checksummed records), catalogued in the
//! library under a hash of (model, prefix tokens). A question on the same document, in this run
//! or after a restart, loads it instead of reading the document again. A changed document or
//! another model makes other tokens or another model key, so another entry: a stale one is
//! never matched, and ages out. The files share a disk quota, the least recently used going
//! first; a file that fails its checksum is removed and rebuilt by the next prefill.

use crate::library::{now_s, KeptKv, Library};
use hillside_engine::kv::snapshot;
use hillside_engine::scheduler::KeptPrefix;
use hillside_engine::Sequence;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const FILE_SUFFIX: &str = ".kv";

/// What the cache did since it was opened.
#[derive(Debug, Default, serde::Serialize)]
pub struct KvCacheStats {
    pub loaded: AtomicU64,
    pub saved: AtomicU64,
    /// Files that failed their checksum or did not match, removed.
    pub damaged: AtomicU64,
    /// Files removed to stay under the quota.
    pub evicted: AtomicU64,
}

pub struct DocumentKvCache {
    library: Arc<Library>,
    dir: PathBuf,
    quota_bytes: u64,
    /// Names the model (see [`model_fingerprint`]): part of every key.
    model_key: String,
    pub stats: KvCacheStats,
}

impl DocumentKvCache {
    /// The cache in `dir` for the model named `model_key`, at most `quota_bytes` on disk.
    /// Files a killed process left half-written, and files and entries without each other,
    /// are removed.
    pub fn open(library: Arc<Library>, dir: &Path, quota_bytes: u64, model_key: &str) -> std::io::Result<Arc<Self>> {
        hillside_engine::private_files::create_dir(dir)?;
        let cache = Self {
            library,
            dir: dir.to_path_buf(),
            quota_bytes,
            model_key: model_key.to_string(),
            stats: KvCacheStats::default(),
        };
        let known: Vec<KeptKv> = cache.library.kept_kvs().map_err(std::io::Error::other)?;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let listed = name.strip_suffix(FILE_SUFFIX).is_some_and(|key| known.iter().any(|k| k.key == key));
            if !listed && (name.ends_with(FILE_SUFFIX) || name.ends_with(snapshot::PARTIAL_SUFFIX)) {
                tracing::info!(path = %path.display(), "removing a K/V file no entry names (left by a killed process)");
                let _ = std::fs::remove_file(&path);
            }
        }
        for kept in known.iter().filter(|k| !cache.path(&k.key).exists()) {
            let _ = cache.library.forget_kv(&kept.key);
        }
        Ok(Arc::new(cache))
    }

    /// The same cache for another model (after a switch): the same files and quota, entries
    /// keyed by `model_key`. Unlike [`Self::open`] it removes nothing, as the other model's
    /// requests may still be writing theirs.
    pub fn for_model(&self, model_key: &str) -> Arc<Self> {
        Arc::new(Self {
            library: self.library.clone(),
            dir: self.dir.clone(),
            quota_bytes: self.quota_bytes,
            model_key: model_key.to_string(),
            stats: KvCacheStats::default(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{FILE_SUFFIX}"))
    }

    /// The kept K/V of `prefix` (tokens that start with `documents`), as a request carries it.
    pub fn prefix(self: &Arc<Self>, documents: &[String], prefix: &[u32]) -> Box<dyn KeptPrefix> {
        let mut hash = Sha256::new();
        hash.update(self.model_key.as_bytes());
        hash.update((prefix.len() as u64).to_le_bytes());
        prefix.iter().for_each(|t| hash.update(t.to_le_bytes()));
        let tag: [u8; 32] = hash.finalize().into();
        let key = tag[..16].iter().map(|b| format!("{b:02x}")).collect();
        Box::new(DocumentPrefix { cache: self.clone(), documents: documents.to_vec(), key, tag, tokens: prefix.len() })
    }

    /// Removes every kept file of document `id`; how many.
    pub fn forget_document(&self, id: &str) -> usize {
        let kept = self.library.kept_kvs().unwrap_or_default();
        kept.iter().filter(|k| k.documents.iter().any(|d| d == id)).map(|k| self.remove(&k.key)).count()
    }

    /// Kept files and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        let kept = self.library.kept_kvs().unwrap_or_default();
        (kept.len(), kept.iter().map(|k| k.bytes).sum())
    }

    fn remove(&self, key: &str) {
        if let Err(e) = self.library.forget_kv(key) {
            tracing::warn!(key, error = %e, "cannot forget a kept K/V entry");
        }
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Removes the least recently used files (never `keep`) until `incoming` more bytes fit.
    fn make_room(&self, incoming: u64, keep: &str) {
        let kept = self.library.kept_kvs().unwrap_or_default();
        let mut total: u64 = kept.iter().map(|k| k.bytes).sum::<u64>() + incoming;
        for old in kept.iter().filter(|k| k.key != keep) {
            if total <= self.quota_bytes {
                break;
            }
            tracing::info!(key = %old.key, bytes = old.bytes, "evicting a kept document K/V file (quota)");
            self.remove(&old.key);
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            total -= old.bytes;
        }
    }
}

/// One request's prefix.
struct DocumentPrefix {
    cache: Arc<DocumentKvCache>,
    documents: Vec<String>,
    key: String,
    tag: [u8; 32],
    tokens: usize,
}

impl KeptPrefix for DocumentPrefix {
    fn tokens(&self) -> usize {
        self.tokens
    }

    fn load(&mut self, seq: &mut Sequence) -> bool {
        let cache = &self.cache;
        let Ok(Some(mut kept)) = cache.library.kept_kv(&self.key) else { return false };
        match snapshot::load(&cache.path(&self.key), &self.tag, seq.kv.as_mut()) {
            Ok(n) if n == self.tokens => {
                kept.used_s = now_s();
                let _ = cache.library.keep_kv(&kept);
                cache.stats.loaded.fetch_add(1, Ordering::Relaxed);
                true
            }
            outcome => {
                // Damaged, or not what the entry said: never used; the prefill rebuilds it.
                tracing::warn!(key = %self.key, outcome = ?outcome.map_err(|e| e.to_string()), "a kept document K/V file is unusable; rebuilding it");
                cache.remove(&self.key);
                cache.stats.damaged.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn save(&mut self, seq: &mut Sequence) {
        let cache = &self.cache;
        if cache.library.kept_kv(&self.key).ok().flatten().is_some() {
            return;
        }
        let bytes = snapshot::file_bytes(seq.kv.shape(), self.tokens);
        if bytes > cache.quota_bytes {
            tracing::info!(
                bytes,
                quota = cache.quota_bytes,
                "a document's K/V is larger than the whole quota; not kept"
            );
            return;
        }
        cache.make_room(bytes, &self.key);
        let path = cache.path(&self.key);
        let saved = snapshot::save(seq.kv.as_mut(), self.tokens, &self.tag, &path).map_err(|e| e.to_string()).and_then(
            |bytes| {
                let kept = KeptKv {
                    key: self.key.clone(),
                    documents: self.documents.clone(),
                    tokens: self.tokens,
                    bytes,
                    used_s: now_s(),
                };
                cache.library.keep_kv(&kept).map_err(|e| e.to_string())
            },
        );
        match saved {
            Ok(()) => {
                cache.stats.saved.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot keep a document's K/V on disk; after a restart, questions will read the document again");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Names a model file for cache keys: its name, size and a hash of its first and last MiB
/// (a different file of the same name and size differs there: header, tensor data).
pub fn model_fingerprint(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut hash = Sha256::new();
    hash.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
    hash.update(size.to_le_bytes());
    let mut head = Vec::new();
    (&mut file).take(1 << 20).read_to_end(&mut head)?;
    hash.update(&head);
    let tail_bytes = (1u64 << 20).min(size);
    let mut tail = vec![0u8; tail_bytes as usize];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut tail, size - tail_bytes)?;
    hash.update(&tail);
    Ok(hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect())
}
