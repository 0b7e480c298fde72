//! What the server asks of the machine's models: the catalogue with what is installed and what
//! would fit, loading one, fetching one, deleting one, importing a file. The registry, the
//! models folder and the fit estimate live in `hillside-common`, which hands the server its
//! [`ModelShelf`]; a server started without one (on a remote engine, or in a test) serves the
//! model it was started with and nothing else.

use hillside_engine::Engine;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use utoipa::ToSchema;

pub trait ModelShelf: Send + Sync {
    /// Every model: the installed ones, then those a pull would fetch, each with its fit at
    /// `context_tokens` (each model's own length where that is shorter).
    fn catalogue(&self, context_tokens: usize) -> Vec<ShelfModel>;

    /// The names of the installed models.
    fn installed(&self) -> Vec<String>;

    /// Loads the installed model `name`, refusing one that would not fit beside what this
    /// process holds now. Slow: seconds to minutes.
    fn load(&self, name: &str) -> Result<LoadedModel, ShelfError>;

    /// Refuses at once what a pull could never fetch: a name outside the catalogue, a repository
    /// without its file.
    fn check_pull(&self, what: &PullRequest) -> Result<(), ShelfError>;

    /// Fetches `what` (a catalogue name, or a Hugging Face repo with its file), resuming a part
    /// an earlier pull left; `cancel` stops it between chunks, keeping the part.
    fn pull(
        &self,
        what: &PullRequest,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<(), ShelfError>;

    /// Deletes the installed model `name` from the models folder (and any unfinished download
    /// of it).
    fn remove(&self, name: &str) -> Result<(), ShelfError>;

    /// The folder models are installed in (an upload is gathered there before its import).
    fn models_dir(&self) -> std::path::PathBuf;

    /// Bytes that may still be written in the models folder; `None` if unknown.
    fn disk_free_bytes(&self) -> Option<u64>;

    /// Installs the GGUF file at `path` as `file_name` in the models folder, checking it is one
    /// first: moved there with `take` (an upload gathered in the folder), else copied. Returns
    /// the name it is installed under.
    fn import(&self, path: &Path, file_name: &str, take: bool) -> Result<String, ShelfError>;
}

/// A model ready to serve.
pub struct LoadedModel {
    pub engine: Arc<Engine>,
    /// The id clients name it by, and other names accepted for it.
    pub model_id: String,
    pub model_aliases: Vec<String>,
    /// Names it in the library's kept summaries and K/V.
    pub model_key: String,
}

/// What to fetch: a catalogue name, or a file of a Hugging Face repository.
#[derive(Debug, Clone, serde::Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// A catalogue name (see `GET /v1/hillside/models`), or a Hugging Face repository
    /// (`org/name`) with `file`.
    #[schema(min_length = 1, max_length = 200)]
    pub model: String,
    /// The file of the repository to fetch (a repository only).
    #[schema(max_length = 500)]
    pub file: Option<String>,
    /// The file's SHA-256 in hex (a repository only; else the hub's own is used).
    #[schema(max_length = 64)]
    pub sha256: Option<String>,
}

impl PullRequest {
    /// The name the download is known by while it runs: the model, or the repository's file.
    pub fn name(&self) -> String {
        match &self.file {
            Some(file) => {
                Path::new(file).file_stem().map_or_else(|| file.clone(), |s| s.to_string_lossy().into_owned())
            }
            None => self.model.clone(),
        }
    }
}

/// How far a pull is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PullProgress {
    pub done_bytes: u64,
    /// `None` until the server says (a PyPI package's size is never said).
    pub total_bytes: Option<u64>,
    pub bytes_per_s: f64,
}

/// A model of the catalogue, or a file in the models folder.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ShelfModel {
    /// What requests and the CLI name it by.
    pub name: String,
    pub description: Option<String>,
    /// The architecture its file names (`llama`, `qwen3moe`, `gemma3` …).
    pub family: Option<String>,
    /// The quantization the file mostly holds (`Q4_K_M`, `MXFP4` …).
    pub format: Option<String>,
    /// The file's size: exact once installed, the catalogue's before.
    pub size_bytes: u64,
    /// The context it was trained for.
    pub context_tokens: Option<usize>,
    pub licence: Option<String>,
    /// Where it comes from: `pypi`, `huggingface:org/name`, or `file` (imported).
    pub source: String,
    /// Where it is, once installed.
    pub path: Option<String>,
    pub installed: bool,
    /// The model a start without `--model` loads.
    pub default: bool,
    /// Whether it fits this machine at the context asked; `None` where the file cannot be read.
    pub fit: Option<FitReport>,
}

/// Will a model fit: the verdict, the sentence that says it with its numbers, and the numbers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FitReport {
    /// `fits`, `fits_tiered` or `does_not_fit`.
    pub verdict: String,
    pub sentence: String,
    pub context_tokens: usize,
    pub weights_bytes: u64,
    /// The full cache's K/V at the whole context.
    pub kv_bytes: u64,
    pub memory_free_bytes: u64,
    /// With the tiered store: its DRAM budget and the cold pool on disk.
    pub hot_bytes: Option<u64>,
    pub cold_bytes: Option<u64>,
}

/// Why the shelf refused, as the status it answers with.
#[derive(Debug, thiserror::Error)]
pub enum ShelfError {
    /// No such model (404).
    #[error("{0}")]
    NotFound(String),
    /// Not possible as asked: not installed, would not fit, not a GGUF, already there (400).
    #[error("{0}")]
    Refused(String),
    /// A download that stopped: offline, a wrong hash, a full disk, cancelled (502 where the
    /// network failed, else 400; the message says which and what was kept).
    #[error("{message}")]
    Download { message: String, network: bool },
    /// The file is there but would not load (400: the old model keeps serving).
    #[error("{0}")]
    Load(String),
}
