//! `--engine`: Hillside's own engine, or an OpenAI-compatible one elsewhere (vLLM, llama.cpp's
//! `llama-server`, Ollama) for when one machine is not enough.

use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_config::RemoteFile;
use hillside_remote::{RemoteConfig, RemoteEngine};
use std::sync::Arc;

/// Requests a summary keeps in flight on a remote engine unless told otherwise.

#[derive(Args, Clone, Default)]
pub struct EngineArgs {
    /// Which engine runs the model: `local` (Hillside's own) or `openai:URL`, an
    /// OpenAI-compatible server such as vLLM, llama.cpp's llama-server or Ollama
    /// (`openai:http://127.0.0.1:8000/v1`) [default: local].
    #[arg(long)]
    pub engine: Option<String>,
    /// A file holding the remote engine's API key (or set `HILLSIDE_REMOTE_API_KEY`; never a
    /// flag, which every user of the machine can read).
    #[arg(long)]
    pub remote_api_key_file: Option<std::path::PathBuf>,
    /// Which of the remote engine's models to use [default: the first it lists].
    #[arg(long)]
    pub remote_model: Option<String>,
    /// Allow plain HTTP to a remote engine on another machine (documents and the key then
    /// cross the network unencrypted).
    #[arg(long)]
    pub allow_insecure_remote: bool,
}

impl EngineArgs {
    /// The remote engine these flags (over the config file's `[remote]`) name; `None` for the
    /// local one.
    pub fn remote_config(&self) -> Result<Option<RemoteConfig>> {
        let file = &hillside_config::get().remote;
        let engine =
            self.engine.clone().or_else(|| file.engine.clone()).unwrap_or_else(|| RemoteFile::LOCAL_ENGINE.into());
        let url = match engine.as_str() {
            "local" => return Ok(None),
            other => match other.strip_prefix("openai:") {
                Some(url) => url.to_string(),
                None => bail!("--engine is `local` or `openai:URL`, not '{other}'"),
            },
        };
        Ok(Some(RemoteConfig {
            url,
            api_key: crate::serve::secret("HILLSIDE_REMOTE_API_KEY", self.remote_api_key_file.as_deref())?
                .or_else(|| file.api_key.clone()),
            model: self.remote_model.clone().or_else(|| file.model.clone()),
            allow_insecure: self.allow_insecure_remote || file.allow_insecure.unwrap_or(false),
            context_tokens: file.context,
            concurrency: file.concurrency.unwrap_or(RemoteFile::DEFAULT_CONCURRENCY),
        }))
    }

    /// Connects to the remote engine, if one is chosen.
    pub fn connect(&self) -> Result<Option<Arc<RemoteEngine>>> {
        let Some(config) = self.remote_config()? else { return Ok(None) };
        let remote = RemoteEngine::connect(&config).with_context(|| "connecting to the remote engine")?;
        Ok(Some(Arc::new(remote)))
    }
}
