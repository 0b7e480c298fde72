//! The server's commands: the only thing the page asks the app directly (its chat and
//! documents go over HTTP, as in a browser).

use super::ServerInfo;
use crate::core::state::AppState;

/// Where the server is, and why it is not on the configured port if it is not.
#[tauri::command]
pub fn server_info(state: tauri::State<'_, AppState>) -> ServerInfo {
    state.server_info()
}
