//! The config file (`$XDG_CONFIG_HOME/hillside/config.toml`, or the one `--config` names): its
//! schema, the defaults of its keys and their checks, in one place. The CLI, the server and the
//! desktop app read it once at start ([`load`], then [`get`]) and take typed values from it;
//! the settings page edits it through [`settings`], checked field by field, rewriting only the
//! keys it changes and keeping the user's comments and other keys (an edit takes effect at the
//! next start).
//! Example:
//!
//! ```toml
//! model = "smollm2-135m-instruct"
//! context = 8192
//! threads = 2
//!
//! [kv]
//! store = "tiered"
//! alpha = 0.2
//! hot_budget_bytes = 50_000_000
//! cold_dir = "/mnt/nvme/hillside-kv"
//!
//! [sampling]
//! temperature = 0.7
//!
//! [server]
//! port = 8080
//! max_live = 4
//! ```

mod loaded;
pub mod settings;

use hillside_engine::kv::KvConfig;
use hillside_engine::SamplingParams;
pub use loaded::{get, load, path};
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// A registry name or a path, as `--model` takes.
    pub model: Option<String>,
    pub context: Option<usize>,
    pub threads: Option<usize>,
    pub kv: KvConfig,
    pub sampling: SamplingFile,
    pub server: ServerFile,
    pub documents: DocumentsFile,
    pub remote: RemoteFile,
}

/// `[remote]`: an OpenAI-compatible engine elsewhere that runs the model (`--engine
/// openai:URL` and the `--remote-…` flags win over these keys).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteFile {
    /// `local` (Hillside's own engine) or `openai:URL`.
    pub engine: Option<String>,
    /// The remote's API key (`HILLSIDE_REMOTE_API_KEY` wins).
    pub api_key: Option<String>,
    /// Which of the remote's models (default: the first it lists).
    pub model: Option<String>,
    /// Allow plain HTTP to a remote engine on another machine.
    pub allow_insecure: Option<bool>,
    /// Each request's context, where the remote does not say.
    pub context: Option<usize>,
    /// Requests a summary keeps in flight at once [default: 4].
    pub concurrency: Option<usize>,
}

impl RemoteFile {
    /// Hillside's own engine.
    pub const LOCAL_ENGINE: &str = "local";
    pub const DEFAULT_CONCURRENCY: usize = 4;
}

/// `[sampling]`: defaults for requests (and `hillside chat`) that do not set their own.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingFile {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl SamplingFile {
    /// The engine's defaults, with the keys this table sets.
    pub fn params(&self) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            ..d
        }
    }
}

/// `[documents]`: where documents and their kept K/V live (flags of the same names win).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DocumentsFile {
    pub dir: Option<PathBuf>,
    pub kv_quota_gb: Option<f64>,
    pub max_file_mb: Option<u64>,
}

impl DocumentsFile {
    pub const DEFAULT_KV_QUOTA_GB: f64 = 4.0;
    pub const DEFAULT_MAX_FILE_MB: u64 = 256;

    /// `$XDG_DATA_HOME/hillside/documents`, else `./hillside/documents`.
    pub fn default_dir() -> PathBuf {
        dirs::data_dir().unwrap_or_else(|| PathBuf::from(".")).join("hillside").join("documents")
    }
}

/// `[server]`: what `hillside serve`'s flags set (each flag wins over its key).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerFile {
    pub host: Option<std::net::IpAddr>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    pub max_body_mb: Option<usize>,
    pub cors_origins: Option<Vec<String>>,
    pub allowed_hosts: Option<Vec<String>>,
    pub max_live: Option<usize>,
    pub max_queued: Option<usize>,
    pub cached_sequences: Option<usize>,
    pub shutdown_grace_s: Option<u64>,
    /// The most tokens a reply may have when an API request gives no `max_tokens`.
    pub max_tokens: Option<usize>,
}

impl ServerFile {
    /// Loopback only: anything else exposes the model to the network.
    pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    pub const DEFAULT_PORT: u16 = 8080;
    pub const DEFAULT_MAX_BODY_MB: usize = 4;
    pub const DEFAULT_MAX_LIVE: usize = 4;
    pub const DEFAULT_MAX_QUEUED: usize = 32;
    pub const DEFAULT_CACHED_SEQUENCES: usize = 2;
    pub const DEFAULT_SHUTDOWN_GRACE_S: u64 = 10;
}

/// Where the config file is looked for when none is named.
pub fn default_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("hillside").join("config.toml"))
}

/// Why the config file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// `--config` or `HILLSIDE_CONFIG` named a file that is not there.
    #[error("the config file {} does not exist", .path.display())]
    Missing { path: PathBuf },
    #[error("reading the config file {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// It is TOML, but a key or value is not one Hillside knows.
    #[error("in the config file {}: {source}", .path.display())]
    Invalid { path: PathBuf, source: toml::de::Error },
    #[error("the config file {} is not valid TOML: {source}", .path.display())]
    NotToml { path: PathBuf, source: toml_edit::TomlError },
    /// An edit this code made would not read back.
    #[error("the edited config would not parse (a bug): {0}")]
    EditUnreadable(toml::de::Error),
    #[error("writing the config file {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

impl ConfigFileError {
    /// The disk is full: the same change can be saved once space is freed.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, Self::Write { source, .. } if hillside_engine::error::is_disk_full(source.kind()))
    }
}

/// Parses the file at `path`; a missing file is the defaults.
pub fn read(path: &Path) -> Result<FileConfig, ConfigFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|source| ConfigFileError::Invalid { path: path.into(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileConfig::default()),
        Err(source) => Err(ConfigFileError::Read { path: path.into(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hillside_engine::kv::StoreKind;

    #[test]
    fn partial_files_keep_defaults_and_typos_are_errors() {
        let c: FileConfig = toml::from_str("context = 4096\n[kv]\nstore = \"tiered\"\nalpha = 0.1\n").unwrap();
        assert_eq!(c.context, Some(4096));
        assert_eq!(c.kv.store, StoreKind::Tiered);
        assert_eq!(c.kv.alpha, 0.1);
        assert_eq!(c.kv.recent_tokens, KvConfig::default().recent_tokens);
        let typo = toml::from_str::<FileConfig>("[kv]\nalpah = 0.1\n").unwrap_err().to_string();
        assert!(typo.contains("alpah"), "{typo}");
        assert!(toml::from_str::<FileConfig>("[kv]\nstore = \"ssd\"\n").is_err());
        let c: FileConfig =
            toml::from_str("[server]\nport = 9000\ncors_origins = [\"http://localhost:3000\"]\n").unwrap();
        assert_eq!((c.server.port, c.server.max_live), (Some(9000), None));
        assert!(toml::from_str::<FileConfig>("[server]\nprot = 9000\n").is_err());
        let c: FileConfig = toml::from_str("[sampling]\ntemperature = 0.2\n").unwrap();
        assert_eq!(
            (c.sampling.params().temperature, c.sampling.params().top_k),
            (0.2, SamplingParams::default().top_k)
        );
    }
}
