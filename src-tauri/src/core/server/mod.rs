//! The endpoint the window shows: `hillside serve`'s server, started in this process on
//! 127.0.0.1. It takes the configured port (8080 by default) so that other tools find it; if
//! that port is taken it takes a free one and says so.

pub mod commands;

use anyhow::Context;
use hillside_common::serve::ServeArgs;
use hillside_server::ChosenPaths;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What the window may ask about the server.
#[derive(Debug, Clone, Serialize)]
pub struct ServerInfo {
    /// The server's address, without the control secret.
    pub url: String,
    /// Why the server is not on the configured port, for the window to show.
    pub notice: Option<String>,
}

/// The server, serving on a thread of its own until [`Running::stop`].
pub struct Running {
    pub url: String,
    /// The web UI's address with this run's control secret: what the window opens.
    pub ui_link: String,
    pub notice: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Loads the model and starts serving, as `hillside serve` would with `args`; the server
    /// reads local paths only from `chosen`.
    pub fn start(args: &ServeArgs, chosen: Arc<ChosenPaths>) -> anyhow::Result<Self> {
        let prepared = hillside_common::serve::prepare(args, Some(chosen))?;
        let wanted = hillside_common::serve::address(args);
        hillside_common::serve::check_exposure(wanted.ip(), prepared.config.api_key.is_some(), args.allow_no_key)?;
        let runtime = hillside_common::serve::runtime()?;
        let (listener, notice) = runtime.block_on(bind(wanted))?;
        let addr = listener.local_addr()?;
        let app = prepared.start().map_err(|e| match e.is_in_use() {
            true => anyhow::anyhow!("{e} (is another Hillside using it?)"),
            false => e.into(),
        })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let served = app.clone();
        let thread = std::thread::Builder::new().name("hillside-server".into()).spawn(move || {
            if let Err(e) = runtime.block_on(hillside_server::serve(listener, served, async {
                stopped.await.ok();
            })) {
                tracing::error!(error = %e, "the server stopped");
            }
        })?;
        let url = format!("http://{addr}/");
        let ui_link = app.ui_link(&url);
        Ok(Self { url, ui_link, notice, stop: Some(stop), thread: Some(thread) })
    }

    pub fn info(&self) -> ServerInfo {
        ServerInfo { url: self.url.clone(), notice: self.notice.clone() }
    }

    /// Stops taking requests, lets those under way finish (for the grace period), and returns
    /// once every sequence and its cold-pool file is gone. Idempotent.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds `wanted`, or a free port on the same address if it is taken (with the notice to show).
async fn bind(wanted: SocketAddr) -> anyhow::Result<(tokio::net::TcpListener, Option<String>)> {
    match tokio::net::TcpListener::bind(wanted).await {
        Ok(listener) => Ok((listener, None)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = tokio::net::TcpListener::bind(SocketAddr::new(wanted.ip(), 0))
                .await
                .with_context(|| format!("listening on {}", wanted.ip()))?;
            let port = listener.local_addr()?.port();
            let notice = format!("Port {} is taken (by another Hillside, or another program), so this window's endpoint is on port {port}.", wanted.port());
            Ok((listener, Some(notice)))
        }
        Err(e) => Err(e).with_context(|| format!("listening on {wanted}")),
    }
}

/// SIGINT or SIGTERM closes the app the way closing its window does.
pub fn exit_on_signal(app: tauri::AppHandle) {
    tauri::async_runtime::spawn(async move {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "cannot watch for SIGTERM"),
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        app.exit(0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_gives_another_and_says_so() {
        let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let taken = first.local_addr().unwrap();
        let (second, notice) = bind(taken).await.unwrap();
        assert_ne!(second.local_addr().unwrap().port(), taken.port());
        let notice = notice.expect("a notice");
        assert!(
            notice.contains(&taken.port().to_string())
                && notice.contains(&second.local_addr().unwrap().port().to_string()),
            "{notice}"
        );
        drop(first);
        let (free, none) = bind(taken).await.unwrap();
        assert_eq!((free.local_addr().unwrap(), none), (taken, None));
    }
}
