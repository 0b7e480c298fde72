//! `/v1/hillside/documents`: add a document (an upload, or a local path from the desktop app),
//! list and show them, summarize one (progress and the summary as server-sent events), and
//! forget one with its kept K/V. Questions go through `/v1/chat/completions` with the
//! `hillside.documents` extension field ([`crate::types::ChatExtension`]).

use crate::backend::remote_error;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{require_json, PathParams, QueryParams};
use crate::types::{ChatExtensionReply, DocumentExcerpt};
use crate::{App, Serving};
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hillside_documents::library::Entry;
use hillside_documents::prompt::PromptError;
use hillside_documents::service::{self, AddError, AddedDocument, AskError};
use hillside_documents::sources::Point;
use hillside_documents::summarize::{fits_whole, Progress, Request as DocumentRequest, SummaryError};
use hillside_documents::IngestError;
use hillside_engine::{CancelFlag, ChatMessage};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use utoipa::ToSchema;

/// A document of the library, as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct DocumentInfo {
    /// The first 16 hex digits of the SHA-256 of its bytes.
    pub id: String,
    pub object: &'static str,
    pub name: String,
    /// text, markdown, html, pdf, docx or epub.
    pub format: String,
    pub size_bytes: u64,
    /// Its tokens for the loaded model.
    pub tokens: Option<usize>,
    /// How it is summarized with the server's context: `whole` (one pass) or `hierarchical`
    /// (chunks, then merges).
    pub mode: &'static str,
    /// Pages (PDF) or sections (headings) it was read in.
    pub parts: usize,
    pub created: u64,
    pub used: u64,
    /// The last summary's points, each with its sources (byte ranges of the text, and the
    /// page or section); absent until summarized.
    #[schema(value_type = Option<Vec<Object>>)]
    pub summary: Option<Vec<Point>>,
    /// A summary that was stopped (by the user, a crash or a restart) before it finished: what
    /// of it is kept. Asking for the summary again resumes it.
    pub unfinished_summary: Option<UnfinishedSummary>,
    /// Disk its kept K/V takes (for any model), which spares the next question a prefill.
    pub kept_kv_bytes: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UnfinishedSummary {
    pub chunks_done: usize,
    pub chunks: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DocumentList {
    pub object: &'static str,
    pub data: Vec<DocumentInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DocumentDeleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
    /// Kept K/V files removed with it.
    pub kv_files_removed: usize,
}

/// `POST /v1/hillside/documents` as JSON: a file on this machine (desktop app only).
#[derive(Debug, Deserialize, ToSchema)]
pub struct AddByPath {
    #[schema(value_type = String)]
    pub path: std::path::PathBuf,
}

/// The largest JSON body `POST /v1/hillside/documents` takes (a path).
const MAX_PATH_REQUEST_BYTES: usize = 64 * 1024;

/// Where an added document's bytes come from.
enum Source {
    Upload {
        name: String,
        bytes: Bytes,
    },
    /// A file the desktop app's user chose.
    Path(std::path::PathBuf),
}

fn info(app: &App, entry: Entry) -> DocumentInfo {
    let whole = entry.tokens.is_none_or(|t| fits_whole(t, app.serving().context_tokens()));
    let docs = app.documents().ok();
    let checkpoint = docs.and_then(|docs| docs.service.library.checkpoint(&entry.id).ok().flatten());
    let kept_kv_bytes = docs
        .and_then(|docs| docs.service.library.kept_kvs().ok())
        .map_or(0, |kept| kept.iter().filter(|k| k.documents.contains(&entry.id)).map(|k| k.bytes).sum());
    DocumentInfo {
        id: entry.id,
        object: "hillside.document",
        name: entry.name,
        format: serde_json::to_value(entry.format)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        size_bytes: entry.size_bytes,
        tokens: entry.tokens,
        mode: if whole { "whole" } else { "hierarchical" },
        parts: entry.parts.len(),
        created: entry.created_s,
        used: entry.used_s,
        summary: entry.summary,
        unfinished_summary: checkpoint.map(|c| UnfinishedSummary { chunks_done: c.chunks_done(), chunks: c.chunks }),
        kept_kv_bytes,
    }
}

fn add_error(e: AddError) -> ApiError {
    match e {
        AddError::ReaderMissing(why) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("document_reader_missing"),
            format!("Documents cannot be added: {why}."),
        ),
        AddError::Read(e) => ingest_error(e),
        AddError::CannotSummarize(e) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("document_too_long"),
            e.to_string(),
        )
        .with_param("tokens"),
        AddError::Store(e) => e.into(),
    }
}

fn ingest_error(e: IngestError) -> ApiError {
    let code = match &e {
        IngestError::TooLarge { .. } => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("document_too_large"),
                e.to_string(),
            )
        }
        IngestError::Empty { .. } | IngestError::NoText { .. } => "empty_document",
        IngestError::Unsupported { .. } => "unsupported_document",
        IngestError::Encrypted { .. } => "encrypted_document",
        IngestError::Scanned { .. } => "scanned_document",
        IngestError::Damaged { .. } => "damaged_document",
        IngestError::Io { .. } => "unreadable_document",
        IngestError::OverLimit { bound, .. } => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("document_over_limit"),
                e.to_string(),
            )
            .with_param(bound.name());
        }
        IngestError::ReaderFailed { .. } => "unreadable_document",
    };
    ApiError::bad_request(e.to_string()).with_code(code)
}

fn unknown(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("document_not_found"),
        format!("No document '{id}'; see GET /v1/hillside/documents."),
    )
}

#[utoipa::path(post, path = "/v1/hillside/documents",
    request_body(description = "multipart/form-data with the file in a part named `file` (its file name kept); or, from the desktop app only, JSON `{\"path\": …}`", content = AddByPath),
    responses(
        (status = 201, description = "Added", body = DocumentInfo),
        (status = 200, description = "The same bytes were added before: that document", body = DocumentInfo),
        (status = 400, description = "Empty, unsupported, encrypted, scanned or damaged, or the reader crashed on it: the message says which, and nothing is stored", body = ErrorBody),
        (status = 403, description = "A local path, from a client other than the desktop app", body = ErrorBody),
        (status = 413, description = "Over the size limit, or over a bound on what reading it may cost (`param` names it: `max_unpacked_bytes`, `max_nesting_depth`, `reader_memory`, …), or too long to summarize with the server's context (`document_too_long`: it would take more merge levels than allowed); nothing is stored", body = ErrorBody),
        (status = 415, description = "Neither multipart/form-data nor JSON", body = ErrorBody),
        (status = 503, description = "The document reader (hillside-ingest) is not installed beside the server", body = ErrorBody)))]
pub async fn add(State(app): State<Arc<App>>, request: Request) -> Result<Response, ApiError> {
    let docs = app.documents()?;
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/form-data"));
    // Each file is held whole while it is read: an upload waits for its turn before its bytes
    // are taken in, so parallel uploads hold at most the reader's slots' worth of memory.
    let _turn = docs.uploads.acquire().await.map_err(|e| ApiError::internal(e.to_string()))?;
    let source = if !is_form {
        require_json(request.headers())?;
        let Some(chosen) = &docs.chosen_paths else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("local_paths_off"),
                "This server does not read local paths; upload the file as multipart/form-data.",
            ));
        };
        // A path is a few hundred bytes: the upload limit does not apply to this branch.
        let body = axum::body::to_bytes(request.into_body(), MAX_PATH_REQUEST_BYTES)
            .await
            .map_err(|_| ApiError::body_too_large(MAX_PATH_REQUEST_BYTES))?;
        let AddByPath { path } = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("expected {{\"path\": \"…\"}}: {e}")).with_param("path"))?;
        let Some(real) = chosen.resolve(&path) else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("path_not_chosen"),
                format!("{} was not dropped on Hillside's window; only files the user chose are read.", path.display()),
            ));
        };
        Source::Path(real)
    } else {
        let mut form = Multipart::from_request(request, &app).await.map_err(|e| {
            ApiError::bad_request(format!("expected multipart/form-data with a part named 'file': {e}"))
        })?;
        let mut found = None;
        let limit = docs.service.limits.max_file_bytes;
        while let Some(field) = form.next_field().await.map_err(|e| upload_error(e, limit))? {
            if field.name() == Some("file") {
                let name = field.file_name().unwrap_or("document").to_string();
                found = Some((name, field.bytes().await.map_err(|e| upload_error(e, limit))?));
                break;
            }
        }
        let (name, bytes) =
            found.ok_or_else(|| ApiError::bad_request("no part named 'file' in the form").with_param("file"))?;
        Source::Upload { name, bytes }
    };
    let (task_app, serving) = (app.clone(), app.serving());
    let added = tokio::task::spawn_blocking(move || -> Result<AddedDocument, ApiError> {
        let service = &task_app.documents()?.service;
        let runner = serving.runner(false);
        match source {
            Source::Path(path) => service.add_file(&runner, &path),
            Source::Upload { name, bytes } => service.add(&runner, &name, &bytes),
        }
        .map_err(add_error)
    })
    .await
    .map_err(|e| ApiError::internal(format!("document task failed: {e}")))??;
    let AddedDocument { entry, created, .. } = added;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(info(&app, entry))).into_response())
}

fn upload_error(e: axum::extract::multipart::MultipartError, limit: u64) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("document_too_large"),
            format!("The upload is larger than the limit of {limit} bytes for a document."),
        );
    }
    ApiError::bad_request(format!("the upload was cut short or malformed: {e}"))
}
#[utoipa::path(get, path = "/v1/hillside/documents", responses((status = 200, description = "Every document, the most recently used first", body = DocumentList)))]
pub async fn list(State(app): State<Arc<App>>) -> Result<Json<DocumentList>, ApiError> {
    let entries = app.documents()?.service.library.list()?;
    Ok(Json(DocumentList { object: "list", data: entries.into_iter().map(|e| info(&app, e)).collect() }))
}

#[utoipa::path(get, path = "/v1/hillside/documents/{id}", params(("id" = String, Path, description = "Document id")),
    responses((status = 200, description = "The document, with its last summary", body = DocumentInfo), (status = 404, description = "No such document", body = ErrorBody)))]
pub async fn get(
    State(app): State<Arc<App>>,
    PathParams(id): PathParams<String>,
) -> Result<Json<DocumentInfo>, ApiError> {
    let entry = app.documents()?.service.library.get(&id)?.ok_or_else(|| unknown(&id))?;
    Ok(Json(info(&app, entry)))
}

/// The longest passage `…/text` returns.
const MAX_PASSAGE_BYTES: usize = 64 * 1024;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ByteRange {
    /// First byte of the document's text (a source's `bytes.start`).
    pub start: usize,
    /// Byte after the last (a source's `bytes.end`); at most 64 KiB after `start`.
    pub end: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Passage {
    pub id: String,
    /// The range actually returned, widened to whole characters.
    pub start: usize,
    pub end: usize,
    pub text: String,
}

#[utoipa::path(get, path = "/v1/hillside/documents/{id}/text", params(("id" = String, Path, description = "Document id"), ByteRange),
    responses((status = 200, description = "A passage of the document's text (a summary point's source)", body = Passage),
        (status = 400, description = "An empty, reversed or too long range", body = ErrorBody), (status = 404, description = "No such document", body = ErrorBody)))]
pub async fn text(
    State(app): State<Arc<App>>,
    PathParams(id): PathParams<String>,
    QueryParams(range): QueryParams<ByteRange>,
) -> Result<Json<Passage>, ApiError> {
    if range.end <= range.start || range.end - range.start > MAX_PASSAGE_BYTES {
        return Err(ApiError::bad_request(format!("a passage is 1 to {MAX_PASSAGE_BYTES} bytes, start before end"))
            .with_param("start"));
    }
    let text = app.documents()?.service.library.text(&id)?.ok_or_else(|| unknown(&id))?;
    let mut start = range.start.min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = range.end.min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    Ok(Json(Passage { id, start, end, text: text[start..end].to_string() }))
}

#[utoipa::path(delete, path = "/v1/hillside/documents/{id}", params(("id" = String, Path, description = "Document id")),
    responses((status = 200, description = "Forgotten, with its kept K/V", body = DocumentDeleted), (status = 404, description = "No such document", body = ErrorBody)))]
pub async fn delete(
    State(app): State<Arc<App>>,
    PathParams(id): PathParams<String>,
) -> Result<Json<DocumentDeleted>, ApiError> {
    let kv_files_removed = app.documents()?.service.remove(&id)?.ok_or_else(|| unknown(&id))?;
    Ok(Json(DocumentDeleted { id, object: "hillside.document.deleted", deleted: true, kv_files_removed }))
}

/// A summary's server-sent events: what it is doing, then the summary or an error.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "object")]
pub enum SummaryEvent {
    /// `stage` is `planned` (with `tokens`, `mode` and, when hierarchical, `chunks` as byte
    /// ranges), `resumed` (`chunks_done`, `merges_done`: kept from a summary stopped before),
    /// `prefill` (`chunk`, `chunks`, `done_tokens`, `total_tokens`), `chunk_summarized`
    /// (`done`, `chunks`, `tokens_read`, `elapsed_s`, `eta_s`), `merging` (`level`, `groups`),
    /// `merged` (`level`, `done`, `groups`, `elapsed_s`, `eta_s`), `writing` (`text`) or `done`.
    #[serde(rename = "hillside.summary.progress")]
    Progress {
        #[serde(flatten)]
        #[schema(value_type = Object)]
        progress: Progress,
    },
    #[serde(rename = "hillside.summary")]
    Summary {
        id: String,
        tokens: usize,
        mode: &'static str,
        #[schema(value_type = Vec<Object>)]
        points: Vec<Point>,
    },
}

#[utoipa::path(post, path = "/v1/hillside/documents/{id}/summary", params(("id" = String, Path, description = "Document id")),
    responses(
        (status = 200, description = "Server-sent `SummaryEvent`s — progress, then the summary (or an error body) — ending in `[DONE]`. Each finished step is kept: closing the stream stops the summary, and asking again resumes it where it stopped (also after a crash or a restart).", content_type = "text/event-stream", body = SummaryEvent),
        (status = 404, description = "No such document", body = ErrorBody)))]
pub async fn summary(State(app): State<Arc<App>>, PathParams(id): PathParams<String>) -> Result<Response, ApiError> {
    let doc = app.documents()?.service.document(&id)?.ok_or_else(|| unknown(&id))?;
    let (out, events) = mpsc::channel::<serde_json::Value>(64);
    let cancel = CancelFlag::default();
    let flag = cancel.clone();
    // The whole summary runs on the model loaded when it starts.
    let serving = app.serving();
    tokio::task::spawn_blocking(move || {
        let service = &app.documents().expect("checked above").service;
        let runner = serving.runner(true);
        let send = |event: SummaryEvent| serde_json::to_value(event).is_ok_and(|v| out.blocking_send(v).is_ok());
        let result = service.summarize(&runner, &id, &doc, &serving.model_key, &flag, &mut |progress| {
            if !send(SummaryEvent::Progress { progress }) {
                flag.cancel(); // nobody listens
            }
        });
        match result {
            Ok(summary) => {
                send(SummaryEvent::Summary {
                    id,
                    tokens: summary.plan.tokens,
                    mode: summary.plan.mode.name(),
                    points: summary.points,
                });
            }
            Err(SummaryError::Cancelled) => {}
            Err(e) => {
                let _ = out.blocking_send(serde_json::to_value(summary_error(e).body()).unwrap_or_default());
            }
        }
    });
    // Dropping the stream (the client left) cancels the summary.
    struct CancelOnDrop(CancelFlag);
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            self.0.cancel();
        }
    }
    let stream =
        futures_util::stream::unfold((events, CancelOnDrop(cancel), false), |(mut events, guard, ended)| async move {
            if ended {
                return None;
            }
            match events.recv().await {
                Some(v) => Some((
                    Ok::<_, std::convert::Infallible>(SseEvent::default().data(v.to_string())),
                    (events, guard, false),
                )),
                None => Some((Ok(SseEvent::default().data("[DONE]")), (events, guard, true))),
            }
        });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(5))).into_response())
}

fn summary_error(e: SummaryError) -> ApiError {
    match e {
        SummaryError::TooLong(_) | SummaryError::ContextTooSmall(_) => {
            ApiError::bad_request(e.to_string()).with_code("document_too_long")
        }
        SummaryError::Engine(e) => e.into(),
        SummaryError::Refused(m) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("engine_refused"), m)
        }
        SummaryError::Remote(e) => remote_error(e),
        SummaryError::Prompt(e) => ApiError::internal(e.to_string()),
        SummaryError::Cancelled => ApiError::internal("cancelled"),
    }
}

/// Refuses, before any document is loaded, a list of more than
/// [`hillside_documents::service::MAX_DOCUMENTS_PER_QUESTION`] ids or one that names a document
/// twice.
pub fn check_ids(ids: &[String]) -> Result<(), ApiError> {
    service::check_ids(ids).map_err(ask_error)
}

fn ask_error(e: AskError) -> ApiError {
    let message = e.to_string();
    match e {
        AskError::TooMany(_) => ApiError::bad_request(message).with_param("hillside.documents"),
        AskError::Twice { index, .. } => {
            ApiError::bad_request(message).with_param(format!("hillside.documents[{index}]"))
        }
        AskError::Unknown { index, .. } => ApiError::bad_request(format!("{message}; see GET /v1/hillside/documents"))
            .with_param(format!("hillside.documents[{index}]")),
        AskError::Prompt(PromptError::Engine(e)) => e.into(),
        AskError::Prompt(PromptError::NoQuestion) => ApiError::bad_request(message).with_param("messages"),
        AskError::Prompt(PromptError::TooLong(_)) => {
            ApiError::bad_request(message).with_code("document_too_long").with_param("hillside.documents")
        }
        AskError::Store(e) => e.into(),
    }
}

/// The request for a chat about the library's documents `ids` on the model `serving` runs, and
/// what of each it reads.
pub fn question(
    app: &App,
    serving: &Serving,
    ids: &[String],
    messages: &[ChatMessage],
) -> Result<(DocumentRequest, ChatExtensionReply), ApiError> {
    let runner = serving.runner(true);
    let asked = app.documents()?.service.question(&runner, ids, messages).map_err(ask_error)?;
    let read = ids
        .iter()
        .zip(&asked.excerpts)
        .map(|(id, e)| DocumentExcerpt {
            id: id.clone(),
            start: e.bytes.start,
            end: e.bytes.end,
            chunk: e.chunk,
            chunks: e.chunks,
        })
        .collect();
    let document_tokens = match &asked.request {
        DocumentRequest::Local { prefix, .. } => prefix.as_ref().map_or(0, |p| p.tokens()),
        DocumentRequest::Remote(_) => 0,
    };
    Ok((asked.request, ChatExtensionReply { documents: read, document_tokens }))
}
