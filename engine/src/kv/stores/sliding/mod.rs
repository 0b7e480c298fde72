//! Models with sliding-window layers (Gemma 3, gpt-oss, Mistral): each windowed layer keeps
//! only its window, in a ring in memory ([`ring`]), and never reaches the cold pool; the global
//! layers go to the store the user chose, built for their count alone. A 32K-token document on
//! Gemma 3 (five windowed layers of 512 tokens to each global one) then keeps about a fifth of
//! the K/V a dense model of its shape would.
//!
//! The price is llama.cpp's too: a truncation further back than the rings' slack keeps nothing,
//! since the window before it is gone, and the sequence's tokens are run again; but for the
//! prefix the caller marks (a document's), whose window the rings keep aside.

mod ring;

use crate::error::{KvMisuse, Result};
use crate::kv::stores::x_cache::KvFromInput;
use crate::kv::{HeadsPart, KvShape, KvStats, KvStore, KvView, LayerPlan, Queries, Selection};
use ring::SlidingRing;
use std::ops::Range;
use std::sync::Arc;

/// Where a model layer's K/V live: the index of its ring, or of its layer in the global store.
#[derive(Debug, Clone, Copy)]
enum Home {
    Ring(usize),
    Global(usize),
}

pub struct SlidingWindowLayers {
    shape: KvShape,
    homes: Vec<Home>,
    rings: Vec<SlidingRing>,
    /// The global layers' store; `None` when every layer is windowed.
    global: Option<Box<dyn KvStore>>,
    len: usize,
    /// The prefix the rings keep a checkpoint at, once the sequence reaches it.
    kept_prefix: Option<usize>,
}

impl SlidingWindowLayers {
    /// The store for a model with a cache of `shape` whose layer `l` attends within
    /// `windows[l]` tokens (`None`: to every earlier one). `build` makes the global layers'
    /// store for their shape and their K/V projection; a model without a window shorter than
    /// `shape`'s length gets that store alone.
    pub fn around(
        shape: KvShape,
        windows: &[Option<usize>],
        rebuild: Option<Arc<dyn KvFromInput>>,
        build: impl FnOnce(KvShape, Option<Arc<dyn KvFromInput>>) -> Result<Box<dyn KvStore>>,
    ) -> Result<Box<dyn KvStore>> {
        let ring_window = |l: usize| windows.get(l).copied().flatten().filter(|&w| w > 0 && w < shape.max_tokens);
        if (0..shape.n_layers).all(|l| ring_window(l).is_none()) {
            return build(shape, rebuild);
        }
        let (mut homes, mut rings, mut global_layers) = (Vec::new(), Vec::new(), Vec::new());
        for l in 0..shape.n_layers {
            homes.push(match ring_window(l) {
                Some(window) => {
                    rings.push(SlidingRing::new(window, shape.n_kv_heads, shape.head_dim));
                    Home::Ring(rings.len() - 1)
                }
                None => {
                    global_layers.push(l);
                    Home::Global(global_layers.len() - 1)
                }
            });
        }
        let global = match global_layers.len() {
            0 => None,
            n => {
                let rebuild = rebuild.map(|inner| Arc::new(GlobalLayers { inner, layers: global_layers }) as _);
                Some(build(KvShape { n_layers: n, ..shape }, rebuild)?)
            }
        };
        Ok(Box::new(Self { shape, homes, rings, global, len: 0, kept_prefix: None }))
    }

    fn global(&mut self) -> &mut dyn KvStore {
        self.global.as_deref_mut().expect("a global layer has a global store")
    }
}

/// The model's K/V projection, indexed by the global store's layers.
struct GlobalLayers {
    inner: Arc<dyn KvFromInput>,
    /// The model layer of each global-store layer.
    layers: Vec<usize>,
}

impl KvFromInput for GlobalLayers {
    fn input_dim(&self) -> usize {
        self.inner.input_dim()
    }

    fn project(&self, layer: usize, x: &[f32], first_position: usize, k: &mut [f32], v: &mut [f32]) {
        self.inner.project(self.layers[layer], x, first_position, k, v)
    }
}

impl KvStore for SlidingWindowLayers {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        match self.homes[layer] {
            Home::Ring(i) => {
                self.shape.tokens_to_append(self.len, k, v)?;
                self.rings[i].append(k, v);
                Ok(())
            }
            Home::Global(g) => self.global().append(g, k, v),
        }
    }

    fn append_input(&mut self, layer: usize, x: &[f32]) -> Result<()> {
        match self.homes[layer] {
            Home::Ring(_) => Ok(()),
            Home::Global(g) => self.global().append_input(g, x),
        }
    }

    fn attend(&mut self, layer: usize, queries: &Queries<'_>, out: &mut [f32]) -> Option<Result<()>> {
        match self.homes[layer] {
            Home::Ring(_) => None,
            Home::Global(g) => self.global().attend(g, queries, out),
        }
    }

    fn prepare(&mut self, layer: usize, queries: &Queries<'_>) -> Result<LayerPlan> {
        match self.homes[layer] {
            Home::Ring(_) => Ok(LayerPlan { selection: Selection::All, parts: HeadsPart::all(self.shape.n_kv_heads) }),
            Home::Global(g) => self.global().prepare(g, queries),
        }
    }

    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection> {
        match self.homes[layer] {
            Home::Ring(_) => Ok(Selection::All),
            Home::Global(g) => self.global().select(g, queries),
        }
    }

    /// The global store's cut (a ring serves any range of heads, whole).
    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        match &self.global {
            Some(global) => global.parts(selection, cached_tokens),
            None => HeadsPart::all(self.shape.n_kv_heads),
        }
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: Range<usize>) -> Result<KvView<'_>> {
        match self.homes[layer] {
            Home::Ring(_) if *selection != Selection::All => Err(KvMisuse::PartialSelection.into()),
            Home::Ring(i) => Ok(self.rings[i].view(heads)),
            Home::Global(g) => self.global().gather(g, selection, heads),
        }
    }

    fn observe(&mut self, layer: usize, selection: &Selection) {
        if let Home::Global(g) = self.homes[layer] {
            self.global().observe(g, selection);
        }
    }

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.len += n_tokens;
        if let Some(at) = self.kept_prefix.filter(|&at| at > self.len - n_tokens && at <= self.len) {
            // The step's tokens reached the prefix: the rings still hold the window before it.
            self.rings.iter_mut().for_each(|ring| ring.checkpoint(at));
        }
        match &mut self.global {
            Some(global) => global.commit(n_tokens),
            None => Ok(()),
        }
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        let mut kept = n_tokens.min(self.len);
        if let Some(global) = &mut self.global {
            kept = global.truncate(kept);
        }
        kept = self.rings.iter().map(|ring| ring.keepable(kept)).min().unwrap_or(kept);
        if let Some(global) = &mut self.global {
            global.truncate(kept);
        }
        self.rings.iter_mut().for_each(|ring| ring.truncate(kept));
        self.len = kept;
        kept
    }

    fn keep_prefix(&mut self, n_tokens: usize) {
        self.kept_prefix = Some(n_tokens);
        if n_tokens <= self.len {
            self.rings.iter_mut().for_each(|ring| ring.checkpoint(n_tokens));
        }
    }

    fn stats(&self) -> KvStats {
        let window_bytes: usize = self.rings.iter().map(SlidingRing::bytes).sum();
        let mut stats = self.global.as_ref().map(|g| g.stats()).unwrap_or_default();
        stats.tokens = self.len;
        stats.resident_bytes += window_bytes;
        stats.window_bytes = window_bytes;
        stats
    }

    fn trim(&mut self) {
        if let Some(global) = &mut self.global {
            global.trim();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::attend;
    use crate::kv::FullKvStore;

    const WINDOW: usize = 20;
    const N_HEADS: usize = 4;

    fn shape() -> KvShape {
        KvShape { n_layers: 2, n_kv_heads: 2, head_dim: 8, max_tokens: 1000 }
    }

    /// Layer 0 windowed, layer 1 global (kept by a full store).
    fn sliding() -> Box<dyn KvStore> {
        SlidingWindowLayers::around(shape(), &[Some(WINDOW), None], None, |global, _| {
            assert_eq!(global, KvShape { n_layers: 1, ..shape() }, "only the global layer reaches the chosen store");
            Ok(Box::new(FullKvStore::new(global)))
        })
        .unwrap()
    }

    /// Values in [-1, 1) from a fixed seed (xorshift).
    struct Values(u64);

    impl Values {
        fn take(&mut self, n: usize) -> Vec<f32> {
            (0..n)
                .map(|_| {
                    self.0 ^= self.0 << 13;
                    self.0 ^= self.0 >> 7;
                    self.0 ^= self.0 << 17;
                    (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect()
        }
    }

    /// Appends `n` tokens to both stores and checks that every layer's queries at the new
    /// positions get the same attention from the rings as from the whole cache, windowed.
    fn step(sliding: &mut dyn KvStore, full: &mut FullKvStore, values: &mut Values, n: usize) {
        let s = shape();
        let positions: Vec<usize> = (full.len_tokens()..full.len_tokens() + n).collect();
        assert_eq!(sliding.len_tokens(), full.len_tokens());
        for layer in 0..s.n_layers {
            let (k, v, q) =
                (values.take(n * s.kv_dim()), values.take(n * s.kv_dim()), values.take(n * N_HEADS * s.head_dim));
            sliding.append(layer, &k, &v).unwrap();
            full.append(layer, &k, &v).unwrap();
            let window = (layer == 0).then_some(WINDOW);
            let mut want = vec![0f32; q.len()];
            attend(
                &q,
                &positions,
                N_HEADS,
                &full.gather(layer, &Selection::All, 0..2).unwrap().windowed(window),
                &mut want,
            );
            let plan = sliding.prepare(layer, &Queries::new(&q, &positions, N_HEADS)).unwrap();
            assert_eq!(plan.parts, HeadsPart::all(s.n_kv_heads));
            let mut got = vec![0f32; q.len()];
            attend(
                &q,
                &positions,
                N_HEADS,
                &sliding.gather(layer, &plan.selection, 0..2).unwrap().windowed(window),
                &mut got,
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // The ring's slots hold keys out of order once it wraps: the sums round differently.
                assert!((g - w).abs() < 1e-5, "layer {layer}, positions {positions:?}, value {i}: {g} vs {w}");
            }
        }
        sliding.commit(n).unwrap();
        full.commit(n).unwrap();
    }

    #[test]
    fn a_windowed_layer_keeps_its_window_in_a_ring_and_attends_as_over_the_whole_cache() {
        let (mut sliding, mut full, mut values) = (sliding(), FullKvStore::new(shape()), Values(0x9e37_79b9_7f4a_7c15));
        // A prompt in chunks, decoding past the ring's end, a chunk longer than the ring, decoding.
        for n in [5, 1, 1, 30].into_iter().chain([1; 60]).chain([100]).chain([1; 30]) {
            step(sliding.as_mut(), &mut full, &mut values, n);
        }
        let held = sliding.len_tokens();
        let grown = sliding.stats().window_bytes;
        for _ in 0..400 {
            step(sliding.as_mut(), &mut full, &mut values, 1);
        }
        assert_eq!(sliding.stats().window_bytes, grown, "decoding never grows the ring");
        let whole_layer_bytes = 2 * 2 * shape().kv_dim() * sliding.len_tokens();
        assert!(grown < whole_layer_bytes / 2, "{grown} bytes in the ring of a layer of {whole_layer_bytes}");

        // A few tokens back (a chat's re-rendered turn end): the window before them is held.
        let len = sliding.len_tokens();
        assert_eq!(sliding.truncate(len - 10), len - 10);
        full.truncate(len - 10);
        for n in [3, 1, 1] {
            step(sliding.as_mut(), &mut full, &mut values, n);
        }
        // Further back than the ring reaches: nothing can be kept, and the store says so.
        assert_eq!(sliding.truncate(held - 50), 0);
        assert_eq!(sliding.len_tokens(), 0);
        full.truncate(0);
        for n in [40, 1, 1, 1] {
            step(sliding.as_mut(), &mut full, &mut values, n);
        }
    }

    #[test]
    fn a_kept_prefix_can_be_gone_back_to_from_far_past_it() {
        let (mut sliding, mut full, mut values) = (sliding(), FullKvStore::new(shape()), Values(0x5851_f42d_4c95_7f2d));
        // A document of 90 tokens, its prefix marked before it is prefilled in chunks of 32.
        sliding.keep_prefix(90);
        for n in [32, 32, 32].into_iter().chain([1; 150]) {
            step(sliding.as_mut(), &mut full, &mut values, n);
        }
        let bytes_with_checkpoint = sliding.stats().window_bytes;
        for back_to in [93, 90] {
            assert_eq!(sliding.truncate(back_to), 90, "the rings go back to the checkpoint");
            full.truncate(90);
            for n in [5, 1, 1].into_iter().chain([1; 80]) {
                step(sliding.as_mut(), &mut full, &mut values, n);
            }
        }
        assert_eq!(sliding.stats().window_bytes, bytes_with_checkpoint);
        // Before the checkpoint, nothing is kept; marked after its tokens went by, nothing is kept aside.
        assert_eq!(sliding.truncate(60), 0);
        full.truncate(0);
        for n in [32].into_iter().chain([1; 100]) {
            step(sliding.as_mut(), &mut full, &mut values, n);
        }
        sliding.keep_prefix(20);
        assert_eq!(sliding.truncate(25), 0);
    }

    #[test]
    fn a_snapshot_keeps_a_prefix_the_rings_hold_whole_and_refuses_one_they_do_not() {
        let scratch = tempfile::Builder::new().prefix("hillside-sliding-").tempdir().unwrap();
        let path = scratch.path().join("prefix.kv");
        let (mut sliding, mut full, mut values) = (sliding(), FullKvStore::new(shape()), Values(0x2545_f491_4f6c_dd1d));
        step(sliding.as_mut(), &mut full, &mut values, 30);
        crate::kv::snapshot::save(sliding.as_mut(), 30, &[7; 32], &path).unwrap();
        let mut loaded = self::sliding();
        assert_eq!(crate::kv::snapshot::load(&path, &[7; 32], loaded.as_mut()).unwrap(), 30);
        // The loaded store goes on where the whole cache does, past the end of its rings.
        for _ in 0..100 {
            step(loaded.as_mut(), &mut full, &mut values, 1);
        }
        let held = loaded.len_tokens();
        assert!(crate::kv::snapshot::save(loaded.as_mut(), held, &[7; 32], &path).is_err(), "the rings wrapped");
    }

    #[test]
    fn a_model_without_a_short_window_gets_the_chosen_store_alone() {
        let built = |windows: &[Option<usize>]| {
            let mut shapes = Vec::new();
            SlidingWindowLayers::around(shape(), windows, None, |s, _| {
                shapes.push(s);
                Ok(Box::new(FullKvStore::new(s)))
            })
            .unwrap();
            shapes
        };
        assert_eq!(built(&[None, None]), [shape()]);
        assert_eq!(built(&[Some(1000), None]), [shape()], "a window as long as the cache is no window");
        assert_eq!(built(&[Some(WINDOW), Some(WINDOW)]), [], "every layer windowed: no global store");
    }
}
