//! The JSON body extractor: a body not sent as `application/json` is a 415 (a browser sends
//! `text/plain` to any site without asking, so a JSON route that took it would be writable by
//! every web page), a body over the limit a 413, anything that is not the request type (bad
//! JSON, a wrong type) a 400 naming the field, all in OpenAI's error shape. Unknown fields are
//! ignored, as OpenAI's clients send fields a local server may not know. Path and query
//! parameters that do not parse (`/conversations/-1`) are 400s in the same shape.

use crate::error::ApiError;
use crate::types::SamplingFields;
use crate::App;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::sync::Arc;

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<App>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<App>) -> Result<Self, ApiError> {
        require_json(req.headers())?;
        let limit = state.config.max_body_bytes;
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::body_too_large(limit)
            } else {
                ApiError::bad_request(format!("could not read the request body: {rejection}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// A path's parameters.
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<Arc<App>> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<App>) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| Self(v))
            .map_err(|rejection| ApiError::bad_request(format!("invalid path: {}", rejection.body_text())))
    }
}

/// A request's query parameters.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<Arc<App>> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<App>) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Self(v))
            .map_err(|rejection| ApiError::bad_request(format!("invalid query: {}", rejection.body_text())))
    }
}

/// `Ok` when the body is declared JSON (`application/json`, with parameters or not, or a
/// `+json` type).
pub fn require_json(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let given = headers.get(axum::http::header::CONTENT_TYPE).map_or("", |v| v.to_str().unwrap_or("(not text)"));
    let essence = given.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json")) {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(if given.is_empty() { "none" } else { given }))
    }
}

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let (mut path, mut message) = (e.path().to_string(), e.into_inner().to_string());
        if path == "." {
            // Fields flattened in from the shared sampling fields lose their path (serde
            // buffers them); checking those fields alone finds it again.
            if let Err(inner) = serde_path_to_error::deserialize::<_, SamplingFields>(&value) {
                (path, message) = (inner.path().to_string(), inner.into_inner().to_string());
            }
        }
        if path == "." {
            ApiError::bad_request(format!("invalid request: {message}"))
        } else {
            ApiError::bad_request(format!("invalid value for '{path}': {message}")).with_param(path)
        }
    })
}
