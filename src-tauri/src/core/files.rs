//! Files dropped on the window: the server may read exactly these (the user chose them), and
//! the page is told their paths, which it adds through the same documents API a browser uses.

use super::state::AppState;
use serde::Serialize;
use std::path::PathBuf;
use tauri::{Emitter, Manager};

/// The event the page listens for (see `ui/src/desktop.ts`).
pub const FILES_DROPPED: &str = "hillside://files-dropped";

#[derive(Debug, Clone, Serialize)]
struct Dropped {
    paths: Vec<PathBuf>,
}

pub fn dropped(app: &tauri::AppHandle, paths: &[PathBuf]) {
    let files = choose(&app.state::<AppState>().chosen, paths);
    if !files.is_empty() {
        if let Err(e) = app.emit_to("main", FILES_DROPPED, Dropped { paths: files }) {
            tracing::warn!(error = %e, "cannot tell the window about dropped files");
        }
    }
}

/// Lets the server read the regular files among `paths` (folders are not taken whole); returns them.
pub fn choose(chosen: &hillside_server::ChosenPaths, paths: &[PathBuf]) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = paths.iter().filter(|p| p.is_file()).cloned().collect();
    for file in &files {
        chosen.choose(file);
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::server::Running;
    use crate::core::DesktopArgs;
    use clap::Parser;
    use hillside_server::ChosenPaths;
    use std::sync::Arc;

    /// What a drop does, without the window: the dropped file becomes readable by the server the
    /// app started, through the documents API the page uses; anything else stays refused.
    #[test]
    fn a_dropped_file_reaches_the_documents_api_and_nothing_else_does() {
        let scratch = tempfile::Builder::new().prefix("hillside-desktop-drop-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(dir.join("folder")).unwrap();
        let (file, other) = (dir.join("notes.md"), dir.join("other.md"));
        std::fs::write(&file, "# Rivers\n\nThe valley has two rivers that meet at the mill.\n").unwrap();
        std::fs::write(&other, "# Not chosen\n").unwrap();
        let args = DesktopArgs::parse_from([
            "hillside-desktop",
            "--port",
            "0",
            "--context",
            "2048",
            "--documents-dir",
            dir.join("data").to_str().unwrap(),
        ]);
        let chosen = Arc::new(ChosenPaths::default());
        let mut server = Running::start(&args.serve, chosen.clone()).unwrap();

        assert_eq!(choose(&chosen, &[file.clone(), dir.join("folder"), dir.join("missing.md")]), vec![file.clone()]);
        let add = |path: &std::path::Path| {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut r = agent
                .post(&format!("{}v1/hillside/documents", server.url))
                .send_json(serde_json::json!({ "path": path }))
                .unwrap();
            (r.status().as_u16(), r.body_mut().read_json::<serde_json::Value>().unwrap())
        };
        let (status, added) = add(&file);
        assert_eq!(
            (status, added["name"].as_str(), added["mode"].as_str()),
            (201, Some("notes.md"), Some("whole")),
            "{added}"
        );
        let (status, refused) = add(&other);
        assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("path_not_chosen")), "{refused}");

        // The window opens the page with this run's secret: its changes to models pass, another
        // program's (without it) do not.
        let secret = server.ui_link.split("#secret=").nth(1).expect("the window's link carries the secret");
        let cancel = |secret: Option<&str>| {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut request = agent.delete(&format!("{}v1/hillside/downloads/nothing", server.url));
            if let Some(secret) = secret {
                request = request.header("X-Hillside-Control", secret);
            }
            request.call().unwrap().status().as_u16()
        };
        assert_eq!((cancel(None), cancel(Some(secret))), (403, 404), "no such download, once allowed to ask");
        server.stop();
    }
}
