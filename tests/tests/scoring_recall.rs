//! Ranking with the low-precision key copies picks (nearly) the same top-α tokens as exact f32
//! scores, on the real model's keys and queries.

mod common;

use hillside_bench::fidelity::{ExactKeys, SelectionWatch, Watched};
use hillside_engine::kv::{FullKvStore, Selection};
use hillside_engine::score::{KeyBits, ScoreBlock, ScoringKeys, TopK};
use hillside_engine::{Engine, Logits};

/// Keeps the last single-token query of each layer (the wrapper keeps every key in f32).
struct LastQuery(Vec<Vec<f32>>);

impl SelectionWatch for LastQuery {
    fn select(
        &mut self,
        _: &ExactKeys,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        selection: Selection,
    ) -> Selection {
        if q_positions.len() == 1 {
            self.0[layer] = q.to_vec();
        }
        selection
    }
}

fn top(tokens: &[u32], scores: &[f32], k: usize) -> Vec<u32> {
    let mut t = TopK::new(k);
    t.merge(tokens, scores);
    t.into_tokens()
}

#[test]
fn int8_top_alpha_recall_is_at_least_95_percent() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let c = engine.model().config.clone();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = engine.tokenizer().encode(&text[100_000..160_000]).unwrap();
    let shape = engine.model().kv_shape(2048);
    let mut store = Watched::new(Box::new(FullKvStore::new(shape)), LastQuery(vec![Vec::new(); c.n_layers]));
    for chunk in tokens[..2000].chunks(256) {
        engine.model().forward(chunk, &mut store, Logits::Last).unwrap();
    }
    engine.model().forward(&tokens[2000..2001], &mut store, Logits::Last).unwrap();

    let (hd, n_kv, group) = (c.head_dim, c.n_kv_heads, c.group_size());
    let n = 2001;
    let k_top = n / 5;
    let ids: Vec<u32> = (0..n as u32).collect();
    let mut recalls = Vec::new();
    for layer in 0..c.n_layers {
        let (keys, q) = (store.keys().layer(layer), &store.watch.0[layer]);
        let mut query = vec![0f32; n_kv * hd];
        for h in 0..n_kv {
            for g in 0..group {
                query[h * hd..][..hd].iter_mut().zip(&q[(h * group + g) * hd..][..hd]).for_each(|(a, b)| *a += b);
            }
        }
        // Each KV head selects its own tokens: recall is averaged over heads.
        let exact = |h: usize| -> Vec<f32> {
            (0..n)
                .map(|t| keys[(t * n_kv + h) * hd..][..hd].iter().zip(&query[h * hd..][..hd]).map(|(k, q)| k * q).sum())
                .collect()
        };
        let want: Vec<Vec<u32>> = (0..n_kv).map(|h| top(&ids, &exact(h), k_top)).collect();
        let recall_of = |bits| {
            let mut copy = ScoringKeys::new(bits, n_kv, hd);
            copy.push(keys);
            let mut block = ScoreBlock::new(ids.clone(), n_kv);
            copy.score(&query, &ids, &mut block.scores);
            let hits: usize = (0..n_kv)
                .map(|h| top(&ids, block.head(h), k_top).iter().filter(|t| want[h].binary_search(t).is_ok()).count())
                .sum();
            hits as f64 / (n_kv * k_top) as f64
        };
        recalls.push((recall_of(KeyBits::Int8), recall_of(KeyBits::Int4)));
    }
    let mean = |f: fn(&(f64, f64)) -> f64| recalls.iter().map(f).sum::<f64>() / recalls.len() as f64;
    let (int8, int4) = (mean(|r| r.0), mean(|r| r.1));
    let worst8 = recalls.iter().map(|r| r.0).fold(1.0, f64::min);
    eprintln!(
        "top-20% recall vs f32 over {} layers: INT8 mean {int8:.4} (worst {worst8:.4}), INT4 mean {int4:.4}",
        c.n_layers
    );
    assert!(int8 >= 0.95 && worst8 >= 0.9, "INT8 recall {int8} (worst layer {worst8})");
    assert!(int4 >= 0.85, "INT4 recall {int4}");
}
