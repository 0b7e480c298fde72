//! HillInfer's β planner (APP, eq. 4): how to split the KV cache between the hot pool and the
//! cold pool so that the host path (score the hot tokens, copy the selected ones) and the
//! storage path (score the cold tokens, read the selected ones) finish together.
//!
//! With M_c bytes of K/V hot and M_s cold, T_host = M_c/f_c + α·M_c/B_c and
//! T_storage = M_s/f_s + α·M_s/B_s; equal times give
//! β = M_c/M_s = B_c·f_c·(B_s + α·f_s) / (B_s·f_s·(B_c + α·f_c)), capped by the DRAM budget.
//! All rates are in bytes of full-precision K/V per second: an evaluator that scores a token
//! from a compact key copy covers that token's whole K/V row.

use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::kv::cold::staged::io_pool;
use crate::kv::cold::{ColdLayout, ColdPool, GROUP_TOKENS};
use crate::score::contract::DeviceQuery;
use crate::score::{KeyBits, ScoringKeys, StorageEvaluator};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The four rates of the latency model, measured on this machine and cold directory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// f_c: the host evaluator's scoring rate.
    pub host_score_bytes_per_s: f64,
    /// f_s: the storage evaluator's scoring rate.
    pub storage_score_bytes_per_s: f64,
    /// B_c: copying selected hot rows into the attention buffers.
    pub hot_fetch_bytes_per_s: f64,
    /// B_s: reading selected groups from the cold pool (random page-sized reads, many in flight).
    pub cold_read_bytes_per_s: f64,
}

impl Profile {
    /// β = M_c / M_s for retention ratio `alpha` (eq. 4, uncapped).
    pub fn beta(&self, alpha: f64) -> f64 {
        let (fc, fs, bc, bs) = (
            self.host_score_bytes_per_s,
            self.storage_score_bytes_per_s,
            self.hot_fetch_bytes_per_s,
            self.cold_read_bytes_per_s,
        );
        bc * fc * (bs + alpha * fs) / (bs * fs * (bc + alpha * fc))
    }

    /// Bytes of K/V the hot pool should hold out of `kv_bytes`, for a given β.
    pub fn hot_share(beta: f64, kv_bytes: usize) -> usize {
        (kv_bytes as f64 * beta / (1.0 + beta)) as usize
    }
}

/// K/V bytes of one token in one layer for the profiling shape (3 KV heads of 64 dims, as
/// the default model; rates per byte barely depend on it).
const PROFILE_HEADS: usize = 3;
const PROFILE_HEAD_DIM: usize = 64;
const PROFILE_TOKENS: usize = 32 * 1024;

/// The profile for `cold_dir`: from memory, else from `cold_dir/hillside-profile-<bits>.json`,
/// else measured (about a second) and saved there.
pub fn profile(cold_dir: &Path, key_bits: KeyBits) -> Result<Profile> {
    static CACHE: Mutex<Option<HashMap<PathBuf, Profile>>> = Mutex::new(None);
    let key = cold_dir.join(format!("hillside-profile-{key_bits}.json"));
    if let Some(p) = CACHE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(&key) {
        return Ok(*p);
    }
    // A link in its place is not read (nor written through: the new profile replaces it).
    let profile = match crate::private_files::read(&key).ok().and_then(|s| serde_json::from_slice(&s).ok()) {
        Some(p) => p,
        None => {
            let p = measure(cold_dir, key_bits)?;
            tracing::info!(?p, "profiled the tiered cache's rates");
            let json = serde_json::to_string_pretty(&p).unwrap_or_default();
            if let Err(e) = crate::private_files::replace(&key, json.as_bytes()) {
                tracing::warn!(path = %key.display(), error = %e, "could not cache the profile");
            }
            p
        }
    };
    CACHE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(key, profile);
    Ok(profile)
}

/// Runs `work` until at least `min` has passed; returns units done per second.
fn rate(min: Duration, mut work: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut units = 0;
    while start.elapsed() < min {
        units += work();
    }
    units as f64 / start.elapsed().as_secs_f64()
}

pub fn measure(cold_dir: &Path, key_bits: KeyBits) -> Result<Profile> {
    let (heads, hd, n) = (PROFILE_HEADS, PROFILE_HEAD_DIM, PROFILE_TOKENS);
    let row_bytes = 2 * 2 * heads * hd; // K and V, f16, one layer
    let window = Duration::from_millis(150);

    let mut keys = ScoringKeys::new(key_bits, heads, hd);
    keys.push(&(0..n * heads * hd).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect::<Vec<_>>());
    let query: Vec<f32> = (0..heads * hd).map(|i| (i % 7) as f32 - 3.0).collect();
    let query = Arc::new(DeviceQuery::new(&query, hd));
    let tokens: Vec<u32> = (0..n as u32).collect();
    let mut scores = vec![0f32; heads * n];
    let host = rate(window, || {
        query.score(&keys, &tokens, &mut scores);
        n * row_bytes
    });
    let keys = Arc::new(RwLock::new(keys));
    let evaluator = StorageEvaluator::new();
    let storage = rate(window, || {
        evaluator
            .score(keys.clone(), query.clone(), tokens.clone())
            .0
            .into_iter()
            .map(|b| b.tokens.len())
            .sum::<usize>()
            * row_bytes
    });

    // Hot fetch: gather a fifth of the rows, scattered, from a row store into a dense buffer.
    let rows: Vec<u16> = (0..n * heads * hd * 2).map(|i| i as u16).collect();
    let mut dst = vec![0u16; n * heads * hd * 2];
    let picks: Vec<usize> = (0..n / 5).map(|i| (i * 7919) % n).collect();
    let hot = rate(window, || {
        let w = heads * hd * 2;
        for (slot, &t) in picks.iter().enumerate() {
            dst[slot * w..][..w].copy_from_slice(&rows[t * w..][..w]);
        }
        std::hint::black_box(&dst);
        picks.len() * row_bytes
    });

    // Cold reads: single-group random reads with the I/O pool's queue depth, as a selection
    // of scattered tokens issues them.
    let groups = 8 * 1024; // 32 MiB: quick to write, small enough for a nearly full disk
    let layout = ColdLayout::f16(1, 1, PROFILE_HEAD_DIM, groups);
    let pool = ColdPool::create(cold_dir, layout)?;
    let page = pool.buffer(1);
    for g in 0..groups {
        pool.write_group(0, 0, g, &page)?;
    }
    let gb = layout.group_bytes();
    let batch = 256;
    let mut staging = AlignedBuf::zeroed(batch * gb);
    let mut next = 0usize;
    let mut failure = None;
    let cold_groups_per_s = rate(window * 2, || {
        let targets: Vec<usize> = (0..batch).map(|i| ((next + i) * 104_729) % groups).collect();
        next += batch;
        let pool = &pool;
        let reads: Vec<(usize, &mut [u8])> = targets.into_iter().zip(staging.as_bytes_mut().chunks_mut(gb)).collect();
        let done = io_pool().install(|| {
            use rayon::prelude::*;
            reads.into_par_iter().try_for_each(|(g, dst)| pool.read_groups(0, 0, g, 1, dst))
        });
        match done {
            Ok(()) => batch,
            Err(e) => {
                failure.get_or_insert(e);
                0
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    // A group holds K and V of GROUP_TOKENS tokens of one head: bytes of K/V it delivers.
    let cold = cold_groups_per_s * (GROUP_TOKENS * 2 * 2 * PROFILE_HEAD_DIM) as f64;
    Ok(Profile {
        host_score_bytes_per_s: host,
        storage_score_bytes_per_s: storage,
        hot_fetch_bytes_per_s: hot,
        cold_read_bytes_per_s: cold,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beta_balances_the_two_paths() {
        let p = Profile {
            host_score_bytes_per_s: 20e9,
            storage_score_bytes_per_s: 5e9,
            hot_fetch_bytes_per_s: 10e9,
            cold_read_bytes_per_s: 1e9,
        };
        let alpha = 0.2;
        let beta = p.beta(alpha);
        // With M_c = β·M_s the two sides of eq. 2 are equal.
        let m_s = 1.0;
        let m_c = beta * m_s;
        let t_host = m_c / p.host_score_bytes_per_s + alpha * m_c / p.hot_fetch_bytes_per_s;
        let t_storage = m_s / p.storage_score_bytes_per_s + alpha * m_s / p.cold_read_bytes_per_s;
        assert!((t_host / t_storage - 1.0).abs() < 1e-9, "{t_host} vs {t_storage}");
        assert_eq!(Profile::hot_share(1.0, 1000), 500);
    }

    #[test]
    fn profiling_measures_positive_rates_and_caches_them() {
        let scratch = tempfile::Builder::new().prefix("hillside-profile-test-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let p = profile(&dir, KeyBits::Int4).unwrap();
        for r in
            [p.host_score_bytes_per_s, p.storage_score_bytes_per_s, p.hot_fetch_bytes_per_s, p.cold_read_bytes_per_s]
        {
            assert!(r.is_finite() && r > 0.0, "{p:?}");
        }
        assert!(dir.join("hillside-profile-int4.json").exists());
        assert_eq!(profile(&dir, KeyBits::Int4).unwrap(), p);
        let leftovers = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".cold"))
            .count();
        assert_eq!(leftovers, 0, "the profiling pool file is removed");
    }
}
