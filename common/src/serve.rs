//! `hillside serve`: the local OpenAI-compatible endpoint over the loaded model.

use crate::engine_choice::EngineArgs;
use crate::shelf::Shelf;
use crate::{load_engine, models, DocumentsArgs, ModelArgs};
use anyhow::{Context, Result};
use clap::Args;
use hillside_config::ServerFile;
use hillside_engine::scheduler::SchedulerConfig;
use hillside_server::shelf::ModelShelf;
use hillside_server::{App, ChosenPaths, EngineChoice, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub documents: DocumentsArgs,
    /// Address to listen on; anything but loopback exposes the model to the network
    /// [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// Port (0 picks a free one; the address is printed) [default: 8080].
    #[arg(long)]
    pub port: Option<u16>,
    /// Require the key in this file as `Authorization: Bearer <key>` (or set
    /// `HILLSIDE_API_KEY`; a key is never taken from the command line, where every user of the
    /// machine can read it).
    #[arg(long)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Also answer requests addressed to this name (`Host`), besides loopback names and the
    /// address the server listens on (repeatable).
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// Listen beyond loopback without an API key: anyone who can reach this machine can then use
    /// the model and read its documents.
    #[arg(long)]
    pub allow_no_key: bool,
    /// Largest request body accepted, in MB [default: 4].
    #[arg(long)]
    pub max_body_mb: Option<usize>,
    /// Let web pages on this origin call the server (repeatable; '*' for any). Without one,
    /// only the server's own web UI may: requests from other sites get 403.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Sequences generating at once, batched together [default: 4].
    #[arg(long)]
    pub max_live: Option<usize>,
    /// Requests that may wait for a free slot; more get 429 [default: 32].
    #[arg(long)]
    pub max_queued: Option<usize>,
    /// Finished conversations kept in memory so that their next turn (or another question on
    /// the same document) skips reading the shared prefix again [default: 2].
    #[arg(long)]
    pub cached_sequences: Option<usize>,
    /// Seconds in-flight requests may run on after SIGINT/SIGTERM [default: 10].
    #[arg(long)]
    pub shutdown_grace_s: Option<u64>,
    /// The most tokens a reply may have when a request gives no `max_tokens` [default: up to
    /// the end of the context].
    #[arg(long)]
    pub max_tokens: Option<usize>,
}

pub fn serve(args: &ServeArgs) -> Result<()> {
    let prepared = prepare(args, None)?;
    let addr = address(args);
    check_exposure(addr.ip(), prepared.config.api_key.is_some(), args.allow_no_key)?;
    let runtime = runtime()?;
    runtime.block_on(async move {
        let stop = shutdown_signal().context("installing the SIGINT and SIGTERM handlers")?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
        let addr = listener.local_addr()?;
        let app = prepared.start().map_err(|e| match e.is_in_use() {
            true => anyhow::anyhow!("{e} (is another Hillside using it?)"),
            false => e.into(),
        })?;
        announce(format_args!("hillside: serving {} on http://{addr}/v1 (Ctrl-C stops)", app.config.model_id));
        if hillside_server::web_ui_is_built() {
            // The link carries this run's secret, which the page needs to change settings and models.
            announce(format_args!("hillside: web UI at {}", app.ui_link(&format!("http://{addr}/"))));
        }
        hillside_server::serve(listener, app, stop).await.context("serving")
    })?;
    eprintln!("hillside: stopped");
    Ok(())
}

/// Writes a line of the banner to stdout. A reader that took the first line and closed the
/// pipe (a parent waiting for the address) must not bring the server down, so a failed write
/// is ignored, where `println!` would panic.
fn announce(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// Refuses to listen beyond loopback without an API key unless the user said so
/// (`--allow-no-key`); warns either way, since anyone who can reach the machine can then try.
pub fn check_exposure(host: IpAddr, has_key: bool, allow_no_key: bool) -> Result<()> {
    if host.is_loopback() {
        return Ok(());
    }
    if !has_key && !allow_no_key {
        anyhow::bail!(
            "refusing to listen on {host} without an API key: anyone who can reach this machine could use the model \
             and read your documents. Set one (HILLSIDE_API_KEY or --api-key-file), or pass --allow-no-key to do it anyway."
        );
    }
    tracing::warn!(%host, has_key, "listening beyond this machine");
    eprintln!(
        "warning: {host} is not a loopback address; anyone who can reach this machine can {}",
        if has_key { "try keys against the API" } else { "use the model and read your documents (no API key set)" }
    );
    Ok(())
}

/// A secret from the environment variable `var`, else from `file` (trimmed); `None` when
/// neither gives one. Secrets are never flags: the command line is visible to every user.
pub fn secret(var: &str, file: Option<&Path>) -> Result<Option<String>> {
    if let Some(value) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
        return Ok(Some(value.trim().to_string()));
    }
    let Some(file) = file else { return Ok(None) };
    let text = std::fs::read_to_string(file).with_context(|| format!("reading the key file {}", file.display()))?;
    let key = text.trim();
    if key.is_empty() {
        anyhow::bail!("the key file {} is empty", file.display());
    }
    use std::os::unix::fs::PermissionsExt;
    if std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        eprintln!("warning: the key file {} can be read by other users (chmod 600 it)", file.display());
    }
    Ok(Some(key.to_string()))
}

/// The address to listen on: each flag over its `[server]` key over 127.0.0.1:8080.
pub fn address(args: &ServeArgs) -> SocketAddr {
    let file = &hillside_config::get().server;
    SocketAddr::new(
        args.host.or(file.host).unwrap_or(ServerFile::DEFAULT_HOST),
        args.port.or(file.port).unwrap_or(ServerFile::DEFAULT_PORT),
    )
}

/// The runtime the server runs on (two workers: the model has the other cores).
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// What a server starts on: its engine, its configuration, and (on the local engine) the
/// machine's models to switch to.
pub struct Prepared {
    pub engine: EngineChoice,
    pub config: ServerConfig,
    pub shelf: Option<Arc<dyn ModelShelf>>,
}

impl Prepared {
    pub fn start(self) -> Result<Arc<App>, hillside_server::StartError> {
        App::with_shelf(self.engine, self.config, self.shelf)
    }
}

/// Loads the model (or connects to the remote engine) and makes the server's configuration, as
/// `hillside serve` runs it: each flag over its `[server]` key over the default.
/// `chosen_paths`: the desktop app's files.
pub fn prepare(args: &ServeArgs, chosen_paths: Option<Arc<ChosenPaths>>) -> Result<Prepared> {
    let file = &hillside_config::get().server;
    let max_live = args.max_live.or(file.max_live).unwrap_or(ServerFile::DEFAULT_MAX_LIVE);
    if max_live == 0 {
        anyhow::bail!("max_live must be at least 1");
    }
    let default_max_tokens = args.max_tokens.or(file.max_tokens);
    if default_max_tokens == Some(0) {
        anyhow::bail!("max_tokens must be at least 1");
    }
    let cors_origins = if args.cors_origins.is_empty() {
        file.cors_origins.clone().unwrap_or_default()
    } else {
        args.cors_origins.clone()
    };
    if hillside_server::AllowedOrigins::parse(&cors_origins).map_err(anyhow::Error::msg).context("--cors-origin")?
        == hillside_server::AllowedOrigins::Any
    {
        eprintln!("warning: --cors-origin '*' lets every web page the user opens call this server");
    }
    let (engine, model_id, model_aliases, installed_models, documents, shelf) = match args.engine.connect()? {
        Some(remote) => {
            // Requests name the remote's model; `/v1/models` lists what the remote serves.
            let documents = args.documents.config_for(format!("remote {} {}", remote.url(), remote.model()))?;
            let installed = remote.models().iter().map(|m| m.id.clone()).collect();
            (EngineChoice::Remote(remote.clone()), remote.model().to_string(), Vec::new(), installed, documents, None)
        }
        None => {
            let path = models::resolve(args.model.model())?;
            let engine = Arc::new(load_engine(&args.model)?);
            let (model_id, model_aliases) = model_names(args.model.model(), &path);
            let shelf: Arc<dyn ModelShelf> = Arc::new(Shelf::new(args.model.clone(), models::hub_endpoint()));
            (
                EngineChoice::Local(engine),
                model_id,
                model_aliases,
                models::installed_names(),
                args.documents.config(&path)?,
                Some(shelf),
            )
        }
    };
    let config = ServerConfig {
        installed_models,
        model_id,
        model_aliases,
        api_key: secret("HILLSIDE_API_KEY", args.api_key_file.as_deref())?
            .or_else(|| file.api_key.clone())
            .filter(|k| !k.is_empty()),
        allowed_hosts: if args.allowed_hosts.is_empty() {
            file.allowed_hosts.clone().unwrap_or_default()
        } else {
            args.allowed_hosts.clone()
        },
        max_body_bytes: args.max_body_mb.or(file.max_body_mb).unwrap_or(ServerFile::DEFAULT_MAX_BODY_MB) * 1_000_000,
        cors_origins,
        shutdown_grace_s: args
            .shutdown_grace_s
            .or(file.shutdown_grace_s)
            .unwrap_or(ServerFile::DEFAULT_SHUTDOWN_GRACE_S),
        scheduler: SchedulerConfig {
            max_live,
            max_queued: args.max_queued.or(file.max_queued).unwrap_or(ServerFile::DEFAULT_MAX_QUEUED),
            kv: args.model.kv_config(),
            context_tokens: args.model.context(),
            cached_sequences: args
                .cached_sequences
                .or(file.cached_sequences)
                .unwrap_or(ServerFile::DEFAULT_CACHED_SEQUENCES),
            shared_prefill_tokens: hillside_engine::scheduler::SHARED_PREFILL_TOKENS,
        },
        documents: Some(documents),
        chosen_paths,
        sampling: hillside_config::get().sampling.params(),
        default_max_tokens,
        settings_file: hillside_config::path().map(Path::to_path_buf),
    };
    Ok(Prepared { engine, config, shelf })
}

/// The id clients name the model by (its registry name, else the file's stem) and the other
/// names accepted for it.
pub fn model_names(spec: Option<&str>, path: &Path) -> (String, Vec<String>) {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let file = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let registry = models::registry();
    let name = spec.unwrap_or(&registry.default);
    if registry.models.iter().any(|e| e.name == name) {
        (name.to_string(), vec![stem, file])
    } else {
        (stem, vec![file])
    }
}

/// SIGINT or SIGTERM.
/// SIGINT or SIGTERM, whichever comes first. The handlers are installed when this is called, not
/// when the future is first polled: a signal that arrives once the server answers must stop it
/// gracefully, never kill it with the default action.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut interrupt, mut terminate) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_beyond_loopback_needs_a_key_or_the_users_word() {
        let lan = IpAddr::from([192, 168, 1, 5]);
        assert!(check_exposure(IpAddr::from([127, 0, 0, 1]), false, false).is_ok());
        let refused = check_exposure(lan, false, false).unwrap_err().to_string();
        assert!(refused.contains("--allow-no-key") && refused.contains("HILLSIDE_API_KEY"), "{refused}");
        assert!(check_exposure(IpAddr::from([0, 0, 0, 0]), false, false).is_err());
        assert!(check_exposure(lan, true, false).is_ok());
        assert!(check_exposure(lan, false, true).is_ok());
    }
}
