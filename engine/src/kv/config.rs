//! Which KV store a sequence gets, and its settings (shared by CLI flags and config files).

use super::cold_format::ColdType;
use super::drop::DropKvStore;
use super::near_storage::NearStorageKvStore;
use super::placement::PlacementKind;
use super::tiered::planner::{self, Profile};
use super::tiered::{budget_floor_bytes, pinned_rows_bytes, TieredKvStore, TieredSettings};
use super::x_cache::{KvFromInput, XCachePlan};
use super::{FullKvStore, KvShape, KvStore, OffloadKvStore};
use crate::error::Result;
use crate::score::xrt::{self, XrtOptions};
use crate::score::{KeyBits, KeyPrecision};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// The whole cache in memory.
    #[default]
    Full,
    /// Everything in the cold pool, all of it read back every step (FlexGen-style baseline).
    Offload,
    /// Hot pool in DRAM, cold pool on disk, attention over the top-α tokens (HillInfer).
    Tiered,
    /// Keep sinks, recent tokens and the top-α heavy hitters in memory; drop the rest (H2O-style).
    Drop,
    /// Everything in the cold pool, as offload, with the cold tokens' exact attention computed
    /// on the storage side and merged with the host's over the recent ones (HILOS).
    #[serde(rename = "near-storage")]
    NearStorage,
}

named_choices!(StoreKind, "KV store", { Full => "full", Offload => "offload", Tiered => "tiered", Drop => "drop", NearStorage => "near-storage" });

impl StoreKind {
    /// Whether every step attends to every cached token (wherever it lives), rather than to a
    /// selection of them.
    pub fn attends_to_every_token(self) -> bool {
        matches!(self, Self::Full | Self::Offload | Self::NearStorage)
    }
}

/// Who scores the cold tokens of a tiered store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvaluatorKind {
    /// The host scores every candidate itself.
    Host,
    /// A worker that owns the cold pool scores the cold tokens and streams score blocks while
    /// the host scores the hot ones.
    #[default]
    Storage,
    /// A SmartSSD's FPGA scores the cold tokens next to the NAND (through XRT); where there is
    /// none, the storage evaluator does.
    Xrt,
}

named_choices!(EvaluatorKind, "evaluator", { Host => "host", Storage => "storage", Xrt => "xrt" });

/// What a tiered store's decode step selects within its top-α budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SelectorKind {
    /// The best-scoring tokens, one by one (a page is read for each cold one).
    Tokens,
    /// The best-scoring tokens, one by one, and with them the tokens ranked just below the
    /// budget whose rows the step holds anyway, in a page it reads or in memory ("free
    /// riders", after ClusterKV): more attention for no more I/O (the default:
    /// docs/decisions/free-riders-by-default.md).
    #[default]
    Riders,
    /// Whole cold-pool pages, the ones holding the most estimated attention, and every token
    /// in them: the budget buys pages, so a step reads as many pages as it attends to
    /// (after Quest and ClusterKV); the best-ranked tokens already in memory come along.
    Pages,
    /// InstInfer's SparF: the best-scoring tokens one by one, each scored on only the query's
    /// [`KvConfig::sparf_dims`] largest dimensions (by magnitude) of the scoring copy, as a
    /// drive that holds keys dimension-major would read only those dimensions.
    Sparf,
}

impl SelectorKind {
    /// Whether the budget buys tokens by their rank alone (no riders, no pages).
    pub fn by_rank_alone(self) -> bool {
        matches!(self, Self::Tokens | Self::Sparf)
    }
}

named_choices!(SelectorKind, "selector", { Tokens => "tokens", Riders => "riders", Pages => "pages", Sparf => "sparf" });

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    pub store: StoreKind,
    /// Where cold-pool files go (one per sequence, removed when it ends).
    pub cold_dir: PathBuf,
    /// More cold-pool directories, one per further SSD: a pool's KV heads are dealt across
    /// `cold_dir` and these, so each device serves its share of every read (HILOS's scale-out).
    pub extra_cold_dirs: Vec<PathBuf>,
    /// Offload, tiered and near-storage: how the cold pool keeps K and V on disk, as f16 or in
    /// 8 bits (q8: 37.5% fewer bytes on every cold read; keys scaled per channel and values per
    /// token, as KIVI does, each value within half a step of its scale).
    pub cold_type: ColdType,
    /// Tiered and drop: share of the cached tokens each decode step attends to (tiered) or that
    /// is kept beyond the sinks and recent tokens (drop).
    pub alpha: f32,
    /// Tiered: DRAM for hot rows, scoring keys, the write-back window and read staging (default: what the β
    /// planner asks for, at most a quarter of the full cache at the sequence's maximum length;
    /// where a quarter cannot even hold the fixed parts, as for short sequences, half again
    /// what they need).
    pub hot_budget_bytes: Option<usize>,
    /// Tiered and drop: first tokens always attended to.
    pub sink_tokens: usize,
    /// Tiered and drop: most recent tokens always attended to.
    pub recent_tokens: usize,
    /// Tiered: leading layers that attend densely, counting only those that attend beyond a
    /// window (in a model with windowed layers, the global ones).
    pub dense_layers: usize,
    /// Tiered: precision of the scoring copy of the keys (`auto`: by the model's head width).
    pub key_bits: KeyPrecision,
    /// Tiered: who scores the cold tokens.
    pub evaluator: EvaluatorKind,
    /// Evaluator `xrt`: XRT's `libxrt_coreutil.so` (default: `HILLSIDE_XRT_LIBRARY`, then
    /// `$XILINX_XRT/lib`, then the standard install paths).
    pub xrt_library: Option<PathBuf>,
    /// Evaluator `xrt`: the scoring kernel's xclbin (default: `HILLSIDE_XCLBIN`, then
    /// `hillside_score.xclbin` in Hillside's data directory).
    pub xrt_xclbin: Option<PathBuf>,
    /// Evaluator `xrt`: which card.
    pub xrt_device: u32,
    /// Tiered: the fidelity guard's threshold on the estimated attention share of the top α
    /// (0 turns it off).
    pub guard_mass: f32,
    /// Tiered: how spilled tokens are laid out in the cold pool's pages (by key similarity, so
    /// a page read serves tokens selected together, or in text order).
    pub placement: PlacementKind,
    /// Tiered: whether a decode step selects tokens one by one (with or without free riders,
    /// or ranked on a few query dimensions as SparF does) or whole pages.
    pub selector: SelectorKind,
    /// Selector `sparf`: the query dimensions each KV head's tokens are scored on.
    pub sparf_dims: usize,
    /// Tiered: while the machine has room for the whole cache beyond a reserve, also keep it
    /// densely in memory and attend to all of it (exact, nothing read); let go under memory
    /// pressure, when steps rank and read from the tiers again.
    pub spare_copy: bool,
    /// Near-storage: the share of layers that keep their inputs X instead of K/V (HILOS's
    /// X-cache), for models where X is the smaller; off (0) by default, as the CPU's rebuild of
    /// K/V costs more than the reads it saves (see [`super::x_cache`]).
    pub x_cache_share: f64,
    /// What [`KvConfig::start_up`] found on this machine.
    #[serde(skip)]
    pub startup: Option<Arc<KvStartup>>,
}

/// What the tiered store needs to know about the machine, found once when a program starts
/// (profiling the disk and CPU takes about a second, looking for a SmartSSD up to a minute),
/// so that no sequence's first step pays for it while others stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvStartup {
    /// The β planner's rates for the cold directory, for each key precision the configuration
    /// may use (none if profiling failed: the hot pool then gets a quarter of the cache).
    pub profiles: Vec<(KeyBits, Profile)>,
    /// Evaluator `xrt`: why the card cannot score (`None` when it can).
    pub xrt_problem: Option<String>,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            store: StoreKind::Full,
            cold_dir: default_cold_dir(),
            extra_cold_dirs: Vec::new(),
            cold_type: ColdType::F16,
            alpha: 0.2,
            hot_budget_bytes: None,
            sink_tokens: 4,
            recent_tokens: 64,
            dense_layers: 1,
            key_bits: KeyPrecision::Auto,
            evaluator: EvaluatorKind::Storage,
            xrt_library: None,
            xrt_xclbin: None,
            xrt_device: 0,
            guard_mass: 0.0,
            placement: PlacementKind::default(),
            selector: SelectorKind::default(),
            sparf_dims: 8,
            spare_copy: true,
            x_cache_share: 0.0,
            startup: None,
        }
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
    /// Does the start-up work this configuration needs — the β planner's profile of the cold
    /// directory (a tiered store without a fixed hot budget) and the SmartSSD probe (evaluator
    /// `xrt`) — now, and keeps the results for every store built from it. A server calls this
    /// before it serves; a configuration built without it does the work at its first tiered
    /// store.
    pub fn start_up(mut self) -> Self {
        self.startup = Some(Arc::new(self.find_startup()));
        self
    }

    fn find_startup(&self) -> KvStartup {
        if self.store != StoreKind::Tiered {
            return KvStartup::default();
        }
        let profiles = match self.hot_budget_bytes {
            Some(_) => Vec::new(),
            None => self
                .key_bits
                .candidates()
                .iter()
                .map_while(|&bits| {
                    planner::profile(&self.cold_dir, bits)
                        .inspect_err(|e| tracing::warn!(error = %e, "could not profile the cold pool; the hot pool gets a quarter of the cache"))
                        .ok()
                        .map(|p| (bits, p))
                })
                .collect(),
        };
        let xrt_problem =
            (self.evaluator == EvaluatorKind::Xrt).then(|| xrt::probe(&self.xrt_options()).problem).flatten();
        KvStartup { profiles, xrt_problem }
    }

    fn startup(&self) -> Arc<KvStartup> {
        self.startup.clone().unwrap_or_else(|| Arc::new(self.find_startup()))
    }

    /// Every cold-pool directory: `cold_dir`, then `extra_cold_dirs`.
    pub fn cold_dirs(&self) -> Vec<PathBuf> {
        std::iter::once(self.cold_dir.clone()).chain(self.extra_cold_dirs.iter().cloned()).collect()
    }

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

    /// The hot budget that holds β·M_s of the K/V in DRAM (M = the whole cache at `shape`'s
    /// length), plus the scoring keys and the write-back window, uncapped.
    pub fn budget_for_beta(&self, shape: KvShape, beta: f64) -> usize {
        let settings = self.tiered_settings_with_budget(shape, 0);
        let fixed = budget_floor_bytes(shape, &settings) - pinned_rows_bytes(shape, &settings);
        fixed + Profile::hot_share(beta, shape.max_tokens * shape.bytes_per_token())
    }

    fn tiered_settings_with_budget(&self, shape: KvShape, hot_budget_bytes: usize) -> TieredSettings {
        TieredSettings {
            alpha: self.alpha,
            hot_budget_bytes,
            sink_tokens: self.sink_tokens,
            recent_tokens: self.recent_tokens,
            dense_layers: self.dense_layers,
            key_bits: self.key_bits.bits_for(shape.head_dim),
            evaluator: self.evaluator,
            xrt: self.xrt_options(),
            guard_mass: self.guard_mass,
            placement: self.placement,
            cold_type: self.cold_type,
            selector: self.selector,
            sparf_dims: self.sparf_dims,
            spare_copy: self.spare_copy,
        }
    }

    pub fn xrt_options(&self) -> XrtOptions {
        XrtOptions { library: self.xrt_library.clone(), xclbin: self.xrt_xclbin.clone(), device: self.xrt_device }
    }

    /// The tiered store's settings for `shape`, its hot budget sized with the start-up profile.
    pub fn tiered_settings(&self, shape: KvShape) -> TieredSettings {
        self.tiered_settings_after(shape, &self.startup())
    }

    fn tiered_settings_after(&self, shape: KvShape, startup: &KvStartup) -> TieredSettings {
        let mut settings = self.tiered_settings_with_budget(shape, 0);
        settings.hot_budget_bytes = self.hot_budget_bytes.unwrap_or_else(|| {
            let kv_bytes = shape.max_tokens * shape.bytes_per_token();
            let floor = budget_floor_bytes(shape, &settings);
            let quarter = kv_bytes / 4;
            if quarter < floor {
                return floor * 3 / 2;
            }
            // The β planner sizes the hot pool; the quarter of the cache is the DRAM cap.
            match startup.profiles.iter().find(|(bits, _)| *bits == settings.key_bits) {
                Some((_, profile)) => {
                    self.budget_for_beta(shape, profile.beta(f64::from(self.alpha))).clamp(floor, quarter)
                }
                None => quarter,
            }
        });
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_budget_comes_from_the_profile_found_at_start_up() {
        let shape = KvShape { n_layers: 30, n_kv_heads: 3, head_dim: 64, max_tokens: 8192 };
        let scratch = tempfile::Builder::new().prefix("hillside-startup-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let config = KvConfig { store: StoreKind::Tiered, cold_dir: dir.clone(), ..KvConfig::default() };
        let with = |profiles: Vec<(KeyBits, Profile)>| {
            let startup = KvStartup { profiles, xrt_problem: None };
            KvConfig { startup: Some(Arc::new(startup)), ..config.clone() }.tiered_settings(shape).hot_budget_bytes
        };
        // A storage side far faster than the host asks for a small hot pool; a slow disk for the cap.
        let rates = |cold_read_bytes_per_s: f64| Profile {
            host_score_bytes_per_s: 1e9,
            storage_score_bytes_per_s: 100e9,
            hot_fetch_bytes_per_s: 10e9,
            cold_read_bytes_per_s,
        };
        let quarter = shape.max_tokens * shape.bytes_per_token() / 4;
        // 64-dim heads score from INT4 rows: the INT4 profile is the one that counts.
        let (fast, slow) = (with(vec![(KeyBits::Int4, rates(100e9))]), with(vec![(KeyBits::Int4, rates(0.1e9))]));
        assert!(fast < slow && slow == quarter, "fast disk {fast}, slow disk {slow}, cap {quarter}");
        assert_eq!(with(Vec::new()), quarter, "no profile: a quarter of the cache");
        assert_eq!(with(vec![(KeyBits::Int8, rates(100e9))]), quarter, "only another precision's profile");
        // Nothing was measured: the cold directory holds no profile.
        assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
        // Starting up measures once for each precision `auto` may pick, where the planner caches it.
        let started = config.clone().start_up();
        assert_eq!(started.startup.as_ref().unwrap().profiles.len(), 2);
        for bits in [KeyBits::Int4, KeyBits::Int8] {
            assert!(dir.join(format!("hillside-profile-{bits}.json")).exists());
        }
    }

    #[test]
    fn auto_scores_wide_heads_from_int8_rows() {
        let settings = |key_bits: KeyPrecision, head_dim: usize| {
            let shape = KvShape { n_layers: 4, n_kv_heads: 1, head_dim, max_tokens: 1024 };
            let config = KvConfig { key_bits, hot_budget_bytes: Some(1 << 30), ..KvConfig::default() };
            config.tiered_settings(shape).key_bits
        };
        assert_eq!(settings(KeyPrecision::Auto, 64), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Auto, 128), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Auto, 256), KeyBits::Int8);
        assert_eq!(settings(KeyPrecision::Int4, 256), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Int8, 64), KeyBits::Int8);
    }
}
