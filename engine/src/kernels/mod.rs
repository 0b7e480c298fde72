//! CPU kernels where the time goes: quantized matrix products, fused attention, and the small
//! element-wise ops around them. Each kernel has a portable version and, where it pays, an
//! AVX-512 VNNI version picked at run time, so one release binary runs on any x86-64 (and on
//! aarch64 through the portable path).

pub mod attention;
pub mod matrix;
pub mod ops;
pub mod parallel;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::sync::OnceLock;

/// The instruction-set level the kernels run at, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// AVX-512 F/BW/VL with VNNI int8 dot products and F16C conversions.
    Avx512Vnni,
    Portable,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Vnni => "avx512-vnni",
            Self::Portable => "portable",
        }
    }
}

/// The level in force; `HILLSIDE_SIMD=portable` forces the portable kernels (for comparisons).
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if std::env::var("HILLSIDE_SIMD").is_ok_and(|v| v == "portable") {
            return SimdLevel::Portable;
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    if std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512vnni")
        && std::is_x86_feature_detected!("f16c")
        && std::is_x86_feature_detected!("fma")
    {
        SimdLevel::Avx512Vnni
    } else {
        SimdLevel::Portable
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Portable
}
