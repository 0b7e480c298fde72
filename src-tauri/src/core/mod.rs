//! The app, after Jan's layout: one managed state ([`state::AppState`]) and a module per domain,
//! each with its commands — `server` (the in-process endpoint), `files` (files dropped on the
//! window, which become the only local paths the server reads).

pub mod files;
pub mod server;
pub mod state;

use anyhow::Context;
use clap::Parser;
use hillside_common::serve::ServeArgs;
use hillside_server::ChosenPaths;
use state::AppState;
use std::path::PathBuf;
use std::sync::Arc;
use tauri::{DragDropEvent, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder, WindowEvent};

/// The same flags as `hillside serve` (and the same config file).
#[derive(Parser)]
#[command(name = "hillside-desktop", version, about = "Hillside's desktop app")]
pub(crate) struct DesktopArgs {
    /// Config file [default: ~/.config/hillside/config.toml, if it exists].
    #[arg(long, env = "HILLSIDE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
}

pub fn run() -> anyhow::Result<()> {
    let args = DesktopArgs::parse();
    hillside_config::load(args.config.as_deref())?;
    let chosen = Arc::new(ChosenPaths::default());
    let server = server::Running::start(&args.serve, chosen.clone())?;
    // Printed for people and for the tests, which read the address from here.
    println!("hillside-desktop: serving on {}", server.url);
    if let Some(notice) = &server.notice {
        println!("hillside-desktop: {notice}");
    }
    // The window opens the page with this run's control secret, so its settings and models work.
    let url = server.ui_link.parse().context("the server's URL")?;
    let app = tauri::Builder::default()
        .manage(AppState::new(server, chosen))
        .invoke_handler(tauri::generate_handler![server::commands::server_info])
        .setup(move |app| {
            let window = WebviewWindowBuilder::new(app, "main", WebviewUrl::External(url))
                .title("Hillside")
                .inner_size(1100.0, 760.0)
                .min_inner_size(800.0, 600.0)
                .build()?;
            let handle = app.handle().clone();
            window.on_window_event(move |event| {
                if let WindowEvent::DragDrop(DragDropEvent::Drop { paths, .. }) = event {
                    files::dropped(&handle, paths);
                }
            });
            server::exit_on_signal(app.handle().clone());
            Ok(())
        })
        .build(tauri::generate_context!())
        .context("starting the window")?;
    app.run(|app, event| {
        if let RunEvent::Exit = event {
            // Finishes or cancels what is running and removes every cold-pool file.
            app.state::<AppState>().stop_server();
        }
    });
    Ok(())
}
