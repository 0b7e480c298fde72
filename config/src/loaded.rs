//! The config this process read at start: loaded once, then read from anywhere.

use crate::{default_path, read, ConfigFileError, FileConfig};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static CONFIG: OnceLock<(FileConfig, Option<PathBuf>)> = OnceLock::new();

/// Reads the named file (which must exist) or the default one (if it exists), once.
pub fn load(named: Option<&Path>) -> Result<&'static FileConfig, ConfigFileError> {
    let (config, path) = match named {
        Some(path) if !path.exists() => return Err(ConfigFileError::Missing { path: path.into() }),
        Some(path) => (read(path)?, Some(path.to_path_buf())),
        None => match default_path() {
            Some(path) => (read(&path)?, Some(path)),
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
