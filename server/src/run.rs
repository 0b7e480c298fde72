//! Between HTTP and the engine: request fields become engine parameters (checked, with 400s
//! that name the field), a generation is submitted (to the scheduler, or to the remote engine),
//! and its updates come back either collected (a plain reply) or as server-sent events. A
//! request that goes away cancels its sequence: the [`Running`] guard cancels on drop, and a
//! stream whose client left stops at once.

use crate::backend::remote_error;
use crate::error::ApiError;
use crate::types::{SamplingFields, Stop as StopStrings};
use crate::{App, Serving};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use hillside_engine::scheduler::{KeptPrefix, Ticket, Update};
use hillside_engine::{Event, FinishReason, GenerateParams, SamplingParams, Summary, TokenLogprob};
use hillside_front::{RemotePrompt, Request};
use hillside_remote::ReplySink;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The most stop strings a request may give (OpenAI takes 4), and the longest.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_CHARS: usize = 256;

/// Engine parameters from the request's fields, for the model `serving` runs; `max_tokens` is
/// the one the request named (chat has two names for it), `prompt_tokens` the prompt's length.
pub fn params(
    app: &App,
    serving: &Serving,
    f: &SamplingFields,
    max_tokens: Option<usize>,
    prompt_tokens: usize,
    logprobs: Option<usize>,
) -> Result<GenerateParams, ApiError> {
    app.check_model(serving, f.model.as_deref())?;
    if let Some(n) = f.n.filter(|&n| n != 1) {
        return Err(ApiError::bad_request(format!(
            "n = {n} is not supported: this server generates one choice per request"
        ))
        .with_param("n"));
    }
    let context = serving.context_tokens();
    if prompt_tokens == 0 {
        return Err(ApiError::bad_request("the prompt is empty").with_param("messages"));
    }
    // `max_tokens` is the client's number: compared without a sum that could wrap.
    if prompt_tokens >= context || max_tokens.is_some_and(|m| m > context - prompt_tokens) {
        return Err(ApiError::context_exceeded(prompt_tokens, max_tokens, context));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1").with_param("max_tokens"));
    }
    let defaults = app.config.sampling.clone();
    let sampling = SamplingParams {
        temperature: f.temperature.unwrap_or(defaults.temperature),
        top_p: f.top_p.unwrap_or(defaults.top_p),
        top_k: f.top_k.unwrap_or(defaults.top_k),
        min_p: f.min_p.unwrap_or(defaults.min_p),
        repeat_penalty: f.repeat_penalty.unwrap_or(defaults.repeat_penalty),
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        seed: f.seed,
        ..defaults
    };
    sampling.validate().map_err(ApiError::from)?;
    let stop = match &f.stop {
        None => Vec::new(),
        Some(StopStrings::One(s)) => vec![s.clone()],
        Some(StopStrings::Many(v)) => v.clone(),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request("stop strings must not be empty").with_param("stop"));
    }
    // Each generated token is matched against every stop string.
    // Characters, not bytes: the published schema's maxLength counts them.
    if stop.len() > MAX_STOP_STRINGS || stop.iter().any(|s| s.chars().count() > MAX_STOP_CHARS) {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters each"
        ))
        .with_param("stop"));
    }
    // A request without a bound stops at the server's default, else at the context's end
    // (finish_reason "length" either way).
    let room = context - prompt_tokens;
    Ok(GenerateParams {
        max_tokens: max_tokens.unwrap_or_else(|| app.config.default_max_tokens.map_or(room, |m| m.min(room))),
        stop,
        sampling,
        logprobs,
        ..GenerateParams::default()
    })
}

/// A submitted generation; dropping it cancels the sequence (or the remote's reply).
pub struct Running {
    updates: mpsc::UnboundedReceiver<Result<Update, ApiError>>,
    stop: Stop,
    /// The model it runs on, kept loaded until it ends even if the server switches models.
    _serving: Arc<Serving>,
}

/// How a generation is stopped.
enum Stop {
    Ticket(Ticket),
    Flag(Arc<AtomicBool>),
}

impl Drop for Running {
    fn drop(&mut self) {
        match &self.stop {
            Stop::Ticket(ticket) => ticket.cancel(),
            Stop::Flag(flag) => flag.store(true, Ordering::Relaxed),
        }
    }
}

/// Refuses a request for log-probabilities on an engine that cannot give them (a remote one),
/// before any work is done for it.
pub fn check_logprobs(serving: &Serving, requested: bool) -> Result<(), ApiError> {
    if requested && !serving.front.gives_logprobs() {
        return Err(ApiError::bad_request(
            "log-probabilities are not available from the remote engine this server runs on",
        )
        .with_param("logprobs"));
    }
    Ok(())
}

/// Submits `request` to the engine `serving` runs, with the engine parameters `params` makes
/// from the prompt's length (a remote prompt's is counted by the remote's tokenizer, over HTTP,
/// so on a blocking thread; a local one's is its tokens).
pub async fn submit(
    app: &Arc<App>,
    serving: &Arc<Serving>,
    request: Request,
    params: impl FnOnce(usize) -> Result<GenerateParams, ApiError>,
) -> Result<Running, ApiError> {
    match request {
        Request::Local { tokens, prefix, reasoning } => {
            let params = GenerateParams { reasoning, ..params(tokens.len())? };
            submit_local(serving, tokens, prefix, params)
        }
        Request::Remote(prompt) => {
            let (prompt_tokens, prompt) =
                blocking(app, serving, move |_, serving| Ok((serving.front.remote_prompt_tokens(&prompt), prompt)))
                    .await?;
            Ok(submit_remote(app, serving, prompt, params(prompt_tokens)?))
        }
    }
}

/// Submits `prompt` to the local engine `serving` runs; its first tokens' K/V may be kept
/// elsewhere (`prefix`: a document's).
fn submit_local(
    serving: &Arc<Serving>,
    prompt: Vec<u32>,
    prefix: Option<Box<dyn KeptPrefix>>,
    params: GenerateParams,
) -> Result<Running, ApiError> {
    let (_, scheduler) = serving.local()?;
    let (tx, updates) = mpsc::unbounded_channel();
    // Unbounded, so the scheduler never waits on a slow client; a generation is bounded by
    // its max_tokens anyway.
    let ticket = scheduler.submit_with_prefix(prompt, prefix, params, Box::new(move |u| tx.send(Ok(u)).is_ok()))?;
    Ok(Running { updates, stop: Stop::Ticket(ticket), _serving: serving.clone() })
}

/// Submits `prompt` to the remote engine: its reply streams in on a blocking thread, and ends
/// at its next piece once the client leaves or the shutdown's grace period is over.
fn submit_remote(app: &App, serving: &Arc<Serving>, prompt: RemotePrompt, params: GenerateParams) -> Running {
    let (tx, updates) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let (serving_held, flag, stopping) = (serving.clone(), stop.clone(), app.stopping.clone());
    tokio::task::spawn_blocking(move || {
        let mut sink = RemoteSink { tx: &tx, stop: &flag, stopping: &stopping };
        let reply = match serving_held.front.remote() {
            Some(remote) => prompt.run(remote, &params, &mut sink).map_err(remote_error),
            None => Err(ApiError::internal("a request for a remote engine reached the local one")),
        };
        let _ = tx.send(reply.map(|summary| Update::Done(Ok(summary))));
    });
    Running { updates, stop: Stop::Flag(stop), _serving: serving.clone() }
}

/// A whole generation: its answer, its reasoning (if the model wrote one), every token's
/// log-probability, the summary.
pub struct Collected {
    pub text: String,
    pub reasoning: Option<String>,
    pub logprobs: Vec<TokenLogprob>,
    pub summary: Summary,
}

/// Where a remote's reply goes: into the generation's updates, until it is stopped.
struct RemoteSink<'a> {
    tx: &'a mpsc::UnboundedSender<Result<Update, ApiError>>,
    stop: &'a AtomicBool,
    stopping: &'a AtomicBool,
}

impl RemoteSink<'_> {
    fn send(&self, event: Event) -> bool {
        !self.stop.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
            && self.tx.send(Ok(Update::Event(event))).is_ok()
    }
}

impl ReplySink for RemoteSink<'_> {
    fn text(&mut self, text: &str) -> bool {
        self.send(Event::Text(text.to_string()))
    }

    fn reasoning(&mut self, text: &str) -> bool {
        self.send(Event::Reasoning(text.to_string()))
    }
}

/// A generation as its consumers see it: text with the log-probabilities of the tokens that
/// made it, then the end.
pub enum Piece {
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The model's reasoning, before its answer (chat only).
    Reasoning(String),
    Done {
        summary: Summary,
        logprobs: Vec<TokenLogprob>,
    },
}

impl Running {
    /// The next piece; `None` after the end. A generation ended by shutdown is an error.
    async fn next(&mut self, pending: &mut Vec<TokenLogprob>) -> Option<Result<Piece, ApiError>> {
        loop {
            let update = match self.updates.recv().await? {
                Ok(update) => update,
                Err(e) => return Some(Err(e)),
            };
            match update {
                Update::Event(Event::Prefill { .. }) => {}
                Update::Event(Event::Logprob(lp)) => pending.push(lp),
                Update::Event(Event::Text(text)) => {
                    return Some(Ok(Piece::Text { text, logprobs: std::mem::take(pending) }))
                }
                Update::Event(Event::Reasoning(text)) => return Some(Ok(Piece::Reasoning(text))),
                Update::Done(Ok(summary)) if summary.finish_reason == FinishReason::Cancelled => {
                    return Some(Err(ApiError::shutting_down()))
                }
                Update::Done(Ok(summary)) => {
                    return Some(Ok(Piece::Done { summary, logprobs: std::mem::take(pending) }))
                }
                Update::Done(Err(e)) => return Some(Err(e.into())),
            }
        }
    }

    /// Waits for the whole generation.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let (mut text, mut reasoning, mut logprobs, mut pending) =
            (String::new(), String::new(), Vec::new(), Vec::new());
        while let Some(piece) = self.next(&mut pending).await {
            match piece? {
                Piece::Text { text: t, logprobs: lp } => {
                    text.push_str(&t);
                    logprobs.extend(lp);
                }
                Piece::Reasoning(r) => reasoning.push_str(&r),
                Piece::Done { summary, logprobs: lp } => {
                    logprobs.extend(lp);
                    let reasoning = (!reasoning.is_empty()).then_some(reasoning);
                    return Ok(Collected { text, reasoning, logprobs, summary });
                }
            }
        }
        Err(ApiError::internal("the generation ended without a result"))
    }

    /// Server-sent events: `render` turns each piece into JSON payloads; errors become an
    /// error payload; `[DONE]` closes the stream. A client that leaves cancels the generation.
    pub fn into_sse<F>(mut self, mut render: F) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>>
    where
        F: FnMut(Piece) -> Vec<serde_json::Value> + Send + 'static,
    {
        let (out, events) = mpsc::channel::<Result<SseEvent, Infallible>>(32);
        tokio::spawn(async move {
            let mut pending = Vec::new();
            loop {
                let piece = tokio::select! {
                    piece = self.next(&mut pending) => piece,
                    _ = out.closed() => return, // the client left: dropping `self` cancels
                };
                let (payloads, last) = match piece {
                    Some(Ok(p @ Piece::Done { .. })) => (render(p), true),
                    Some(Ok(p)) => (render(p), false),
                    Some(Err(e)) => (vec![serde_json::to_value(e.body()).unwrap_or_default()], true),
                    None => (Vec::new(), true),
                };
                for payload in payloads {
                    if out.send(Ok(SseEvent::default().data(payload.to_string()))).await.is_err() {
                        return;
                    }
                }
                if last {
                    let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
            }
        });
        // Comments keep idle streams (a long prompt being read) alive through proxies, and let
        // the server notice a client that left.
        Sse::new(tokio_stream(events)).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
    }
}

fn tokio_stream<T: Send + 'static>(rx: mpsc::Receiver<T>) -> impl Stream<Item = T> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

/// OpenAI's finish reasons.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Cancelled => "length",
    }
}

/// Tokenizes off the async threads (a long document takes a while), on the model `serving` runs.
pub async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    serving: &Arc<Serving>,
    f: impl FnOnce(&App, &Serving) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let (app, serving) = (app.clone(), serving.clone());
    tokio::task::spawn_blocking(move || f(&app, &serving))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
}
