//! What decides where data goes or what runs — the settings (the engine's URL and key, the model,
//! the cold-pool folder, the API key itself) and the models on disk and loaded — changes only
//! for a request that carries a secret a stranger cannot have: the API key where one is set
//! (the key check has then passed already), else this run's control secret. The secret is made
//! at start, printed in the web UI's link (`#secret=…`, a fragment browsers never send) and handed
//! to the desktop window; the page sends it back as `X-Hillside-Control`. A local process of
//! another user, a machine on the network or a page that rebinds its name to this machine cannot
//! read it, and a cross-site form cannot send a custom header.

use crate::error::ApiError;
use crate::App;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// The header the control secret travels in.
pub const HEADER: &str = "x-hillside-control";

/// A fresh secret for one run: 256 random bits, as hex.
pub fn new_secret() -> String {
    rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect()
}

pub async fn require_control(State(app): State<Arc<App>>, req: Request, next: Next) -> Result<Response, ApiError> {
    if app.config.api_key.is_some() {
        return Ok(next.run(req).await);
    }
    let given = req.headers().get(HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    match crate::auth::constant_time_eq(given.trim().as_bytes(), app.control_secret.as_bytes()) {
        true => Ok(next.run(req).await),
        false => {
            tracing::warn!(method = %req.method(), path = req.uri().path(), "refused a change without the control secret");
            Err(ApiError::control_secret_needed())
        }
    }
}
