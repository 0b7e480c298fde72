//! The compute tier: attention over a layer's gathered working set — the selected tokens and
//! the recent window, as a [`KvView`] — on a candle device.
//!
//! On the CPU the engine's fused kernel ([`crate::kernels::attention::attend`]) reads the view
//! where it lies and is faster, so the host path stays the default. With the `cuda` feature the
//! working set is copied into VRAM as candle tensors and attended there, and only the layer's
//! attention output comes back. The same code runs on candle's CPU device in the tests, against
//! the fused kernel.

use crate::error::{Error, Result};
use crate::kernels::attention::{attend, attend_partial, KvView, KV_TILE};
use candle_core::{DType, Device, Tensor, D};

/// Where a layer's attention runs.
pub enum Attention {
    /// The engine's fused CPU kernel over the view in place.
    Host,
    /// Candle tensors on a device (a GPU with the `cuda` feature).
    Device(Device),
}

impl Attention {
    /// The first CUDA GPU, or why there is none.
    pub fn cuda(ordinal: usize) -> Result<Self> {
        if !candle_core::utils::cuda_is_available() {
            return Err(Error::Device(
                "this build has no CUDA support; rebuild with `cargo build --release --features cuda` where nvcc is installed".into(),
            ));
        }
        Device::new_cuda(ordinal).map(Self::Device).map_err(|e| Error::Device(format!("CUDA device {ordinal}: {e}")))
    }

    pub fn name(&self) -> String {
        match self {
            Self::Host => "cpu".into(),
            Self::Device(d) => format!("{:?}", d.location()),
        }
    }

    /// Attention output `out` (`n × n_heads·head_dim`) for queries `q` (same shape, RoPE
    /// applied) at `q_positions`: the same exact softmax attention as [`attend`], up to the
    /// order of rounding.
    pub fn attend(
        &self,
        q: &[f32],
        q_positions: &[usize],
        n_heads: usize,
        view: &KvView<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        match self {
            Self::Host => {
                attend(q, q_positions, n_heads, view, out);
                Ok(())
            }
            Self::Device(device) => attend_on(device, q, q_positions, n_heads, view, out, None)
                .map_err(|e| Error::Device(format!("attention on {device:?}: {e}"))),
        }
    }

    /// [`Attention::attend`] over part of the cache, with each row's softmax statistics
    /// (`n × n_heads`) in `max` and `sum`, as [`attend_partial`] gives them: partials over
    /// disjoint tokens merge into the attention over all of them.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_partial(
        &self,
        q: &[f32],
        q_positions: &[usize],
        n_heads: usize,
        view: &KvView<'_>,
        out: &mut [f32],
        max: &mut [f32],
        sum: &mut [f32],
    ) -> Result<()> {
        match self {
            Self::Host => {
                attend_partial(q, q_positions, n_heads, view, out, max, sum);
                Ok(())
            }
            Self::Device(device) => attend_on(device, q, q_positions, n_heads, view, out, Some((max, sum)))
                .map_err(|e| Error::Device(format!("attention on {device:?}: {e}"))),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attend_on(
    device: &Device,
    q: &[f32],
    q_positions: &[usize],
    n_heads: usize,
    view: &KvView<'_>,
    out: &mut [f32],
    stats: Option<(&mut [f32], &mut [f32])>,
) -> candle_core::Result<()> {
    let (n_kv, hd, stride, n_tokens) = (view.n_kv_heads, view.head_dim, view.head_stride_tokens, view.n_tokens);
    let (group, n) = (n_heads / n_kv, q_positions.len());
    // The working set goes up once per layer: K in the view's tiles ([head][tile][dim][lane]),
    // untiled on the device; V token-major as it is.
    let k = Tensor::from_slice(&view.k[..n_kv * stride * hd], (n_kv, stride / KV_TILE, hd, KV_TILE), device)?
        .permute((0, 1, 3, 2))?
        .reshape((n_kv, stride, hd))?
        .narrow(1, 0, n_tokens)?
        .to_dtype(DType::F32)?;
    let v = Tensor::from_slice(&view.v[..n_kv * stride * hd], (n_kv, stride, hd), device)?
        .narrow(1, 0, n_tokens)?
        .to_dtype(DType::F32)?;
    // Queries grouped by KV head: [kv_head][token·group][dim].
    let q =
        Tensor::from_slice(q, (n, n_kv, group, hd), device)?.permute((1, 0, 2, 3))?.reshape((n_kv, n * group, hd))?;
    let scores = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (hd as f64).sqrt()))?;
    // Causal: a query sees the tokens at or before its position (a view without positions
    // holds token j at position j). A decode step's selection usually needs no mask at all.
    let position = |h: usize, j: usize| view.positions.map_or(j, |p| p[h * n_tokens + j] as usize);
    let earliest = q_positions.iter().copied().min().unwrap_or(0);
    let masked = view.window_tokens.is_some() || (0..n_kv).any(|h| (0..n_tokens).any(|j| position(h, j) > earliest));
    let scores = if masked {
        // Built on the host: a prompt chunk's mask is as large as its scores (a GPU holds it).
        let mask: Vec<f32> = (0..n_kv)
            .flat_map(|h| q_positions.iter().flat_map(move |&p| std::iter::repeat_n((h, p), group)))
            .flat_map(|(h, p)| {
                (0..n_tokens).map(move |j| {
                    let key = position(h, j);
                    if key <= p && !view.before_window(key, p) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        (scores + Tensor::from_vec(mask, (n_kv, n * group, n_tokens), device)?)?
    } else {
        scores
    };
    // A row that sees no key of a part (its max −∞) gets a finite max, so that its weights
    // are 0 rather than NaN, and a sum of 0, which a merge of partials passes over.
    let max = scores.max_keepdim(D::Minus1)?.maximum(f32::MIN)?;
    let shifted = scores.broadcast_sub(&max)?.exp()?;
    let sum = shifted.sum_keepdim(D::Minus1)?;
    let probs = shifted.broadcast_div(&sum.maximum(f32::MIN_POSITIVE)?)?;
    let o = probs.matmul(&v)?.reshape((n_kv, n, group, hd))?.permute((1, 0, 2, 3))?.flatten_all()?;
    out.copy_from_slice(&o.to_vec1::<f32>()?);
    if let Some((max_out, sum_out)) = stats {
        // [kv_head][token·group] → [token][kv_head·group], the rows of `out`.
        let by_row = |t: Tensor| t.reshape((n_kv, n, group))?.permute((1, 0, 2))?.flatten_all()?.to_vec1::<f32>();
        max_out.copy_from_slice(&by_row(max)?);
        sum_out.copy_from_slice(&by_row(sum)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::k_tile_index;
    use half::f16;

    /// A view of `n` tokens for `n_kv` heads with pseudo-random K/V.
    fn view_data(n_kv: usize, hd: usize, n: usize) -> (usize, Vec<f16>, Vec<f16>) {
        let stride = n.div_ceil(KV_TILE) * KV_TILE;
        let (mut k, mut v) = (vec![f16::ZERO; n_kv * stride * hd], vec![f16::ZERO; n_kv * stride * hd]);
        for h in 0..n_kv {
            for t in 0..n {
                for d in 0..hd {
                    let x = ((h * 7919 + t * 104_729 + d * 31) % 1000) as f32 / 500.0 - 1.0;
                    k[h * stride * hd + k_tile_index(t, d, hd)] = f16::from_f32(x);
                    v[(h * stride + t) * hd + d] = f16::from_f32(-x * 0.5);
                }
            }
        }
        (stride, k, v)
    }

    #[test]
    fn device_attention_matches_the_fused_kernel() {
        let (n_kv, hd, group, n) = (3, 64, 3, 300);
        let (stride, k, v) = view_data(n_kv, hd, n);
        // Per-head positions, some after the query (masked), and all before it (no mask).
        let later: Vec<u32> = (0..n_kv).flat_map(|h| (0..n as u32).map(move |t| t * 2 + h as u32)).collect();
        let earlier: Vec<u32> = (0..n_kv).flat_map(|h| (0..n as u32).map(move |t| t / 2 + h as u32)).collect();
        let n_heads = n_kv * group;
        let cases = [(40, None, None), (1, None, None), (1, Some(&later), None), (1, Some(&earlier), None)];
        // And through a sliding window, where keys sit at their index and where they do not.
        let windowed = [(40, None, Some(50)), (1, Some(&earlier), Some(30))];
        for (queries, positions, window_tokens) in cases.into_iter().chain(windowed) {
            let q: Vec<f32> = (0..queries * n_heads * hd).map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0).collect();
            let q_positions: Vec<usize> = (n - queries..n).collect();
            let view = KvView {
                n_tokens: n,
                n_kv_heads: n_kv,
                head_dim: hd,
                head_stride_tokens: stride,
                k: &k,
                v: &v,
                positions: positions.map(|p| &p[..]),
                window_tokens,
            };
            let (mut host, mut dev) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            Attention::Host.attend(&q, &q_positions, n_heads, &view, &mut host).unwrap();
            Attention::Device(Device::Cpu).attend(&q, &q_positions, n_heads, &view, &mut dev).unwrap();
            let worst = host.iter().zip(&dev).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                worst < 1e-4,
                "queries {queries}, positions {positions:?}, window {window_tokens:?}: max |Δ| {worst}"
            );
        }
    }

    #[test]
    fn device_partials_match_the_fused_kernels_even_where_a_row_sees_no_key() {
        let (n_kv, hd, group, n) = (2, 64, 7, 200);
        let (stride, k, v) = view_data(n_kv, hd, n);
        // A span of a prompt's cache at positions 100..300: the chunk's queries at 90..120 see
        // none of it, part of it, or all of it.
        let span: Vec<u32> = (0..n_kv).flat_map(|_| 100..100 + n as u32).collect();
        let view = KvView {
            n_tokens: n,
            n_kv_heads: n_kv,
            head_dim: hd,
            head_stride_tokens: stride,
            k: &k,
            v: &v,
            positions: Some(&span),
            window_tokens: None,
        };
        let n_heads = n_kv * group;
        let q_positions: Vec<usize> = (90..120).chain([400]).collect();
        let q: Vec<f32> = (0..q_positions.len() * n_heads * hd).map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0).collect();
        let rows = q_positions.len() * n_heads;
        let mut got = Vec::new();
        for attention in [Attention::Host, Attention::Device(Device::Cpu)] {
            let (mut out, mut max, mut sum) = (vec![0f32; q.len()], vec![0f32; rows], vec![0f32; rows]);
            attention.attend_partial(&q, &q_positions, n_heads, &view, &mut out, &mut max, &mut sum).unwrap();
            assert!(out.iter().all(|x| x.is_finite()), "{}: a row that sees no key is 0, not NaN", attention.name());
            got.push((out, max, sum));
        }
        let ((host, host_max, host_sum), (dev, dev_max, dev_sum)) = (&got[0], &got[1]);
        let unseen = 10 * n_heads; // queries 90..99
        assert!(host_sum[..unseen].iter().chain(&dev_sum[..unseen]).all(|&s| s == 0.0));
        assert!(host_sum[unseen..].iter().all(|&s| s >= 1.0));
        for r in unseen..rows {
            assert!(
                (host_max[r] - dev_max[r]).abs() < 1e-4 && (host_sum[r] - dev_sum[r]).abs() < 1e-3 * host_sum[r],
                "row {r}"
            );
        }
        let worst = host.iter().zip(dev).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "max |Δ| {worst}");
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn asking_for_cuda_without_it_says_how_to_get_it() {
        let err = Attention::cuda(0).err().expect("no CUDA in this build").to_string();
        assert!(err.contains("--features cuda"), "{err}");
    }
}
