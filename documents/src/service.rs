//! The documents a user keeps, as one service: the library with its kept K/V, opened once; a
//! file added (read in the sandboxed reader, and refused before it is stored if it could not be
//! summarized); a summary run with its steps and its points kept; a question's documents looked
//! up; a document forgotten with its K/V. The server's routes, the CLI and the bench call it, so
//! that none of them opens the library or reads a file itself.

use crate::ingest::file_bytes;
use crate::ingest::isolated::{IsolatedReader, ProcessLimits, ReaderMissing};
use crate::kv_cache::DocumentKvCache;
use crate::library::{Entry, Library};
use crate::prompt::PromptError;
use crate::questions::{self, Question};
use crate::summarize::{plan_summary, summarize, DocumentSummary, LibraryCheckpoints, Progress, Runner, SummaryError};
use crate::{Document, IngestError, Limits, StoreError};
use hillside_engine::{CancelFlag, ChatMessage};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a library lives and what it may take.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentsConfig {
    /// Holds `library.redb` and the `kv/` folder of kept K/V files.
    pub dir: PathBuf,
    /// Disk the kept K/V files may take; the least recently used go first.
    pub kv_quota_bytes: u64,
    /// The largest file a document may be.
    pub max_file_bytes: u64,
    /// Names the model a library is opened for in the kept K/V's keys
    /// ([`crate::kv_cache::model_fingerprint`]).
    pub model_key: String,
}

/// The most documents one question may name: each is loaded and read into the prompt.
pub const MAX_DOCUMENTS_PER_QUESTION: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Library(#[from] StoreError),
    #[error("document K/V folder {}: {source}", .path.display())]
    KvFolder { path: PathBuf, source: std::io::Error },
}

impl OpenError {
    /// Another process holds the library (a second Hillside, most likely).
    pub fn is_in_use(&self) -> bool {
        matches!(self, Self::Library(e) if e.is_in_use())
    }
}

/// Why a document was not added; nothing is stored.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("documents cannot be added: {0}")]
    ReaderMissing(String),
    #[error(transparent)]
    Read(#[from] IngestError),
    /// Said when it is added, not after minutes of work: a document whose summary cannot be
    /// done with this context.
    #[error(transparent)]
    CannotSummarize(SummaryError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a question's documents were refused, before any is loaded into a prompt.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("a question may name at most {MAX_DOCUMENTS_PER_QUESTION} documents, not {0}")]
    TooMany(usize),
    #[error("document '{id}' is named twice")]
    Twice { index: usize, id: String },
    #[error("no document '{id}'")]
    Unknown { index: usize, id: String },
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A document added: its entry, whether its bytes were new, and what was read from them.
pub struct AddedDocument {
    pub entry: Entry,
    pub created: bool,
    pub document: Document,
}

pub struct DocumentService {
    pub library: Arc<Library>,
    /// The kept K/V of the model the library was opened for ([`DocumentKvCache::for_model`]
    /// gives another's).
    pub kv: Arc<DocumentKvCache>,
    pub limits: Limits,
    /// Every file is read in a child process; `Err`: the reader is not installed, and documents
    /// cannot be added (each add says why).
    reader: Result<IsolatedReader, ReaderMissing>,
}

impl DocumentService {
    /// Opens the library and its kept K/V in `config.dir`, creating them if missing; files are
    /// read by children that may use `process`.
    pub fn open(config: &DocumentsConfig, process: ProcessLimits) -> Result<Self, OpenError> {
        let library = Arc::new(Library::open(&config.dir.join("library.redb"))?);
        let kv_dir = config.dir.join("kv");
        let kv = DocumentKvCache::open(library.clone(), &kv_dir, config.kv_quota_bytes, &config.model_key)
            .map_err(|source| OpenError::KvFolder { path: kv_dir.clone(), source })?;
        let reader = IsolatedReader::locate(process);
        if let Err(why) = &reader {
            tracing::error!(%why, "documents cannot be added");
        }
        let limits = Limits { max_file_bytes: config.max_file_bytes, ..Limits::default() };
        Ok(Self { library, kv, limits, reader })
    }

    /// Adds the file `name` with `bytes` (read in the sandboxed reader), with its tokens as
    /// `runner` counts them; the same bytes added before give that document back.
    pub fn add(&self, runner: &Runner<'_>, name: &str, bytes: &[u8]) -> Result<AddedDocument, AddError> {
        let reader = self.reader.as_ref().map_err(|why| AddError::ReaderMissing(why.to_string()))?;
        let doc = reader.read(name, bytes, &self.limits)?;
        // The plan counts the document's tokens: they are stored with it, not counted again.
        let plan = plan_summary(&doc, runner.context_tokens, &|s| runner.count_tokens(s))
            .map_err(AddError::CannotSummarize)?;
        let added = self.library.add(&doc, bytes)?;
        let entry = self.library.update(&added.entry.id, |e| e.tokens = Some(plan.tokens))?.unwrap_or(added.entry);
        Ok(AddedDocument { entry, created: added.created, document: doc })
    }

    /// [`Self::add`] for the file at `path`, its size checked before it is read.
    pub fn add_file(&self, runner: &Runner<'_>, path: &Path) -> Result<AddedDocument, AddError> {
        let (name, bytes) = file_bytes(path, &self.limits)?;
        self.add(runner, &name, &bytes)
    }

    /// The document `id` and its text; `None`: there is none.
    pub fn document(&self, id: &str) -> Result<Option<Document>, StoreError> {
        Ok(self.library.document(id)?.map(|(_, doc)| doc))
    }

    /// Summarizes the document `id` (`doc`) through `runner` for the model `model_key` names,
    /// resuming from the steps kept for it and keeping each new one, and stores its points.
    pub fn summarize(
        &self,
        runner: &Runner<'_>,
        id: &str,
        doc: &Document,
        model_key: &str,
        cancel: &CancelFlag,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<DocumentSummary, SummaryError> {
        let mut checkpoints = LibraryCheckpoints { library: &self.library, id, model_key };
        let summary = summarize(runner, doc, id, &mut checkpoints, cancel, on_progress)?;
        // The summary is the user's either way: a library that cannot store it is logged, as a
        // checkpoint that cannot be kept is.
        if let Err(e) = self.library.finish_summary(id, summary.points.clone(), summary.plan.tokens) {
            tracing::error!(error = %e, document = id, "cannot store a summary in the library");
        }
        Ok(summary)
    }

    /// The request for `messages` about the documents `ids` (in order), through `runner`; each
    /// is marked used.
    pub fn question(
        &self,
        runner: &Runner<'_>,
        ids: &[String],
        messages: &[ChatMessage],
    ) -> Result<Question, AskError> {
        check_ids(ids)?;
        let mut documents = Vec::with_capacity(ids.len());
        for (index, id) in ids.iter().enumerate() {
            let doc = self.document(id)?.ok_or_else(|| AskError::Unknown { index, id: id.clone() })?;
            documents.push((id.clone(), doc));
        }
        let asked = questions::question(runner, &documents, messages)?;
        // Which documents were used last orders the list; a question is not refused for it.
        for id in ids {
            if let Err(e) = self.library.update(id, |e| e.used_s = crate::library::now_s()) {
                tracing::warn!(error = %e, document = id, "cannot mark a document used");
            }
        }
        Ok(asked)
    }

    /// Forgets the document `id` with its kept K/V: the K/V files removed, or `None` when there
    /// is no such document.
    pub fn remove(&self, id: &str) -> Result<Option<usize>, StoreError> {
        Ok(self.library.remove(id)?.then(|| self.kv.forget_document(id)))
    }
}

/// Refuses, before any document is loaded, more than [`MAX_DOCUMENTS_PER_QUESTION`] ids or an
/// id named twice.
pub fn check_ids(ids: &[String]) -> Result<(), AskError> {
    if ids.len() > MAX_DOCUMENTS_PER_QUESTION {
        return Err(AskError::TooMany(ids.len()));
    }
    match ids.iter().enumerate().find(|(i, id)| ids[..*i].contains(id)) {
        Some((index, id)) => Err(AskError::Twice { index, id: id.clone() }),
        None => Ok(()),
    }
}
