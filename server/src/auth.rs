//! The optional API key: `Authorization: Bearer <key>` (or `x-api-key`, as some clients send),
//! compared in constant time so response timing says nothing about the key.

use crate::error::ApiError;
use crate::App;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

pub async fn require_key(State(app): State<Arc<App>>, req: Request, next: Next) -> Result<Response, ApiError> {
    let Some(expected) = app.config.api_key.as_deref() else {
        return Ok(next.run(req).await);
    };
    let headers = req.headers();
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    match given {
        Some(key) if constant_time_eq(key.trim().as_bytes(), expected.as_bytes()) => Ok(next.run(req).await),
        _ => Err(ApiError::unauthorized()),
    }
}

/// Equality whose running time depends only on the lengths, not on where the bytes differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i).copied().unwrap_or(0), b.get(i).copied().unwrap_or(0));
        diff |= u64::from(std::hint::black_box(x ^ y));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn equal_only_when_identical() {
        assert!(constant_time_eq(b"sk-local", b"sk-local"));
        assert!(!constant_time_eq(b"sk-local", b"sk-locaX"));
        assert!(!constant_time_eq(b"sk-local", b"sk-local2"));
        assert!(!constant_time_eq(b"", b"x"));
        // A key padded with zero bytes is still a different key.
        assert!(!constant_time_eq(b"ab\0", b"ab"));
    }
}
