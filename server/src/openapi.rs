//! `GET /openapi.json`, generated from the route annotations and the wire types.

use crate::routes::{chat, completions, conversations, documents, info, settings};
use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Hillside", description = "A local, OpenAI-compatible endpoint for long documents"),
    paths(
        chat::chat_completions,
        completions::completions,
        info::models,
        info::model,
        info::health,
        info::sequences,
        info::tiers,
        info::config,
        settings::get,
        settings::put,
        conversations::list,
        conversations::create,
        conversations::get,
        conversations::change,
        conversations::delete,
        documents::add,
        documents::list,
        documents::get,
        documents::delete,
        documents::summary,
        documents::text,
    ),
    components(schemas(crate::types::ChatCompletionChunk, crate::types::ChatExtension))
)]
struct ApiDoc;

pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
