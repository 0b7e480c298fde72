//! HillInfer's tiered cache: a hot pool in DRAM, a cold pool on the SSD, and per decode step
//! attention over only the most important tokens.
//!
//! Per layer and step: the new token's K/V enter the write-back window (and reach the cold pool
//! a page at a time); every token is ranked, for each KV head, by raw q·k against a compact
//! INT4/INT8 copy of its key that stays in DRAM, in score blocks merged into each head's top-k
//! as they are produced; each head's selection is the attention sinks, the recent window and
//! its top-α tokens, with the tokens ranked just below them whose rows the step holds anyway
//! (free riders, the default selector), and, when the fidelity guard finds the top α holds too
//! little of a head's estimated attention (sink logits included), as many more as that head
//! needs, up to twice the budget; hot rows are copied from DRAM, cold ones read
//! from the SSD page by page and filtered; attention is exact over the selection. After the
//! step the hot pool keeps the most-selected of its unpinned rows and of the cold rows just
//! read, within the byte budget (the planner in [`planner`] sizes that budget). Prompts (several
//! queries at once) attend to everything, so prefill stays exact.
//!
//! While the machine has memory to spare, the store also keeps a dense copy of every token and
//! decode steps attend to all of it instead ([`spare`]); the copy is let go under pressure.

mod cold_reader;
mod gather;
mod pages;
pub mod planner;
mod promoter;
mod ranker;
mod reads;
mod spare;

use crate::error::{Error, Result};
use crate::kernels::parallel::map_items;
use crate::kv::backing::DiskBacking;
use crate::kv::cold::format::ColdType;
use crate::kv::cold::placement::PlacementKind;
use crate::kv::cold::{ColdLayout, GROUP_TOKENS};
use crate::kv::view::ViewBuffers;
use crate::kv::{
    EvaluatorKind, HeadsPart, KvShape, KvStats, KvStore, KvView, Queries, Selection, SelectorKind, TierStats,
};
use crate::score::topk::ascending;
use crate::score::xrt::XrtOptions;
use crate::score::{HeadsTopK, KeyBits};
use crate::trace::{self, timed, Phase};
use cold_reader::{ColdReader, Residence};
use promoter::{Promoter, Standing};
use ranker::Ranker;
use spare::SpareCopy;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The tiered store's knobs (see [`crate::kv::KvConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TieredSettings {
    /// Share of the cached tokens each decode step attends to.
    pub alpha: f32,
    /// DRAM for hot K/V rows, scoring keys, the write-back window and read staging together.
    pub hot_budget_bytes: usize,
    /// First tokens, always attended to and always hot.
    pub sink_tokens: usize,
    /// Most recent tokens, always attended to and always hot (at least one cold-pool group).
    pub recent_tokens: usize,
    /// Leading layers that attend densely (layer 0 is not sparse) and stay wholly hot.
    pub dense_layers: usize,
    pub key_bits: KeyBits,
    pub evaluator: EvaluatorKind,
    /// The card for [`EvaluatorKind::Xrt`].
    pub xrt: XrtOptions,
    /// The fidelity guard: a step whose top α holds less than this share of a head's
    /// estimated attention attends, in that layer, to as many more tokens as the neediest head
    /// needs to reach it, up to twice the budget (0 turns it off).
    pub guard_mass: f32,
    /// How spilled tokens are laid out in the cold pool's pages.
    pub placement: PlacementKind,
    /// How the cold pool keeps K and V.
    pub cold_type: ColdType,
    /// Tokens one by one (with or without free riders), or whole pages.
    pub selector: SelectorKind,
    /// Selector `sparf`: the query dimensions tokens are scored on.
    pub sparf_dims: usize,
    /// While memory is spare, also keep the whole cache densely and attend to all of it
    /// (see [`spare`]).
    pub spare_copy: bool,
}

/// DRAM a tiered store must hold at its maximum length whatever it decides: scoring keys, the
/// write-back window, and the K/V rows of dense layers, sinks and the recent window.
pub fn budget_floor_bytes(shape: KvShape, s: &TieredSettings) -> usize {
    let row = 2 * 2 * shape.kv_dim();
    let sparse_layers = shape.n_layers - s.dense_layers.min(shape.n_layers);
    let keys = sparse_layers * shape.max_tokens * s.key_bits.bytes_per_token(shape.n_kv_heads, shape.head_dim);
    let window = shape.n_layers * GROUP_TOKENS * row;
    keys + window + staging_reserve_bytes(shape) + pinned_rows_bytes(shape, s)
}

/// Read staging the budget sets aside: the most a step's read buffers hold at once, with f16
/// groups (q8's are smaller), so that the cold type leaves the hot rows as they are.
fn staging_reserve_bytes(shape: KvShape) -> usize {
    let max_groups = shape.max_tokens.div_ceil(GROUP_TOKENS);
    reads::staging_bound_bytes(
        ColdLayout::f16(shape.n_layers, shape.n_kv_heads, shape.head_dim, max_groups).layer_bytes(),
    )
}

/// K/V rows that are always hot: dense layers, sinks and the recent window.
pub fn pinned_rows_bytes(shape: KvShape, s: &TieredSettings) -> usize {
    let n = shape.max_tokens;
    let row = 2 * 2 * shape.kv_dim();
    let dense_layers = s.dense_layers.min(shape.n_layers);
    dense_layers * n * row + (shape.n_layers - dense_layers) * (s.sink_tokens + s.recent_tokens).min(n) * row
}

pub struct TieredKvStore {
    shape: KvShape,
    settings: TieredSettings,
    /// The cold pool, the write-back window and the token count.
    backing: DiskBacking,
    /// Scoring keys, the cold-token evaluator and the fidelity guard.
    ranker: Ranker,
    /// The rows kept in DRAM, their hits, and promotion and demotion between the tiers.
    hot: Promoter,
    view: ViewBuffers,
    positions: Vec<u32>,
    /// Which cold groups a selection needs, and their reads (at a layer's turn, and ahead).
    reader: ColdReader,
    /// Decode steps since the last prompt chunk: placement `hits` re-places the cold pool at
    /// some of them.
    decode_steps: u64,
    /// Placement `hits`: `hits` as the last prompt chunk left it (its seeds), so that a
    /// re-placement ranks tokens by what decode steps selected first and by the seeds second.
    prompt_hits: Vec<Vec<u16>>,
    /// Every token's K/V, densely, while memory is spare.
    spare: Option<SpareCopy>,
    tier: TierStats,
}

impl TieredKvStore {
    /// A store with its cold pool in `cold_dir`. `xrt_problem` is what the start-up probe said
    /// about the card (evaluator `xrt` only; see [`crate::kv::config::KvStartup`]).
    pub fn new(
        shape: KvShape,
        cold_dirs: &[PathBuf],
        settings: TieredSettings,
        xrt_problem: Option<String>,
    ) -> Result<Self> {
        if !crate::kv::alpha_in_range(settings.alpha) {
            return Err(Error::InvalidParameter("alpha must be in (0, 1]".into()));
        }
        if settings.recent_tokens < GROUP_TOKENS {
            return Err(Error::InvalidParameter(format!("the recent window must hold at least {GROUP_TOKENS} tokens")));
        }
        let lanes = shape.n_layers * shape.n_kv_heads;
        // Without the card, no key chunks are laid out for it.
        let evaluator = ranker::evaluator_in_use(settings.evaluator, xrt_problem);
        let key_chunk_bytes =
            if evaluator == EvaluatorKind::Xrt { ranker::key_chunks(shape, &settings).chunk_bytes() } else { 0 };
        let backing = DiskBacking::new(shape, cold_dirs, key_chunk_bytes, settings.placement, settings.cold_type)?;
        let floor = budget_floor_bytes(shape, &settings);
        if settings.hot_budget_bytes < floor {
            return Err(Error::InvalidParameter(format!(
                "hot budget {} MB is below the {} MB that scoring keys, read staging, dense layers and pinned tokens need at {} tokens",
                settings.hot_budget_bytes / 1_000_000,
                floor.div_ceil(1_000_000),
                shape.max_tokens
            )));
        }
        Ok(Self {
            ranker: Ranker::new(shape, &settings, evaluator, backing.cold()),
            hot: Promoter::new(
                lanes,
                settings.dense_layers.min(shape.n_layers) * shape.n_kv_heads..lanes,
                shape.head_dim,
                settings.hot_budget_bytes,
                shape.max_tokens,
            ),
            view: ViewBuffers::new(shape.head_dim),
            positions: Vec::new(),
            reader: ColdReader::new(shape.n_layers, settings.dense_layers, backing.cold().layout().layer_bytes()),
            decode_steps: 0,
            prompt_hits: Vec::new(),
            spare: if settings.spare_copy { SpareCopy::if_room(shape) } else { None },
            backing,
            shape,
            settings,
            tier: TierStats::default(),
        })
    }

    fn tier_stats(&self) -> TierStats {
        let moves = self.hot.moves();
        let mut tier = TierStats {
            hot_bytes: self.hot_bytes(),
            promotions: moves.promotions,
            demotions: moves.demotions,
            hot_budget_bytes: self.settings.hot_budget_bytes,
            spare_copy_bytes: self.spare.as_ref().map_or(0, SpareCopy::bytes),
            ..self.tier.clone()
        };
        self.ranker.report(&mut tier);
        self.reader.report(&mut tier);
        tier
    }

    /// DRAM in use now, counted against the hot budget.
    pub fn hot_bytes(&self) -> usize {
        self.hot.bytes() + self.keys_and_window_bytes() + self.reader.staging_bytes()
    }

    /// Scoring keys and the write-back window.
    fn keys_and_window_bytes(&self) -> usize {
        let window_tokens = self.backing.window_tokens();
        self.ranker.key_bytes() + window_tokens * self.hot.pool().row_bytes() * self.shape.n_kv_heads
    }

    /// Bookkeeping beside the budget: the promoter's (hits, the pool's index, the demotion
    /// reserve), the reader's last selections and the placement maps (about 9 bytes
    /// per token and lane).
    fn bookkeeping_bytes(&self) -> usize {
        let seeds: usize = self.prompt_hits.iter().map(|h| 2 * h.capacity()).sum();
        self.hot.bookkeeping_bytes() + self.reader.bookkeeping_bytes() + seeds + self.backing.placement_bytes()
    }

    /// Lets the promoter decide which rows stay in DRAM after a step.
    fn rebalance(&mut self) {
        // What the rows share the budget with. Read staging is set aside at its bound, not at
        // what the buffers hold now, so that the next step's reads never push the store over.
        let fixed = self.keys_and_window_bytes() + staging_reserve_bytes(self.shape);
        let (slot, unpinned, cold_end) = {
            let backing = &self.backing;
            let unpinned =
                self.settings.sink_tokens as u32..backing.len().saturating_sub(self.settings.recent_tokens) as u32;
            (|lane: usize, t: u32| backing.lane_slot(lane, t as usize) as u32, unpinned, backing.cold_end() as u32)
        };
        self.hot.rebalance(&Standing { slot: &slot, unpinned, cold_end }, self.settings.hot_budget_bytes, fixed);
    }

    fn lane(&self, layer: usize, head: usize) -> usize {
        layer * self.shape.n_kv_heads + head
    }

    /// Where each row lives.
    fn residence(&self) -> Residence<'_> {
        Residence { backing: &self.backing, hot: self.hot.pool(), n_kv_heads: self.shape.n_kv_heads }
    }

    /// The cold reader, and where each row lives, borrowed together.
    fn reader_at(&mut self) -> (&mut ColdReader, Residence<'_>) {
        (
            &mut self.reader,
            Residence { backing: &self.backing, hot: self.hot.pool(), n_kv_heads: self.shape.n_kv_heads },
        )
    }

    fn is_dense(&self, layer: usize) -> bool {
        layer < self.settings.dense_layers
    }

    /// The sinks, the top `budget` of `candidates` for each head by its query, and the recent
    /// tokens. Cold candidates go to the storage evaluator, which streams score blocks back
    /// while the compute threads score the hot ones; every block, of either kind, merges into
    /// one top-k per head as it comes. The layer's sink logits (`sink_logits`, one per KV head)
    /// take their share of the mass the fidelity guard estimates.
    fn rank(
        &mut self,
        layer: usize,
        query: &[f32],
        group: usize,
        sink_logits: Option<&[f32]>,
        candidates: std::ops::Range<usize>,
        budget: usize,
    ) -> Vec<Vec<u32>> {
        let n_kv = self.shape.n_kv_heads;
        let base = self.backing.cold_end();
        let lanes: Vec<usize> = (0..n_kv).map(|h| self.lane(layer, h)).collect();
        let guard = self.ranker.guards();
        // With the guard on, twice the budget is kept ranked, to widen into if needed; free
        // riders come from below the budget, and page-wise selection weighs pages by those too.
        let selector = self.settings.selector;
        let keep = if guard || !selector.by_rank_alone() { (2 * budget).min(candidates.len()) } else { budget };
        let (hot, cold) = match self.ranker.scores_beside_the_pool() {
            true => split_by_residence(
                &lanes.iter().map(|&l| self.hot.pool().bitmap(l)).collect::<Vec<_>>(),
                candidates.clone(),
                base,
            ),
            false => (candidates.clone().map(|t| t as u32).collect(), Vec::new()),
        };
        let mass_scale = self.mass_scale(group);
        let n = candidates.end + self.settings.recent_tokens;
        let pinned: Vec<u32> = (0..candidates.start as u32).chain(candidates.end as u32..n as u32).collect();
        let merged = self.ranker.rank(layer, query, mass_scale, hot, cold, pinned, keep);
        let _picking = trace::span(Phase::RankPick);
        let chosen = if merged.mass.is_none() && selector.by_rank_alone() {
            merged.top.into_tokens()
        } else {
            // Page-wise selection weighs every ranked token and needs no order (the guard does).
            let ranked = match selector == SelectorKind::Pages && merged.mass.is_none() {
                true => merged.top.into_unordered(),
                false => merged.top.into_ranked(),
            };
            let take = match merged.mass {
                Some(mass) => self.ranker.guard(&ranked, mass, &merged.pinned, sink_logits, budget.min(keep)),
                None => budget,
            };
            match selector {
                SelectorKind::Tokens | SelectorKind::Sparf => {
                    ranked.iter().map(|head| ascending_tokens(&head[..take.min(head.len())])).collect()
                }
                SelectorKind::Riders => self.with_free_riders(layer, &ranked, take),
                SelectorKind::Pages => {
                    let pages = self.whole_pages(layer, &ranked, take, mass_scale, candidates.clone());
                    self.with_hot_riders(layer, &ranked, pages)
                }
            }
        };
        chosen
            .into_iter()
            .map(|chosen| {
                let mut tokens: Vec<u32> = (0..candidates.start as u32).collect();
                tokens.extend(chosen);
                tokens.extend(candidates.end as u32..n as u32);
                tokens
            })
            .collect()
    }

    /// The factor that turns a summed query's scores into the logits of its `group` heads' mean
    /// query: their score over G heads is G times the mean logit·√d.
    fn mass_scale(&self, group: usize) -> f32 {
        1.0 / (group as f32 * (self.shape.head_dim as f32).sqrt())
    }

    /// Each head's best `take` of its `ranked` tokens and its free riders (see [`pages`]),
    /// ascending.
    fn with_free_riders(&self, layer: usize, ranked: &[Vec<(f32, u32)>], take: usize) -> Vec<Vec<u32>> {
        let held = self.residence().in_memory(layer);
        let page_of = |head: usize, t: u32| self.backing.slot(layer, head, t as usize) / GROUP_TOKENS;
        let riders = pages::free_riders(ranked, take, held, page_of);
        let chosen = ranked.iter().map(|head| head[..take.min(head.len())].iter().map(|r| r.1).collect()).collect();
        joined(chosen, riders)
    }

    /// Each head's `chosen` tokens (ascending) and, past them, its `ranked` tokens that are in
    /// memory (see [`pages::hot_riders`]), ascending.
    fn with_hot_riders(&self, layer: usize, ranked: &[Vec<(f32, u32)>], chosen: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
        let riders = pages::hot_riders(ranked, &chosen, self.residence().in_memory(layer));
        joined(chosen, riders)
    }

    /// Each head's `take` tokens of `candidates` as whole cold-pool pages (see [`pages`]),
    /// weighted by the attention `scale` gives their `ranked` scores.
    fn whole_pages(
        &self,
        layer: usize,
        ranked: &[Vec<(f32, u32)>],
        take: usize,
        scale: f32,
        candidates: std::ops::Range<usize>,
    ) -> Vec<Vec<u32>> {
        let backing = &self.backing;
        map_items(ranked.iter().enumerate().collect(), |(head, ranked)| {
            pages::whole_pages(
                ranked,
                take,
                scale,
                |t| backing.slot(layer, head, t as usize) / GROUP_TOKENS,
                |page| std::array::from_fn(|i| backing.token(layer, head, page * GROUP_TOKENS + i) as u32),
                |t| candidates.contains(&(t as usize)),
            )
        })
    }
}

impl KvStore for TieredKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.backing.len()
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.backing.append(layer, k, v)?;
        if let Some(spare) = &mut self.spare {
            spare.dense.append(layer, k, v)?;
        }
        if !self.is_dense(layer) {
            // Dense layers never rank their tokens, so they need no scoring copy.
            self.ranker.push(layer, k);
        }
        Ok(())
    }

    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection> {
        let (q, q_positions) = (queries.q, queries.positions);
        if self.spare.is_some() && q_positions.len() == 1 {
            return Ok(Selection::All); // a decode step with the dense copy at hand
        }
        let s = &self.settings;
        let n = self.backing.held(layer);
        // The top α of the tokens, on top of the sinks and the recent window.
        let budget = (s.alpha * n as f32).ceil() as usize;
        let pinned = s.sink_tokens + s.recent_tokens;
        if self.is_dense(layer) || budget + pinned >= n {
            return Ok(Selection::All);
        }
        let candidates = s.sink_tokens..n - s.recent_tokens;
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
            self.seed_hits(layer, &query, group, candidates, budget);
            return Ok(Selection::All);
        }
        if self.settings.selector == SelectorKind::Sparf {
            for row in query.chunks_exact_mut(hd) {
                keep_largest_dims(row, self.settings.sparf_dims.max(1));
            }
        }
        // The summed query stands for its group's mean query, so a head's sink is the group's mean.
        let sinks: Option<Vec<f32>> =
            queries.sinks.map(|s| s.chunks_exact(group).map(|g| g.iter().sum::<f32>() / group as f32).collect());
        Ok(Selection::per_head(&self.rank(layer, &query, group, sinks.as_deref(), candidates, budget)))
    }

    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        match (&self.spare, selection) {
            // The view is the dense copy itself.
            (Some(_), _) => HeadsPart::all(self.shape.n_kv_heads),
            // A decode step reads every head's cold groups at once, for more requests in flight.
            (None, Selection::Tokens { .. }) => HeadsPart::all(self.shape.n_kv_heads),
            // A prompt (or a dense layer's step) attends to every token: one head at a time, in
            // spans, so that the view and the read staging hold a span of one head, never the
            // layer's whole cache.
            (None, Selection::All | Selection::Span(_)) => {
                HeadsPart::each_head(self.shape.n_kv_heads, cached_tokens, Some(SPAN_TOKENS))
            }
        }
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        // Not `if let`: a borrow returned from it would hold `self` for the rest of the function.
        #[allow(clippy::unnecessary_unwrap)]
        if self.spare.is_some() {
            return self.spare.as_mut().expect("checked").dense.gather(layer, selection, heads);
        }
        let n = self.backing.held(layer);
        let every: Vec<u32> = match selection {
            Selection::All => (0..n as u32).collect(),
            Selection::Span(span) => (span.start.min(n) as u32..span.end.min(n) as u32).collect(),
            Selection::Tokens { .. } => Vec::new(),
        };
        let tokens = |head: usize| selection.head(head).unwrap_or(&every);
        let (slots, n_heads) = (tokens(heads.start).len(), heads.len()); // every head selects as many
        self.view.reset(n_heads, slots);
        self.positions.clear();
        if let Selection::Tokens { .. } = selection {
            debug_assert_eq!(heads, 0..self.shape.n_kv_heads, "a decode step gathers every head at once");
            // A decode step: the cold groups the read-ahead is not already reading, every
            // head's at once for more requests in flight, start at once on reader threads, in
            // pieces; the resident rows are copied while the reads run, then each read's rows
            // as it lands. The next layer's read-ahead starts only once the last piece lands:
            // sharing the disk with it delays this layer's reads, which the step waits for.
            let reading = timed(Phase::ReadIssue, || {
                let (reader, at) = self.reader_at();
                reader.start(at, layer, &tokens)
            });
            let mut cold_rows =
                timed(Phase::CopyResident, || self.copy_resident_rows(layer, &tokens, heads.clone(), true));
            if let Some(ahead) = timed(Phase::ReadWait, || self.reader.claim_ahead(layer)) {
                let copied = timed(Phase::CopyCold, || {
                    self.copy_cold_rows(layer, &mut cold_rows, &ahead.staged, &ahead.buf, heads.clone(), true)
                });
                self.reader.recycle_ahead(ahead.buf); // for the next layer's read-ahead
                copied?;
            }
            let read_ahead = |store: &mut Self| {
                let (reader, at) = store.reader_at();
                timed(Phase::ReadAhead, || reader.read_ahead(at.backing.cold(), layer));
            };
            if let Some(mut reading) = reading {
                let cold = self.backing.cold().clone();
                while let Some((staged, buf)) = timed(Phase::ReadWait, || self.reader.next_landed(&cold, &mut reading))
                {
                    let staged = staged?;
                    if reading.is_drained() {
                        read_ahead(self);
                    }
                    let copied = timed(Phase::CopyCold, || {
                        self.copy_cold_rows(layer, &mut cold_rows, &staged, &buf, heads.clone(), true)
                    });
                    self.reader.recycle(buf);
                    copied?;
                }
            } else {
                read_ahead(self);
            }
            // Rows still missing are the read-ahead's, which failed (and said so).
            self.read_missing_rows(layer, &mut cold_rows, heads)?;
            (0..self.shape.n_kv_heads).for_each(|head| self.positions.extend_from_slice(tokens(head)));
        } else {
            let first_span = !matches!(selection, Selection::Span(span) if span.start > 0);
            let (reader, at) = self.reader_at();
            if at.backing.pending(layer) == 1 && heads.start == 0 && first_span {
                reader.read_ahead(at.backing.cold(), layer); // a dense layer's decode step
            }
            let groups = at.cold_groups(layer, |h| if heads.contains(&h) { tokens(h) } else { &[] });
            let mut cold_rows = self.copy_resident_rows(layer, &tokens, heads.clone(), false);
            self.read_cold_rows(layer, &mut cold_rows, groups, heads, false)?;
        }
        let positions = match selection {
            Selection::Tokens { .. } => Some(&self.positions[..]),
            // A span after the first holds positions other than its slots.
            Selection::Span(span) if span.start > 0 => {
                (0..n_heads).for_each(|_| self.positions.extend_from_slice(&every));
                Some(&self.positions[..])
            }
            Selection::All | Selection::Span(_) => None,
        };
        Ok(self.view.view(slots, positions))
    }

    fn observe(&mut self, layer: usize, selection: &Selection) {
        for head in 0..self.shape.n_kv_heads {
            let Some(tokens) = selection.head(head) else { return };
            self.hot.count_hits(self.lane(layer, head), tokens);
        }
    }

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        if let Some(spare) = &mut self.spare {
            spare.dense.commit(n_tokens)?;
            self.tier.spare_copy_steps += u64::from(n_tokens == 1);
        }
        self.trim();
        self.view.end_step();
        self.reader.end_step();
        // Tokens leaving the window are recent (pinned), so they stay hot as they reach the SSD.
        let (hot, n_kv) = (&mut self.hot, self.shape.n_kv_heads);
        let spilled = timed(Phase::Spill, || {
            self.backing.commit(n_tokens, |layer, head, t, k, v| hot.keep_pinned(layer * n_kv + head, t as u32, k, v))
        });
        spilled?;
        self.hot.commit_hits(self.backing.len());
        self.ranker.store_key_chunks(
            self.settings.dense_layers.min(self.shape.n_layers)..self.shape.n_layers,
            self.backing.cold_end(),
        );
        timed(Phase::Rebalance, || self.rebalance());
        self.tier.steps += 1;
        self.decode_steps = if n_tokens == 1 { self.decode_steps + 1 } else { 0 };
        if self.settings.placement == PlacementKind::Hits {
            if self.decode_steps == 0 {
                self.prompt_hits = self.hot.hits().to_vec();
            } else if relayout_due(self.decode_steps) {
                self.relayout_by_hits();
            }
        }
        Ok(())
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        self.reader.reset();
        let kept = self.backing.truncate(n_tokens);
        if let Some(spare) = &mut self.spare {
            spare.dense.truncate(kept);
        }
        self.truncate_bookkeeping(kept);
        kept
    }

    fn trim(&mut self) {
        if self.spare.as_mut().is_some_and(|spare| !spare.may_stay()) {
            self.spare = None;
        }
    }

    fn stats(&self) -> KvStats {
        let (cold_lanes_cached, cold_lanes, cold_bytes_read_cached) = self.backing.cached_reads();
        let cold_bytes_read = self.backing.cold().stats.bytes_read.load(Ordering::Relaxed);
        KvStats {
            tokens: self.backing.len(),
            resident_bytes: self.hot_bytes()
                + self.view.bytes()
                + self.bookkeeping_bytes()
                + self.spare.as_ref().map_or(0, SpareCopy::bytes),
            cold_bytes: self.backing.cold_bytes(),
            cold_bytes_read,
            cold_reads: self.backing.cold().stats.reads.load(Ordering::Relaxed),
            cold_bytes_read_per_dir: self.backing.cold().bytes_read_per_dir(),
            cold_bytes_read_cached,
            cold_lanes_cached,
            cold_lanes,
            bytes_to_host: cold_bytes_read,
            tier: Some(self.tier_stats()),
            ..KvStats::default()
        }
    }
}

/// Tokens of one head that a gather of the whole cache (a prompt chunk, a dense layer) holds at
/// a time: 1 MB of view for a 64-dimension head, and a 32K prompt in eight spans, so that the
/// view's memory does not grow with the context.
const SPAN_TOKENS: usize = 4096;

/// Decode steps after a prompt at which placement `hits` first re-places the cold pool: by then
/// the hit table holds the prompt's seeds and a few steps' selections, enough to place by.
const RELAYOUT_AFTER_STEPS: u64 = 8;

/// Decode steps between later re-placements, as the selections drift through a long answer.
const RELAYOUT_EVERY_STEPS: u64 = 128;

fn relayout_due(decode_steps: u64) -> bool {
    decode_steps == RELAYOUT_AFTER_STEPS
        || (decode_steps > RELAYOUT_AFTER_STEPS
            && (decode_steps - RELAYOUT_AFTER_STEPS).is_multiple_of(RELAYOUT_EVERY_STEPS))
}

/// `candidates` split (each part ascending) into the tokens that every head holds in memory —
/// hot in each of the heads' `hot_bitmaps` (see [`HotPool::bitmap`]), or in the write-back
/// window from `base` on — and the rest, which are the storage side's: a token is cold when any
/// head's K/V must come from the SSD. Checked a word of 64 tokens at a time.
fn split_by_residence(hot_bitmaps: &[&[u64]], candidates: std::ops::Range<usize>, base: usize) -> (Vec<u32>, Vec<u32>) {
    let (mut hot, mut cold) = (Vec::with_capacity(candidates.len()), Vec::new());
    // Bits of word `w` for the tokens of `range`.
    let mask = |range: std::ops::Range<usize>, w: usize| {
        let (lo, hi) = (range.start.clamp(64 * w, 64 * w + 64) - 64 * w, range.end.clamp(64 * w, 64 * w + 64) - 64 * w);
        if lo == hi {
            0
        } else {
            (u64::MAX >> (64 - (hi - lo))) << lo
        }
    };
    let push_bits = |out: &mut Vec<u32>, w: usize, mut bits: u64| {
        while bits != 0 {
            out.push((64 * w) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    };
    for w in candidates.start / 64..candidates.end.div_ceil(64) {
        let in_all_lanes = hot_bitmaps.iter().fold(u64::MAX, |all, bits| all & bits.get(w).copied().unwrap_or(0));
        let wanted = mask(candidates.clone(), w);
        let resident = (in_all_lanes | mask(base..usize::MAX, w)) & wanted;
        push_bits(&mut hot, w, resident);
        push_bits(&mut cold, w, wanted & !resident);
    }
    (hot, cold)
}

/// SparF's first step: zeroes all but the `dims` largest components of `query` by magnitude
/// (ties to the lower index), so that scores add up only those dimensions of each key.
fn keep_largest_dims(query: &mut [f32], dims: usize) {
    if dims >= query.len() {
        return;
    }
    let mut order: Vec<usize> = (0..query.len()).collect();
    order.sort_by(|&a, &b| query[b].abs().total_cmp(&query[a].abs()).then(a.cmp(&b)));
    for &d in &order[dims..] {
        query[d] = 0.0;
    }
}

/// The tokens of `ranked` (score, token) pairs, ascending.
fn ascending_tokens(ranked: &[(f32, u32)]) -> Vec<u32> {
    ascending(ranked.iter().map(|r| r.1).collect())
}

/// Each head's `chosen` tokens and its `riders`, ascending.
fn joined(chosen: Vec<Vec<u32>>, riders: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    chosen
        .into_iter()
        .zip(riders)
        .map(|(mut tokens, riders)| {
            tokens.extend(riders);
            ascending(tokens)
        })
        .collect()
}

impl TieredKvStore {
    /// Counts a hit, in each head, for the `budget` best-scoring `candidates` against `query`
    /// (as whole pages, with the pages selector).
    fn seed_hits(
        &mut self,
        layer: usize,
        query: &[f32],
        group: usize,
        candidates: std::ops::Range<usize>,
        budget: usize,
    ) {
        let n_kv = self.shape.n_kv_heads;
        let block = self.ranker.scores(layer, query, candidates.clone().map(|t| t as u32).collect());
        let pages = self.settings.selector == SelectorKind::Pages;
        let mut top = HeadsTopK::new(n_kv, if pages { (2 * budget).min(candidates.len()) } else { budget });
        top.merge(&block);
        // Seeded as a decode step would select, so that whole pages start out hot.
        let seeds = match pages {
            true => self.whole_pages(layer, &top.into_unordered(), budget, self.mass_scale(group), candidates),
            false => top.into_tokens(),
        };
        for (head, chosen) in seeds.into_iter().enumerate() {
            self.hot.count_hits(layer * n_kv + head, &chosen);
        }
    }

    /// Orders each sparse lane's cold blocks by the hit table — the decode steps' selections
    /// first, the prompt's seeds to break ties — so that the tokens decode steps keep selecting
    /// share pages. A failure leaves the layout it could not change (every token still reads
    /// back) and is only logged: the layout is an optimization.
    fn relayout_by_hits(&mut self) {
        let n_kv = self.shape.n_kv_heads;
        let lanes = self.settings.dense_layers.min(self.shape.n_layers) * n_kv..self.shape.n_layers * n_kv;
        let started = Instant::now();
        let read_before = self.backing.cold().stats.bytes_read.load(Ordering::Relaxed);
        let (hits, seeds) = (self.hot.hits(), &self.prompt_hits);
        let rank = |lane: usize, t: usize| {
            let (all, seed) =
                (hits[lane].get(t).copied().unwrap_or(0), seeds.get(lane).and_then(|s| s.get(t)).copied().unwrap_or(0));
            (u32::from(all.saturating_sub(seed)) << 16) | u32::from(seed)
        };
        let result = self.backing.relayout(lanes, rank);
        self.hot.slots_moved();
        self.tier.relayout_ns += started.elapsed().as_nanos() as u64;
        self.tier.relayout_bytes_read += self.backing.cold().stats.bytes_read.load(Ordering::Relaxed) - read_before;
        match result {
            Ok(blocks) => {
                self.tier.relaid_blocks += blocks as u64;
                tracing::debug!(blocks, ms = started.elapsed().as_millis() as u64, "cold pool re-placed by hits");
            }
            Err(e) => {
                tracing::warn!(error = %e, "re-placing the cold pool by hits failed; the blocks not rewritten keep their layout")
            }
        }
    }

    /// Cuts the ranking and residency state to the `n_tokens` the backing kept.
    fn truncate_bookkeeping(&mut self, n_tokens: usize) {
        self.ranker.truncate(n_tokens);
        self.hot.truncate(n_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::hot_pool::HotPool;

    #[test]
    fn sparf_keeps_the_largest_query_dimensions_by_magnitude() {
        let mut q = [0.5, -3.0, 0.1, 2.0, -2.0, 0.0];
        keep_largest_dims(&mut q, 3);
        assert_eq!(q, [0.0, -3.0, 0.0, 2.0, -2.0, 0.0]);
        let mut all = [1.0, -1.0];
        keep_largest_dims(&mut all, 8);
        assert_eq!(all, [1.0, -1.0]);
    }

    #[test]
    fn tokens_split_by_residence_as_one_by_one_checks_would() {
        let mut pool = HotPool::new(2, 1, 300);
        for (lane, t) in [(0, 3), (1, 3), (0, 64), (1, 64), (0, 65), (1, 66), (0, 130), (1, 130), (0, 199), (1, 199)] {
            pool.insert(lane, t, &[0], &[0]);
        }
        let bitmaps = [pool.bitmap(0), pool.bitmap(1)];
        for (candidates, base) in [(0..300, 300), (4..190, 150), (64..65, 64), (3..131, 1000), (10..10, 0)] {
            let (hot, cold) = split_by_residence(&bitmaps, candidates.clone(), base);
            let resident = |t: usize| t >= base || (pool.contains(0, t as u32) && pool.contains(1, t as u32));
            let (want_hot, want_cold): (Vec<u32>, Vec<u32>) =
                candidates.clone().map(|t| t as u32).partition(|&t| resident(t as usize));
            assert_eq!((hot, cold), (want_hot, want_cold), "{candidates:?} from {base}");
        }
    }
}
