//! HillInfer's tiered cache: a hot pool in DRAM, a cold pool on the SSD, and per decode step
//! attention over only the most important tokens.
//!
//! Per layer and step: the new token's K/V enter the write-back window (and reach the cold pool
//! a page at a time); every token is ranked by raw q·k against a compact INT4/INT8 copy of its
//! key that stays in DRAM, in score blocks merged into the global top-k as they are produced;
//! the selection is the attention sinks, the recent window and the top-α tokens; hot tokens are
//! copied from DRAM, cold ones read from the SSD page by page and filtered; attention is exact
//! over the selection. After the step, cold tokens that made the cut are promoted to the hot
//! pool and the least-selected unpinned hot tokens are demoted, within the hot byte budget.
//! Prompts (several queries at once) attend to everything, so prefill stays exact.

use super::aligned::AlignedBuf;
use super::cold::{ColdLayout, ColdPool, GROUP_TOKENS};
use super::hot::HotPool;
use super::view::ViewBuffers;
use super::window::RecentWindow;
use super::{KvShape, KvStats, KvStore, KvView, Selection, TierStats};
use crate::error::{Error, Result};
use crate::score::{KeyBits, ScoreBlock, ScoringKeys, StorageEvaluator, TopK, SCORE_BLOCK_TOKENS};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

/// The tiered store's knobs (see [`super::KvConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TieredSettings {
    /// Share of the cached tokens each decode step attends to.
    pub alpha: f32,
    /// DRAM for hot K/V rows, scoring keys and the write-back window together.
    pub hot_budget_bytes: usize,
    /// First tokens, always attended to and always hot.
    pub sink_tokens: usize,
    /// Most recent tokens, always attended to and always hot (at least one cold-pool group).
    pub recent_tokens: usize,
    /// Leading layers that attend densely (layer 0 is not sparse) and stay wholly hot.
    pub dense_layers: usize,
    pub key_bits: KeyBits,
}

/// DRAM a tiered store must hold at its maximum length whatever it decides: scoring keys, the
/// write-back window, dense layers, sinks and the recent window.
pub fn budget_floor_bytes(shape: KvShape, s: &TieredSettings) -> usize {
    let n = shape.max_tokens;
    let row = 2 * 2 * shape.kv_dim();
    let dense_layers = s.dense_layers.min(shape.n_layers);
    let keys = shape.n_layers * n * s.key_bits.bytes_per_token(shape.n_kv_heads, shape.head_dim);
    let window = shape.n_layers * GROUP_TOKENS * row;
    let pinned = (shape.n_layers - dense_layers) * (s.sink_tokens + s.recent_tokens).min(n) * row;
    keys + window + dense_layers * n * row + pinned
}

/// A cold token read this step, with its K and V rows (all KV heads, f16 bits).
type FetchedRow = (u32, Vec<u16>, Vec<u16>);

pub struct TieredKvStore {
    shape: KvShape,
    settings: TieredSettings,
    cold: ColdPool,
    window: RecentWindow,
    /// Per layer; shared with the storage evaluator's worker while it scans.
    keys: Vec<Arc<RwLock<ScoringKeys>>>,
    evaluator: StorageEvaluator,
    hot: HotPool,
    /// `[layer][token]`: how many decode steps selected the token.
    hits: Vec<Vec<u32>>,
    /// `[layer]`: cold tokens selected this step: promotion candidates.
    fetched: Vec<Vec<FetchedRow>>,
    view: ViewBuffers,
    positions: Vec<u32>,
    staging: AlignedBuf,
    len: usize,
    pending: Vec<usize>,
    tier: TierStats,
}

impl TieredKvStore {
    pub fn new(shape: KvShape, cold_dir: &Path, settings: TieredSettings) -> Result<Self> {
        let max_groups = shape.max_tokens.div_ceil(GROUP_TOKENS);
        let layout = ColdLayout { n_layers: shape.n_layers, n_kv_heads: shape.n_kv_heads, head_dim: shape.head_dim, max_groups };
        if !(settings.alpha > 0.0 && settings.alpha <= 1.0) {
            return Err(Error::InvalidParameter("alpha must be in (0, 1]".into()));
        }
        if settings.recent_tokens < GROUP_TOKENS {
            return Err(Error::InvalidParameter(format!("the recent window must hold at least {GROUP_TOKENS} tokens")));
        }
        let keys: Vec<Arc<RwLock<ScoringKeys>>> = (0..shape.n_layers)
            .map(|_| Arc::new(RwLock::new(ScoringKeys::new(settings.key_bits, shape.n_kv_heads, shape.head_dim))))
            .collect();
        let row_words = shape.kv_dim();
        let store = Self {
            hot: HotPool::new(shape.n_layers, row_words),
            window: RecentWindow::new(shape.n_layers, shape.n_kv_heads, shape.head_dim),
            hits: vec![Vec::new(); shape.n_layers],
            fetched: vec![Vec::new(); shape.n_layers],
            view: ViewBuffers::new(shape.n_kv_heads, shape.head_dim, shape.max_tokens),
            positions: Vec::new(),
            staging: AlignedBuf::zeroed(max_groups * shape.n_kv_heads * layout.group_bytes()),
            cold: ColdPool::create(cold_dir, layout)?,
            keys,
            evaluator: StorageEvaluator::new(),
            shape,
            settings,
            len: 0,
            pending: vec![0; shape.n_layers],
            tier: TierStats::default(),
        };
        let floor = budget_floor_bytes(shape, &store.settings);
        if store.settings.hot_budget_bytes < floor {
            return Err(Error::InvalidParameter(format!(
                "hot budget {} MB is below the {} MB that scoring keys, dense layers and pinned tokens need at {} tokens",
                store.settings.hot_budget_bytes / 1_000_000,
                floor.div_ceil(1_000_000),
                shape.max_tokens
            )));
        }
        Ok(store)
    }

    /// DRAM in use now, counted against the hot budget.
    pub fn hot_bytes(&self) -> usize {
        let window_tokens: usize = (0..self.shape.n_layers).map(|l| self.window.len(l)).sum();
        let key_bytes: usize = self.keys.iter().map(|k| k.read().unwrap_or_else(|p| p.into_inner()).bytes()).sum();
        self.hot.bytes() + key_bytes + window_tokens * self.hot.row_bytes()
    }

    fn is_dense(&self, layer: usize) -> bool {
        layer < self.settings.dense_layers
    }

    fn is_pinned(&self, layer: usize, token: u32) -> bool {
        let t = token as usize;
        self.is_dense(layer) || t < self.settings.sink_tokens || t + self.settings.recent_tokens >= self.len
    }

    /// K or V rows of every head of a window token, concatenated as the hot pool stores them.
    fn window_rows(&self, layer: usize, token: usize) -> (Vec<u16>, Vec<u16>) {
        let mut k = Vec::with_capacity(self.shape.kv_dim());
        let mut v = Vec::with_capacity(self.shape.kv_dim());
        for head in 0..self.shape.n_kv_heads {
            k.extend_from_slice(self.window.row(layer, head, token, false));
            v.extend_from_slice(self.window.row(layer, head, token, true));
        }
        (k, v)
    }

    /// Reads the cold groups holding `tokens` that are neither hot nor in the window, into
    /// `staging` as `[head][needed group]`; returns the groups read (ascending).
    fn read_cold_groups(&mut self, layer: usize, tokens: &[u32]) -> Result<Vec<usize>> {
        let base = self.window.base();
        let mut groups: Vec<usize> = tokens
            .iter()
            .filter(|&&t| (t as usize) < base && !self.hot.contains(layer, t))
            .map(|&t| t as usize / GROUP_TOKENS)
            .collect();
        groups.dedup(); // tokens are ascending, so equal groups are adjacent
        let gb = self.cold.layout().group_bytes();
        // One request per run of consecutive groups per head, issued from the I/O pool so that
        // many are in flight at once (an SSD needs a deep queue for its random-read rate).
        let mut runs = Vec::new(); // (head, first group index in `groups`, count), in staging order
        for head in 0..self.shape.n_kv_heads {
            let mut i = 0;
            while i < groups.len() {
                let mut j = i + 1;
                while j < groups.len() && groups[j] == groups[j - 1] + 1 {
                    j += 1;
                }
                runs.push((head, i, j - i));
                i = j;
            }
        }
        let mut rest = &mut self.staging.as_bytes_mut()[..self.shape.n_kv_heads * groups.len() * gb];
        let mut requests = Vec::with_capacity(runs.len());
        for &(head, at, count) in &runs {
            let (dst, tail) = rest.split_at_mut(count * gb);
            requests.push((head, groups[at], count, dst));
            rest = tail;
        }
        let cold = &self.cold;
        io_pool().install(|| {
            use rayon::prelude::*;
            requests.into_par_iter().try_for_each(|(head, first, count, dst)| cold.read_groups(layer, head, first, count, dst))
        })?;
        Ok(groups)
    }
}

impl KvStore for TieredKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let n = self.shape.tokens_to_append(self.len, k, v)?;
        self.window.push(layer, k, v);
        self.keys[layer].write().unwrap_or_else(|p| p.into_inner()).push(k);
        self.pending[layer] = n;
        Ok(())
    }

    fn select(&mut self, layer: usize, q: &[f32], q_positions: &[usize]) -> Result<Selection> {
        let s = &self.settings;
        let n = self.len + self.pending[layer];
        // The top α of the tokens, on top of the sinks and the recent window.
        let budget = (s.alpha * n as f32).ceil() as usize;
        let pinned = s.sink_tokens + s.recent_tokens;
        if self.is_dense(layer) || budget + pinned >= n {
            return Ok(Selection::All);
        }
        // Each KV head's query is the sum of its group's query heads (the score aggregates them).
        let (hd, n_kv) = (self.shape.head_dim, self.shape.n_kv_heads);
        let row = q.len() / q_positions.len();
        let group = row / hd / n_kv;
        let last_row = &q[q.len() - row..];
        let mut query = vec![0f32; n_kv * hd];
        for h in 0..n_kv {
            for g in 0..group {
                let src = &last_row[(h * group + g) * hd..][..hd];
                query[h * hd..][..hd].iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
        }
        if q_positions.len() > 1 {
            // A prompt chunk attends to everything; its last query seeds the hit table, so the
            // tokens the prompt found important start out hot instead of the merely recent.
            self.seed_hits(layer, &query, s.sink_tokens..n - s.recent_tokens, budget);
            return Ok(Selection::All);
        }
        // Cold candidates go to the storage evaluator, which streams score blocks back while
        // the host scores the hot ones; both kinds of block merge into one top-k as they come.
        let candidates = s.sink_tokens..n - s.recent_tokens;
        let base = self.window.base();
        let (hot, cold): (Vec<u32>, Vec<u32>) =
            candidates.clone().map(|t| t as u32).partition(|&t| t as usize >= base || self.hot.contains(layer, t));
        let cold_blocks = self.evaluator.score(self.keys[layer].clone(), query.clone(), cold);
        let mut top = TopK::new(budget);
        {
            let keys = self.keys[layer].read().unwrap_or_else(|p| p.into_inner());
            let mut block = ScoreBlock::default();
            for chunk in hot.chunks(SCORE_BLOCK_TOKENS) {
                block.tokens.clear();
                block.tokens.extend_from_slice(chunk);
                block.scores.resize(chunk.len(), 0.0);
                keys.score(&query, chunk, &mut block.scores);
                top.merge(&block);
                while let Ok(cold_block) = cold_blocks.try_recv() {
                    top.merge(&cold_block);
                }
            }
        }
        for cold_block in cold_blocks {
            top.merge(&cold_block);
        }
        let mut tokens: Vec<u32> = (0..s.sink_tokens as u32).collect();
        tokens.extend(top.into_tokens());
        tokens.extend(candidates.end as u32..n as u32);
        Ok(Selection::Tokens(tokens))
    }

    fn gather(&mut self, layer: usize, selection: &Selection) -> Result<KvView<'_>> {
        let n = self.len + self.pending[layer];
        let tokens: Vec<u32> = match selection {
            Selection::All => (0..n as u32).collect(),
            Selection::Tokens(t) => t.clone(),
        };
        let groups = self.read_cold_groups(layer, &tokens)?;
        let (hd, n_kv, base) = (self.shape.head_dim, self.shape.n_kv_heads, self.window.base());
        let gb_words = self.cold.layout().group_bytes() / 2;
        let per_head_words = groups.len() * gb_words;
        let sparse = matches!(selection, Selection::Tokens(_));
        self.positions.clear();
        let mut group_at = 0;
        for (slot, &t) in tokens.iter().enumerate() {
            let tu = t as usize;
            self.positions.push(t);
            if tu >= base {
                for head in 0..n_kv {
                    self.view.set_token(slot, head, self.window.row(layer, head, tu, false), self.window.row(layer, head, tu, true));
                }
            } else if let Some((k, v)) = self.hot.get(layer, t) {
                for head in 0..n_kv {
                    self.view.set_token(slot, head, &k[head * hd..][..hd], &v[head * hd..][..hd]);
                }
                if sparse {
                    self.tier.hot_hits += 1;
                }
            } else {
                while groups[group_at] != tu / GROUP_TOKENS {
                    group_at += 1;
                }
                let row = tu % GROUP_TOKENS;
                let mut k_all = Vec::with_capacity(n_kv * hd);
                let mut v_all = Vec::with_capacity(n_kv * hd);
                for head in 0..n_kv {
                    let page = &self.staging.as_u16()[head * per_head_words + group_at * gb_words..][..gb_words];
                    let (k, v) = (&page[row * hd..][..hd], &page[GROUP_TOKENS * hd + row * hd..][..hd]);
                    self.view.set_token(slot, head, k, v);
                    if sparse {
                        k_all.extend_from_slice(k);
                        v_all.extend_from_slice(v);
                    }
                }
                if sparse {
                    self.tier.cold_hits += 1;
                    self.fetched[layer].push((t, k_all, v_all));
                }
            }
        }
        let positions = match selection {
            Selection::All => None,
            Selection::Tokens(_) => Some(&self.positions[..]),
        };
        Ok(self.view.view(tokens.len(), positions))
    }

    fn observe(&mut self, layer: usize, selection: &Selection) {
        if let Selection::Tokens(tokens) = selection {
            let hits = &mut self.hits[layer];
            let n = self.len + self.pending[layer];
            if hits.len() < n {
                hits.resize(n, 0);
            }
            for &t in tokens {
                hits[t as usize] += 1;
            }
        }
    }

    fn commit(&mut self, n_tokens: usize) {
        self.len += n_tokens;
        self.pending.fill(0);
        for hits in &mut self.hits {
            hits.resize(self.len, 0);
        }
        // Tokens leaving the window are recent (pinned), so they stay hot as they reach the SSD.
        let spill_end = self.window.base() + (0..self.shape.n_layers).map(|l| self.window.len(l)).min().unwrap_or(0) / GROUP_TOKENS * GROUP_TOKENS;
        for layer in 0..self.shape.n_layers {
            for t in self.window.base()..spill_end {
                let (k, v) = self.window_rows(layer, t);
                self.hot.insert(layer, t as u32, &k, &v);
            }
        }
        if let Err(e) = self.window.spill(&mut self.cold) {
            tracing::error!(error = %e, "cold pool write failed; keeping tokens in memory");
        }
        // Promote the cold tokens this step selected.
        for layer in 0..self.shape.n_layers {
            for (t, k, v) in std::mem::take(&mut self.fetched[layer]) {
                self.hot.insert(layer, t, &k, &v);
                self.tier.promotions += 1;
            }
        }
        self.demote_to_budget();
        self.tier.steps += 1;
    }

    fn truncate(&mut self, n_tokens: usize) {
        self.pending.fill(0);
        for f in &mut self.fetched {
            f.clear();
        }
        let keep = n_tokens.min(self.len);
        if let Err(e) = self.window.truncate(keep, &self.cold) {
            tracing::error!(error = %e, "cold pool read failed while truncating; dropping the cache");
            self.window = RecentWindow::new(self.shape.n_layers, self.shape.n_kv_heads, self.shape.head_dim);
            return self.truncate_bookkeeping(0);
        }
        self.truncate_bookkeeping(keep);
    }

    fn stats(&self) -> KvStats {
        KvStats {
            tokens: self.len,
            resident_bytes: self.hot_bytes() + self.view.bytes() + self.staging.len(),
            cold_bytes: self.window.base() * self.shape.bytes_per_token(),
            cold_bytes_read: self.cold.stats.bytes_read.load(Ordering::Relaxed),
            tier: Some(TierStats { hot_bytes: self.hot_bytes(), hot_budget_bytes: self.settings.hot_budget_bytes, ..self.tier.clone() }),
        }
    }
}

/// Threads that issue cold-pool reads: blocking preads, so more threads than cores means more
/// requests in flight.
fn io_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(IO_THREADS)
            .thread_name(|i| format!("hillside-io-{i}"))
            .build()
            .expect("starting the cold-pool I/O threads")
    })
}

/// Reads in flight at once against the cold pool.
const IO_THREADS: usize = 16;

impl TieredKvStore {
    /// Counts a hit for the `budget` best-scoring `candidates` against `query`.
    fn seed_hits(&mut self, layer: usize, query: &[f32], candidates: std::ops::Range<usize>, budget: usize) {
        let tokens: Vec<u32> = candidates.map(|t| t as u32).collect();
        let mut block = ScoreBlock { scores: vec![0.0; tokens.len()], tokens };
        self.keys[layer].read().unwrap_or_else(|p| p.into_inner()).score(query, &block.tokens, &mut block.scores);
        let mut top = TopK::new(budget);
        top.merge(&block);
        let n = self.len + self.pending[layer];
        let hits = &mut self.hits[layer];
        hits.resize(hits.len().max(n), 0);
        for t in top.into_tokens() {
            hits[t as usize] += 1;
        }
    }

    fn truncate_bookkeeping(&mut self, n_tokens: usize) {
        self.len = n_tokens;
        for keys in &self.keys {
            keys.write().unwrap_or_else(|p| p.into_inner()).truncate(n_tokens);
        }
        for hits in &mut self.hits {
            hits.truncate(n_tokens);
        }
        self.hot.truncate(n_tokens);
    }

    /// Evicts the least-selected unpinned hot tokens (over all sparse layers) until the hot
    /// pool, the scoring keys and the window fit the budget. Evicted tokens are already on the
    /// SSD, so demotion frees memory without I/O.
    fn demote_to_budget(&mut self) {
        let used = self.hot_bytes();
        if used <= self.settings.hot_budget_bytes {
            return;
        }
        let excess_rows = (used - self.settings.hot_budget_bytes).div_ceil(self.hot.row_bytes());
        let mut victims: Vec<(u32, usize, u32)> = Vec::new();
        for layer in self.settings.dense_layers..self.shape.n_layers {
            for t in self.hot.tokens(layer).filter(|&t| !self.is_pinned(layer, t)) {
                victims.push((self.hits[layer].get(t as usize).copied().unwrap_or(0), layer, t));
            }
        }
        // Fewest selections first; among equals, the oldest token.
        victims.sort_unstable_by_key(|&(hits, layer, t)| (hits, t, layer));
        for &(_, layer, t) in victims.iter().take(excess_rows) {
            self.hot.remove(layer, t);
            self.tier.demotions += 1;
        }
    }
}
