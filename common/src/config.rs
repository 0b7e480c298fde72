//! The config file, read once at start: `$XDG_CONFIG_HOME/hillside/config.toml` (or `--config` /
//! `HILLSIDE_CONFIG`). Command-line flags override it; it overrides the built-in defaults. Its
//! keys are described in [`hillside_server::settings`], which the UI's settings page also edits.

use anyhow::Result;
use hillside_server::settings;
pub use hillside_server::settings::FileConfig;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static CONFIG: OnceLock<(FileConfig, Option<PathBuf>)> = OnceLock::new();

/// Reads the named file (which must exist) or the default one (if it exists), once.
pub fn load(named: Option<&Path>) -> Result<&'static FileConfig> {
    let (config, path) = match named {
        Some(path) if !path.exists() => anyhow::bail!("the config file {} does not exist", path.display()),
        Some(path) => (settings::read(path)?, Some(path.to_path_buf())),
        None => match settings::default_path() {
            Some(path) => (settings::read(&path)?, Some(path)),
            None => (FileConfig::default(), None),
        },
    };
    Ok(&CONFIG.get_or_init(|| (config, path)).0)
}

/// The loaded config (defaults if [`load`] was not called, as in tests of single commands).
pub fn get() -> &'static FileConfig {
    &CONFIG.get_or_init(|| (FileConfig::default(), None)).0
}

/// The file the config came from, or would come from once written (the settings page's).
pub fn path() -> Option<&'static Path> {
    CONFIG.get().and_then(|(_, path)| path.as_deref())
}
