//! HILOS's cooperative X-cache: some layers keep each token's layer input X (the normed hidden
//! state the K and V projections read) in the cold pool instead of its K and V, and the host
//! rebuilds K/V from X with the model's weights when the layer attends. The storage side reads
//! and hands up X alone for those layers, while it attends near the data for the others.
//!
//! It pays only where a token's X is smaller than its K and V together: a model with as many KV
//! heads as query heads (multi-head attention) moves half the bytes. With grouped-query attention
//! K and V are already small (SmolLM2: X is 576 values per token and layer, K+V 384; Qwen2.5-0.5B:
//! 896 against 256), so [`XCachePlan`] turns it off. HILOS partitions the batch and the heads
//! between X and K/V; one sequence's X serves every head at once, so here the partition is by
//! layer: the first [`XCachePlan::layers`] keep X.
//!
//! The rebuild costs the host `input · (q_dim + 2 · kv_dim)` multiply-adds per cached token and
//! layer every step (the fused q/k/v product, q computed and dropped). On HILOS's GPU that hides
//! behind the storage side's attention; on a CPU it costs far more than the reads it saves, so
//! the share of layers defaults to 0 and users with a slow drive opt in.

use crate::aligned::AlignedBuf;
use crate::error::{KvMisuse, Result};
use crate::kv::backing::DiskBacking;
use crate::kv::cold::format::ColdType;
use crate::kv::cold::placement::PlacementKind;
use crate::kv::cold::GROUP_TOKENS;
use crate::kv::view::ViewBuffers;
use crate::kv::{KvShape, KvView};
use half::f16;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The model side of the X-cache: rebuilds a layer's K and V rows from its input.
pub trait KvFromInput: Send + Sync {
    /// Values per token of a layer's input (the model's hidden size).
    fn input_dim(&self) -> usize;

    /// K (RoPE applied) and V rows (`n × kv_dim` each) of `n` consecutive tokens, the first at
    /// `first_position`, from their inputs `x` (`n × input_dim`) to `layer`.
    fn project(&self, layer: usize, x: &[f32], first_position: usize, k: &mut [f32], v: &mut [f32]);
}

/// Which layers of a model keep X, decided from its shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct XCachePlan {
    /// Layers `0..layers` keep X; the others keep K and V.
    pub layers: usize,
    pub n_layers: usize,
    /// Values a token takes per layer as X, and as K plus V.
    pub input_values: usize,
    pub kv_values: usize,
}

impl XCachePlan {
    /// The plan for a cache of `shape` whose layer inputs have `input_dim` values, giving X the
    /// `share` of the layers asked for (HILOS found half best on its GPU) where X is the
    /// smaller. One layer at least keeps its K/V, and with it attention near storage.
    pub fn new(shape: KvShape, input_dim: usize, share: f64) -> Self {
        let kv_values = 2 * shape.kv_dim();
        let layers = if input_dim < kv_values {
            ((share.clamp(0.0, 1.0) * shape.n_layers as f64).round() as usize).min(shape.n_layers.saturating_sub(1))
        } else {
            0
        };
        Self { layers, n_layers: shape.n_layers, input_values: input_dim, kv_values }
    }

    /// Bytes a token takes in the cold pool (f16), across all layers.
    pub fn bytes_per_token(&self) -> usize {
        2 * (self.layers * self.input_values + (self.n_layers - self.layers) * self.kv_values)
    }
}

impl fmt::Display for XCachePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (x, kv) = (self.input_values, self.kv_values);
        if x >= kv {
            write!(f, "off: a token's layer input is {x} values, its K and V only {kv} (grouped-query attention)")
        } else if self.layers == 0 {
            write!(f, "off (x_cache_share 0): a token's layer input is {x} values, its K and V {kv}, but rebuilding K/V on the CPU costs more than reading them")
        } else {
            write!(
                f,
                "on for {} of {} layers: a token's layer input is {x} values, its K and V {kv}",
                self.layers, self.n_layers
            )
        }
    }
}

/// The X-cached layers of one sequence: their inputs in a cold pool of their own, with its
/// write-back window, and the buffers K/V are rebuilt into.
pub struct LayerInputs {
    /// Each X row is kept as the two halves of a one-head K/V row pair, so that the backing's
    /// window, spills, checksums and truncation serve X unchanged.
    backing: DiskBacking,
    rebuild: Arc<dyn KvFromInput>,
    /// The model's K/V shape (what is rebuilt).
    kv_shape: KvShape,
    read_buf: AlignedBuf,
    halves: [Vec<f32>; 2],
    x: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    row: [Vec<u16>; 2],
    view: ViewBuffers,
}

impl LayerInputs {
    /// Inputs of layers `0..layers` of a model whose cache is `kv_shape`, in pool files in `cold_dirs`.
    pub fn new(kv_shape: KvShape, layers: usize, cold_dirs: &[PathBuf], rebuild: Arc<dyn KvFromInput>) -> Result<Self> {
        let input_dim = rebuild.input_dim();
        if !input_dim.is_multiple_of(2) {
            return Err(KvMisuse::OddInput(input_dim).into());
        }
        let x_shape =
            KvShape { n_layers: layers, n_kv_heads: 1, head_dim: input_dim / 2, max_tokens: kv_shape.max_tokens };
        // Layer inputs are not K/V: kept exact whatever the K/V pool's type.
        let backing = DiskBacking::new(x_shape, cold_dirs, 0, PlacementKind::Position, ColdType::F16)?;
        let read_buf = backing.cold().buffer(kv_shape.max_tokens.div_ceil(GROUP_TOKENS));
        Ok(Self {
            backing,
            rebuild,
            kv_shape,
            read_buf,
            halves: Default::default(),
            x: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            row: Default::default(),
            view: ViewBuffers::new(kv_shape.head_dim),
        })
    }

    /// Tokens `layer` took this step.
    pub fn pending(&self, layer: usize) -> usize {
        self.backing.pending(layer)
    }

    /// Keeps the step's inputs `x` (`n × input_dim`) of `layer`.
    pub fn append(&mut self, layer: usize, x: &[f32]) -> Result<()> {
        let dim = self.rebuild.input_dim();
        if !x.len().is_multiple_of(dim) {
            return Err(KvMisuse::RowsNotWhole { what: "X-cache input", values: x.len(), row: dim }.into());
        }
        let [first, second] = &mut self.halves;
        first.clear();
        second.clear();
        for row in x.chunks_exact(dim) {
            first.extend_from_slice(&row[..dim / 2]);
            second.extend_from_slice(&row[dim / 2..]);
        }
        self.backing.append(layer, first, second)
    }

    /// Every token's K/V of `layer` (the committed ones and the step's), rebuilt from X: the
    /// cold tokens' X read in one request, the window's from memory.
    pub fn gather(&mut self, layer: usize) -> Result<KvView<'_>> {
        let (dim, half) = (self.rebuild.input_dim(), self.rebuild.input_dim() / 2);
        let held = self.backing.held(layer);
        let cold_groups = self.backing.cold_end() / GROUP_TOKENS;
        self.x.resize(held * dim, 0.0);
        if cold_groups > 0 {
            let cold = self.backing.cold();
            cold.read_groups(layer, 0, 0, cold_groups, self.read_buf.as_bytes_mut())?;
            let (words, group_words) = (self.read_buf.as_u16(), cold.layout().group_bytes() / 2);
            for (t, x) in self.x.chunks_exact_mut(dim).take(cold_groups * GROUP_TOKENS).enumerate() {
                let group = &words[t / GROUP_TOKENS * group_words..];
                let row = |part: usize| &group[(part * GROUP_TOKENS + t % GROUP_TOKENS) * half..][..half];
                widen(row(0), &mut x[..half]);
                widen(row(1), &mut x[half..]);
            }
        }
        for t in self.backing.cold_end()..held {
            let x = &mut self.x[t * dim..][..dim];
            widen(self.backing.row(layer, 0, t, false), &mut x[..half]);
            widen(self.backing.row(layer, 0, t, true), &mut x[half..]);
        }
        let (kv_dim, hd) = (self.kv_shape.kv_dim(), self.kv_shape.head_dim);
        self.k.resize(held * kv_dim, 0.0);
        self.v.resize(held * kv_dim, 0.0);
        self.rebuild.project(layer, &self.x, 0, &mut self.k, &mut self.v);
        self.view.reset(self.kv_shape.n_kv_heads, held);
        let [k_row, v_row] = &mut self.row;
        for t in 0..held {
            for head in 0..self.kv_shape.n_kv_heads {
                narrow(&self.k[t * kv_dim + head * hd..][..hd], k_row);
                narrow(&self.v[t * kv_dim + head * hd..][..hd], v_row);
                self.view.set_token(t, head, k_row, v_row);
            }
        }
        Ok(self.view.view(held, None))
    }

    pub fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.view.end_step();
        self.backing.commit(n_tokens, |_, _, _, _, _| {})
    }

    pub fn truncate(&mut self, n_tokens: usize) -> usize {
        self.backing.truncate(n_tokens)
    }

    /// Bytes of X in the cold pool.
    pub fn cold_bytes(&self) -> usize {
        self.backing.cold_bytes()
    }

    /// Bytes of X read from the cold pool so far.
    pub fn bytes_read(&self) -> u64 {
        self.backing.cold().stats.bytes_read.load(Ordering::Relaxed)
    }

    /// Read requests the X pool took.
    pub fn reads(&self) -> u64 {
        self.backing.cold().stats.reads.load(Ordering::Relaxed)
    }

    /// Regions of the X pool read through the page cache, of all, and the bytes read that way.
    pub fn cached_reads(&self) -> (usize, usize, u64) {
        self.backing.cached_reads()
    }

    pub fn resident_bytes(&self) -> usize {
        let floats = self.x.capacity()
            + self.k.capacity()
            + self.v.capacity()
            + self.halves.iter().map(Vec::capacity).sum::<usize>();
        4 * floats + self.read_buf.len() + self.view.bytes()
    }
}

fn widen(bits: &[u16], out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(bits) {
        *o = f16::from_bits(b).to_f32();
    }
}

fn narrow(values: &[f32], out: &mut Vec<u16>) {
    out.clear();
    out.extend(values.iter().map(|&v| f16::from_f32(v).to_bits()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n_kv_heads: usize) -> KvShape {
        KvShape { n_layers: 30, n_kv_heads, head_dim: 64, max_tokens: 8192 }
    }

    #[test]
    fn the_plan_keeps_x_only_where_it_is_smaller_than_k_and_v() {
        // SmolLM2 (9 query heads over 3 KV heads): X is 576 values, K+V 384.
        let gqa = XCachePlan::new(shape(3), 576, 0.5);
        assert_eq!(gqa.layers, 0);
        assert!(gqa.to_string().starts_with("off: a token's layer input is 576 values, its K and V only 384"), "{gqa}");
        // The same model with a KV head per query head: half the layers keep X, at half the bytes.
        let mha = XCachePlan::new(shape(9), 576, 0.5);
        assert_eq!(mha.layers, 15);
        assert_eq!(mha.bytes_per_token(), 2 * (15 * 576 + 15 * 1152));
        assert_eq!(XCachePlan::new(shape(9), 576, 1.0).layers, 29, "one layer keeps its K/V");
        assert_eq!(XCachePlan::new(shape(9), 576, 0.0).layers, 0);
    }
}
