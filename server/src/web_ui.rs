//! The web UI at `/`: the files `ui/` builds, embedded at compile time (see `build.rs`), each
//! served with its type and a strict content-security policy: scripts, styles and requests
//! only from this origin, no eval, no frames. Vite's hashed assets are cached for good;
//! `index.html` never is, so a new build shows at the next load.

use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

mod built {
    include!(concat!(env!("OUT_DIR"), "/web_ui_files.rs"));
}

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// Whether the UI was built into this binary.
pub fn is_built() -> bool {
    built::FILES.iter().any(|(name, _)| *name == "index.html")
}

/// Whether `path` is one of the UI's own routes (the page and its files), which the router
/// sends to [`file`].
pub fn serves(path: &str) -> bool {
    path == "/" || path == "/favicon.svg" || path.starts_with("/assets/")
}

/// `GET /` and the UI's own files.
pub async fn file(uri: Uri) -> Response {
    let name = match uri.path().trim_start_matches('/') {
        "" => "index.html",
        name => name,
    };
    let Some((_, bytes)) = built::FILES.iter().find(|(n, _)| *n == name) else {
        if name == "index.html" {
            let why = "The web UI is not built into this binary: run `make ui` (it needs Node.js and npm), then build Hillside again.\n";
            return (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], why)
                .into_response();
        }
        return crate::ApiError::not_found(uri.path()).into_response();
    };
    let cache = if name.starts_with("assets/") { "public, max-age=31536000, immutable" } else { "no-cache" };
    let mut response = (StatusCode::OK, *bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(name)));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}
