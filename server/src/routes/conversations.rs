//! `/v1/hillside/conversations`: the UI's chat history (list with search, create, show, change,
//! delete), kept in the data folder so it survives a restart.

use crate::conversations::{Conversation, ConversationChange, ConversationSummary, Conversations};
use crate::error::{ApiError, ErrorBody};
use crate::extract::JsonBody;
use crate::App;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, IntoParams)]
pub struct Search {
    /// Only conversations whose title or messages hold this text (any case).
    pub q: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ConversationList {
    pub data: Vec<ConversationSummary>,
}

fn store(app: &App) -> Result<&Conversations, ApiError> {
    app.conversations.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("conversations_off"),
            "This server keeps no conversations (it was started without a data folder).",
        )
    })
}

fn missing(id: u64) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("conversation_not_found"),
        format!("There is no conversation {id}."),
    )
}

#[utoipa::path(get, path = "/v1/hillside/conversations", params(Search),
    responses((status = 200, description = "Conversations, the most recently changed first", body = ConversationList)))]
pub async fn list(
    State(app): State<Arc<App>>,
    Query(search): Query<Search>,
) -> Result<Json<ConversationList>, ApiError> {
    Ok(Json(ConversationList { data: store(&app)?.list(search.q.as_deref()).map_err(ApiError::internal)? }))
}

#[utoipa::path(post, path = "/v1/hillside/conversations", request_body = ConversationChange,
    responses((status = 201, description = "Created", body = Conversation), (status = 400, description = "Invalid body", body = ErrorBody)))]
pub async fn create(
    State(app): State<Arc<App>>,
    JsonBody(change): JsonBody<ConversationChange>,
) -> Result<(StatusCode, Json<Conversation>), ApiError> {
    Ok((StatusCode::CREATED, Json(store(&app)?.create(change).map_err(ApiError::internal)?)))
}

#[utoipa::path(get, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")),
    responses((status = 200, description = "The conversation", body = Conversation), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn get(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Result<Json<Conversation>, ApiError> {
    store(&app)?.get(id).map_err(ApiError::internal)?.map(Json).ok_or_else(|| missing(id))
}

#[utoipa::path(patch, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")), request_body = ConversationChange,
    responses((status = 200, description = "Changed", body = Conversation), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn change(
    State(app): State<Arc<App>>,
    Path(id): Path<u64>,
    JsonBody(change): JsonBody<ConversationChange>,
) -> Result<Json<Conversation>, ApiError> {
    store(&app)?.update(id, change).map_err(ApiError::internal)?.map(Json).ok_or_else(|| missing(id))
}

#[utoipa::path(delete, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn delete(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Result<StatusCode, ApiError> {
    if store(&app)?.delete(id).map_err(ApiError::internal)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(missing(id))
    }
}
