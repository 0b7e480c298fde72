//! A KV store filled with synthetic rows whose V says which token it belongs to, so that a
//! decode step can check every slot of every view the store hands out.

use hillside_engine::kv::{KvStore, Queries, Selection};
use std::ops::Range;

/// K and V rows of `tokens`: keys that repeat every 13 tokens, and every value of a token's V
/// its position modulo 2,048 (what f16 holds exactly).
pub fn rows(store: &dyn KvStore, tokens: Range<usize>) -> (Vec<f32>, Vec<f32>) {
    let per_token = store.shape().n_kv_heads * store.shape().head_dim;
    let k: Vec<f32> =
        tokens.clone().flat_map(|t| (0..per_token).map(move |i| ((t * 7 + i) % 13) as f32 - 6.0)).collect();
    let v: Vec<f32> = tokens.flat_map(|t| std::iter::repeat_n((t % 2048) as f32, per_token)).collect();
    (k, v)
}

/// Appends and commits `n_tokens` tokens to every layer, `chunk` at a time.
pub fn fill(store: &mut dyn KvStore, n_tokens: usize, chunk: usize) {
    for start in (0..n_tokens).step_by(chunk) {
        let (k, v) = rows(store, start..start + chunk);
        (0..store.shape().n_layers).for_each(|layer| store.append(layer, &k, &v).unwrap());
        store.commit(chunk).unwrap();
    }
}

/// One decode step, its key the query: checks that every slot of every view holds its token's
/// V, and says how many layers ranked a selection.
pub fn decode_step(store: &mut dyn KvStore) -> usize {
    let (shape, t) = (store.shape(), store.len_tokens());
    let (k, v) = rows(store, t..t + 1);
    let mut ranked = 0;
    for layer in 0..shape.n_layers {
        store.append(layer, &k, &v).unwrap();
        let selection = store.select(layer, &Queries::new(&k, &[t], shape.n_kv_heads)).unwrap();
        ranked += usize::from(matches!(selection, Selection::Tokens { .. }));
        let view = store.gather(layer, &selection, 0..shape.n_kv_heads).unwrap();
        for head in 0..shape.n_kv_heads {
            for slot in 0..view.n_tokens {
                let token = view.positions.map_or(slot, |p| p[head * view.n_tokens + slot] as usize);
                let value = view.v[(head * view.head_stride_tokens + slot) * shape.head_dim].to_f32();
                assert_eq!(value, (token % 2048) as f32, "token {t}: layer {layer} head {head} slot {slot}");
            }
        }
        store.observe(layer, &selection);
    }
    store.commit(1).unwrap();
    ranked
}
