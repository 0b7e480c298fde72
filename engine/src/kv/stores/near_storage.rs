//! HILOS's lossless mode, exact attention near storage (`--kv near-storage`): every token's K/V
//! lives in the cold pool as with [`OffloadKvStore`], but the cold tokens' attention is computed
//! where they lie. The storage side reads a layer's cold K/V, attends to all of it with the
//! layer's queries and hands up only a partial output and its softmax statistics (running max
//! and sum) per query row; the host attends to the tokens still in the write-back window and
//! merges the two, each weighed by its share of the softmax mass (a layer's sink logits, as
//! gpt-oss has them, join the merge as parts with no value). No token is skipped, so the output
//! is full attention's, up to the order of floating-point sums.
//!
//! On a computational drive the K/V would never cross to the host: only the partials would
//! (`n_heads × (head_dim + 2)` floats per layer and token, against the whole cache). Without
//! one, the storage side is a part of this process reading over direct I/O, so the disk still
//! delivers the whole cache every step, and the speed is offload's. (The storage side does not
//! read the next layer while the host computes this one: on 2 cores the two take turns.)
//!
//! With the X-cache ([`super::x_cache`]), the first layers keep their inputs instead of K/V: the
//! storage side hands up X, the host rebuilds K/V and attends to all of it itself.

use super::x_cache::{KvFromInput, LayerInputs};
use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::kernels::attention::{attend_partial, Partial, RunningPartials};
use crate::kv::cold::format::ColdType;
use crate::kv::cold::staged::{read_heads, ReadPlan};
use crate::kv::cold::{ColdPool, GROUP_TOKENS};
use crate::kv::view::ViewBuffers;
use crate::kv::{HeadsPart, KvShape, KvStats, KvStore, KvView, OffloadKvStore, Queries, Selection};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

pub struct NearStorageKvStore {
    shape: KvShape,
    /// Layers `x_layers..`: the cold pool and write-back window, kept exactly as offload keeps
    /// them (its layer `l` is the model's `x_layers + l`).
    inner: OffloadKvStore,
    /// Layers `..x_layers`, with the X-cache: their inputs, from which the host rebuilds K/V.
    inputs: Option<LayerInputs>,
    x_layers: usize,
    storage: StorageAttention,
    host: HostAttention,
}

impl NearStorageKvStore {
    /// A store whose first `x_layers` layers keep their inputs, rebuilt to K/V by `rebuild`
    /// (none without one).
    pub fn new(
        shape: KvShape,
        cold_dirs: &[PathBuf],
        cold_type: ColdType,
        x_cache: Option<(usize, Arc<dyn KvFromInput>)>,
    ) -> Result<Self> {
        let x_cache = x_cache.filter(|&(layers, _)| layers > 0 && layers < shape.n_layers);
        let x_layers = x_cache.as_ref().map_or(0, |&(layers, _)| layers);
        let inputs = match x_cache {
            // The X pool holds one lane per layer, so it lives in the first directory alone.
            Some((layers, rebuild)) => Some(LayerInputs::new(shape, layers, &cold_dirs[..1], rebuild)?),
            None => None,
        };
        let kv_shape = KvShape { n_layers: shape.n_layers - x_layers, ..shape };
        Ok(Self {
            shape,
            inner: OffloadKvStore::new(kv_shape, cold_dirs, cold_type)?,
            inputs,
            x_layers,
            storage: StorageAttention::new(shape),
            host: HostAttention::new(shape),
        })
    }

    /// The layer's X-cache, if it keeps its inputs; else its index in the K/V store.
    fn route(&mut self, layer: usize) -> std::result::Result<&mut LayerInputs, usize> {
        match &mut self.inputs {
            Some(inputs) if layer < self.x_layers => Ok(inputs),
            _ => Err(layer - self.x_layers),
        }
    }

    fn attend_exactly(&mut self, layer: usize, queries: &Queries<'_>, out: &mut [f32]) -> Result<()> {
        let backing = self.inner.backing();
        let cold_groups = backing.cold_end() / GROUP_TOKENS;
        let hd = self.shape().head_dim;
        let Queries { q, positions, n_heads, sinks } = *queries;
        let host = self.host.attend(backing, layer, q, positions, n_heads);
        if cold_groups == 0 && sinks.is_none() {
            out.copy_from_slice(host.out);
            return Ok(());
        }
        let mut merged = RunningPartials::new(out.len() / hd, hd);
        if cold_groups > 0 {
            merged.add(&self.storage.attend(backing.cold(), layer, cold_groups, q, positions, n_heads)?);
        }
        merged.add(&host);
        if let Some(sinks) = sinks {
            merged.add_sinks(sinks);
        }
        merged.finish(out);
        Ok(())
    }
}

impl KvStore for NearStorageKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.inner.len_tokens()
    }

    fn append_input(&mut self, layer: usize, x: &[f32]) -> Result<()> {
        match self.route(layer) {
            Ok(inputs) => inputs.append(layer, x),
            Err(_) => Ok(()),
        }
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (shape, held) = (self.shape, self.len_tokens());
        match self.route(layer) {
            Ok(inputs) => {
                // The layer keeps only what `append_input` gave it: K/V alone (a snapshot's
                // replay) cannot be kept, and the caller computes the tokens afresh.
                let n = shape.tokens_to_append(held, k, v)?;
                if inputs.pending(layer) != n {
                    return Err(crate::error::KvMisuse::InputsMissing { layer, tokens: n }.into());
                }
                Ok(())
            }
            Err(layer) => self.inner.append(layer, k, v),
        }
    }

    fn attend(&mut self, layer: usize, queries: &Queries<'_>, out: &mut [f32]) -> Option<Result<()>> {
        // An X-cached layer's K/V are rebuilt on the host, which attends to them as to a
        // gathered view (the model asks `gather`).
        let layer = self.route(layer).err()?;
        Some(self.attend_exactly(layer, queries, out))
    }

    // The model asks a store that attends itself neither to select nor to gather; saving a
    // prompt's K/V (`snapshot`) still gathers, and reads the cold pool as offload does.
    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection> {
        match self.route(layer) {
            Ok(_) => Ok(Selection::All),
            Err(layer) => self.inner.select(layer, queries),
        }
    }

    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        // Rebuilding K/V from X costs the same for one head as for all of them.
        match self.inputs {
            Some(_) => HeadsPart::all(self.shape.n_kv_heads),
            None => self.inner.parts(selection, cached_tokens),
        }
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: Range<usize>) -> Result<KvView<'_>> {
        match &mut self.inputs {
            Some(inputs) if layer < self.x_layers => {
                debug_assert_eq!(heads.len(), self.shape.n_kv_heads, "X-cached layers gather every head at once");
                inputs.gather(layer)
            }
            _ => self.inner.gather(layer - self.x_layers, selection, heads),
        }
    }

    fn observe(&mut self, _layer: usize, _selection: &Selection) {}

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.storage.view.end_step();
        self.host.view.end_step();
        let kv = self.inner.commit(n_tokens);
        let x = self.inputs.as_mut().map_or(Ok(()), |inputs| inputs.commit(n_tokens));
        kv.and(x)
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        // Both keep as much as the one that could read back less.
        let mut kept = self.inner.truncate(n_tokens);
        while let Some(inputs) = &mut self.inputs {
            let kept_x = inputs.truncate(kept);
            if kept_x == kept {
                break;
            }
            kept = self.inner.truncate(kept_x);
        }
        kept
    }

    fn stats(&self) -> KvStats {
        let mut stats = self.inner.stats();
        stats.resident_bytes += self.storage.bytes() + self.host.bytes();
        stats.bytes_to_host = self.storage.output_bytes;
        if let Some(inputs) = &self.inputs {
            // X crosses to the host whole: it is what the host rebuilds K/V from.
            stats.resident_bytes += inputs.resident_bytes();
            stats.cold_bytes += inputs.cold_bytes();
            stats.cold_bytes_read += inputs.bytes_read();
            stats.cold_reads += inputs.reads();
            stats.cold_bytes_read_per_dir[0] += inputs.bytes_read();
            stats.bytes_to_host += inputs.bytes_read();
            let (lanes_cached, lanes, bytes_cached) = inputs.cached_reads();
            stats.cold_lanes_cached += lanes_cached;
            stats.cold_lanes += lanes;
            stats.cold_bytes_read_cached += bytes_cached;
        }
        stats
    }
}

/// The storage side: reads a layer's cold K/V and attends to it, so that only a partial
/// output and its softmax statistics per query row leave it.
struct StorageAttention {
    shape: KvShape,
    view: ViewBuffers,
    partial: PartialBuffers,
    /// Where a layer's cold K/V is read to.
    buf: AlignedBuf,
    /// Bytes of partial outputs handed to the host.
    output_bytes: u64,
}

impl StorageAttention {
    fn new(shape: KvShape) -> Self {
        Self {
            shape,
            view: ViewBuffers::new(shape.head_dim),
            partial: PartialBuffers::default(),
            buf: AlignedBuf::zeroed(0),
            output_bytes: 0,
        }
    }

    /// Attention of `q` over tokens `0 .. cold_groups · GROUP_TOKENS` of `layer`, all in the cold
    /// pool, as a partial.
    fn attend(
        &mut self,
        cold: &ColdPool,
        layer: usize,
        cold_groups: usize,
        q: &[f32],
        q_positions: &[usize],
        n_heads: usize,
    ) -> Result<Partial<'_>> {
        let every_group = vec![(0..cold_groups).collect(); self.shape.n_kv_heads];
        let staged = read_heads(cold, layer, ReadPlan::new(cold, layer, every_group), &mut self.buf)?;
        let layout = cold.layout();
        let mut page = vec![0u16; 2 * layout.group_values()];
        self.view.reset(self.shape.n_kv_heads, cold_groups * GROUP_TOKENS);
        for head in 0..self.shape.n_kv_heads {
            for g in 0..cold_groups {
                let group = staged.group(cold, &self.buf, head, g)?.expect("every group of the layer was read");
                layout.cold_type.decode_group(group, layout.head_dim, &mut page);
                self.view.set_group(g * GROUP_TOKENS, head, &page);
            }
        }
        // Every cold token precedes every query: nothing to mask.
        let view = self.view.view(cold_groups * GROUP_TOKENS, None);
        let partial = self.partial.attend(q, q_positions, n_heads, &view);
        self.output_bytes += partial.bytes();
        Ok(partial)
    }

    fn bytes(&self) -> usize {
        self.view.bytes() + self.partial.bytes() + self.buf.len()
    }
}

/// The host side: attention over the tokens in the write-back window (those not yet spilled,
/// including this step's), masked causally among the step's queries.
struct HostAttention {
    view: ViewBuffers,
    /// Each window slot's position, `[kv_head][slot]`.
    positions: Vec<u32>,
    partial: PartialBuffers,
}

impl HostAttention {
    fn new(shape: KvShape) -> Self {
        Self { view: ViewBuffers::new(shape.head_dim), positions: Vec::new(), partial: PartialBuffers::default() }
    }

    fn attend(
        &mut self,
        backing: &crate::kv::backing::DiskBacking,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        n_heads: usize,
    ) -> Partial<'_> {
        let n_kv = backing.cold().layout().n_kv_heads;
        let window = backing.cold_end()..backing.held(layer);
        self.view.reset(n_kv, window.len());
        self.positions.clear();
        for head in 0..n_kv {
            for (slot, token) in window.clone().enumerate() {
                self.view.set_token(
                    slot,
                    head,
                    backing.row(layer, head, token, false),
                    backing.row(layer, head, token, true),
                );
                self.positions.push(token as u32);
            }
        }
        self.partial.attend(q, q_positions, n_heads, &self.view.view(window.len(), Some(&self.positions)))
    }

    fn bytes(&self) -> usize {
        self.view.bytes() + 4 * self.positions.capacity() + self.partial.bytes()
    }
}

/// Where one side's [`Partial`] is computed.
#[derive(Default)]
struct PartialBuffers {
    out: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

impl PartialBuffers {
    fn attend(&mut self, q: &[f32], q_positions: &[usize], n_heads: usize, view: &KvView<'_>) -> Partial<'_> {
        let rows = q_positions.len() * n_heads;
        self.out.resize(q.len(), 0.0);
        self.max.resize(rows, 0.0);
        self.sum.resize(rows, 0.0);
        attend_partial(q, q_positions, n_heads, view, &mut self.out, &mut self.max, &mut self.sum);
        Partial { out: &self.out, max: &self.max, sum: &self.sum }
    }

    fn bytes(&self) -> usize {
        4 * (self.out.capacity() + self.max.capacity() + self.sum.capacity())
    }
}
