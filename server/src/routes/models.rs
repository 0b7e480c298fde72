//! `/v1/hillside/models`: the catalogue with what is installed and what would fit this machine,
//! downloads (started here, followed as server-sent events on `/v1/hillside/downloads`,
//! cancelled there), deleting a model, and switching the loaded one without a restart.

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::serving::Serving;
use crate::shelf::{ModelShelf, PullRequest, ShelfError, ShelfModel};
use crate::{App, EngineChoice, SwitchStatus};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::{IntoParams, ToSchema};

/// The longest context a fit may be asked for.
const MAX_FIT_CONTEXT_TOKENS: usize = 1 << 24;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModelsQuery {
    /// The context to estimate each model's fit at [default: the server's].
    #[param(minimum = 1, maximum = 16777216)]
    pub context: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelsReport {
    /// The model requests run on now.
    pub loaded: String,
    /// The context each fit is estimated at.
    pub context_tokens: usize,
    /// Installed models first, then those a pull would fetch.
    pub models: Vec<ShelfModel>,
    pub downloads: Vec<crate::downloads::DownloadStatus>,
    pub switch: SwitchStatus,
    /// Whether this server can fetch, delete and switch models (not on a remote engine).
    pub manageable: bool,
}

#[utoipa::path(get, path = "/v1/hillside/models", params(ModelsQuery),
    responses((status = 200, description = "The catalogue: installed models apart from available ones, each with whether it fits this machine", body = ModelsReport),
        (status = 400, description = "The context is out of range", body = ErrorBody)))]
pub async fn list(
    State(app): State<Arc<App>>,
    QueryParams(q): QueryParams<ModelsQuery>,
) -> Result<Json<ModelsReport>, ApiError> {
    let serving = app.serving();
    let context_tokens = match q.context {
        Some(c) if c == 0 || c > MAX_FIT_CONTEXT_TOKENS => {
            return Err(ApiError::bad_request(format!("context must be from 1 to {MAX_FIT_CONTEXT_TOKENS}"))
                .with_param("context"))
        }
        Some(c) => c,
        None => serving.context_tokens(),
    };
    let models = match app.shelf.clone() {
        Some(shelf) => tokio::task::spawn_blocking(move || shelf.catalogue(context_tokens))
            .await
            .map_err(|e| ApiError::internal(format!("listing the models failed: {e}")))?,
        None => vec![only_model(&serving)],
    };
    Ok(Json(ModelsReport {
        loaded: serving.model_id.clone(),
        context_tokens,
        models,
        downloads: app.downloads.list(),
        switch: app.switch_status(),
        manageable: app.shelf.is_some(),
    }))
}

/// The model a server without a shelf serves, as the catalogue would list it.
fn only_model(serving: &Serving) -> ShelfModel {
    ShelfModel {
        name: serving.model_id.clone(),
        description: None,
        family: None,
        format: None,
        size_bytes: serving.local().map_or(0, |(engine, _)| engine.model().weight_bytes() as u64),
        context_tokens: Some(serving.context_tokens()),
        licence: None,
        source: serving.front.name(),
        path: None,
        installed: true,
        default: false,
        fit: None,
    }
}

fn shelf(app: &App) -> Result<Arc<dyn ModelShelf>, ApiError> {
    app.shelf.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("models_fixed"),
            format!("This server serves {} only: models are fetched and switched where Hillside runs its own engine on this machine.", app.serving().model_id),
        )
    })
}

#[utoipa::path(post, path = "/v1/hillside/models/pull", request_body = PullRequest,
    responses((status = 202, description = "The download started; follow it on /v1/hillside/downloads", body = crate::downloads::DownloadStatus),
        (status = 400, description = "The body is not the request: `param` names the field", body = ErrorBody),
        (status = 404, description = "Neither a catalogue name nor a repository with its file", body = ErrorBody),
        (status = 409, description = "It is being fetched already, or this server cannot fetch models", body = ErrorBody)))]
pub async fn pull(State(app): State<Arc<App>>, JsonBody(what): JsonBody<PullRequest>) -> Result<Response, ApiError> {
    let shelf = shelf(&app)?;
    if what.model.trim().is_empty() {
        return Err(ApiError::bad_request("name the model to fetch").with_param("model"));
    }
    shelf.check_pull(&what).map_err(shelf_error)?;
    match app.downloads.start(shelf, what) {
        Ok(status) => Ok((StatusCode::ACCEPTED, Json(status)).into_response()),
        Err(running) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("download_running"),
            format!("{} is being fetched already ({} bytes so far).", running.name, running.done_bytes),
        )),
    }
}

#[utoipa::path(get, path = "/v1/hillside/downloads",
    responses((status = 200, description = "The downloads, the most recent first; with `Accept: text/event-stream`, server-sent events, each that list: one at once, then one per change, for as long as the client listens",
        content((Vec<crate::downloads::DownloadStatus> = "application/json"), (Vec<crate::downloads::DownloadStatus> = "text/event-stream")))))]
pub async fn downloads(State(app): State<Arc<App>>, headers: axum::http::HeaderMap) -> Response {
    let wants_events = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !wants_events {
        return Json(app.downloads.list()).into_response();
    }
    let mut changes = app.downloads.subscribe();
    changes.mark_changed();
    let downloads = app.downloads.clone();
    let stream = futures_util::stream::unfold((changes, downloads), |(mut changes, downloads)| async move {
        changes.changed().await.ok()?;
        let list = serde_json::to_string(&downloads.list()).unwrap_or_default();
        Some((Ok::<_, std::convert::Infallible>(SseEvent::default().data(list)), (changes, downloads)))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(5))).into_response()
}

#[utoipa::path(delete, path = "/v1/hillside/downloads/{name}", params(("name" = String, Path, description = "The download's name")),
    responses((status = 202, description = "Cancelling: the bytes fetched so far are kept for the next pull"),
        (status = 404, description = "No such download running", body = ErrorBody)))]
pub async fn cancel(State(app): State<Arc<App>>, PathParams(name): PathParams<String>) -> Result<StatusCode, ApiError> {
    match app.downloads.cancel(&name) {
        true => Ok(StatusCode::ACCEPTED),
        false => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("no_such_download"),
            format!("No download of '{name}' is running."),
        )),
    }
}

#[utoipa::path(delete, path = "/v1/hillside/models/{name}", params(("name" = String, Path, description = "An installed model's name")),
    responses((status = 204, description = "Deleted from the models folder"),
        (status = 404, description = "Not installed", body = ErrorBody),
        (status = 409, description = "It is the loaded model, it is being fetched, or this server cannot delete models", body = ErrorBody)))]
pub async fn remove(State(app): State<Arc<App>>, PathParams(name): PathParams<String>) -> Result<StatusCode, ApiError> {
    let shelf = shelf(&app)?;
    let conflict =
        |why: String| ApiError::new(StatusCode::CONFLICT, "invalid_request_error", Some("model_in_use"), why);
    if app.serving().answers_to(&name) {
        return Err(conflict(format!("{name} is the loaded model: switch to another before deleting it.")));
    }
    if app.switch_status().loading.as_deref() == Some(name.as_str()) {
        return Err(conflict(format!("{name} is being loaded.")));
    }
    if app.downloads.is_running(&name) {
        return Err(conflict(format!("{name} is being fetched: cancel the download first.")));
    }
    tokio::task::spawn_blocking(move || shelf.remove(&name))
        .await
        .map_err(|e| ApiError::internal(format!("deleting failed: {e}")))?
        .map_err(shelf_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LoadReport {
    /// The model requests run on from now.
    pub loaded: String,
    pub context_tokens: usize,
    /// How long loading it took.
    pub load_s: f64,
}

#[utoipa::path(post, path = "/v1/hillside/models/{name}/load", params(("name" = String, Path, description = "An installed model's name")),
    responses((status = 200, description = "Loaded: new requests run on it; those in flight finish on the model they started on", body = LoadReport),
        (status = 400, description = "It would not fit, or its file would not load: the model before keeps serving, and the message says why", body = ErrorBody),
        (status = 404, description = "Not installed", body = ErrorBody),
        (status = 409, description = "Another switch is under way, or this server cannot switch models", body = ErrorBody)))]
pub async fn load(
    State(app): State<Arc<App>>,
    PathParams(name): PathParams<String>,
) -> Result<Json<LoadReport>, ApiError> {
    let shelf = shelf(&app)?;
    let started = Instant::now();
    if app.serving().answers_to(&name) {
        let serving = app.serving();
        return Ok(Json(LoadReport {
            loaded: serving.model_id.clone(),
            context_tokens: serving.context_tokens(),
            load_s: 0.0,
        }));
    }
    {
        let mut switch = app.switch.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(loading) = &switch.loading {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some("switch_running"),
                format!("{loading} is being loaded; wait for it, then switch."),
            ));
        }
        *switch = SwitchStatus { loading: Some(name.clone()), last_error: None };
    }
    let task_app = app.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let loaded = shelf.load(&name)?;
        let kept_kv = task_app.documents.as_ref().map(|d| d.service.kv.for_model(&loaded.model_key));
        Ok::<_, ShelfError>(Serving::new(
            EngineChoice::Local(loaded.engine),
            &task_app.config.scheduler,
            (loaded.model_id, loaded.model_aliases),
            loaded.model_key,
            kept_kv,
        ))
    })
    .await
    .map_err(|e| ApiError::internal(format!("loading failed: {e}")))
    .and_then(|r| r.map_err(shelf_error));
    let serving = match loaded {
        Ok(serving) => Arc::new(serving),
        Err(e) => {
            let mut switch = app.switch.lock().unwrap_or_else(|p| p.into_inner());
            *switch = SwitchStatus { loading: None, last_error: Some(e.detail.message.clone()) };
            return Err(e);
        }
    };
    let report = LoadReport {
        loaded: serving.model_id.clone(),
        context_tokens: serving.context_tokens(),
        load_s: started.elapsed().as_secs_f64(),
    };
    let old = std::mem::replace(&mut *app.serving.write().unwrap_or_else(|p| p.into_inner()), serving);
    app.switch.lock().unwrap_or_else(|p| p.into_inner()).loading = None;
    tracing::info!(from = old.model_id, to = report.loaded, load_s = report.load_s, "switched models");
    let mut retiring = app.retiring.lock().unwrap_or_else(|p| p.into_inner());
    retiring.retain(|w| w.strong_count() > 0);
    retiring.push(Arc::downgrade(&old));
    drop(retiring);
    unload_when_idle(old);
    Ok(Json(report))
}

/// Unloads `old` once the requests that took it have finished (its scheduler stops, and its
/// weights go), on a thread of its own so that no request waits for it.
fn unload_when_idle(old: Arc<Serving>) {
    let spawned = std::thread::Builder::new().name("unload model".into()).spawn(move || {
        while Arc::strong_count(&old) > 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::info!(model = old.model_id, "unloading the model switched from");
        drop(old);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that unloads the old model; it stays loaded");
    }
}

fn shelf_error(e: ShelfError) -> ApiError {
    let (status, code) = match &e {
        ShelfError::NotFound(_) => (StatusCode::NOT_FOUND, "model_not_found"),
        ShelfError::Refused(_) => (StatusCode::BAD_REQUEST, "model_refused"),
        ShelfError::Download { network: true, .. } => (StatusCode::BAD_GATEWAY, "download_failed"),
        ShelfError::Download { network: false, .. } => (StatusCode::BAD_REQUEST, "download_failed"),
        ShelfError::Load(_) => (StatusCode::BAD_REQUEST, "model_load_failed"),
    };
    ApiError::new(status, "invalid_request_error", Some(code), e.to_string())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The file's name, for an upload (`model.gguf`).
    #[param(max_length = 255)]
    pub name: Option<String>,
}

/// A local file to import (the desktop app only: one its user chose).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportByPath {
    #[schema(value_type = String)]
    pub path: std::path::PathBuf,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Imported {
    /// The name it is installed under.
    pub name: String,
}

#[utoipa::path(post, path = "/v1/hillside/models/import", params(ImportQuery),
    request_body(description = "The GGUF file's bytes (`application/octet-stream`, with `?name=`); or, from the desktop app only, JSON `{\"path\": …}` naming a file its user chose", content = ImportByPath),
    responses((status = 201, description = "Installed", body = Imported),
        (status = 400, description = "Not a GGUF file, cut short, or a model of that name is installed already; nothing is kept", body = ErrorBody),
        (status = 403, description = "A local path the user did not choose", body = ErrorBody),
        (status = 409, description = "This server cannot install models", body = ErrorBody),
        (status = 415, description = "Neither a file's bytes nor JSON", body = ErrorBody),
        (status = 507, description = "Not enough disk space for it", body = ErrorBody)))]
pub async fn import(
    State(app): State<Arc<App>>,
    QueryParams(q): QueryParams<ImportQuery>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let shelf = shelf(&app)?;
    let content_type = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let name = if content_type.starts_with("application/octet-stream") {
        let file_name = gguf_file_name(q.name.as_deref())?;
        let staged = receive(&shelf.models_dir(), shelf.disk_free_bytes(), &file_name, request).await?;
        let path = staged.path().to_path_buf();
        let result = tokio::task::spawn_blocking(move || shelf.import(&path, &file_name, true)).await;
        drop(staged);
        result.map_err(|e| ApiError::internal(format!("importing failed: {e}")))?.map_err(shelf_error)?
    } else {
        crate::extract::require_json(request.headers())?;
        let body = axum::body::to_bytes(request.into_body(), app.config.max_body_bytes)
            .await
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        let ImportByPath { path } = crate::extract::parse(&body)?;
        let chosen = app.documents.as_ref().and_then(|d| d.chosen_paths.as_ref()).and_then(|c| c.resolve(&path));
        let Some(real) = chosen else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("path_not_chosen"),
                format!("{} was not chosen in Hillside's window; only files the user chose are read.", path.display()),
            ));
        };
        let file_name = gguf_file_name(real.file_name().and_then(|n| n.to_str()))?;
        tokio::task::spawn_blocking(move || shelf.import(&real, &file_name, false))
            .await
            .map_err(|e| ApiError::internal(format!("importing failed: {e}")))?
            .map_err(shelf_error)?
    };
    Ok((StatusCode::CREATED, Json(Imported { name })).into_response())
}

/// A plain file name ending in `.gguf`: nothing that reaches another folder.
fn gguf_file_name(name: Option<&str>) -> Result<String, ApiError> {
    let name = name.unwrap_or_default();
    let plain = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name.to_ascii_lowercase().ends_with(".gguf");
    match plain {
        true => Ok(name.to_string()),
        false => Err(ApiError::bad_request("name the file, ending in .gguf (a model file's name, without folders)")
            .with_param("name")),
    }
}

/// An upload gathered in the models folder; removed on drop unless imported (moved) first.
struct Staged(std::path::PathBuf);

impl Staged {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes the request's body to a private file in `dir` as it arrives (never whole in memory),
/// refusing it up front when its declared length would not fit the disk.
async fn receive(
    dir: &std::path::Path,
    free_bytes: Option<u64>,
    file_name: &str,
    request: axum::extract::Request,
) -> Result<Staged, ApiError> {
    use futures_util::StreamExt;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let no_space = |need: u64| {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "server_error",
            Some("disk_full"),
            format!("Not enough disk space for {file_name} ({need} bytes) in {}; nothing was kept.", dir.display()),
        )
    };
    let io = |e: std::io::Error| ApiError::internal(format!("writing the upload into {}: {e}", dir.display()));
    hillside_engine::private_files::create_dir(dir).map_err(io)?;
    let declared =
        request.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(need) = declared {
        if free_bytes.is_some_and(|free| free < need) {
            return Err(no_space(need));
        }
    }
    let staged = Staged(dir.join(format!(".{file_name}.upload-{:08x}", rand::random::<u32>())));
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(staged.path()).map_err(io)?;
    let mut body = request.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("the upload was cut short: {e}")))?;
        file.write_all(&chunk).map_err(|e| match e.kind() == std::io::ErrorKind::StorageFull {
            true => no_space(declared.unwrap_or_default()),
            false => io(e),
        })?;
    }
    file.sync_all().map_err(io)?;
    Ok(staged)
}
