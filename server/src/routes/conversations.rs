//! `/v1/hillside/conversations`: the UI's chat history (list with search, create, show, change,
//! delete), kept in the data folder so it survives a restart.

use crate::conversations::{Conversation, ConversationChange, ConversationSummary, Conversations};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::App;
use axum::extract::State;
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
    QueryParams(search): QueryParams<Search>,
) -> Result<Json<ConversationList>, ApiError> {
    Ok(Json(ConversationList { data: store(&app)?.list(search.q.as_deref())? }))
}

#[utoipa::path(post, path = "/v1/hillside/conversations", request_body = ConversationChange,
    responses((status = 201, description = "Created", body = Conversation), (status = 400, description = "Invalid body", body = ErrorBody)))]
pub async fn create(
    State(app): State<Arc<App>>,
    JsonBody(change): JsonBody<ConversationChange>,
) -> Result<(StatusCode, Json<Conversation>), ApiError> {
    check_meta(&change)?;
    Ok((StatusCode::CREATED, Json(store(&app)?.create(change)?)))
}

#[utoipa::path(get, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")),
    responses((status = 200, description = "The conversation", body = Conversation), (status = 400, description = "The id is not a conversation id (a whole number)", body = ErrorBody), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn get(State(app): State<Arc<App>>, PathParams(id): PathParams<u64>) -> Result<Json<Conversation>, ApiError> {
    store(&app)?.get(id)?.map(Json).ok_or_else(|| missing(id))
}

#[utoipa::path(patch, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")), request_body = ConversationChange,
    responses((status = 200, description = "Changed", body = Conversation), (status = 400, description = "The id is not a conversation id (a whole number)", body = ErrorBody), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn change(
    State(app): State<Arc<App>>,
    PathParams(id): PathParams<u64>,
    JsonBody(change): JsonBody<ConversationChange>,
) -> Result<Json<Conversation>, ApiError> {
    check_meta(&change)?;
    store(&app)?.update(id, change)?.map(Json).ok_or_else(|| missing(id))
}

#[utoipa::path(delete, path = "/v1/hillside/conversations/{id}", params(("id" = u64, Path, description = "Conversation id")),
    responses((status = 204, description = "Deleted"), (status = 400, description = "The id is not a conversation id (a whole number)", body = ErrorBody), (status = 404, description = "No such conversation", body = ErrorBody)))]
pub async fn delete(State(app): State<Arc<App>>, PathParams(id): PathParams<u64>) -> Result<StatusCode, ApiError> {
    if store(&app)?.delete(id)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(missing(id))
    }
}

/// A message's `meta` is an object or null, as the schema says.
fn check_meta(change: &ConversationChange) -> Result<(), ApiError> {
    match change.messages.iter().flatten().position(|m| m.meta.as_ref().is_some_and(|v| !v.is_object() && !v.is_null()))
    {
        Some(i) => {
            Err(ApiError::bad_request("a message's meta is an object or null")
                .with_param(format!("messages[{i}].meta")))
        }
        None => Ok(()),
    }
}
