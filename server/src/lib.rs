//! Hillside's local OpenAI-compatible endpoint: axum routes over the engine's scheduler.
//!
//! `/v1/chat/completions`, `/v1/completions` (streamed or not), `/v1/models`, `/health`,
//! `/openapi.json`, and Hillside's own `/v1/hillside/sequences` (KV tier stats of every live
//! sequence), `/v1/hillside/tiers` (the tiers summed, with counters for rates),
//! `/v1/hillside/config`, `/v1/hillside/documents` (a library of documents to summarize and ask
//! about), `/v1/hillside/conversations` (the UI's history), `/v1/hillside/settings` (the
//! config file) and `/v1/hillside/models` (the catalogue: what is installed and what would fit,
//! downloads, switching the loaded model). The web UI is served at `/`. Loopback by default,
//! optional API key, a body limit, CORS only for origins the user names.

mod auth;
mod backend;
mod control;
mod conversations;
mod cross_site;
mod documents;
mod downloads;
mod error;
mod extract;
mod host_check;
mod openapi;
mod routes;
mod run;
mod serving;
pub mod shelf;
mod start_error;
pub mod types;
mod web_ui;

pub use backend::EngineChoice;
pub use cross_site::AllowedOrigins;
pub use documents::ChosenPaths;
pub use error::{ApiError, ErrorBody};
pub use hillside_documents::DocumentsConfig;
pub use serving::Serving;
pub use start_error::StartError;
pub use web_ui::is_built as web_ui_is_built;

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::{HeaderValue, Method};
use axum::routing::{delete, get, post};
use axum::Router;
use conversations::Conversations;
use documents::Documents;
use downloads::Downloads;
use hillside_engine::scheduler::SchedulerConfig;
use hillside_engine::SamplingParams;
use serde::Serialize;
use shelf::ModelShelf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How the server runs (everything but the key is shown by `/v1/hillside/config`).
#[derive(Debug, Clone, Serialize)]
pub struct ServerConfig {
    /// The id clients name the model the server starts with by (a registry name, or the file's
    /// stem); `/v1/hillside/config` shows the one loaded now.
    #[serde(skip)]
    pub model_id: String,
    /// Other names accepted for it (its file name).
    #[serde(skip)]
    pub model_aliases: Vec<String>,
    /// Every installed model, listed by `/v1/models` (the loaded one first), where the server has
    /// no models shelf to ask.
    #[serde(skip)]
    pub installed_models: Vec<String>,
    #[serde(skip)]
    pub api_key: Option<String>,
    /// Names besides loopback ones and the address it listens on that requests may address this
    /// server by in `Host` (`--allowed-host`).
    pub allowed_hosts: Vec<String>,
    pub max_body_bytes: usize,
    /// Origins allowed by CORS (none: CORS off).
    pub cors_origins: Vec<String>,
    /// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_grace_s: u64,
    #[serde(skip)]
    pub scheduler: SchedulerConfig,
    /// Where documents, their kept K/V and the conversations live; `None`: those routes are off.
    pub documents: Option<DocumentsConfig>,
    /// The local files the desktop app's user chose, which documents may be added from; `None`:
    /// only uploads.
    #[serde(skip)]
    pub chosen_paths: Option<Arc<ChosenPaths>>,
    /// Sampling for requests that do not set their own (the config file's `[sampling]`).
    pub sampling: SamplingParams,
    /// The most tokens a reply may have when its request gives no `max_tokens`; `None`: up to
    /// the context's end, as OpenAI's chat route and llama.cpp's server do.
    pub default_max_tokens: Option<usize>,
    /// The config file the settings routes edit; `None`: they are off.
    pub settings_file: Option<std::path::PathBuf>,
}

/// Shared by every request.
pub struct App {
    /// The model requests run on now (see [`Serving`]).
    serving: RwLock<Arc<Serving>>,
    pub config: ServerConfig,
    /// The machine's models; `None`: only the model the server started with.
    shelf: Option<Arc<dyn ModelShelf>>,
    downloads: Downloads,
    /// The model being loaded by a switch, and why the last switch failed.
    switch: Mutex<SwitchStatus>,
    /// Models switched from whose last requests are still running: a shutdown stops them too.
    retiring: Mutex<Vec<std::sync::Weak<Serving>>>,
    documents: Option<Documents>,
    conversations: Option<Conversations>,
    allowed_origins: cross_site::AllowedOrigins,
    /// This run's secret for changes to settings and models (see [`control`]).
    control_secret: String,
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
    /// or which CORS origin is not one. The server serves this one model.
    pub fn new(engine: impl Into<EngineChoice>, config: ServerConfig) -> Result<Arc<Self>, StartError> {
        Self::with_shelf(engine, config, None)
    }

    /// The same, with the machine's models to list, fetch and switch to.
    pub fn with_shelf(
        engine: impl Into<EngineChoice>,
        config: ServerConfig,
        shelf: Option<Arc<dyn ModelShelf>>,
    ) -> Result<Arc<Self>, StartError> {
        let allowed_origins = cross_site::AllowedOrigins::parse(&config.cors_origins)?;
        let documents =
            config.documents.as_ref().map(|d| Documents::open(d, config.chosen_paths.clone())).transpose()?;
        let conversations =
            config.documents.as_ref().map(|d| Conversations::open(&d.dir.join("conversations.redb"))).transpose()?;
        let model_key = config.documents.as_ref().map(|d| d.model_key.clone()).unwrap_or_default();
        let serving = Serving::new(
            engine.into(),
            &config.scheduler,
            (config.model_id.clone(), config.model_aliases.clone()),
            model_key,
            documents.as_ref().map(|d| d.service.kv.clone()),
        );
        let id_prefix = format!("{:08x}", rand::random::<u32>());
        Ok(Arc::new(Self {
            serving: RwLock::new(Arc::new(serving)),
            config,
            shelf,
            downloads: Downloads::default(),
            switch: Mutex::default(),
            retiring: Mutex::default(),
            documents,
            conversations,
            allowed_origins,
            control_secret: control::new_secret(),
            id_prefix,
            next_id: AtomicU64::new(1),
            stopping: Arc::default(),
        }))
    }

    /// The model new requests run on; a request keeps the one it took to its end.
    pub fn serving(&self) -> Arc<Serving> {
        self.serving.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This run's control secret: the desktop window and the web UI's printed link carry it.
    pub fn control_secret(&self) -> &str {
        &self.control_secret
    }

    /// The web UI's address for `base` (`http://host:port/`) with this run's control secret, in a
    /// fragment, which browsers keep to the page.
    pub fn ui_link(&self, base: &str) -> String {
        format!("{}/#secret={}", base.trim_end_matches('/'), self.control_secret)
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

    /// The switch under way, and why the last one failed.
    pub fn switch_status(&self) -> SwitchStatus {
        self.switch.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The installed models' names: the shelf's, else those the server was started with.
    pub(crate) fn installed_models(&self) -> Vec<String> {
        match &self.shelf {
            Some(shelf) => shelf.installed(),
            None => self.config.installed_models.clone(),
        }
    }

    /// A request may name the model `serving` runs (any of its names) or none; an installed
    /// model that is not loaded gets a 400 that says how to switch to it.
    fn check_model(&self, serving: &Serving, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None | Some("") => Ok(()),
            Some(m) if serving.answers_to(m) => Ok(()),
            Some(m) if self.shelf.is_some() && self.installed_models().iter().any(|i| i == m) => {
                Err(ApiError::model_not_loaded(m, &serving.model_id))
            }
            Some(m) => Err(ApiError::model_not_found(m, &serving.model_id)),
        }
    }
}

/// A switch of the loaded model, as the Models page shows it.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct SwitchStatus {
    /// The model being loaded now, if a switch is under way.
    pub loading: Option<String>,
    /// Why the last switch failed (the model before it kept serving); cleared by the next.
    pub last_error: Option<String>,
}

pub fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Every route, with the key check, the control secret on changes to settings and models, the
/// body limit, (when origins are configured) CORS, and outermost the checks that requests are
/// addressed to this server and that no page on another site made them.
pub fn router(app: Arc<App>) -> Router {
    // An upload carries a whole document (and the multipart framing around it).
    let upload_limit = app
        .config
        .documents
        .as_ref()
        .map_or(0, |d| d.max_file_bytes as usize + 64 * 1024)
        .max(app.config.max_body_bytes);
    // Changes to what decides where data goes or what runs need this run's secret (or the key).
    let control = || axum::middleware::from_fn_with_state(app.clone(), control::require_control);
    let mut router = Router::new()
        .route("/v1/chat/completions", post(routes::chat::chat_completions))
        .route("/v1/completions", post(routes::completions::completions))
        .route("/v1/models", get(routes::info::models))
        .route("/v1/models/{id}", get(routes::info::model))
        .route("/v1/hillside/sequences", get(routes::info::sequences))
        .route("/v1/hillside/tiers", get(routes::info::tiers))
        .route("/v1/hillside/config", get(routes::info::config))
        .route("/v1/hillside/settings", get(routes::settings::get).put(routes::settings::put.layer(control())))
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
        .route("/v1/hillside/models", get(routes::models::list))
        .route("/v1/hillside/models/pull", post(routes::models::pull).route_layer(control()))
        .route(
            "/v1/hillside/models/import",
            post(routes::models::import).route_layer(control()).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/hillside/models/{name}", delete(routes::models::remove).route_layer(control()))
        .route("/v1/hillside/models/{name}/load", post(routes::models::load).route_layer(control()))
        .route("/v1/hillside/downloads", get(routes::models::downloads))
        .route("/v1/hillside/downloads/{name}", delete(routes::models::cancel).route_layer(control()))
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
        .allow_headers([
            axum::http::header::AUTHORIZATION,
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderName::from_static(control::HEADER),
        ]);
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
        .layer(axum::middleware::from_fn_with_state(app.clone(), host_check::require_own_host))
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
        let serving = draining.serving();
        let retiring: Vec<Arc<Serving>> =
            draining.retiring.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(|w| w.upgrade()).collect();
        for old in retiring {
            drop(tokio::task::spawn_blocking(move || old.scheduler().map(|s| s.shutdown(grace))));
        }
        match serving.scheduler().is_some() {
            true => drop(tokio::task::spawn_blocking(move || serving.scheduler().map(|s| s.shutdown(grace)))),
            false => drop(tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                draining.stopping.store(true, Ordering::Relaxed);
            })),
        }
    };
    let service = router(app.clone()).into_make_service_with_connect_info::<host_check::Connection>();
    axum::serve(listener, service).with_graceful_shutdown(signal).await?;
    // The connections are closed; make sure the worker is gone too (a no-op if it is).
    tokio::task::spawn_blocking(move || app.serving().scheduler().map(|s| s.shutdown(Duration::ZERO))).await.ok();
    Ok(())
}
