//! Hillside on an existing OpenAI-compatible engine (vLLM, llama.cpp's server, Ollama) when one
//! machine is not enough: the documents, conversations and UI stay local, the model runs there.
//!
//! [`RemoteEngine`] is a blocking client, like the worker threads that call it: it lists the
//! remote's models, learns its context, counts tokens with the remote's own tokenizer where it
//! offers one, and streams chat and text completions, retrying 429 and 503 as `Retry-After` asks. The
//! API key goes in the `Authorization` header and nowhere else (no log, no `Debug`).

mod endpoint;
pub mod events;

pub use endpoint::{Endpoint, EndpointError};
pub use events::Usage;

use events::{excerpt, Chunk};
use hillside_engine::{ChatMessage, FinishReason, GenerateParams, Summary};
use serde::Deserialize;
use std::io::BufReader;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How Hillside reaches a remote engine (the config file's `[remote]`, or the flags).
#[derive(Clone, Default)]
pub struct RemoteConfig {
    /// The OpenAI API's root, with or without its `/v1`.
    pub url: String,
    pub api_key: Option<String>,
    /// Which of the remote's models to use (default: the first it lists).
    pub model: Option<String>,
    /// Allow plain HTTP to another machine.
    pub allow_insecure: bool,
    /// Each request's context in tokens (default: what the remote says, else 4,096).
    pub context_tokens: Option<usize>,
    /// Requests a summary keeps in flight at once (the remote batches them).
    pub concurrency: usize,
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .field("model", &self.model)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("the engine at {url} cannot be reached ({why}); is it running?")]
    Unreachable { url: String, why: String },
    #[error("the engine at {url} refused the request (HTTP {status}): {body}")]
    Refused { url: String, status: u16, body: String },
    #[error("the engine at {url} stayed busy (HTTP {status}) through {tries} tries")]
    Busy { url: String, status: u16, tries: usize },
    #[error("the engine at {url} answered something other than OpenAI's API: {why}")]
    Garbage { url: String, why: String },
    #[error("the engine at {url} serves no model named '{model}' (it has: {available})")]
    UnknownModel { url: String, model: String, available: String },
    #[error("the engine at {url} lists no models")]
    NoModels { url: String },
}

/// A model the remote serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteModel {
    pub id: String,
    pub owned_by: Option<String>,
    /// The context vLLM lists for it.
    pub max_model_len: Option<usize>,
}

/// One chat completion's text as it streams, with a way to stop it.
pub trait ReplySink {
    /// Takes a piece of the reply; `false` stops the request (the client went away).
    fn text(&mut self, text: &str) -> bool;

    /// Takes a piece of the model's reasoning, which the remote sends apart from the reply
    /// (left out unless the sink wants it); `false` stops the request.
    fn reasoning(&mut self, _text: &str) -> bool {
        true
    }
}

impl<F: FnMut(&str) -> bool> ReplySink for F {
    fn text(&mut self, text: &str) -> bool {
        self(text)
    }
}

/// A connected remote engine.
pub struct RemoteEngine {
    endpoint: Endpoint,
    api_key: Option<String>,
    agent: ureq::Agent,
    model: String,
    models: Vec<RemoteModel>,
    context_tokens: usize,
    concurrency: usize,
    tokenizer: AtomicU8,
}

/// Whether the remote counts tokens for us (`/tokenize`).
const TOKENIZER_UNKNOWN: u8 = 0;
const TOKENIZER_REMOTE: u8 = 1;
const TOKENIZER_NONE: u8 = 2;

/// Tries for a request the remote answers 429 or 503, and the longest wait between two.
const MAX_TRIES: usize = 6;
const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);
/// The context assumed where neither the user nor the remote says.
const DEFAULT_CONTEXT_TOKENS: usize = 4096;
/// Bytes of text per token assumed where the remote cannot count: fewer than most tokenizers
/// take, so a document is cut into chunks that fit.
const BYTES_PER_TOKEN: usize = 3;

impl RemoteEngine {
    /// Checks the address, lists the remote's models and picks one, and learns its context.
    pub fn connect(config: &RemoteConfig) -> Result<Self, RemoteError> {
        let endpoint = Endpoint::parse(&config.url, config.allow_insecure)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            // A long prompt may take the remote minutes before its first byte; this only
            // catches one that went silent.
            .timeout_recv_response(Some(Duration::from_secs(600)))
            .build()
            .into();
        let mut engine = Self {
            endpoint,
            api_key: config.api_key.clone().filter(|k| !k.is_empty()),
            agent,
            model: String::new(),
            models: Vec::new(),
            context_tokens: 0,
            concurrency: config.concurrency.max(1),
            tokenizer: AtomicU8::new(TOKENIZER_UNKNOWN),
        };
        engine.models = engine.list_models()?;
        engine.model = match &config.model {
            Some(m) if engine.models.iter().any(|r| &r.id == m) => m.clone(),
            Some(m) => {
                let available = engine.models.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ");
                return Err(RemoteError::UnknownModel {
                    url: engine.endpoint.api.clone(),
                    model: m.clone(),
                    available,
                });
            }
            None => engine
                .models
                .first()
                .ok_or_else(|| RemoteError::NoModels { url: engine.endpoint.api.clone() })?
                .id
                .clone(),
        };
        engine.context_tokens =
            config.context_tokens.or_else(|| engine.discover_context()).unwrap_or(DEFAULT_CONTEXT_TOKENS);
        tracing::info!(url = %engine.endpoint.api, model = %engine.model, context_tokens = engine.context_tokens, "remote engine connected");
        Ok(engine)
    }

    pub fn url(&self) -> &str {
        &self.endpoint.api
    }

    /// The model requests go to.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Every model the remote listed when it connected.
    pub fn models(&self) -> &[RemoteModel] {
        &self.models
    }

    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    /// Requests a summary keeps in flight at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The tokens `text` takes for the remote's model: counted by the remote where it can
    /// (llama.cpp's and vLLM's `/tokenize`), else estimated on the high side.
    pub fn count_tokens(&self, text: &str) -> usize {
        if self.tokenizer.load(Ordering::Relaxed) != TOKENIZER_NONE {
            match self.tokenize(text) {
                Some(n) => {
                    self.tokenizer.store(TOKENIZER_REMOTE, Ordering::Relaxed);
                    return n;
                }
                None if self.tokenizer.load(Ordering::Relaxed) == TOKENIZER_UNKNOWN => {
                    tracing::info!(url = %self.endpoint.root, "the remote engine does not count tokens: estimating them from the text's length");
                    self.tokenizer.store(TOKENIZER_NONE, Ordering::Relaxed);
                }
                None => {}
            }
        }
        text.len().div_ceil(BYTES_PER_TOKEN)
    }

    /// Streams the reply to `messages` into `sink`; the returned summary has the remote's
    /// token counts (and its cached prompt tokens, where it reports them) and the time to the
    /// first token as `prefill_ms`. 429s and 503s before the reply starts are retried.
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        params: &GenerateParams,
        sink: &mut dyn ReplySink,
    ) -> Result<Summary, RemoteError> {
        let mut body = self.body(params);
        body["messages"] = serde_json::to_value(messages).expect("messages serialize");
        self.stream("chat/completions", &body, sink)
    }

    /// The same for a raw `prompt` continued without a chat template (`/v1/completions`).
    pub fn complete(
        &self,
        prompt: &str,
        params: &GenerateParams,
        sink: &mut dyn ReplySink,
    ) -> Result<Summary, RemoteError> {
        let mut body = self.body(params);
        body["prompt"] = prompt.into();
        self.stream("completions", &body, sink)
    }

    /// Whether the remote answers now (it lists its models).
    pub fn reachable(&self) -> Result<(), RemoteError> {
        self.list_models().map(|_| ())
    }

    fn stream(&self, path: &str, body: &serde_json::Value, sink: &mut dyn ReplySink) -> Result<Summary, RemoteError> {
        let started = Instant::now();
        let response = self.post(path, body)?;
        let mut reader = BufReader::new(response.into_body().into_reader());
        let (mut usage, mut finish, mut first_text) = (None, None, None);
        let mut pieces = 0;
        loop {
            let chunks = events::next(&mut reader).map_err(|why| self.broken(why))?;
            let Some(chunks) = chunks else {
                return Err(self.broken("the stream ended before [DONE]".into()));
            };
            for chunk in chunks {
                match chunk {
                    Chunk::Text(text) => {
                        first_text.get_or_insert_with(|| started.elapsed());
                        pieces += 1;
                        if !sink.text(&text) {
                            // Dropping the reader closes the connection, which stops the remote.
                            return Ok(summary(usage, FinishReason::Cancelled, pieces, started, first_text));
                        }
                    }
                    Chunk::Reasoning(text) => {
                        first_text.get_or_insert_with(|| started.elapsed());
                        if !sink.reasoning(&text) {
                            return Ok(summary(usage, FinishReason::Cancelled, pieces, started, first_text));
                        }
                    }
                    Chunk::Finished(reason) => {
                        finish = Some(if reason == "length" { FinishReason::Length } else { FinishReason::Stop })
                    }
                    Chunk::Usage(u) => usage = Some(u),
                    Chunk::Nothing => {}
                    Chunk::Done => {
                        return Ok(summary(usage, finish.unwrap_or(FinishReason::Stop), pieces, started, first_text))
                    }
                }
            }
        }
    }

    /// A streamed request's fields for `params`, without the prompt.
    fn body(&self, params: &GenerateParams) -> serde_json::Value {
        let s = &params.sampling;
        let mut body = serde_json::json!({
            "model": self.model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": params.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        });
        let fields = body.as_object_mut().expect("an object");
        if !params.stop.is_empty() {
            fields.insert("stop".into(), params.stop.clone().into());
        }
        if let Some(seed) = s.seed {
            fields.insert("seed".into(), seed.into());
        }
        if s.presence_penalty != 0.0 {
            fields.insert("presence_penalty".into(), s.presence_penalty.into());
        }
        if s.frequency_penalty != 0.0 {
            fields.insert("frequency_penalty".into(), s.frequency_penalty.into());
        }
        // Beyond OpenAI's fields, sent only where they do something (OpenAI itself refuses
        // fields it does not know): llama.cpp's and vLLM's names.
        if s.repeat_penalty != 1.0 {
            fields.insert("repeat_penalty".into(), s.repeat_penalty.into());
            fields.insert("repetition_penalty".into(), s.repeat_penalty.into());
        }
        if s.top_k > 0 && s.temperature > 0.0 {
            fields.insert("top_k".into(), s.top_k.into());
        }
        if s.min_p > 0.0 && s.temperature > 0.0 {
            fields.insert("min_p".into(), s.min_p.into());
        }
        body
    }

    fn list_models(&self) -> Result<Vec<RemoteModel>, RemoteError> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<Entry>,
        }
        #[derive(Deserialize)]
        struct Entry {
            id: String,
            #[serde(default)]
            owned_by: Option<String>,
            #[serde(default)]
            max_model_len: Option<usize>,
        }
        let url = format!("{}/models", self.endpoint.api);
        let response = self.send(&url, None)?;
        let list: List = self.read_json(response)?;
        Ok(list
            .data
            .into_iter()
            .map(|e| RemoteModel { id: e.id, owned_by: e.owned_by, max_model_len: e.max_model_len })
            .collect())
    }

    /// The context the remote gives each request: llama.cpp's `/props` (its slots' `n_ctx`),
    /// else vLLM's `max_model_len` in the model list read at connect.
    fn discover_context(&self) -> Option<usize> {
        let props = format!("{}/props", self.endpoint.root);
        if let Ok(response) = self.send(&props, None) {
            if let Ok(v) = self.read_json::<serde_json::Value>(response) {
                if let Some(n) = v.pointer("/default_generation_settings/n_ctx").and_then(|n| n.as_u64()) {
                    return Some(n as usize);
                }
            }
        }
        self.models.iter().find(|m| m.id == self.model)?.max_model_len
    }

    /// The remote's count of `text`'s tokens, or `None` where it has no `/tokenize`.
    fn tokenize(&self, text: &str) -> Option<usize> {
        let url = format!("{}/tokenize", self.endpoint.root);
        // llama.cpp reads `content`, vLLM `prompt` (and answers `count`).
        let body = serde_json::json!({"model": self.model, "content": text, "prompt": text, "add_special": false});
        let answer: serde_json::Value = self.read_json(self.send(&url, Some(&body)).ok()?).ok()?;
        answer["count"].as_u64().map(|n| n as usize).or_else(|| answer["tokens"].as_array().map(Vec::len))
    }

    fn post(&self, path: &str, body: &serde_json::Value) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        self.send(&format!("{}/{path}", self.endpoint.api), Some(body))
    }

    /// GETs `url`, or POSTs `body` there; retries 429 and 503 as the remote asks.
    fn send(
        &self,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let auth = self.api_key.as_ref().map(|key| format!("Bearer {key}"));
        let mut status = 0;
        for attempt in 0..MAX_TRIES {
            let sent = match (body, &auth) {
                (Some(body), Some(auth)) => self.agent.post(url).header("Authorization", auth).send_json(body),
                (Some(body), None) => self.agent.post(url).send_json(body),
                (None, Some(auth)) => self.agent.get(url).header("Authorization", auth).call(),
                (None, None) => self.agent.get(url).call(),
            };
            let mut response =
                sent.map_err(|e| RemoteError::Unreachable { url: url.to_string(), why: e.to_string() })?;
            status = response.status().as_u16();
            match status {
                200..=299 => return Ok(response),
                429 | 503 if attempt + 1 < MAX_TRIES => {
                    let wait = retry_after(response.headers().get("retry-after").and_then(|v| v.to_str().ok()))
                        .unwrap_or(Duration::from_millis(500 << attempt))
                        .min(MAX_RETRY_WAIT);
                    tracing::info!(
                        url,
                        status,
                        wait_ms = wait.as_millis() as u64,
                        "the remote engine is busy: retrying"
                    );
                    std::thread::sleep(wait);
                }
                429 | 503 => break,
                _ => {
                    let body = response.body_mut().with_config().limit(64 * 1024).read_to_string().unwrap_or_default();
                    return Err(RemoteError::Refused { url: url.to_string(), status, body: excerpt(body.trim()) });
                }
            }
        }
        Err(RemoteError::Busy { url: url.to_string(), status, tries: MAX_TRIES })
    }

    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        mut response: ureq::http::Response<ureq::Body>,
    ) -> Result<T, RemoteError> {
        let text = response
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .map_err(|e| self.broken(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| self.broken(format!("{e}: {}", excerpt(&text))))
    }

    fn broken(&self, why: String) -> RemoteError {
        RemoteError::Garbage { url: self.endpoint.api.clone(), why }
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare from engines; it falls back to backoff).
fn retry_after(value: Option<&str>) -> Option<Duration> {
    value?.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

fn summary(
    usage: Option<Usage>,
    finish_reason: FinishReason,
    pieces: usize,
    started: Instant,
    first_text: Option<Duration>,
) -> Summary {
    let usage = usage.unwrap_or_default();
    let first_ms = first_text.unwrap_or_else(|| started.elapsed()).as_secs_f64() * 1e3;
    Summary {
        prompt_tokens: usage.prompt_tokens,
        reused_tokens: usage.cached_tokens().unwrap_or(0),
        // A remote that reports no usage: its pieces are about a token each.
        completion_tokens: if usage.completion_tokens > 0 { usage.completion_tokens } else { pieces },
        completion_ids: Vec::new(),
        finish_reason,
        prefill_ms: first_ms,
        decode_ms: started.elapsed().as_secs_f64() * 1e3 - first_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_refuses_nonsense() {
        assert_eq!(retry_after(Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(Some(" 0.5 ")), Some(Duration::from_millis(500)));
        assert_eq!(retry_after(Some("-1")), None);
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(None), None);
    }

    #[test]
    fn the_key_stays_out_of_debug_output() {
        let config = RemoteConfig {
            url: "https://gpu.example/v1".into(),
            api_key: Some("sk-secret".into()),
            ..RemoteConfig::default()
        };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
