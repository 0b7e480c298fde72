//! Hillside's inference engine: a llama-family model on the CPU with its own kernels, a KV cache
//! behind one trait, tokenization, chat templates, sampling and streaming generation.
//! No HTTP and no UI live here.

#[macro_use]
mod names;

pub mod aligned;
pub mod device;
pub mod error;
pub mod generate;
pub mod headroom;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod private_files;
pub mod sampling;
pub mod scheduler;
pub mod score;
pub mod text;
pub mod trace;

pub use error::{Error, KvMisuse, Result};
pub use generate::{
    feed_batch, generate, CancelFlag, Event, FinishReason, GenerateParams, Generation, GenerationStream, Next,
    Sequence, Summary, TokenLogprob,
};
pub use model::{BatchItem, Logits, Model};
pub use sampling::SamplingParams;
pub use text::chat::{ChatMessage, ChatTemplate};
pub use text::reasoning::ReasoningFormat;
pub use text::tokenizer::Tokenizer;

use kv::stores::sliding::SlidingWindowLayers;
use std::path::Path;

/// A loaded model with its tokenizer and chat template.
pub struct Engine {
    model: Model,
    tokenizer: Tokenizer,
    chat_template: ChatTemplate,
}

impl Engine {
    /// Loads a GGUF file, or a Hugging Face checkpoint (a directory, or a `.safetensors` file
    /// with `config.json` and `tokenizer.json` beside it).
    pub fn load(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(Error::ModelIo { path: path.to_path_buf(), source: std::io::ErrorKind::NotFound.into() });
        }
        let is_safetensors = path.is_dir() || path.extension().is_some_and(|e| e == "safetensors");
        if is_safetensors {
            Self::load_checkpoint(path)
        } else {
            Self::load_gguf(path)
        }
    }

    fn load_gguf(path: &Path) -> Result<Self> {
        let mut file = model::gguf::open(path)?;
        let metadata = file.metadata();
        let tokenizer = Tokenizer::from_gguf(metadata)?;
        let template = metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok());
        let name_of = |key: &str| {
            metadata.get(key).and_then(|v| v.to_u32().ok()).and_then(|id| tokenizer.token_text(id)).unwrap_or_default()
        };
        let fallback = text::chat::fallback_template(tokenizer.token_id("<start_of_turn>").is_some());
        let chat_template = ChatTemplate::new(
            Some(template.map_or(fallback, String::as_str)),
            &name_of("tokenizer.ggml.bos_token_id"),
            &name_of("tokenizer.ggml.eos_token_id"),
        )?;
        file.drop_vocabulary();
        let loaded = file.load_weights()?;
        Ok(Self { model: Model::new(loaded.config, loaded.weights), tokenizer, chat_template })
    }

    fn load_checkpoint(path: &Path) -> Result<Self> {
        let (config, weights) = model::safetensors::load(path)?;
        let dir = model::safetensors::checkpoint_dir(path);
        let read_json = |name: &str| -> Option<serde_json::Value> {
            std::fs::read_to_string(dir.join(name)).ok().and_then(|t| serde_json::from_str(&t).ok())
        };
        let hf_config = read_json("config.json").unwrap_or_default();
        let tok_config = read_json("tokenizer_config.json").unwrap_or_default();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            match v {
                serde_json::Value::Number(n) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
                serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64()).map(|n| n as u32).collect(),
                _ => Vec::new(),
            }
        };
        let eos = ids(&hf_config["eos_token_id"]);
        let bos = ids(&hf_config["bos_token_id"]).first().copied();
        let add_bos = tok_config["add_bos_token"].as_bool().unwrap_or(false);
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"), &eos, bos, add_bos)?;
        let token_str = |key: &str| match &tok_config[key] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let chat_template =
            ChatTemplate::new(tok_config["chat_template"].as_str(), &token_str("bos_token"), &token_str("eos_token"))?;
        Ok(Self { model: Model::new(config, weights), tokenizer, chat_template })
    }

    /// Where attention runs: the CPU kernel, or a GPU with the `cuda` feature.
    pub fn set_attention(&mut self, attention: device::Attention) {
        self.model.set_attention(attention);
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A new, empty sequence with the whole cache in memory, for up to `max_tokens` tokens
    /// (the model's context when `None`).
    pub fn new_sequence(&self, max_tokens: Option<usize>) -> Sequence {
        self.new_sequence_with(&kv::KvConfig::default(), max_tokens).expect("the full store needs no disk")
    }

    /// A new, empty sequence in the store `kv` describes.
    pub fn new_sequence_with(&self, kv: &kv::KvConfig, max_tokens: Option<usize>) -> Result<Sequence> {
        let max = max_tokens.unwrap_or(self.model.config.context_tokens);
        let store = SlidingWindowLayers::around(
            self.model.kv_shape(max),
            &self.model.config.layer_windows(),
            Some(self.model.kv_from_input()),
            |shape, rebuild| kv.build(shape, rebuild),
        )?;
        Ok(Sequence { kv: store, tokens: Vec::new() })
    }

    /// The prompt tokens for a chat, with the assistant's turn opened. Control tokens come only
    /// from the template: a message's `<|im_end|>` is its characters.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.tokenizer.encode_prompt(&self.chat_text(messages)?)
    }

    /// The prompt text for a chat (the model's template applied), with the assistant's turn
    /// opened and the messages' control strings marked: [`Tokenizer::encode_prompt`] reads it.
    pub fn chat_text(&self, messages: &[ChatMessage]) -> Result<String> {
        let marked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: self.tokenizer.mark_controls(&m.content).into_owned(),
            })
            .collect();
        self.chat_template.render(&marked, true)
    }
}
