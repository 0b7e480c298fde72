//! `POST /v1/chat/completions`: messages through the model's chat template, one choice,
//! streamed as `chat.completion.chunk` events or returned whole.

use crate::error::{ApiError, GenerationErrors};
use crate::extract::JsonBody;
use crate::routes::documents;
use crate::run::{self, Collected, Piece};
use crate::types::*;
use crate::{unix_now_s, App};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hillside_engine::{ChatMessage, TokenLogprob};
use std::sync::Arc;

/// OpenAI's limit on alternatives per token.
const MAX_TOP_LOGPROBS: usize = 20;

#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, server-sent `ChatCompletionChunk`s ending in `[DONE]`",
            content((ChatCompletion = "application/json"), (ChatCompletionChunk = "text/event-stream"))),
        GenerationErrors,
    )
)]
pub async fn chat_completions(
    State(app): State<Arc<App>>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let messages = to_messages(&req.messages)?;
    let top_logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::bad_request(format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"))
                .with_param("top_logprobs"))
        }
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true").with_param("top_logprobs"))
        }
        (true, n) => Some(n.unwrap_or(0)),
        (false, None) => None,
    };
    let documents = req.hillside.as_ref().map(|h| h.documents.clone()).unwrap_or_default();
    documents::check_ids(&documents)?;
    let max_tokens = req.max_completion_tokens.or(req.sampling.max_tokens);
    let serving = app.serving();
    run::check_logprobs(&serving, top_logprobs.is_some())?;
    let (request, read) = if documents.is_empty() {
        let request = run::blocking(&app, &serving, move |_, serving| {
            serving.front.chat_request(messages).map_err(ApiError::from)
        })
        .await?;
        (request, None)
    } else {
        let (request, read) =
            run::blocking(&app, &serving, move |app, serving| documents::question(app, serving, &documents, &messages))
                .await?;
        (request, Some(read))
    };
    let running = run::submit(&app, &serving, request, |prompt_tokens| {
        run::params(&app, &serving, &req.sampling, max_tokens, prompt_tokens, top_logprobs)
    })
    .await?;
    let head = Head { id: app.response_id("chatcmpl"), created: unix_now_s(), model: serving.model_id.clone() };
    let with_logprobs = top_logprobs.is_some();
    if !req.sampling.stream.unwrap_or(false) {
        let Collected { text, reasoning, logprobs, summary } = running.collect().await?;
        return Ok(Json(ChatCompletion {
            id: head.id,
            object: "chat.completion",
            created: head.created,
            model: head.model,
            choices: vec![ChatChoice {
                index: 0,
                message: ResponseMessage { role: "assistant", content: text, reasoning_content: reasoning },
                logprobs: with_logprobs.then(|| chat_logprobs(&logprobs)),
                finish_reason: run::finish_reason(summary.finish_reason),
            }],
            usage: Usage::of(&summary),
            hillside: read,
        })
        .into_response());
    }
    let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let mut role_sent = false;
    let mut read = read;
    let render = move |piece: Piece| {
        let mut chunks = Vec::new();
        if !role_sent {
            role_sent = true;
            chunks.push(head.chunk(
                Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() },
                None,
                None,
                include_usage,
            ));
        }
        let logprobs = |lp: &[TokenLogprob]| with_logprobs.then(|| chat_logprobs(lp));
        match piece {
            Piece::Text { text, logprobs: lp } => chunks.push(head.chunk(
                Delta { content: Some(text), ..Delta::default() },
                logprobs(&lp),
                None,
                include_usage,
            )),
            Piece::Reasoning(text) => chunks.push(head.chunk(
                Delta { reasoning_content: Some(text), ..Delta::default() },
                None,
                None,
                include_usage,
            )),
            Piece::Done { summary, logprobs: lp } => {
                if !lp.is_empty() && with_logprobs {
                    chunks.push(head.chunk(
                        Delta { content: Some(String::new()), ..Delta::default() },
                        logprobs(&lp),
                        None,
                        include_usage,
                    ));
                }
                let mut last =
                    head.chunk(Delta::default(), None, Some(run::finish_reason(summary.finish_reason)), include_usage);
                last.hillside = read.take();
                chunks.push(last);
                if include_usage {
                    let mut last = head.chunk(Delta::default(), None, None, true);
                    last.choices.clear();
                    last.usage = Some(Some(Usage::of(&summary)));
                    chunks.push(last);
                }
            }
        }
        chunks.into_iter().map(|c| serde_json::to_value(c).unwrap_or_default()).collect()
    };
    Ok(running.into_sse(render).into_response())
}

/// What every chunk of one response repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
}

impl Head {
    fn chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<&'static str>,
        include_usage: bool,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChunkChoice { index: 0, delta, logprobs, finish_reason }],
            usage: include_usage.then_some(None),
            hillside: None,
        }
    }
}

/// The request's messages as the chat template takes them.
fn to_messages(messages: &[RequestMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must hold at least one message").with_param("messages"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::bad_request(format!(
                        "role '{other}' is not supported (system, developer, user, assistant)"
                    ))
                    .with_param(format!("messages[{i}].role")))
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "content part of type '{kind}' is not supported: this model reads text only"
                                ))
                                .with_param(format!("messages[{i}].content")))
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

fn chat_logprobs(tokens: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| ChatTokenLogprob {
                token: t.text.clone(),
                logprob: t.logprob,
                bytes: t.text.as_bytes().to_vec(),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(_, text, lp)| TopLogprob {
                        token: text.clone(),
                        logprob: *lp,
                        bytes: text.as_bytes().to_vec(),
                    })
                    .collect(),
            })
            .collect(),
    }
}
