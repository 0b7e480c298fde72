//! How much DRAM a tiered store gets for its hot pool: what the β planner asks for with the
//! rates found at start-up, within a quarter of the full cache, and never below what the store's
//! fixed parts need.

use super::probe::KvStartup;
use super::KvConfig;
use crate::kv::stores::tiered::planner::Profile;
use crate::kv::stores::tiered::{budget_floor_bytes, pinned_rows_bytes, TieredSettings};
use crate::kv::KvShape;

impl KvConfig {
    /// The hot budget that holds β·M_s of the K/V in DRAM (M = the whole cache at `shape`'s
    /// length), plus the scoring keys and the write-back window, uncapped.
    pub fn budget_for_beta(&self, shape: KvShape, beta: f64) -> usize {
        let settings = self.tiered_settings_with_budget(shape, 0);
        let fixed = budget_floor_bytes(shape, &settings) - pinned_rows_bytes(shape, &settings);
        fixed + Profile::hot_share(beta, shape.max_tokens * shape.bytes_per_token())
    }

    fn tiered_settings_with_budget(&self, shape: KvShape, hot_budget_bytes: usize) -> TieredSettings {
        TieredSettings {
            alpha: self.alpha,
            hot_budget_bytes,
            sink_tokens: self.sink_tokens,
            recent_tokens: self.recent_tokens,
            dense_layers: self.dense_layers,
            key_bits: self.key_bits.bits_for(shape.head_dim),
            evaluator: self.evaluator,
            xrt: self.xrt_options(),
            guard_mass: self.guard_mass,
            placement: self.placement,
            cold_type: self.cold_type,
            selector: self.selector,
            sparf_dims: self.sparf_dims,
            spare_copy: self.spare_copy,
        }
    }

    /// The tiered store's settings for `shape`, its hot budget sized with the start-up profile.
    pub fn tiered_settings(&self, shape: KvShape) -> TieredSettings {
        self.tiered_settings_after(shape, &self.startup())
    }

    pub(super) fn tiered_settings_after(&self, shape: KvShape, startup: &KvStartup) -> TieredSettings {
        let mut settings = self.tiered_settings_with_budget(shape, 0);
        settings.hot_budget_bytes = self.hot_budget_bytes.unwrap_or_else(|| {
            let kv_bytes = shape.max_tokens * shape.bytes_per_token();
            let floor = budget_floor_bytes(shape, &settings);
            let quarter = kv_bytes / 4;
            if quarter < floor {
                return floor * 3 / 2;
            }
            // The β planner sizes the hot pool; the quarter of the cache is the DRAM cap.
            match startup.profiles.iter().find(|(bits, _)| *bits == settings.key_bits) {
                Some((_, profile)) => {
                    self.budget_for_beta(shape, profile.beta(f64::from(self.alpha))).clamp(floor, quarter)
                }
                None => quarter,
            }
        });
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvShape, StoreKind};
    use crate::score::{KeyBits, KeyPrecision};
    use std::sync::Arc;

    #[test]
    fn the_hot_budget_comes_from_the_profile_found_at_start_up() {
        let shape = KvShape { n_layers: 30, n_kv_heads: 3, head_dim: 64, max_tokens: 8192 };
        let scratch = tempfile::Builder::new().prefix("hillside-startup-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let config = KvConfig { store: StoreKind::Tiered, cold_dir: dir.clone(), ..KvConfig::default() };
        let with = |profiles: Vec<(KeyBits, Profile)>| {
            let startup = KvStartup { profiles, xrt_problem: None };
            KvConfig { startup: Some(Arc::new(startup)), ..config.clone() }.tiered_settings(shape).hot_budget_bytes
        };
        // A storage side far faster than the host asks for a small hot pool; a slow disk for the cap.
        let rates = |cold_read_bytes_per_s: f64| Profile {
            host_score_bytes_per_s: 1e9,
            storage_score_bytes_per_s: 100e9,
            hot_fetch_bytes_per_s: 10e9,
            cold_read_bytes_per_s,
        };
        let quarter = shape.max_tokens * shape.bytes_per_token() / 4;
        // 64-dim heads score from INT4 rows: the INT4 profile is the one that counts.
        let (fast, slow) = (with(vec![(KeyBits::Int4, rates(100e9))]), with(vec![(KeyBits::Int4, rates(0.1e9))]));
        assert!(fast < slow && slow == quarter, "fast disk {fast}, slow disk {slow}, cap {quarter}");
        assert_eq!(with(Vec::new()), quarter, "no profile: a quarter of the cache");
        assert_eq!(with(vec![(KeyBits::Int8, rates(100e9))]), quarter, "only another precision's profile");
        // Nothing was measured: the cold directory holds no profile.
        assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
        // Starting up measures once for each precision `auto` may pick, where the planner caches it.
        let started = config.clone().start_up();
        assert_eq!(started.startup.as_ref().unwrap().profiles.len(), 2);
        for bits in [KeyBits::Int4, KeyBits::Int8] {
            assert!(dir.join(format!("hillside-profile-{bits}.json")).exists());
        }
    }

    #[test]
    fn auto_scores_wide_heads_from_int8_rows() {
        let settings = |key_bits: KeyPrecision, head_dim: usize| {
            let shape = KvShape { n_layers: 4, n_kv_heads: 1, head_dim, max_tokens: 1024 };
            let config = KvConfig { key_bits, hot_budget_bytes: Some(1 << 30), ..KvConfig::default() };
            config.tiered_settings(shape).key_bits
        };
        assert_eq!(settings(KeyPrecision::Auto, 64), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Auto, 128), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Auto, 256), KeyBits::Int8);
        assert_eq!(settings(KeyPrecision::Int4, 256), KeyBits::Int4);
        assert_eq!(settings(KeyPrecision::Int8, 64), KeyBits::Int8);
    }
}
