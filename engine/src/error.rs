//! The engine's error type. Every failure a user can cause (a bad model file, a prompt that does
//! not fit) is a variant with a message that says what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read model file {path}: {source}")]
    ModelIo { path: PathBuf, source: std::io::Error },

    #[error("{path} is not a usable model file: {reason}")]
    BadModelFile { path: PathBuf, reason: String },

    #[error("unsupported model architecture '{0}' (supported: llama, qwen2)")]
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
    Kv(String),

    #[error("SmartSSD: {0}")]
    Xrt(String),

    #[error("compute device: {0}")]
    Device(String),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
