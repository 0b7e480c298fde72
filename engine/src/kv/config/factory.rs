//! The store a configuration asks for, built for a cache of a given shape.

use super::{KvConfig, StoreKind};
use crate::error::Result;
use crate::kv::stores::drop::DropKvStore;
use crate::kv::stores::near_storage::NearStorageKvStore;
use crate::kv::stores::tiered::TieredKvStore;
use crate::kv::stores::x_cache::{KvFromInput, XCachePlan};
use crate::kv::{FullKvStore, KvShape, KvStore, OffloadKvStore};
use std::sync::Arc;

impl KvConfig {
    /// A store for a cache of `shape`; `rebuild` is the model's K/V projection, which the
    /// X-cache needs (without it no layer keeps its inputs).
    pub fn build(&self, shape: KvShape, rebuild: Option<Arc<dyn KvFromInput>>) -> Result<Box<dyn KvStore>> {
        Ok(match self.store {
            StoreKind::Full => Box::new(FullKvStore::new(shape)),
            StoreKind::Offload => Box::new(OffloadKvStore::new(shape, &self.cold_dirs(), self.cold_type)?),
            StoreKind::Tiered => {
                let startup = self.startup();
                let settings = self.tiered_settings_after(shape, &startup);
                Box::new(TieredKvStore::new(shape, &self.cold_dirs(), settings, startup.xrt_problem.clone())?)
            }
            StoreKind::Drop => Box::new(DropKvStore::new(shape, self.alpha, self.sink_tokens, self.recent_tokens)),
            StoreKind::NearStorage => {
                let x_cache = rebuild.map(|rebuild| (self.x_cache_plan(shape, rebuild.input_dim()).layers, rebuild));
                Box::new(NearStorageKvStore::new(shape, &self.cold_dirs(), self.cold_type, x_cache)?)
            }
        })
    }

    /// Which layers of a model with a cache of `shape` and layer inputs of `input_dim` values
    /// keep X in a near-storage store.
    pub fn x_cache_plan(&self, shape: KvShape, input_dim: usize) -> XCachePlan {
        XCachePlan::new(shape, input_dim, self.x_cache_share)
    }
}
