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

/// Extractors of a request's parts whose rejection is a 400 in the API's shape.
macro_rules! parts_in_api_shape {
    ($(#[$doc:meta])* $name:ident from $axum:ident, $what:literal) => {
        $(#[$doc])*
        pub struct $name<T>(pub T);

        impl<T: DeserializeOwned + Send> FromRequestParts<Arc<App>> for $name<T> {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &Arc<App>) -> Result<Self, ApiError> {
                axum::extract::$axum::<T>::from_request_parts(parts, state)
                    .await
                    .map(|axum::extract::$axum(v)| Self(v))
                    .map_err(|rejection| ApiError::bad_request(format!(concat!("invalid ", $what, ": {}"), rejection.body_text())))
            }
        }
    };
}

parts_in_api_shape!(
    /// A path's parameters.
    PathParams from Path, "path"
);
parts_in_api_shape!(
    /// A request's query parameters.
    QueryParams from Query, "query"
);

/// JSON has one kind of number, and to JSON Schema (so to the published document) `5.0` is the
/// integer 5: a whole number written with a fraction becomes an integer before the request type
/// reads it (float fields take integers as they are).
fn whole_numbers_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    // Beyond 2^53 a float no longer holds every whole number exactly.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() <= EXACT {
                *n = if f >= 0.0 { (f as u64).into() } else { (f as i64).into() };
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
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
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    whole_numbers_as_integers(&mut value);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Counted {
        n: usize,
        share: f32,
    }

    #[test]
    fn a_whole_number_with_a_fraction_reads_as_an_integer_and_a_fraction_does_not() {
        let counted: Counted = parse(br#"{"n": 5.0, "share": 1}"#).unwrap();
        assert_eq!((counted.n, counted.share), (5, 1.0));
        let refused = parse::<Counted>(br#"{"n": 5.5, "share": 0.5}"#).unwrap_err();
        assert_eq!(refused.detail.param.as_deref(), Some("n"), "{:?}", refused.detail);
        assert!(parse::<Counted>(br#"{"n": -1.0, "share": 0.5}"#).is_err(), "still not a usize");
        assert!(parse::<Counted>(br#"{"n": 1e300, "share": 0.5}"#).is_err(), "too large to be exact");
    }
}
