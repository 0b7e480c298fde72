//! What the server holds: `/health`, `/v1/models`, and Hillside's own `/v1/hillside/…` routes
//! (KV tier stats per live sequence, the configuration).

use crate::backend::remote_error;
use crate::error::{ApiError, ErrorBody};
use crate::extract::PathParams;
use crate::run;
use crate::types::{Health, ModelCard, ModelList};
use crate::{unix_now_s, App, ServerConfig};
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::Json;
use hillside_engine::scheduler::{Phase, SequenceStats, Totals};
use serde::Serialize;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use utoipa::ToSchema;

#[utoipa::path(get, path = "/health", responses(
    (status = 200, description = "The server is up", body = Health),
    (status = 502, description = "The remote engine this server runs on does not answer", body = ErrorBody),
    (status = 503, description = "The engine stopped after an internal error; requests are refused", body = ErrorBody)))]
pub async fn health(State(app): State<Arc<App>>) -> Result<Json<Health>, ApiError> {
    let serving = app.serving();
    let Some(scheduler) = serving.scheduler() else {
        // On a remote engine, healthy is the remote answering.
        run::blocking(&app, &serving, |_, serving| serving.front.reachable().map_err(remote_error)).await?;
        return Ok(Json(Health {
            status: "ok",
            model: serving.model_id.clone(),
            live_sequences: 0,
            queued_requests: 0,
        }));
    };
    scheduler.health()?;
    let stats = scheduler.stats();
    let count = |phase: Phase| stats.iter().filter(|s| s.phase == phase).count();
    let queued = count(Phase::Queued);
    let live = stats.len() - queued - count(Phase::Cached);
    Ok(Json(Health { status: "ok", model: serving.model_id.clone(), live_sequences: live, queued_requests: queued }))
}

fn card(id: &str) -> ModelCard {
    ModelCard { id: id.to_string(), object: "model", created: unix_now_s(), owned_by: "hillside".into() }
}

#[utoipa::path(get, path = "/v1/models", responses((status = 200, description = "Installed models, the loaded one first", body = ModelList)))]
pub async fn models(State(app): State<Arc<App>>) -> Result<Json<ModelList>, ApiError> {
    let serving = app.serving();
    let installed = installed(&app).await?;
    let mut ids = vec![serving.model_id.as_str()];
    ids.extend(installed.iter().map(String::as_str).filter(|&m| m != serving.model_id));
    Ok(Json(ModelList { object: "list", data: ids.into_iter().map(card).collect() }))
}

/// The installed models' names, read off the async threads (the shelf lists a folder).
async fn installed(app: &Arc<App>) -> Result<Vec<String>, ApiError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || app.installed_models())
        .await
        .map_err(|e| ApiError::internal(format!("listing the models failed: {e}")))
}

#[utoipa::path(get, path = "/v1/models/{id}", params(("id" = String, Path, description = "Model id")),
    responses((status = 200, description = "The model", body = ModelCard), (status = 404, description = "Not installed", body = ErrorBody)))]
pub async fn model(
    State(app): State<Arc<App>>,
    PathParams(id): PathParams<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let serving = app.serving();
    if serving.answers_to(&id) || installed(&app).await?.contains(&id) {
        Ok(Json(card(&id)))
    } else {
        Err(ApiError::model_not_found(&id, &serving.model_id))
    }
}

/// A request and its KV store, as of the scheduler's last round.
#[derive(Debug, Serialize, ToSchema)]
pub struct SequenceReport {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub sequence: SequenceStats,
    /// Cold-pool bytes read per generated token.
    pub cold_bytes_read_per_token: f64,
    /// Share of selected (token, KV head) rows found hot (tiered stores).
    pub hot_hit_rate: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SequencesReport {
    pub sequences: Vec<SequenceReport>,
}

#[utoipa::path(get, path = "/v1/hillside/sequences", responses(
    (status = 200, description = "Every live or queued sequence with its KV tier stats", body = SequencesReport),
    (status = 409, description = "The server runs on a remote engine, which has no sequences to show", body = ErrorBody)))]
pub async fn sequences(State(app): State<Arc<App>>) -> Result<Json<SequencesReport>, ApiError> {
    let sequences = app
        .serving()
        .local()?
        .1
        .stats()
        .into_iter()
        .map(|s| {
            let read = s.kv.as_ref().map_or(0, |kv| kv.cold_bytes_read);
            let hot_hit_rate = s.kv.as_ref().and_then(|kv| kv.tier.as_ref()).and_then(|t| {
                let total = t.hot_hits + t.cold_hits;
                (total > 0).then(|| t.hot_hits as f64 / total as f64)
            });
            SequenceReport {
                cold_bytes_read_per_token: read as f64 / s.generated_tokens.max(1) as f64,
                hot_hit_rate,
                sequence: s,
            }
        })
        .collect();
    Ok(Json(SequencesReport { sequences }))
}

/// The KV tiers of every sequence together, now, and counters since the server started: a
/// client takes rates (hit rate, cold bytes per token, score blocks per second) from two
/// readings.
#[derive(Debug, Serialize, ToSchema)]
pub struct TiersReport {
    /// When this was read, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The store each sequence gets: full, offload, tiered or drop.
    pub store: String,
    /// Sequences generating (the others are queued or cached).
    pub live_sequences: usize,
    pub tokens: usize,
    /// Memory the stores hold (K/V, scoring copies, buffers).
    pub resident_bytes: usize,
    /// Tiered stores: DRAM counted against the hot budgets, and those budgets.
    pub hot_bytes: usize,
    pub hot_budget_bytes: usize,
    /// Tiered stores: dense copies of the whole cache, kept while memory is spare.
    pub spare_copy_bytes: usize,
    /// K/V in the cold pools on disk.
    pub cold_bytes: usize,
    /// The model's sliding-window layers: each keeps only its last `window_tokens` positions,
    /// in memory, and never reaches the chosen store; `window_bytes` is what they hold (part of
    /// `resident_bytes`).
    pub windowed_layers: Vec<usize>,
    pub window_tokens: Option<usize>,
    pub window_bytes: usize,
    #[schema(value_type = Object)]
    pub totals: Totals,
}

#[utoipa::path(get, path = "/v1/hillside/tiers", responses(
    (status = 200, description = "KV tier occupancy and counters, summed over the sequences", body = TiersReport),
    (status = 409, description = "The server runs on a remote engine, which has no KV tiers to show", body = ErrorBody)))]
pub async fn tiers(State(app): State<Arc<App>>) -> Result<Json<TiersReport>, ApiError> {
    let serving = app.serving();
    let (engine, scheduler) = serving.local()?;
    let model = &engine.model().config;
    let windowed_layers: Vec<usize> = (0..model.n_layers).filter(|&l| model.window_of(l).is_some()).collect();
    let stats = scheduler.stats();
    let kvs = || stats.iter().filter_map(|s| s.kv.as_ref());
    let tiers = || kvs().filter_map(|kv| kv.tier.as_ref());
    let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    Ok(Json(TiersReport {
        unix_ms,
        store: app.config.scheduler.kv.store.to_string(),
        live_sequences: stats.iter().filter(|s| matches!(s.phase, Phase::Prefill | Phase::Decode)).count(),
        tokens: kvs().map(|kv| kv.tokens).sum(),
        resident_bytes: kvs().map(|kv| kv.resident_bytes).sum(),
        hot_bytes: tiers().map(|t| t.hot_bytes).sum(),
        hot_budget_bytes: tiers().map(|t| t.hot_budget_bytes).sum(),
        spare_copy_bytes: tiers().map(|t| t.spare_copy_bytes).sum(),
        cold_bytes: kvs().map(|kv| kv.cold_bytes).sum(),
        window_tokens: windowed_layers.first().and_then(|&l| model.window_of(l)),
        windowed_layers,
        window_bytes: kvs().map(|kv| kv.window_bytes).sum(),
        totals: scheduler.totals(),
    }))
}

/// The configuration in force (never the API key).
#[derive(Debug, Serialize, ToSchema)]
pub struct ConfigReport {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub server: ServerConfig,
    /// The model requests run on now (a registry name, the file's stem, or the remote's).
    pub model_id: String,
    pub api_key_required: bool,
    /// `local` (Hillside's own engine) or `openai:URL` (a remote one; `model_id` is its model).
    pub engine: String,
    pub context_tokens: usize,
    pub max_live_sequences: usize,
    pub max_queued_requests: usize,
    pub cached_sequences: usize,
    #[schema(value_type = Object)]
    pub kv: hillside_engine::kv::KvConfig,
}

#[utoipa::path(get, path = "/v1/hillside/config", responses((status = 200, description = "The server's configuration, read-only", body = ConfigReport)))]
pub async fn config(State(app): State<Arc<App>>) -> Json<ConfigReport> {
    let s = &app.config.scheduler;
    let serving = app.serving();
    Json(ConfigReport {
        server: app.config.clone(),
        model_id: serving.model_id.clone(),
        api_key_required: app.config.api_key.is_some(),
        engine: serving.front.name(),
        context_tokens: serving.context_tokens(),
        max_live_sequences: s.max_live,
        max_queued_requests: s.max_queued,
        cached_sequences: s.cached_sequences,
        kv: s.kv.clone(),
    })
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(&method, uri.path())
}
