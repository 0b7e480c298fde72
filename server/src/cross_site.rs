//! Requests that a web page on another site makes through the user's browser are refused before
//! any work. A browser lets any page send "simple" requests anywhere without asking the server
//! first — a POST of `text/plain`, a form, a multipart upload — and while the page cannot read
//! the answer, the request still does its work: a conversation written, a document added, the
//! model kept busy. Browsers say where such a request comes from (`Origin`, and `Sec-Fetch-Site`
//! in current ones); clients outside a browser (curl, the OpenAI SDKs) send neither.
//!
//! So a request passes when its `Origin` is this server's own (the web UI, the desktop window,
//! which shows the same page) or one the user allowed with `--cors-origin`, or when it has no
//! `Origin` and is not marked `cross-site`. A link to the web UI from another site still opens
//! it: a top-level navigation to the UI's own files is let through (the page cannot read it,
//! and it changes nothing).

use crate::error::ApiError;
use crate::{App, StartError};
use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// The origins a browser page may call this server from, besides its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// Only the server's own origin.
    #[default]
    Own,
    /// These too (`--cors-origin`), normalised by [`normalise`].
    List(Vec<String>),
    /// Any origin (`--cors-origin '*'`): the user turned the protection off on purpose.
    Any,
}

impl AllowedOrigins {
    /// From the configured origins; `Err` names one that is not an origin (`scheme://host[:port]`).
    pub fn parse(configured: &[String]) -> Result<Self, StartError> {
        if configured.iter().any(|o| o.trim() == "*") {
            return Ok(Self::Any);
        }
        if configured.is_empty() {
            return Ok(Self::Own);
        }
        configured
            .iter()
            .map(|o| {
                let n = normalise(o);
                let valid = n.split_once("://").is_some_and(|(scheme, host)| {
                    !scheme.is_empty() && !host.is_empty() && !host.contains(['/', ' ', '?', '#'])
                });
                if valid {
                    Ok(n)
                } else {
                    Err(StartError::NotAnOrigin(o.clone()))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self::List)
    }

    fn allows(&self, origin: &str) -> bool {
        match self {
            Self::Own => false,
            Self::List(list) => list.iter().any(|o| o == origin),
            Self::Any => true,
        }
    }
}

/// An origin as browsers send it, for comparison: lower case, no trailing slash.
fn normalise(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

pub async fn refuse_cross_site(State(app): State<Arc<App>>, req: Request, next: Next) -> Result<Response, ApiError> {
    match verdict(req.headers(), req.method(), req.uri().path(), &app.allowed_origins) {
        Ok(()) => Ok(next.run(req).await),
        Err(from) => {
            tracing::warn!(from, method = %req.method(), path = req.uri().path(), "refused a cross-site request");
            Err(ApiError::cross_site(&from))
        }
    }
}

/// `Err(where it came from)` for a request a page on another site made.
fn verdict(headers: &HeaderMap, method: &Method, path: &str, allowed: &AllowedOrigins) -> Result<(), String> {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("(not text)"));
    if let Some(origin) = header(ORIGIN.as_str()) {
        let origin = normalise(origin);
        let own = header(HOST.as_str())
            .map(|host| host.to_ascii_lowercase())
            .is_some_and(|host| origin == format!("http://{host}") || origin == format!("https://{host}"));
        return if own || allowed.allows(&origin) { Ok(()) } else { Err(origin) };
    }
    let cross_site = header("sec-fetch-site").is_some_and(|site| site.eq_ignore_ascii_case("cross-site"));
    let opens_the_ui = matches!(*method, Method::GET | Method::HEAD)
        && header("sec-fetch-mode").is_some_and(|mode| mode.eq_ignore_ascii_case("navigate"))
        && crate::web_ui::serves(path);
    if cross_site && !opens_the_ui && !matches!(allowed, AllowedOrigins::Any) {
        return Err("another site (Sec-Fetch-Site: cross-site)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn check(
        pairs: &[(&'static str, &str)],
        method: Method,
        path: &str,
        allowed: &AllowedOrigins,
    ) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:8080"));
        for (k, v) in pairs {
            headers.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        verdict(&headers, &method, path, allowed)
    }

    #[test]
    fn the_servers_own_origin_and_clients_without_one_pass() {
        let own = AllowedOrigins::Own;
        assert_eq!(check(&[("origin", "http://127.0.0.1:8080")], Method::POST, "/v1/chat/completions", &own), Ok(()));
        assert_eq!(
            check(
                &[("origin", "HTTP://127.0.0.1:8080/"), ("sec-fetch-site", "same-origin")],
                Method::POST,
                "/v1/chat/completions",
                &own
            ),
            Ok(())
        );
        assert_eq!(check(&[], Method::POST, "/v1/chat/completions", &own), Ok(()), "curl and SDKs send no Origin");
        assert_eq!(check(&[("sec-fetch-site", "none")], Method::GET, "/", &own), Ok(()), "typed in the address bar");
    }

    #[test]
    fn other_origins_and_cross_site_fetches_are_refused() {
        let own = AllowedOrigins::Own;
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:8081",
            "http://localhost:8080",
            "https://127.0.0.1:8080.evil.example",
        ] {
            assert!(
                check(&[("origin", origin)], Method::POST, "/v1/hillside/conversations", &own).is_err(),
                "{origin}"
            );
        }
        assert!(check(&[("sec-fetch-site", "cross-site")], Method::POST, "/v1/hillside/conversations", &own).is_err());
        assert!(check(
            &[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")],
            Method::GET,
            "/v1/models",
            &own
        )
        .is_err());
        // A link from another site to the web UI opens it; the API stays refused even so.
        assert_eq!(
            check(&[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")], Method::GET, "/", &own),
            Ok(())
        );
        assert!(check(
            &[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")],
            Method::GET,
            "/v1/hillside/conversations",
            &own
        )
        .is_err());
        assert!(check(&[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")], Method::POST, "/", &own)
            .is_err());
    }

    #[test]
    fn allowed_origins_are_the_users_choice() {
        let list = AllowedOrigins::parse(&["http://localhost:3000/".into()]).unwrap();
        assert_eq!(
            check(
                &[("origin", "http://localhost:3000"), ("sec-fetch-site", "cross-site")],
                Method::POST,
                "/v1/chat/completions",
                &list
            ),
            Ok(())
        );
        assert!(check(&[("origin", "http://localhost:3001")], Method::POST, "/v1/chat/completions", &list).is_err());
        let any = AllowedOrigins::parse(&["http://a.example".into(), "*".into()]).unwrap();
        assert_eq!(any, AllowedOrigins::Any);
        assert_eq!(check(&[("origin", "http://evil.example")], Method::POST, "/v1/chat/completions", &any), Ok(()));
        assert_eq!(AllowedOrigins::parse(&[]).unwrap(), AllowedOrigins::Own);
        for bad in ["localhost:3000", "http://", "http://a.example/path", ""] {
            assert!(AllowedOrigins::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
