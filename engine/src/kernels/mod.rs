//! CPU kernels where the time goes: quantized matrix products, fused attention, the scoring of
//! low-bit keys, and the small element-wise ops around them. Each kernel has a portable version
//! and x86-64 versions for AVX-512 VNNI, AVX2 with AVX-VNNI, and plain AVX2 (x86-64-v3: AVX2,
//! FMA, F16C), picked at run time, so one release binary runs fast on any x86-64 (and on aarch64
//! through the portable path, written so the compiler can vectorize it).

pub mod attention;
pub mod huge_pages;
pub mod k_quant;
pub mod kv_q8;
pub mod matrix;
pub mod ops;
pub mod parallel;
pub mod quant;
pub mod rope;
pub mod spin_pool;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::sync::OnceLock;

/// The instruction-set level the kernels run at, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// AVX-512 F/BW/VL with VNNI int8 dot products, plus F16C and FMA.
    Avx512Vnni,
    /// x86-64-v3 with the VEX-encoded VNNI dot products (Alder Lake and later, Zen 5).
    AvxVnni,
    /// x86-64-v3: AVX2, FMA and F16C (most laptops; AMD before Zen 4).
    Avx2,
    Portable,
}

impl SimdLevel {
    pub const ALL: [SimdLevel; 4] = [Self::Avx512Vnni, Self::AvxVnni, Self::Avx2, Self::Portable];

    /// The name `HILLSIDE_SIMD` takes and reports show.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Vnni => "avx512",
            Self::AvxVnni => "avx-vnni",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        }
    }

    /// Whether this CPU can run the level's kernels.
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            let v3 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Self::Avx512Vnni => v3 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni"),
                Self::AvxVnni => v3 && has!("avxvnni"),
                Self::Avx2 => v3,
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }

    /// Every level this CPU runs, fastest first (tests check each against the portable one).
    pub fn supported() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.is_supported()).collect()
    }
}

/// Asks the CPU to start loading the cache lines `values` lie in, for reads soon after (a hint:
/// nothing where the target has no prefetch instruction).
#[inline(always)]
pub(crate) fn prefetch_lines<T>(values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for line in (values.as_ptr() as usize & !63..values.as_ptr_range().end as usize).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, wherever the address lies.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

/// The level in force: the fastest this CPU runs, or the one `HILLSIDE_SIMD`
/// (`avx512|avx-vnni|avx2|portable`) names, so any machine can test and time every path it has.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let (level, warning) = level_for(std::env::var("HILLSIDE_SIMD").ok().as_deref());
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
        }
        level
    })
}

/// The level `wanted` names, or the fastest one with a warning when this CPU lacks it or the
/// name is not a level.
fn level_for(wanted: Option<&str>) -> (SimdLevel, Option<String>) {
    let best = SimdLevel::supported()[0];
    let Some(wanted) = wanted else { return (best, None) };
    match SimdLevel::ALL.into_iter().find(|l| l.name() == wanted) {
        Some(level) if level.is_supported() => (level, None),
        Some(level) => {
            (best, Some(format!("HILLSIDE_SIMD={wanted}: this CPU lacks {}; using {}", level.name(), best.name())))
        }
        None => (
            best,
            Some(format!(
                "HILLSIDE_SIMD={wanted} is not a level (avx512, avx-vnni, avx2, portable); using {}",
                best.name()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{level_for, SimdLevel};

    #[test]
    fn hillside_simd_picks_a_level_the_cpu_has_and_warns_otherwise() {
        let best = SimdLevel::supported()[0];
        assert_eq!(level_for(None), (best, None));
        assert_eq!(level_for(Some("portable")), (SimdLevel::Portable, None));
        let (level, warning) = level_for(Some("avx3"));
        assert_eq!(level, best);
        assert!(warning.unwrap().contains("HILLSIDE_SIMD=avx3 is not a level"));
        // A level this CPU lacks falls back to the best it has, with a warning that says so.
        for missing in SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()) {
            let (level, warning) = level_for(Some(missing.name()));
            assert_eq!(level, best);
            assert!(warning.unwrap().contains("this CPU lacks"));
        }
    }
}
