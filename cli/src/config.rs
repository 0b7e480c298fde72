//! The config file: `$XDG_CONFIG_HOME/hillside/config.toml` (or `--config` / `HILLSIDE_CONFIG`).
//! Command-line flags override it; it overrides the built-in defaults. Example:
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
//! [server]
//! port = 8080
//! max_live = 4
//! ```

use anyhow::{Context, Result};
use hillside_engine::kv::KvConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// A registry name or a path, as `--model` takes.
    pub model: Option<String>,
    pub context: Option<usize>,
    pub threads: Option<usize>,
    pub kv: KvConfig,
    pub server: ServerFile,
    pub documents: DocumentsFile,
}

/// `[documents]`: where documents and their kept K/V live (flags of the same names win).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DocumentsFile {
    pub dir: Option<PathBuf>,
    pub kv_quota_gb: Option<f64>,
    pub max_file_mb: Option<u64>,
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
    pub max_live: Option<usize>,
    pub max_queued: Option<usize>,
    pub cached_sequences: Option<usize>,
    pub shutdown_grace_s: Option<u64>,
}

static CONFIG: OnceLock<FileConfig> = OnceLock::new();

/// Where the config file is looked for when none is named.
pub fn default_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("hillside").join("config.toml"))
}

/// Reads the named file (which must exist) or the default one (if it exists), once.
pub fn load(named: Option<&Path>) -> Result<&'static FileConfig> {
    let config = match named {
        Some(path) => parse(path)?,
        None => match default_path().filter(|p| p.exists()) {
            Some(path) => parse(&path)?,
            None => FileConfig::default(),
        },
    };
    Ok(CONFIG.get_or_init(|| config))
}

fn parse(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("in the config file {}", path.display()))
}

/// The loaded config (defaults if [`load`] was not called, as in tests of single commands).
pub fn get() -> &'static FileConfig {
    CONFIG.get_or_init(FileConfig::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_files_keep_defaults_and_typos_are_errors() {
        let c: FileConfig = toml::from_str("context = 4096\n[kv]\nstore = \"tiered\"\nalpha = 0.1\n").unwrap();
        assert_eq!(c.context, Some(4096));
        assert_eq!(c.kv.store, hillside_engine::kv::StoreKind::Tiered);
        assert_eq!(c.kv.alpha, 0.1);
        assert_eq!(c.kv.recent_tokens, KvConfig::default().recent_tokens);
        let typo = toml::from_str::<FileConfig>("[kv]\nalpah = 0.1\n").unwrap_err().to_string();
        assert!(typo.contains("alpah"), "{typo}");
        assert!(toml::from_str::<FileConfig>("[kv]\nstore = \"ssd\"\n").is_err());
        let c: FileConfig = toml::from_str("[server]\nport = 9000\ncors_origins = [\"http://localhost:3000\"]\n").unwrap();
        assert_eq!((c.server.port, c.server.max_live), (Some(9000), None));
        assert!(toml::from_str::<FileConfig>("[server]\nprot = 9000\n").is_err());
    }

    #[test]
    fn the_readme_example_parses() {
        let readme = include_str!("../../README.md");
        let example = readme.split("```toml\n").nth(1).and_then(|s| s.split("```").next()).expect("a toml block in the README");
        let c: FileConfig = toml::from_str(example).unwrap();
        assert_eq!(c.kv.store, hillside_engine::kv::StoreKind::Tiered);
        assert_eq!(c.kv.hot_budget_bytes, Some(50_000_000));
    }
}
