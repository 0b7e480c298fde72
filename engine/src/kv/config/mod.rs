//! Which KV store a sequence gets, and its settings (shared by CLI flags and config files).
//! Building the store ([`factory`]), sizing a tiered store's hot pool ([`budget`]) and what is
//! learned of the machine at start-up ([`probe`]) each have a file of their own.

mod budget;
mod factory;
mod probe;

use crate::kv::cold::format::ColdType;
use crate::kv::cold::placement::PlacementKind;
use crate::score::xrt::XrtOptions;
use crate::score::KeyPrecision;
pub use probe::KvStartup;
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
    /// K/V costs more than the reads it saves (see [`crate::kv::stores::x_cache`]).
    pub x_cache_share: f64,
    /// What [`KvConfig::start_up`] found on this machine.
    #[serde(skip)]
    pub startup: Option<Arc<KvStartup>>,
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
    /// Every cold-pool directory: `cold_dir`, then `extra_cold_dirs`.
    pub fn cold_dirs(&self) -> Vec<PathBuf> {
        std::iter::once(self.cold_dir.clone()).chain(self.extra_cold_dirs.iter().cloned()).collect()
    }

    pub fn xrt_options(&self) -> XrtOptions {
        XrtOptions { library: self.xrt_library.clone(), xclbin: self.xrt_xclbin.clone(), device: self.xrt_device }
    }
}
