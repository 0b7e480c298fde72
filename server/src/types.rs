//! The wire types of the OpenAI-compatible API (the subset Hillside serves), from which the
//! OpenAPI document is generated. Requests ignore fields they do not know.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Sampling and length fields shared by chat and text completions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SamplingFields {
    /// The model to use (optional: the loaded model).
    pub model: Option<String>,
    #[schema(minimum = 1)]
    pub max_tokens: Option<usize>,
    // The bounds are the engine's (SamplingParams::validate).
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    /// Strings that end the completion; they are never part of the output.
    pub stop: Option<Stop>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f32>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f32>,
    /// Choices to generate; only 1 is supported.
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<usize>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// llama.cpp-style extras.
    pub top_k: Option<usize>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f32>,
    #[schema(exclusive_minimum = 0.0)]
    pub repeat_penalty: Option<f32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct StreamOptions {
    /// Send a last chunk with token usage (and `usage: null` in the others).
    pub include_usage: bool,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    #[schema(min_items = 1)]
    pub messages: Vec<RequestMessage>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Newer name of `max_tokens`.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token with `logprobs` (0–20).
    #[serde(default)]
    #[schema(maximum = 20)]
    pub top_logprobs: Option<usize>,
    /// Hillside's extension: ask about documents of the library.
    #[serde(default)]
    pub hillside: Option<ChatExtension>,
}

/// `"hillside": {"documents": [id, …]}` in a chat request: the documents (ids from
/// `/v1/hillside/documents`) are put before the first user message, so that the model answers
/// about them. Their K/V, kept since their summary or an earlier question, is reused: only the
/// conversation is prefilled (see `usage.prompt_tokens_details.cached_tokens`). A document
/// longer than the context is represented by its chunk that best matches the last user
/// message (a lexical match: the message's rarer words).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatExtension {
    pub documents: Vec<String>,
}

/// What of each document a reply read.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatExtensionReply {
    pub documents: Vec<DocumentExcerpt>,
    /// Tokens of the prompt's document part (the prefix whose K/V is kept); those of them not
    /// counted in `usage.prompt_tokens_details.cached_tokens` were read (prefilled) again.
    pub document_tokens: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DocumentExcerpt {
    pub id: String,
    /// Bytes of the document's text the prompt held.
    pub start: usize,
    pub end: usize,
    /// The chunk (from 1, of `chunks`) chosen for the question; absent when the whole text was read.
    pub chunk: Option<usize>,
    pub chunks: usize,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct RequestMessage {
    /// system, developer (treated as system), user or assistant.
    #[schema(pattern = "^(system|developer|user|assistant)$")]
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Alternatives per token to report (0–5); absent: no log-probabilities.
    #[serde(default)]
    #[schema(maximum = 5)]
    pub logprobs: Option<usize>,
    /// Read control-token strings in a text prompt (`<|im_start|>`) as the control tokens, for a
    /// caller that writes the chat template itself (llama.cpp's `parse_special`); by default a
    /// text prompt is plain text.
    #[serde(default)]
    pub parse_special: bool,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose K/V came from an earlier request (the prefix cache).
    pub cached_tokens: usize,
}

impl Usage {
    pub fn of(summary: &hillside_engine::Summary) -> Self {
        Self {
            prompt_tokens: summary.prompt_tokens,
            completion_tokens: summary.completion_tokens,
            total_tokens: summary.prompt_tokens + summary.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: summary.reused_tokens },
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// With the `hillside.documents` extension: what of each document was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hillside: Option<ChatExtensionReply>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    /// stop or length.
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseMessage {
    pub role: &'static str,
    pub content: String,
    /// The model's reasoning before its answer, for models that write one (as llama.cpp and
    /// vLLM return it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Present (null until the last chunk) only when `stream_options.include_usage` asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// On the chunk with the finish reason, when the request named documents: what of them it read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hillside: Option<ChatExtensionReply>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    /// Always in a full reply; in a stream only in the last chunk, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The legacy completions format: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    pub model: String,
    pub live_sequences: usize,
    pub queued_requests: usize,
}
