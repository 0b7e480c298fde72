//! The two ways `bench recall` keeps r of a head's dimensions: the rotary pairs with the most
//! query × key energy, and the principal components of the keys (a symmetric eigen-solver, Jacobi
//! rotations, for the keys' covariance).

use hillside_engine::kernels::rope::RopeLayout;

/// A way of keeping r coordinates of a head's keys and queries.
pub enum Projection {
    /// These dimensions (whole RoPE pairs).
    Dims(Vec<usize>),
    /// Coordinates along these orthonormal directions (`r × head_dim`), keys centered on `mean`
    /// (the mean's part of q·k is the same for every token, so queries are not centered).
    Basis { directions: Vec<f32>, mean: Vec<f32> },
}

impl Projection {
    pub fn rank(&self, head_dim: usize) -> usize {
        match self {
            Self::Dims(d) => d.len(),
            Self::Basis { directions, .. } => directions.len() / head_dim,
        }
    }

    pub fn apply(&self, x: &[f32], centered: bool, out: &mut Vec<f32>) {
        out.clear();
        match self {
            Self::Dims(dims) => out.extend(dims.iter().map(|&d| x[d])),
            Self::Basis { directions, mean } => out.extend(directions.chunks_exact(x.len()).map(|dir| {
                dir.iter().zip(x).zip(mean).map(|((a, &v), &m)| a * if centered { v - m } else { v }).sum::<f32>()
            })),
        }
    }
}

/// The `rank`/2 rotary pairs of a head with the largest query × key RMS product over the fitting
/// tokens (`fit_keys`, `fit_queries`: that head's rows, `head_dim` each).
pub fn rope_pairs(
    layout: RopeLayout,
    head_dim: usize,
    fit_keys: &[&[f32]],
    fit_queries: &[&[f32]],
    rank: usize,
) -> Projection {
    let half = head_dim / 2;
    let pair = |i: usize| match layout {
        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
        RopeLayout::Halves => (i, i + half),
    };
    let energy = |rows: &[&[f32]], (a, b): (usize, usize)| {
        rows.iter().map(|r| r[a] * r[a] + r[b] * r[b]).sum::<f32>() / rows.len().max(1) as f32
    };
    let mut pairs: Vec<(f32, usize)> =
        (0..half).map(|i| (energy(fit_keys, pair(i)).sqrt() * energy(fit_queries, pair(i)).sqrt(), i)).collect();
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut dims: Vec<usize> = pairs[..rank / 2].iter().flat_map(|&(_, i)| [pair(i).0, pair(i).1]).collect();
    dims.sort_unstable();
    Projection::Dims(dims)
}

/// The `rank` principal directions of `fit_keys` about their mean.
pub fn pca(head_dim: usize, fit_keys: &[&[f32]], rank: usize) -> Projection {
    let n = fit_keys.len().max(1) as f64;
    let mut mean = vec![0f64; head_dim];
    for k in fit_keys {
        mean.iter_mut().zip(*k).for_each(|(m, &x)| *m += f64::from(x) / n);
    }
    let mut cov = vec![0f64; head_dim * head_dim];
    for k in fit_keys {
        for i in 0..head_dim {
            let di = f64::from(k[i]) - mean[i];
            for j in 0..head_dim {
                cov[i * head_dim + j] += di * (f64::from(k[j]) - mean[j]) / n;
            }
        }
    }
    let (values, vectors) = symmetric_eigen(head_dim, cov);
    let mut order: Vec<usize> = (0..head_dim).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let directions = order[..rank]
        .iter()
        .flat_map(|&c| (0..head_dim).map(move |i| (c, i)))
        .map(|(c, i)| vectors[i * head_dim + c] as f32)
        .collect();
    Projection::Basis { directions, mean: mean.iter().map(|&m| m as f32).collect() }
}

/// Eigenvalues and eigenvectors (columns of the row-major result) of the symmetric `n × n`
/// matrix `a`, by cyclic Jacobi rotations.
fn symmetric_eigen(n: usize, mut a: Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    let mut v: Vec<f64> = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect();
    for _ in 0..JACOBI_SWEEPS {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j].powi(2))
            .sum();
        if off < 1e-22 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// Sweeps after which a 64 × 64 covariance is diagonal to rounding.
const JACOBI_SWEEPS: usize = 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jacobi_finds_the_eigenvectors_of_a_known_matrix() {
        // Q diag(5, 2, 1) Qᵀ for a rotation Q: the eigenvalues and the top direction come back.
        let (c, s) = (0.6f64, 0.8f64);
        let q = [c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0];
        let d = [5.0, 2.0, 1.0];
        let a: Vec<f64> = (0..9).map(|i| (0..3).map(|k| q[i / 3 * 3 + k] * d[k] * q[i % 3 * 3 + k]).sum()).collect();
        let (values, vectors) = symmetric_eigen(3, a);
        let top = (0..3).max_by(|&x, &y| values[x].total_cmp(&values[y])).unwrap();
        assert!((values[top] - 5.0).abs() < 1e-9, "{values:?}");
        let dir: Vec<f64> = (0..3).map(|i| vectors[i * 3 + top]).collect();
        assert!((dir[0].abs() - c).abs() < 1e-9 && (dir[1].abs() - s).abs() < 1e-9, "{dir:?}");
    }
}
