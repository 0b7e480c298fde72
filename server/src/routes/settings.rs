//! `/v1/hillside/settings`: the settings page reads and writes the config file the CLI reads.
//! A change is checked first (a 400 naming the field and why) and applies at the next start.

use crate::error::{ApiError, ErrorBody};
use crate::extract::JsonBody;
use crate::App;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use hillside_config::settings::{self, Settings};
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct SettingsReport {
    /// The config file.
    pub path: String,
    pub settings: Settings,
    /// Set once, when the API key was just turned on: the new key, to copy now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_api_key: Option<String>,
}

fn path(app: &App) -> Result<&std::path::Path, ApiError> {
    app.config.settings_file.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("settings_off"),
            "This server was started without a config file to edit.",
        )
    })
}

#[utoipa::path(get, path = "/v1/hillside/settings",
    responses((status = 200, description = "The config file's settings", body = SettingsReport), (status = 500, description = "The file cannot be read", body = ErrorBody)))]
pub async fn get(State(app): State<Arc<App>>) -> Result<Json<SettingsReport>, ApiError> {
    let path = path(&app)?;
    let file = hillside_config::read(path)?;
    Ok(Json(SettingsReport { path: path.display().to_string(), settings: Settings::of(&file), new_api_key: None }))
}

#[utoipa::path(put, path = "/v1/hillside/settings", request_body = Settings,
    responses((status = 200, description = "Saved; applies at the next start", body = SettingsReport),
        (status = 400, description = "A field is wrong: `param` names it", body = ErrorBody)))]
pub async fn put(
    State(app): State<Arc<App>>,
    JsonBody(wanted): JsonBody<Settings>,
) -> Result<Json<SettingsReport>, ApiError> {
    let path = path(&app)?.to_path_buf();
    let shown = path.display().to_string();
    wanted
        .check(&app.installed_models())
        .map_err(|(field, why)| ApiError::bad_request(why).with_param(field).with_code("invalid_setting"))?;
    let written = wanted.clone();
    let new_api_key = tokio::task::spawn_blocking(move || settings::write(&path, &written))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(SettingsReport { path: shown, settings: wanted, new_api_key }))
}
