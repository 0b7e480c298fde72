//! The engine's error type. Every failure a user can cause (a bad model file, a prompt that does
//! not fit) is a variant with a message that says what to do about it.

use std::io::ErrorKind;
use std::ops::Range;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read model file {path}: {source}")]
    ModelIo { path: PathBuf, source: std::io::Error },

    #[error("{path} is not a usable model file: {reason}")]
    BadModelFile { path: PathBuf, reason: String },

    #[error(
        "unsupported model architecture '{0}' (Hillside runs {supported}); to use this model, serve it with \
         another engine (llama.cpp's llama-server, vLLM) and point Hillside at it with \
         `--engine openai:http://HOST:PORT/v1`",
        supported = crate::model::config::Architecture::supported_names()
    )]
    UnsupportedArchitecture(String),

    #[error("model is missing tensor '{0}'")]
    MissingTensor(String),

    #[error("tensor '{name}' has shape {actual:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, actual: Vec<usize> },

    #[error("model metadata: {0}")]
    Metadata(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    ChatTemplate(String),

    #[error(
        "the prompt is {prompt_tokens} tokens but the context holds {context_tokens}; \
         shorten it (or start a new conversation)"
    )]
    ContextOverflow { prompt_tokens: usize, context_tokens: usize },

    #[error("invalid generation parameter: {0}")]
    InvalidParameter(String),

    #[error("KV cache: {0}")]
    Kv(#[from] KvMisuse),

    /// Rolling a sequence back after a failed step lost tokens it held (their cold pages could
    /// not be read back): the sequence cannot go on where it was.
    #[error("KV cache: {lost} of the sequence's {held} tokens could not be read back")]
    TokensLost { lost: usize, held: usize },

    /// The cold pool's file failed. The message names no path, since it can reach an HTTP
    /// client; the log line written where it happened does.
    #[error("cold pool: {what}: {source}{}", storage_hint(source.kind()))]
    ColdIo { what: String, source: std::io::Error },

    #[error("cold pool block damaged: layer {layer}, KV head {head}, tokens {}..{} fail their checksum", tokens.start, tokens.end)]
    ColdBlockDamaged { layer: usize, head: usize, tokens: Range<usize> },

    /// A saved prefix's K/V that cannot be used (damaged, or written for something else).
    #[error("saved K/V: {0}")]
    KvSnapshot(String),

    /// A bug: a broken invariant or a panic, caught before it could take more than one
    /// sequence down.
    #[error("internal error (a bug; please report it): {0}")]
    Internal(String),

    #[error("SmartSSD: {0}")]
    Xrt(#[from] crate::score::xrt::XrtError),

    #[error("compute device: {0}")]
    Device(String),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// A KV store asked for what it cannot give: a caller that broke the store's contract.
#[derive(Debug, thiserror::Error)]
pub enum KvMisuse {
    #[error("{what}: {values} values are not whole rows of {row}")]
    RowsNotWhole { what: &'static str, values: usize, row: usize },
    #[error("append: {k} K and {v} V values are not whole rows of {row}")]
    KvRowsNotWhole { k: usize, v: usize, row: usize },
    #[error("the full store serves only whole-cache selections")]
    PartialSelection,
    #[error("layer {layer} keeps its inputs (X-cache), and {tokens} tokens' K/V came without them")]
    InputsMissing { layer: usize, tokens: usize },
    #[error("X-cache: a layer input of {0} values does not split into two halves")]
    OddInput(usize),
    #[error("a snapshot of {tokens} tokens from a store holding {held}")]
    SnapshotBeyondStore { tokens: usize, held: usize },
    #[error("a snapshot loads only into an empty store")]
    SnapshotIntoNonEmpty,
    #[error("the store holds no whole prefix of {tokens} tokens to keep ({in_view} tokens in view)")]
    NoWholePrefix { tokens: usize, in_view: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether more disk space would have avoided it.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, Error::ColdIo { source, .. } if is_disk_full(source.kind()))
    }
}

/// Whether an I/O error of this kind means the disk (or the user's share of it) is full: what
/// every store maps to "free space" for the user.
pub fn is_disk_full(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge)
}

/// What a user can do about an I/O error of the cold pool.
fn storage_hint(kind: ErrorKind) -> &'static str {
    match kind {
        k if is_disk_full(k) => " (the disk is full; free space or choose another cold-pool directory)",
        ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => " (choose a writable cold-pool directory)",
        _ => "",
    }
}
