//! The KV cache, as the model sees it: one trait for every way of keeping keys and values.
//!
//! A decode step, per layer: `append` the new tokens' K/V, `prepare` the layer (the store
//! selects the cached tokens the queries attend to, and cuts the attention into the views it
//! will hand out: all KV heads at once, or a few at a time, and a long cache in spans), then
//! `gather` each planned view and attend over it, and `observe` what was used. Once every layer
//! is done the step is `commit`ted. The model follows the plan and never knows where a token
//! lives: a store that keeps everything in memory, one that offloads to disk and one that keeps
//! only the important tokens all look the same from here.

pub mod backing;
pub mod cold;
pub mod config;
#[doc(hidden)]
pub mod fault;
pub mod hot_pool;
pub mod snapshot;
pub mod stores;
pub mod view;

use crate::error::{KvMisuse, Result};
pub use crate::kernels::attention::{KvView, KV_TILE};
pub use config::{EvaluatorKind, KvConfig, SelectorKind, StoreKind};
use std::ops::Range;
pub use stores::full::FullKvStore;
pub use stores::offload::OffloadKvStore;

/// Whether `alpha` can be the share of the cached tokens a step attends to: more than none, at
/// most all. The tiered store and the settings page hold this one check.
pub fn alpha_in_range(alpha: f32) -> bool {
    alpha > 0.0 && alpha <= 1.0
}

/// The dimensions of the cache a model needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The most tokens the store can hold (at most the model's context).
    pub max_tokens: usize,
}

impl KvShape {
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// f16 bytes of K and V per token across all layers.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.kv_dim() * 2
    }

    /// How many tokens the rows `k`/`v` hold, checking their shape and that they fit after
    /// the `held` tokens already cached (the check every store's `append` starts with).
    pub fn tokens_to_append(&self, held: usize, k: &[f32], v: &[f32]) -> Result<usize> {
        let n = k.len() / self.kv_dim();
        if k.len() != n * self.kv_dim() || v.len() != k.len() {
            return Err(KvMisuse::KvRowsNotWhole { k: k.len(), v: v.len(), row: self.kv_dim() }.into());
        }
        if held + n > self.max_tokens {
            return Err(crate::Error::ContextOverflow { prompt_tokens: held + n, context_tokens: self.max_tokens });
        }
        Ok(n)
    }
}

/// Which cached tokens a layer's queries attend to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every cached token (causally masked).
    All,
    /// The cached tokens at these positions (causally masked): a part of [`Selection::All`]
    /// that the model asks for when the store's plan cuts the whole cache into spans (see
    /// [`HeadsPart::spans`]).
    Span(Range<usize>),
    /// `per_head` tokens for each KV head, ascending: head h attends to
    /// `tokens[h * per_head..][..per_head]`.
    Tokens { per_head: usize, tokens: Vec<u32> },
}

impl Selection {
    /// The same tokens (ascending) for each of `n_kv_heads` heads.
    pub fn shared(tokens: &[u32], n_kv_heads: usize) -> Self {
        Self::Tokens { per_head: tokens.len(), tokens: tokens.repeat(n_kv_heads) }
    }

    /// One set per head, all of the same length.
    pub fn per_head(sets: &[Vec<u32>]) -> Self {
        let per_head = sets.first().map_or(0, Vec::len);
        debug_assert!(sets.iter().all(|s| s.len() == per_head), "every head selects as many tokens");
        Self::Tokens { per_head, tokens: sets.concat() }
    }

    /// Head `h`'s tokens (`None` for [`Selection::All`] and [`Selection::Span`]).
    pub fn head(&self, h: usize) -> Option<&[u32]> {
        match self {
            Self::All | Self::Span(_) => None,
            Self::Tokens { per_head, tokens } => Some(&tokens[h * per_head..][..*per_head]),
        }
    }
}

/// One layer's queries as a store sees them: `n × n_heads·head_dim` values (RoPE applied, after
/// this step's `append`) at `positions`, and the layer's sink logits where the model has them
/// (gpt-oss: one per query head, a key with no value in every row's softmax).
#[derive(Debug, Clone, Copy)]
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub positions: &'a [usize],
    pub n_heads: usize,
    pub sinks: Option<&'a [f32]>,
}

impl<'a> Queries<'a> {
    /// Queries without sinks.
    pub fn new(q: &'a [f32], positions: &'a [usize], n_heads: usize) -> Self {
        Self { q, positions, n_heads, sinks: None }
    }
}

/// One range of KV heads that a layer's attention covers in one view, as the store planned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadsPart {
    pub heads: Range<usize>,
    /// For a whole-cache selection, the spans of positions gathered in turn, whose attentions
    /// the model merges by their softmax statistics (so that a view never holds a long cache
    /// whole); empty: the whole selection in one view.
    pub spans: Vec<Range<usize>>,
}

/// A layer prepared for attention: the tokens its queries attend to, and the views the store
/// will hand out for them, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    pub selection: Selection,
    pub parts: Vec<HeadsPart>,
}

impl HeadsPart {
    /// Every one of `n_kv_heads` KV heads in one view of the whole selection.
    pub fn all(n_kv_heads: usize) -> Vec<HeadsPart> {
        vec![HeadsPart { heads: 0..n_kv_heads, spans: Vec::new() }]
    }

    /// One KV head at a time; with `span_tokens`, the `cached_tokens` positions in spans of that
    /// many (only where there is more than one).
    pub fn each_head(n_kv_heads: usize, cached_tokens: usize, span_tokens: Option<usize>) -> Vec<HeadsPart> {
        let spans: Vec<Range<usize>> = match span_tokens {
            Some(span) if span > 0 && span < cached_tokens => {
                (0..cached_tokens).step_by(span).map(|s| s..(s + span).min(cached_tokens)).collect()
            }
            _ => Vec::new(),
        };
        (0..n_kv_heads).map(|h| HeadsPart { heads: h..h + 1, spans: spans.clone() }).collect()
    }
}

/// What a store reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvStats {
    pub tokens: usize,
    /// Bytes the store holds in memory (K/V, scoring copies, working buffers).
    pub resident_bytes: usize,
    /// Bytes of K/V in the cold pool, as it keeps them.
    pub cold_bytes: usize,
    /// Bytes read from the cold pool so far.
    pub cold_bytes_read: u64,
    /// Read requests those bytes took (groups that lie one after another in the file are one
    /// request): on an SSD, random requests cost more than their bytes.
    pub cold_reads: u64,
    /// The same, per cold-pool directory (one per SSD); empty for stores without a pool.
    pub cold_bytes_read_per_dir: Vec<u64>,
    /// The part of `cold_bytes_read` that went through the page cache (the dual path).
    pub cold_bytes_read_cached: u64,
    /// (Layer, KV head) regions of the cold pool read through the page cache now, of all.
    pub cold_lanes_cached: usize,
    pub cold_lanes: usize,
    /// Bytes that crossed from storage to the host: the cold reads, for stores that read K/V
    /// into memory to attend; only the partial attention outputs and their softmax statistics,
    /// for near-storage attention, where a computational drive keeps its reads to itself.
    pub bytes_to_host: u64,
    /// Bytes the sliding-window layers' rings hold in memory (part of `resident_bytes`).
    pub window_bytes: usize,
    /// Hot/cold bookkeeping, for stores with tiers.
    pub tier: Option<TierStats>,
}

/// What a tiered store did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    /// DRAM counted against the budget: hot rows, scoring keys, write-back window.
    pub hot_bytes: usize,
    pub hot_budget_bytes: usize,
    /// Selected (token, KV head) rows found hot / read from the cold pool (decode steps).
    pub hot_hits: u64,
    pub cold_hits: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub steps: u64,
    /// Cold-token score blocks merged, and the total time they waited between the storage
    /// evaluator finishing them and the host merging them.
    pub score_blocks: u64,
    pub score_block_wait_ns: u64,
    /// Total time from handing the cold tokens to the storage evaluator to merging its last block.
    pub cold_scan_ns: u64,
    /// Time decode steps waited for cold-pool reads: those issued ahead of a layer's turn, and
    /// the layer's own.
    pub cold_read_wait_ns: u64,
    /// Fidelity guard: (layer, step) selections checked, and those widened.
    pub guard_checks: u64,
    pub guard_widened: u64,
    /// Cold groups read ahead of their layer's turn (predicted from the last step), and those
    /// that the layer's selection then needed.
    pub read_ahead_groups: u64,
    pub read_ahead_used: u64,
    /// Decode-step selections of one (layer, KV head), and the cold-pool groups their cold
    /// tokens lie in, hot or not: how well the placement packs what is selected together.
    pub selections: u64,
    pub selected_groups: u64,
    /// The part of `selected_groups` holding a selected token that was not hot: the pages the
    /// selections had to read (before reads bridge gaps or run ahead).
    pub selected_cold_groups: u64,
    /// Placement `hits`: cold-pool blocks (per lane) rewritten in a new order, the time the
    /// re-placements took, and the part of `KvStats::cold_bytes_read` they read.
    pub relaid_blocks: u64,
    pub relayout_ns: u64,
    pub relayout_bytes_read: u64,
    /// SmartSSD (evaluator `xrt`): cold tokens the card scored, kernel runs, and whether the
    /// card failed and the host took over.
    pub device_tokens: u64,
    pub device_runs: u64,
    pub device_failed: bool,
    /// K/V bytes of the dense copy kept while memory is spare (0 once let go), and the decode
    /// steps that attended through it.
    pub spare_copy_bytes: usize,
    pub spare_copy_steps: u64,
}

pub trait KvStore: Send {
    fn shape(&self) -> KvShape;

    /// Tokens every layer holds.
    fn len_tokens(&self) -> usize;

    /// Stores K and V (`n × kv_dim` f32 rows each, RoPE applied to K) of the `n` tokens that
    /// follow the committed ones, for one layer.
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()>;

    /// Stores that keep some layers' inputs instead of their K/V (the X-cache) take the step's
    /// inputs to `layer` (`n × hidden`, normed: what the K and V projections read) here,
    /// before its `append`.
    fn append_input(&mut self, _layer: usize, _x: &[f32]) -> Result<()> {
        Ok(())
    }

    /// Stores that attend themselves, next to the data (exact near-storage attention), write
    /// the attention output of `queries` (the layer's sinks included) into `out` here and are
    /// not asked to select, gather or observe; `None` for the stores that hand the model their
    /// K/V instead.
    fn attend(&mut self, _layer: usize, _queries: &Queries<'_>, _out: &mut [f32]) -> Option<Result<()>> {
        None
    }

    /// Prepares `layer` for `queries`: the tokens they attend to, and the views that
    /// [`KvStore::gather`] will hand out for them.
    fn prepare(&mut self, layer: usize, queries: &Queries<'_>) -> Result<LayerPlan> {
        let selection = self.select(layer, queries)?;
        let cached_tokens = queries.positions.iter().max().map_or(0, |&p| p + 1);
        Ok(LayerPlan { parts: self.parts(&selection, cached_tokens), selection })
    }

    /// Chooses the tokens that `queries` attend to.
    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection>;

    /// How the attention to `selection` over `cached_tokens` tokens is cut into views. The
    /// default: every KV head in one view of the whole selection. Stores that assemble a view
    /// (rather than lend their own memory) gather a prompt's whole-cache selection one head at
    /// a time, and a long one in spans, so that the view never holds the layer's whole cache.
    fn parts(&self, _selection: &Selection, _cached_tokens: usize) -> Vec<HeadsPart> {
        HeadsPart::all(self.shape().n_kv_heads)
    }

    /// Makes the selected tokens' K/V of the KV heads `heads` readable (including the tokens
    /// appended this step): one of the planned views, with [`Selection::Span`] for a span.
    fn gather(&mut self, layer: usize, selection: &Selection, heads: Range<usize>) -> Result<KvView<'_>>;

    /// Called after attention with the selection that was used.
    fn observe(&mut self, layer: usize, selection: &Selection);

    /// Every layer has appended the `n_tokens` new tokens: they become part of the sequence.
    /// An error (the cold pool could not take them) leaves every token readable as before;
    /// the caller decides whether to go on or roll the step back with `truncate`.
    fn commit(&mut self, n_tokens: usize) -> Result<()>;

    /// Forgets every token from index `n_tokens` on, and anything appended but not committed.
    /// Returns how many tokens it kept: `n_tokens` (or fewer if it held fewer), or less when
    /// part of what it should keep cannot be read back; the caller must believe it and run the
    /// tokens after that again. Keeping fewer is always possible, so this cannot fail.
    fn truncate(&mut self, n_tokens: usize) -> usize;

    /// The sequence will be asked to go back to its first `n_tokens` tokens (a document's, for
    /// the questions after its summary). Stores that forget old tokens keep, from when they
    /// hold it, what a [`KvStore::truncate`] to there needs; the others keep it anyway.
    fn keep_prefix(&mut self, _n_tokens: usize) {}

    fn stats(&self) -> KvStats;

    /// The sequence is idle (cached between requests): a store lets go of memory it keeps only
    /// for speed if the machine no longer has room for it. A store that steps checks at each
    /// commit by itself; an idle one would otherwise hold on until its next request.
    fn trim(&mut self) {}
}
