//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the status
//! each one deserves, so clients' own error handling (and retries) work unchanged.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hillside_engine::scheduler::SubmitError;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The errors a generation request can meet, for the OpenAPI document.
#[allow(dead_code)] // only its derived description is used
#[derive(utoipa::IntoResponses)]
pub enum GenerationErrors {
    /// Invalid request, or the prompt does not fit the context
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// Missing or wrong API key
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// A web page on another site sent it through the user's browser (`Origin` or
    /// `Sec-Fetch-Site`), or a request from this machine addressed to another host
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// Unknown model
    #[response(status = 404)]
    UnknownModel(ErrorBody),
    /// Body over the limit
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The body is not sent as `Content-Type: application/json`
    #[response(status = 415)]
    NotJson(ErrorBody),
    /// Queue full (see Retry-After)
    #[response(status = 429)]
    QueueFull(ErrorBody),
    /// An internal error (a bug), or a cold-pool I/O error
    #[response(status = 500)]
    Internal(ErrorBody),
    /// Shutting down, or the engine stopped after an internal error (see Retry-After)
    #[response(status = 503)]
    Unavailable(ErrorBody),
    /// The cold pool's disk is full
    #[response(status = 507)]
    InsufficientStorage(ErrorBody),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: ErrorDetail,
    /// Seconds a client should wait before retrying (429/503).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self { status, detail: ErrorDetail { message: message.into(), kind, param: None, code }, retry_after_s: None }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", None, message)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.detail.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.detail.code = Some(code);
        self
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'.",
        )
    }

    pub fn foreign_host(host: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            Some("foreign_host"),
            format!("This server answers only requests addressed to it (Host: localhost, 127.0.0.1, the address it listens on, or a name given with --allowed-host), not to '{host}'."),
        )
    }

    pub fn control_secret_needed() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            Some("control_secret_needed"),
            "Changing settings or models needs this run's secret: open the web UI from the link Hillside printed when it started (or the desktop app), or send the API key if one is set.",
        )
    }

    pub fn cross_site(from: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            Some("cross_site_request"),
            format!("Requests from web pages on other sites are refused (this one came from {from}); start the server with --cors-origin to allow a site."),
        )
    }

    pub fn unsupported_media_type(given: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            Some("unsupported_media_type"),
            format!("This route takes a JSON body sent as 'Content-Type: application/json', not '{given}'."),
        )
    }

    pub fn model_not_found(model: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("The model '{model}' does not exist here; this server runs '{served}' (see GET /v1/models)."),
        )
        .with_param("model")
    }

    /// An installed model that another one is serving in place of.
    pub fn model_not_loaded(model: &str, served: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("model_not_loaded"),
            format!("The model '{model}' is installed but not loaded; this server runs '{served}'. Switch to it with POST /v1/hillside/models/{model}/load (the app's Models page does), then ask again."),
        )
        .with_param("model")
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            format!("No route {path}; see GET /openapi.json."),
        )
    }

    pub fn method_not_allowed(method: &axum::http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            Some("method_not_allowed"),
            format!("{path} does not take {method}; see GET /openapi.json."),
        )
    }

    pub fn body_too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("The request body is larger than the server's limit of {limit_bytes} bytes."),
        )
    }

    pub fn context_exceeded(prompt_tokens: usize, max_tokens: Option<usize>, context_tokens: usize) -> Self {
        let asked = match max_tokens {
            Some(m) => format!("{prompt_tokens} tokens in the prompt and {m} requested for the completion"),
            None => format!("{prompt_tokens} tokens in the prompt"),
        };
        Self::bad_request(format!("This model's maximum context length is {context_tokens} tokens, but the request has {asked}. Shorten the prompt or lower max_tokens."))
            .with_code("context_length_exceeded")
            .with_param("messages")
    }

    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("shutting_down"),
            "The server is shutting down.",
        );
        e.retry_after_s = Some(5);
        e
    }

    /// A failure on the server's side: 507 when more disk space would have avoided it, else 500.
    fn server_side(storage_full: bool, message: String) -> Self {
        match storage_full {
            true => Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", Some("insufficient_storage"), message),
            false => Self::internal(message),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, message)
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: self.detail.clone() }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull { .. } => {
                let mut err =
                    Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("queue_full"), e.to_string());
                err.retry_after_s = Some(1);
                err
            }
            SubmitError::ShuttingDown => Self::shutting_down(),
            SubmitError::EngineFailed(_) => {
                let mut err =
                    Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("engine_failed"), e.to_string());
                err.retry_after_s = Some(30);
                err
            }
        }
    }
}

impl From<hillside_engine::Error> for ApiError {
    fn from(e: hillside_engine::Error) -> Self {
        use hillside_engine::Error as E;
        match e {
            E::ContextOverflow { prompt_tokens, context_tokens } => {
                Self::context_exceeded(prompt_tokens, None, context_tokens)
            }
            E::InvalidParameter(m) => Self::bad_request(m),
            E::ChatTemplate(m) => Self::bad_request(format!("the messages do not fit the model's chat template: {m}"))
                .with_param("messages"),
            other => Self::server_side(other.is_storage_full(), other.to_string()),
        }
    }
}

impl From<hillside_documents::StoreError> for ApiError {
    fn from(e: hillside_documents::StoreError) -> Self {
        tracing::error!(error = %e, "store");
        Self::server_side(e.is_storage_full(), e.to_string())
    }
}

impl From<hillside_config::ConfigFileError> for ApiError {
    fn from(e: hillside_config::ConfigFileError) -> Self {
        Self::server_side(e.is_storage_full(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hillside_engine::Error;

    #[test]
    fn a_full_disk_under_a_store_is_507_and_other_store_failures_500() {
        use hillside_documents::StoreError;
        let io = |kind: std::io::ErrorKind| StoreError::new("document library", redb::StorageError::Io(kind.into()));
        let full = ApiError::from(io(std::io::ErrorKind::StorageFull));
        assert_eq!((full.status, full.detail.code), (StatusCode::INSUFFICIENT_STORAGE, Some("insufficient_storage")));
        assert!(full.detail.message.starts_with("document library: "), "{}", full.detail.message);
        assert_eq!(ApiError::from(io(std::io::ErrorKind::PermissionDenied)).status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_config_file_that_cannot_be_saved_for_a_full_disk_is_507() {
        use hillside_config::ConfigFileError;
        let write =
            |kind: std::io::ErrorKind| ConfigFileError::Write { path: "/x/config.toml".into(), source: kind.into() };
        let full = ApiError::from(write(std::io::ErrorKind::StorageFull));
        assert_eq!((full.status, full.detail.code), (StatusCode::INSUFFICIENT_STORAGE, Some("insufficient_storage")));
        assert!(full.detail.message.contains("/x/config.toml"), "{}", full.detail.message);
        assert_eq!(
            ApiError::from(write(std::io::ErrorKind::PermissionDenied)).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn engine_errors_keep_their_kind_in_the_status() {
        let io = |kind: std::io::ErrorKind| Error::ColdIo { what: "write failed".into(), source: kind.into() };
        let full = ApiError::from(io(std::io::ErrorKind::StorageFull));
        assert_eq!((full.status, full.detail.code), (StatusCode::INSUFFICIENT_STORAGE, Some("insufficient_storage")));
        assert!(full.detail.message.contains("disk is full"), "{}", full.detail.message);
        assert_eq!(ApiError::from(io(std::io::ErrorKind::Other)).status, StatusCode::INTERNAL_SERVER_ERROR);
        let damaged = ApiError::from(Error::ColdBlockDamaged { layer: 3, head: 1, tokens: 32..48 });
        assert_eq!(damaged.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(damaged.detail.message.contains("layer 3, KV head 1, tokens 32..48"), "{}", damaged.detail.message);
        let failed = ApiError::from(SubmitError::EngineFailed("index out of bounds".into()));
        assert_eq!((failed.status, failed.retry_after_s), (StatusCode::SERVICE_UNAVAILABLE, Some(30)));
    }
}
