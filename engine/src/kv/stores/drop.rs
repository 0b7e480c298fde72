//! H2O-style eviction, a comparison store: K/V stay in memory, but only the attention sinks,
//! the recent tokens and the heavy hitters (tokens with the most accumulated attention) are
//! kept; the rest is discarded for good. Each layer evicts on its own. Importance is the
//! softmax attention each token receives from the newest query of every step (the last query
//! of a prompt chunk, every decoded token), summed over query heads.

use crate::error::Result;
use crate::kv::hot_pool::HotPool;
use crate::kv::view::ViewBuffers;
use crate::kv::{KvShape, KvStats, KvStore, KvView, Queries, Selection};
use half::f16;

pub struct DropKvStore {
    shape: KvShape,
    alpha: f32,
    sink_tokens: usize,
    recent_tokens: usize,
    kept: HotPool,
    /// `[layer][token]` accumulated attention.
    importance: Vec<Vec<f32>>,
    view: ViewBuffers,
    positions: Vec<u32>,
    len: usize,
    pending: Vec<usize>,
}

impl DropKvStore {
    pub fn new(shape: KvShape, alpha: f32, sink_tokens: usize, recent_tokens: usize) -> Self {
        Self {
            kept: HotPool::new(shape.n_layers, shape.kv_dim(), shape.n_layers * shape.max_tokens),
            importance: vec![Vec::new(); shape.n_layers],
            view: ViewBuffers::new(shape.head_dim),
            positions: Vec::new(),
            shape,
            alpha,
            sink_tokens,
            recent_tokens,
            len: 0,
            pending: vec![0; shape.n_layers],
        }
    }

    fn kept_sorted(&self, layer: usize) -> Vec<u32> {
        let mut tokens: Vec<u32> = self.kept.tokens(layer).collect();
        tokens.sort_unstable();
        tokens
    }

    /// Adds the attention each of `tokens` gets from the query row `q_row`, whose heads' softmax
    /// also holds their `sinks` where the layer has them.
    fn accumulate(&mut self, layer: usize, q_row: &[f32], sinks: Option<&[f32]>, tokens: &[u32]) {
        let (hd, n_kv) = (self.shape.head_dim, self.shape.n_kv_heads);
        let n_heads = q_row.len() / hd;
        let group = n_heads / n_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scores = vec![0f32; tokens.len()];
        for head in 0..n_heads {
            let kv_head = head / group;
            let q = &q_row[head * hd..][..hd];
            for (s, &t) in scores.iter_mut().zip(tokens) {
                let (k, _) = self.kept.get(layer, t).expect("kept token");
                *s = k[kv_head * hd..][..hd].iter().zip(q).map(|(&k, &q)| f16::from_bits(k).to_f32() * q).sum::<f32>()
                    * scale;
            }
            let sink = sinks.map_or(f32::NEG_INFINITY, |s| s[head]);
            let max = scores.iter().copied().fold(sink, f32::max);
            let total: f32 = scores.iter().map(|s| (s - max).exp()).sum::<f32>() + (sink - max).exp();
            let importance = &mut self.importance[layer];
            for (&s, &t) in scores.iter().zip(tokens) {
                importance[t as usize] += (s - max).exp() / total;
            }
        }
    }
}

impl KvStore for DropKvStore {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn len_tokens(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let n = self.shape.tokens_to_append(self.len, k, v)?;
        let kv_dim = self.shape.kv_dim();
        let bits = |row: &[f32]| row.iter().map(|&x| f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        for i in 0..n {
            let (kr, vr) = (bits(&k[i * kv_dim..][..kv_dim]), bits(&v[i * kv_dim..][..kv_dim]));
            self.kept.insert(layer, (self.len + i) as u32, &kr, &vr);
        }
        self.importance[layer].resize(self.len + n, 0.0);
        self.pending[layer] = n;
        Ok(())
    }

    fn select(&mut self, layer: usize, queries: &Queries<'_>) -> Result<Selection> {
        let tokens = self.kept_sorted(layer);
        let q = queries.q;
        let row = q.len() / queries.positions.len();
        // The newest query sees every kept token (earlier rows of a chunk are causally masked).
        self.accumulate(layer, &q[q.len() - row..], queries.sinks, &tokens);
        Ok(Selection::shared(&tokens, self.shape.n_kv_heads))
    }

    fn gather(&mut self, layer: usize, selection: &Selection, heads: std::ops::Range<usize>) -> Result<KvView<'_>> {
        let (hd, n_kv) = (self.shape.head_dim, self.shape.n_kv_heads);
        let selection = match selection {
            Selection::All => Selection::shared(&self.kept_sorted(layer), n_kv),
            tokens => tokens.clone(),
        };
        self.positions.clear();
        let slots = selection.head(heads.start).map_or(0, <[u32]>::len);
        self.view.reset(heads.len(), slots);
        let kept = &self.kept;
        // A tile of rows at a time (see `SlotRun::fill`), not a token at a time.
        for mut run in self.view.heads_mut(0..heads.len()) {
            let head = heads.start + run.head;
            let tokens = selection.head(head).expect("a token selection");
            run.fill(|slot| {
                let (k, v) = kept.get(layer, *tokens.get(slot)?).expect("selected tokens are kept");
                Some((&k[head * hd..][..hd], &v[head * hd..][..hd]))
            });
        }
        for head in heads {
            self.positions.extend_from_slice(selection.head(head).expect("a token selection"));
        }
        Ok(self.view.view(slots, Some(&self.positions)))
    }

    fn observe(&mut self, _layer: usize, _selection: &Selection) {}

    fn commit(&mut self, n_tokens: usize) -> Result<()> {
        self.view.end_step();
        self.len += n_tokens;
        self.pending.fill(0);
        let budget = (self.alpha * self.len as f32).ceil() as usize + self.sink_tokens + self.recent_tokens;
        for layer in 0..self.shape.n_layers {
            let excess = self.kept.len(layer).saturating_sub(budget);
            if excess == 0 {
                continue;
            }
            let recent_start = self.len.saturating_sub(self.recent_tokens);
            let mut victims: Vec<u32> = self
                .kept
                .tokens(layer)
                .filter(|&t| t as usize >= self.sink_tokens && (t as usize) < recent_start)
                .collect();
            let importance = &self.importance[layer];
            victims.sort_by(|&a, &b| importance[a as usize].total_cmp(&importance[b as usize]));
            for t in victims.into_iter().take(excess) {
                self.kept.remove(layer, t);
            }
        }
        Ok(())
    }

    fn truncate(&mut self, n_tokens: usize) -> usize {
        self.pending.fill(0);
        self.len = self.len.min(n_tokens);
        self.kept.truncate(self.len);
        for importance in &mut self.importance {
            importance.truncate(self.len);
        }
        self.len
    }

    fn stats(&self) -> KvStats {
        KvStats { tokens: self.len, resident_bytes: self.kept.bytes() + self.view.bytes(), ..KvStats::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each query head hands out one unit of attention, less what its sink takes.
    #[test]
    fn a_sink_takes_its_share_of_the_attention_the_tokens_get() {
        let shape = KvShape { n_layers: 1, n_kv_heads: 1, head_dim: 4, max_tokens: 16 };
        let given = |sinks: Option<&[f32]>| {
            let mut store = DropKvStore::new(shape, 1.0, 0, 0);
            let k: Vec<f32> = (0..8 * 4).map(|i| (i % 5) as f32 * 0.25).collect();
            store.append(0, &k, &k).unwrap();
            let q = [0.5f32, -0.25, 1.0, 0.0, 0.25, 0.5, -1.0, 0.75];
            store.select(0, &Queries { q: &q, positions: &[7], n_heads: 2, sinks }).unwrap();
            store.importance[0].iter().sum::<f32>()
        };
        assert!((given(None) - 2.0).abs() < 1e-5);
        let sinks = [0.0f32, 2.0];
        let with_sinks = given(Some(&sinks));
        assert!(with_sinks > 0.05 && with_sinks < 1.95, "{with_sinks}");
        // A sink far above every score takes nearly all of it.
        assert!(given(Some(&[60.0, 60.0])) < 1e-6);
    }
}
