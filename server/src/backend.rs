//! The engine a server is started on: Hillside's own or an OpenAI-compatible one elsewhere
//! (vLLM, llama.cpp's server), which it serves through one front
//! ([`hillside_front::EngineFront`]). The routes above it (documents, conversations, the UI) are
//! the same on either; those that show the local engine's insides (KV tiers, sequences) say
//! plainly that a remote one has none, and a remote's failures reach clients as its errors.

use crate::error::ApiError;
use axum::http::StatusCode;
use hillside_engine::Engine;
use hillside_front::EngineFront;
use hillside_remote::{RemoteEngine, RemoteError};
use std::sync::Arc;

/// What a server is started on.
pub enum EngineChoice {
    Local(Arc<Engine>),
    Remote(Arc<RemoteEngine>),
}

impl From<Arc<Engine>> for EngineChoice {
    fn from(engine: Arc<Engine>) -> Self {
        Self::Local(engine)
    }
}

impl From<Arc<RemoteEngine>> for EngineChoice {
    fn from(remote: Arc<RemoteEngine>) -> Self {
        Self::Remote(remote)
    }
}

/// What a route that needs Hillside's own engine answers on a remote one.
pub fn needs_local_engine(front: &EngineFront) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "invalid_request_error",
        Some("engine_is_remote"),
        format!("This server runs on the remote engine {}: KV tiers, sequences and token ids belong to Hillside's own engine (start it without --engine to see them).", front.name()),
    )
}

/// A remote engine's failure, as this server's clients see it.
pub fn remote_error(e: RemoteError) -> ApiError {
    let message = e.to_string();
    match e {
        // What the remote refused as malformed is the request's fault.
        RemoteError::Refused { status: 400 | 413 | 422, .. } => {
            ApiError::bad_request(message).with_code("remote_engine_refused")
        }
        RemoteError::Busy { .. } => {
            let mut busy =
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("remote_engine_busy"), message);
            busy.retry_after_s = Some(5);
            busy
        }
        RemoteError::Endpoint(_) => ApiError::internal(message),
        _ => ApiError::new(StatusCode::BAD_GATEWAY, "server_error", Some("remote_engine_failed"), message),
    }
}
