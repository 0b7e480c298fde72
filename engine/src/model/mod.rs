//! The transformer: embedding, `n_layers` blocks assembled by each family from the shared
//! pieces of [`layers`] (norms, GQA attention with an optional window, a gated feed-forward
//! network), and the output projection. Attention reads and writes the cache only through
//! [`KvStore`].

pub mod config;
mod gemma3;
pub mod gguf;
mod gguf_header;
mod gpt_oss;
pub mod layers;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3moe;
pub mod safetensors;
pub mod weights;

use crate::device::Attention;
use crate::error::{Error, Result};
use crate::kernels::attention::{Partial, RunningPartials};
use crate::kernels::ops::{add_bias, add_in_place, rms_norm};
use crate::kernels::quant::QuantizedActivations;
use crate::kernels::rope::{Rope, RopeScaling};
use crate::kv::stores::x_cache::KvFromInput;
use crate::kv::{HeadsPart, KvShape, KvStore, Queries, Selection};
use crate::trace::{span, timed, Phase};
use config::ModelConfig;
use layers::{post_norm, MlpBuffers, ProjectionBuffers};
use std::ops::Range;
use std::sync::Arc;
use weights::Weights;

/// A model's configuration alone, without its weights: a GGUF file's header, or a
/// checkpoint's config.json.
pub fn read_config(path: &std::path::Path) -> Result<ModelConfig> {
    if gguf::is_gguf(path) {
        Ok(gguf::open(path)?.config().clone())
    } else {
        safetensors::read_config(path)
    }
}

/// Which positions' logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (what generation needs).
    Last,
    /// Every token's, `n × vocab` (perplexity, evaluation).
    All,
}

pub struct Model {
    pub config: ModelConfig,
    /// Shared with the X-cache's K/V rebuilds ([`Model::kv_from_input`]).
    weights: Arc<Weights>,
    /// The rotary embeddings the layers use ([`layers::SelfAttention::rope`] indexes them).
    ropes: Arc<[Rope]>,
    attention: Attention,
}

/// The model's rotary embeddings: the main one, and the windowed layers' own where they have
/// one ([`layers::WINDOW_ROPE`], which only a family that sets that base uses).
fn ropes(config: &ModelConfig, freq_factors: Option<&[f32]>) -> Arc<[Rope]> {
    let c = config;
    let main = Rope::new(c.head_dim, c.rope_theta, &c.rope_scaling, c.rope_layout, freq_factors);
    match c.sliding_window.as_ref().and_then(|w| w.rope_theta) {
        Some(theta) => vec![main, Rope::new(c.head_dim, theta, &RopeScaling::None, c.rope_layout, None)].into(),
        None => vec![main].into(),
    }
}

impl Model {
    pub fn new(config: ModelConfig, weights: Weights) -> Self {
        let ropes = ropes(&config, weights.rope_freq_factors.as_deref());
        Self { config, weights: Arc::new(weights), ropes, attention: Attention::Host }
    }

    /// Where attention over each layer's gathered K/V runs (the CPU kernel unless set).
    pub fn set_attention(&mut self, attention: Attention) {
        self.attention = attention;
    }

    pub fn attention(&self) -> &Attention {
        &self.attention
    }

    /// Bytes of weights one decode step streams.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// The cache shape this model needs for sequences of up to `max_tokens`.
    pub fn kv_shape(&self, max_tokens: usize) -> KvShape {
        self.config.kv_shape(max_tokens)
    }

    /// The K and V projections alone, for stores that keep layer inputs and rebuild K/V from
    /// them (the X-cache).
    pub fn kv_from_input(&self) -> Arc<dyn KvFromInput> {
        Arc::new(KvProjection {
            config: self.config.clone(),
            weights: Arc::clone(&self.weights),
            ropes: Arc::clone(&self.ropes),
        })
    }

    /// Runs `tokens`, which follow the `kv.len_tokens()` tokens already cached, through the
    /// model; their K/V are appended to `kv`. Returns logits as asked (`vocab` per row).
    pub fn forward(&self, tokens: &[u32], kv: &mut dyn KvStore, want: Logits) -> Result<Vec<f32>> {
        let mut logits = self.forward_batch(&mut [BatchItem { tokens, kv }], want)?;
        Ok(logits.pop().unwrap_or_default())
    }

    /// Runs several sequences' tokens through the model at once: the matrix products take every
    /// row together, so a decode step reads the weights once for the whole batch instead of
    /// once per sequence; attention runs per sequence against its own cache. Returns each
    /// item's logits as asked. On an error the caches may hold part of the step: callers roll
    /// them back (`KvStore::truncate`).
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>], want: Logits) -> Result<Vec<Vec<f32>>> {
        let _forward = span(Phase::Forward);
        let c = &self.config;
        // Row ranges of each item in the batch, and every row's position in its sequence.
        let mut rows_of = Vec::with_capacity(items.len());
        let mut positions = Vec::new();
        for item in items.iter() {
            let (n, pos0, limit) = (item.tokens.len(), item.kv.len_tokens(), item.kv.shape().max_tokens);
            if pos0 + n > limit {
                return Err(Error::ContextOverflow { prompt_tokens: pos0 + n, context_tokens: limit });
            }
            if let Some(&bad) = item.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(Error::InvalidParameter(format!(
                    "token id {bad} is outside the vocabulary ({})",
                    c.vocab_size
                )));
            }
            rows_of.push(positions.len()..positions.len() + n);
            positions.extend(pos0..pos0 + n);
        }
        let n = positions.len();
        if n == 0 {
            return Ok(vec![Vec::new(); items.len()]);
        }
        let hidden = c.hidden_size;
        let mut x = vec![0f32; n * hidden];
        let tokens = items.iter().flat_map(|item| item.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(hidden).zip(tokens) {
            self.weights.embedding.dequantize_row(t as usize, row);
            if c.embedding_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embedding_scale);
            }
        }
        self.blocks(items, &rows_of, &positions, &mut x)?;
        for (item, rows) in items.iter_mut().zip(&rows_of) {
            timed(Phase::Commit, || item.kv.commit(rows.len()))?;
        }
        let _output = span(Phase::Output);

        // The rows whose logits were asked for, all items together through the output head.
        let wanted: Vec<std::ops::Range<usize>> = match want {
            Logits::Last => rows_of.iter().map(|r| r.end - 1..r.end).collect(),
            Logits::All => rows_of.clone(),
        };
        let rows: Vec<f32> = wanted.iter().flat_map(|r| &x[r.start * hidden..r.end * hidden]).copied().collect();
        let m = rows.len() / hidden;
        let mut normed = vec![0f32; rows.len()];
        rms_norm(&rows, &self.weights.output_norm, c.rms_norm_eps, &mut normed);
        let mut logits = vec![0f32; m * c.vocab_size];
        self.weights.lm_head().matmul(&normed, m, &mut QuantizedActivations::default(), &mut logits);
        let mut out = Vec::with_capacity(items.len());
        let mut rest = &logits[..];
        for r in &wanted {
            let (mine, tail) = rest.split_at(r.len() * c.vocab_size);
            out.push(mine.to_vec());
            rest = tail;
        }
        Ok(out)
    }
}

impl Model {
    /// The transformer blocks over the hidden states `x` (one row per token of the batch),
    /// appending each item's K/V to its cache. The per-layer activations live only here, so
    /// they are gone before the caches commit the step (a prompt chunk's are ~8 MB).
    fn blocks(
        &self,
        items: &mut [BatchItem<'_>],
        rows_of: &[Range<usize>],
        positions: &[usize],
        x: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let n = positions.len();
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let tables: Vec<(Vec<f32>, Vec<f32>)> = self.ropes.iter().map(|rope| rope.tables(positions)).collect();

        let mut h = vec![0f32; n * hidden];
        let (mut q, mut k, mut v) = (vec![0f32; n * q_dim], vec![0f32; n * kv_dim], vec![0f32; n * kv_dim]);
        let mut attn = vec![0f32; n * q_dim];
        let mut mlp_buffers = MlpBuffers::default();
        let mut buffers = ProjectionBuffers::default();
        let mut scratch = QuantizedActivations::default();

        for (l, block) in self.weights.blocks.iter().enumerate() {
            let projections = span(Phase::Projections);
            let a = &block.attention;
            rms_norm(x, &block.attn_norm, c.rms_norm_eps, &mut h);
            let (cos, sin) = &tables[a.rope];
            a.project(c, &self.ropes[a.rope], (cos, sin), &h, n, &mut scratch, &mut buffers, &mut q, &mut k, &mut v);
            drop(projections);

            let window = c.window_of(l);
            for (item, rows) in items.iter_mut().zip(rows_of) {
                let (qs, kvs) = (rows.start * q_dim..rows.end * q_dim, rows.start * kv_dim..rows.end * kv_dim);
                let kv = &mut *item.kv;
                timed(Phase::Append, || -> Result<()> {
                    kv.append_input(l, &h[rows.start * hidden..rows.end * hidden])?;
                    kv.append(l, &k[kvs.clone()], &v[kvs])
                })?;
                let queries = Queries {
                    q: &q[qs.clone()],
                    positions: &positions[rows.clone()],
                    n_heads: c.n_heads,
                    sinks: a.sinks.as_deref(),
                };
                // Stores that attend next to the data (near-storage) do it here, in one call; a
                // windowed layer's mask is the model's, so its layers take the gathered road.
                if window.is_none() {
                    if let Some(attended) = timed(Phase::Attention, || kv.attend(l, &queries, &mut attn[qs.clone()])) {
                        attended?;
                        continue;
                    }
                }
                let plan = timed(Phase::Prepare, || kv.prepare(l, &queries))?;
                for part in &plan.parts {
                    self.attend_part(
                        kv,
                        l,
                        (window, a.sinks.as_deref()),
                        &plan.selection,
                        part,
                        &q[qs.clone()],
                        &positions[rows.clone()],
                        &mut attn[qs.clone()],
                    )?;
                }
                timed(Phase::Observe, || kv.observe(l, &plan.selection));
            }

            let _mlp = span(Phase::Mlp);
            a.output.matmul(&attn, n, &mut scratch, &mut h);
            if let Some(bias) = &a.output_bias {
                add_bias(&mut h, bias);
            }
            post_norm(block.attn_post_norm.as_ref(), &mut h, c.rms_norm_eps);
            add_in_place(x, &h);

            rms_norm(x, &block.ffn_norm, c.rms_norm_eps, &mut h);
            block.mlp.forward(&mut h, n, &mut scratch, &mut mlp_buffers);
            post_norm(block.ffn_post_norm.as_ref(), &mut h, c.rms_norm_eps);
            add_in_place(x, &h);
        }
        Ok(())
    }

    /// Attention of the query heads that share the KV heads of `part` (one of the views the
    /// store planned) over what `selection` chose, into their columns of `out`: over one view,
    /// or over the part's spans gathered in turn and merged by their softmax statistics, with
    /// the layer's sink logits (one per query head) joining each row's softmax.
    #[allow(clippy::too_many_arguments)]
    fn attend_part(
        &self,
        kv: &mut dyn KvStore,
        layer: usize,
        (window, sinks): (Option<usize>, Option<&[f32]>),
        selection: &Selection,
        part: &HeadsPart,
        q: &[f32],
        q_positions: &[usize],
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let heads = part.heads.start.min(c.n_kv_heads)..part.heads.end.min(c.n_kv_heads);
        if heads.len() == c.n_kv_heads && part.spans.is_empty() && sinks.is_none() {
            let view = timed(Phase::Gather, || kv.gather(layer, selection, heads))?.windowed(window);
            return timed(Phase::Attention, || self.attention.attend(q, q_positions, c.n_heads, &view, out));
        }
        // The heads' columns of each row, gathered into rows of their own and scattered back.
        let group_width = c.n_heads / c.n_kv_heads * c.head_dim;
        let columns = heads.start * group_width..heads.end * group_width;
        let part_q: Vec<f32> = q.chunks_exact(c.q_dim()).flat_map(|row| &row[columns.clone()]).copied().collect();
        let part_heads = columns.len() / c.head_dim;
        let mut part_out = vec![0f32; part_q.len()];
        if part.spans.is_empty() && sinks.is_none() {
            let view = timed(Phase::Gather, || kv.gather(layer, selection, heads))?.windowed(window);
            timed(Phase::Attention, || self.attention.attend(&part_q, q_positions, part_heads, &view, &mut part_out))?;
        } else {
            let rows = q_positions.len() * part_heads;
            let (mut max, mut sum) = (vec![0f32; rows], vec![0f32; rows]);
            let mut merged = RunningPartials::new(rows, c.head_dim);
            // The selection as one view where the store planned no spans (a layer with sinks).
            let spans: Vec<Option<Range<usize>>> =
                if part.spans.is_empty() { vec![None] } else { part.spans.iter().cloned().map(Some).collect() };
            for span in spans {
                let view = timed(Phase::Gather, || match span {
                    Some(span) => kv.gather(layer, &Selection::Span(span), heads.clone()),
                    None => kv.gather(layer, selection, heads.clone()),
                })?
                .windowed(window);
                timed(Phase::Attention, || {
                    self.attention.attend_partial(
                        &part_q,
                        q_positions,
                        part_heads,
                        &view,
                        &mut part_out,
                        &mut max,
                        &mut sum,
                    )
                })?;
                merged.add(&Partial { out: &part_out, max: &max, sum: &sum });
            }
            if let Some(sinks) = sinks {
                let first_head = columns.start / c.head_dim;
                merged.add_sinks(&sinks[first_head..first_head + part_heads]);
            }
            merged.finish(&mut part_out);
        }
        for (row, part) in out.chunks_exact_mut(c.q_dim()).zip(part_out.chunks_exact(columns.len())) {
            row[columns.clone()].copy_from_slice(part);
        }
        Ok(())
    }
}

/// A layer's K and V projections, norms and RoPE, as [`Model::blocks`] computes them.
struct KvProjection {
    config: ModelConfig,
    weights: Arc<Weights>,
    ropes: Arc<[Rope]>,
}

impl KvFromInput for KvProjection {
    fn input_dim(&self) -> usize {
        self.config.hidden_size
    }

    fn project(&self, layer: usize, x: &[f32], first_position: usize, k: &mut [f32], v: &mut [f32]) {
        // In chunks, so the products' buffers stay small however long the sequence. The fused
        // q/k/v product also computes q, a third more work than K and V alone need.
        const CHUNK_TOKENS: usize = 256;
        let c = &self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let attention = &self.weights.blocks[layer].attention;
        let rope = &self.ropes[attention.rope];
        let mut q = Vec::new();
        let mut buffers = ProjectionBuffers::default();
        let mut scratch = QuantizedActivations::default();
        let chunks = x
            .chunks(CHUNK_TOKENS * hidden)
            .zip(k.chunks_mut(CHUNK_TOKENS * kv_dim))
            .zip(v.chunks_mut(CHUNK_TOKENS * kv_dim));
        for (i, ((x, k), v)) in chunks.enumerate() {
            let n = x.len() / hidden;
            q.resize(n * q_dim, 0.0);
            let first = first_position + i * CHUNK_TOKENS;
            let (cos, sin) = rope.tables(&(first..first + n).collect::<Vec<_>>());
            attention.project(c, rope, (&cos, &sin), x, n, &mut scratch, &mut buffers, &mut q, k, v);
        }
    }
}

/// One sequence's part of a batched forward pass: its new tokens and its cache.
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut dyn KvStore,
}
