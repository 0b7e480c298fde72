//! `POST /v1/completions`: a raw prompt (no chat template) continued, streamed as
//! `text_completion` chunks or returned whole, with the legacy log-probability format.

use crate::error::{ApiError, GenerationErrors};
use crate::extract::JsonBody;
use crate::run::{self, Piece};
use crate::types::*;
use crate::{unix_now_s, App};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hillside_engine::TokenLogprob;
use std::sync::Arc;

/// OpenAI's limit on alternatives per token in the legacy API.
const MAX_LOGPROBS: usize = 5;

#[utoipa::path(
    post,
    path = "/v1/completions",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, server-sent `Completion` chunks ending in `[DONE]`",
            content((Completion = "application/json"), (Completion = "text/event-stream"))),
        GenerationErrors,
    )
)]
pub async fn completions(
    State(app): State<Arc<App>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    if let Some(n) = req.logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(
            ApiError::bad_request(format!("logprobs must be at most {MAX_LOGPROBS} (got {n})")).with_param("logprobs")
        );
    }
    let text = match req.prompt {
        Prompt::Text(text) => Ok(text),
        Prompt::Texts(mut texts) if texts.len() == 1 => Ok(texts.remove(0)),
        Prompt::Texts(_) => {
            return Err(ApiError::bad_request("give one prompt per request (a list of several is not supported)")
                .with_param("prompt"))
        }
        Prompt::Tokens(ids) => Err(ids),
    };
    let serving = app.serving();
    run::check_logprobs(&serving, req.logprobs.is_some())?;
    let request = match text {
        Ok(text) => {
            let parse_special = req.parse_special;
            run::blocking(&app, &serving, move |_, serving| {
                serving.front.text_request(text, parse_special).map_err(ApiError::from)
            })
            .await?
        }
        Err(ids) => serving.front.token_request(ids).map_err(|e| ApiError::bad_request(e).with_param("prompt"))?,
    };
    let running = run::submit(&app, &serving, request, |prompt_tokens| {
        run::params(&app, &serving, &req.sampling, req.sampling.max_tokens, prompt_tokens, req.logprobs)
    })
    .await?;
    let (id, created, model) = (app.response_id("cmpl"), unix_now_s(), serving.model_id.clone());
    let with_logprobs = req.logprobs.is_some();
    let response = move |text: String,
                         logprobs: Option<CompletionLogprobs>,
                         finish_reason: Option<&'static str>,
                         usage: Option<Option<Usage>>| Completion {
        id: id.clone(),
        object: "text_completion",
        created,
        model: model.clone(),
        choices: vec![CompletionChoice { index: 0, text, logprobs, finish_reason }],
        usage,
    };
    if !req.sampling.stream.unwrap_or(false) {
        let run::Collected { text, logprobs, summary, .. } = running.collect().await?;
        let logprobs = with_logprobs.then(|| legacy_logprobs(&logprobs, 0));
        let usage = Usage::of(&summary);
        return Ok(Json(response(text, logprobs, Some(run::finish_reason(summary.finish_reason)), Some(Some(usage))))
            .into_response());
    }
    let include_usage = req.sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let usage_field = include_usage.then_some(None);
    // Offsets of the legacy format count from the start of the generated text.
    let mut offset = 0;
    let render = move |piece: Piece| {
        let mut chunks = Vec::new();
        match piece {
            Piece::Text { text, logprobs } => {
                let lp = with_logprobs.then(|| legacy_logprobs(&logprobs, offset));
                offset += text.len();
                chunks.push(response(text, lp, None, usage_field.clone()));
            }
            // Raw completions do not split reasoning out: a model's text comes back whole.
            Piece::Reasoning(_) => {}
            Piece::Done { summary, logprobs } => {
                let lp = (with_logprobs && !logprobs.is_empty()).then(|| legacy_logprobs(&logprobs, offset));
                chunks.push(response(
                    String::new(),
                    lp,
                    Some(run::finish_reason(summary.finish_reason)),
                    usage_field.clone(),
                ));
                if include_usage {
                    let mut last = response(String::new(), None, None, Some(Some(Usage::of(&summary))));
                    last.choices.clear();
                    chunks.push(last);
                }
            }
        }
        chunks.into_iter().map(|c| serde_json::to_value(c).unwrap_or_default()).collect()
    };
    Ok(running.into_sse(render).into_response())
}

/// Parallel lists, one entry per token; `offset` is where the first token's text starts.
fn legacy_logprobs(tokens: &[TokenLogprob], mut offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for t in tokens {
        out.tokens.push(t.text.clone());
        out.token_logprobs.push(t.logprob);
        out.top_logprobs.push(t.top.iter().map(|(_, text, lp)| (text.clone(), *lp)).collect());
        out.text_offset.push(offset);
        offset += t.text.len();
    }
    out
}
