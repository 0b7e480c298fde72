//! Which KV store a sequence gets, and its settings (shared by CLI flags and config files).

use super::{FullKvStore, KvShape, KvStore, OffloadKvStore};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// The whole cache in memory.
    #[default]
    Full,
    /// Everything in the cold pool, all of it read back every step (FlexGen-style baseline).
    Offload,
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "full" => Ok(Self::Full),
            "offload" => Ok(Self::Offload),
            other => Err(format!("unknown KV store '{other}' (full, offload)")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvConfig {
    pub store: StoreKind,
    /// Where cold-pool files go (one per sequence, removed when it ends).
    pub cold_dir: PathBuf,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self { store: StoreKind::Full, cold_dir: default_cold_dir() }
    }
}

/// `$XDG_CACHE_HOME/hillside/kv`, else `~/.cache/hillside/kv`.
pub fn default_cold_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("hillside").join("kv")
}

impl KvConfig {
    pub fn build(&self, shape: KvShape) -> Result<Box<dyn KvStore>> {
        Ok(match self.store {
            StoreKind::Full => Box::new(FullKvStore::new(shape)),
            StoreKind::Offload => Box::new(OffloadKvStore::new(shape, &self.cold_dir)?),
        })
    }
}
