//! Hillside's local OpenAI-compatible endpoint: axum routes over the engine's scheduler.
//!
//! `/v1/chat/completions`, `/v1/completions` (streamed or not), `/v1/models`, `/health`,
//! `/openapi.json`, and Hillside's own `/v1/hillside/sequences` (KV tier stats of every live
//! sequence), `/v1/hillside/tiers` (the tiers summed, with counters for rates),
//! `/v1/hillside/config`, `/v1/hillside/documents` (a library of documents to summarize and ask
//! about), `/v1/hillside/conversations` (the UI's history) and `/v1/hillside/settings` (the
//! config file). The web UI is served at `/`. Loopback by default, optional API key, a body
//! limit, CORS only for origins the user names.

mod auth;
mod backend;
mod conversations;
mod cross_site;
mod documents;
mod error;
mod extract;
mod local_host;
mod openapi;
mod routes;
mod run;
pub mod settings;
mod start_error;
pub mod types;
mod web_ui;

pub use backend::{Backend, EngineChoice};
pub use cross_site::AllowedOrigins;
pub use documents::{ChosenPaths, DocumentsConfig};
pub use error::{ApiError, ErrorBody};
pub use start_error::StartError;
pub use web_ui::is_built as web_ui_is_built;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method};
use axum::routing::{get, post};
use axum::Router;
use conversations::Conversations;
use documents::Documents;
use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::summarize::{self, Runner};
use hillside_engine::scheduler::{Scheduler, SchedulerConfig};
use hillside_engine::{Engine, SamplingParams};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How the server runs (everything but the key is shown by `/v1/hillside/config`).
#[derive(Debug, Clone, Serialize)]
pub struct ServerConfig {
    /// The id clients name the loaded model by (a registry name, or the file's stem).
    pub model_id: String,
    /// Other names accepted for it (its file name).
    pub model_aliases: Vec<String>,
    /// Every installed model, listed by `/v1/models` (the loaded one first).
    pub installed_models: Vec<String>,
    #[serde(skip)]
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Origins allowed by CORS (none: CORS off).
    pub cors_origins: Vec<String>,
    /// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_grace_s: u64,
    #[serde(skip)]
    pub scheduler: SchedulerConfig,
    /// Where documents, their kept K/V and the conversations live; `None`: those routes are off.
    pub documents: Option<DocumentsConfig>,
    /// Sampling for requests that do not set their own (the config file's `[sampling]`).
    pub sampling: SamplingParams,
    /// The config file the settings routes edit; `None`: they are off.
    pub settings_file: Option<std::path::PathBuf>,
}

/// Shared by every request.
pub struct App {
    pub backend: Backend,
    pub config: ServerConfig,
    documents: Option<Documents>,
    conversations: Option<Conversations>,
    allowed_origins: cross_site::AllowedOrigins,
    /// Response ids: a random per-process prefix and a counter.
    id_prefix: String,
    next_id: AtomicU64,
    /// Set once the shutdown's grace period is over: replies streaming from a remote engine
    /// end (the local scheduler cancels its own).
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl App {
    /// Opens the document library (if configured) and starts the scheduler (on the local
    /// engine); `Err` says why the library cannot be opened (another Hillside holds it, say),
    /// or which CORS origin is not one.
    pub fn new(engine: impl Into<EngineChoice>, config: ServerConfig) -> Result<Arc<Self>, StartError> {
        let allowed_origins = cross_site::AllowedOrigins::parse(&config.cors_origins)?;
        let documents = config.documents.as_ref().map(Documents::open).transpose()?;
        let conversations =
            config.documents.as_ref().map(|d| Conversations::open(&d.dir.join("conversations.redb"))).transpose()?;
        let backend = match engine.into() {
            EngineChoice::Local(engine) => {
                Backend::Local { scheduler: Scheduler::start(engine.clone(), config.scheduler.clone()), engine }
            }
            EngineChoice::Remote(remote) => Backend::Remote(remote),
        };
        let id_prefix = format!("{:08x}", rand::random::<u32>());
        Ok(Arc::new(Self {
            backend,
            config,
            documents,
            conversations,
            allowed_origins,
            id_prefix,
            next_id: AtomicU64::new(1),
            stopping: Arc::default(),
        }))
    }

    /// The local engine and its scheduler; on a remote engine, the error for a route that
    /// needs them.
    pub fn local(&self) -> Result<(&Arc<Engine>, &Scheduler), ApiError> {
        match &self.backend {
            Backend::Local { engine, scheduler } => Ok((engine, scheduler)),
            Backend::Remote(remote) => Err(backend::needs_local_engine(remote)),
        }
    }

    /// The local engine's scheduler; `None` on a remote engine.
    pub fn scheduler(&self) -> Option<&Scheduler> {
        self.local().ok().map(|(_, scheduler)| scheduler)
    }

    /// What summaries and questions run on, with documents' K/V kept in `kv_cache` (local
    /// engine only).
    fn runner<'a>(&'a self, kv_cache: Option<&'a Arc<DocumentKvCache>>) -> Runner<'a> {
        let backend = match &self.backend {
            Backend::Local { engine, scheduler } => summarize::Backend::Local { engine, scheduler },
            Backend::Remote(remote) => summarize::Backend::Remote(remote),
        };
        Runner {
            backend,
            context_tokens: self.context_tokens(),
            kv_cache: kv_cache.filter(|_| matches!(self.backend, Backend::Local { .. })),
        }
    }

    fn documents(&self) -> Result<&Documents, ApiError> {
        self.documents.as_ref().ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("documents_off"),
                "This server keeps no documents (it was started without a data folder).",
            )
        })
    }

    /// A fresh response id such as `chatcmpl-1a2b3c4d-7`.
    fn response_id(&self, kind: &str) -> String {
        format!("{kind}-{}-{}", self.id_prefix, self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Each sequence's context in tokens (on a remote engine, each request's).
    pub(crate) fn context_tokens(&self) -> usize {
        match &self.backend {
            Backend::Local { engine, .. } => {
                let model = engine.model();
                model.kv_shape(self.config.scheduler.context_tokens.unwrap_or(model.config.context_tokens)).max_tokens
            }
            Backend::Remote(remote) => remote.context_tokens(),
        }
    }

    /// A request may name the loaded model (any of its names) or none.
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None | Some("") => Ok(()),
            Some(m) if m == self.config.model_id || self.config.model_aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m, &self.config.model_id)),
        }
    }
}

pub fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Every route, with the key check, the body limit, (when origins are configured) CORS, and
/// outermost the checks that requests from this machine are addressed to it and that no page
/// on another site made them.
pub fn router(app: Arc<App>) -> Router {
    // An upload carries a whole document (and the multipart framing around it).
    let upload_limit = app
        .config
        .documents
        .as_ref()
        .map_or(0, |d| d.max_file_bytes as usize + 64 * 1024)
        .max(app.config.max_body_bytes);
    let mut router = Router::new()
        .route("/v1/chat/completions", post(routes::chat::chat_completions))
        .route("/v1/completions", post(routes::completions::completions))
        .route("/v1/models", get(routes::info::models))
        .route("/v1/models/{id}", get(routes::info::model))
        .route("/v1/hillside/sequences", get(routes::info::sequences))
        .route("/v1/hillside/tiers", get(routes::info::tiers))
        .route("/v1/hillside/config", get(routes::info::config))
        .route("/v1/hillside/settings", get(routes::settings::get).put(routes::settings::put))
        .route("/v1/hillside/conversations", get(routes::conversations::list).post(routes::conversations::create))
        .route(
            "/v1/hillside/conversations/{id}",
            get(routes::conversations::get).patch(routes::conversations::change).delete(routes::conversations::delete),
        )
        .route(
            "/v1/hillside/documents",
            post(routes::documents::add).get(routes::documents::list).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/v1/hillside/documents/{id}", get(routes::documents::get).delete(routes::documents::delete))
        .route("/v1/hillside/documents/{id}/summary", post(routes::documents::summary))
        .route("/v1/hillside/documents/{id}/text", get(routes::documents::text))
        .route("/openapi.json", get(openapi::document))
        .layer(axum::middleware::from_fn_with_state(app.clone(), auth::require_key))
        .route("/health", get(routes::info::health))
        // The UI's own files need no key: the page asks for it when the API does.
        .route("/", get(web_ui::file))
        .route("/assets/{*file}", get(web_ui::file))
        .route("/favicon.svg", get(web_ui::file))
        .fallback(routes::info::not_found)
        .method_not_allowed_fallback(routes::info::method_not_allowed)
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes));
    let cors = tower_http::cors::CorsLayer::new()
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
        .allow_headers([axum::http::header::AUTHORIZATION, axum::http::header::CONTENT_TYPE]);
    match &app.allowed_origins {
        cross_site::AllowedOrigins::Own => {}
        cross_site::AllowedOrigins::List(origins) => {
            let origins: Vec<HeaderValue> = origins.iter().filter_map(|o| o.parse().ok()).collect();
            router = router.layer(cors.allow_origin(origins));
        }
        cross_site::AllowedOrigins::Any => router = router.layer(cors.allow_origin(tower_http::cors::Any)),
    }
    router
        .layer(axum::middleware::from_fn_with_state(app.clone(), cross_site::refuse_cross_site))
        .layer(axum::middleware::from_fn(local_host::require_local_host))
        .with_state(app)
}

/// Serves on `listener` until `shutdown` resolves; then stops accepting, gives in-flight
/// generations `shutdown_grace_s` to finish, cancels the rest and returns once every
/// connection is closed and every sequence (and its cold-pool file) is gone.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = Duration::from_secs(app.config.shutdown_grace_s);
    let draining = app.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!(grace_s = grace.as_secs(), "shutting down: finishing in-flight requests");
        // Ends the streams of whatever is still running once the grace period is over, which
        // lets the connections (and so `axum::serve`) finish.
        match draining.scheduler().is_some() {
            true => drop(tokio::task::spawn_blocking(move || draining.scheduler().map(|s| s.shutdown(grace)))),
            false => drop(tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                draining.stopping.store(true, Ordering::Relaxed);
            })),
        }
    };
    let service = router(app.clone()).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(signal).await?;
    // The connections are closed; make sure the worker is gone too (a no-op if it is).
    tokio::task::spawn_blocking(move || app.scheduler().map(|s| s.shutdown(Duration::ZERO))).await.ok();
    Ok(())
}
