//! x86-64 kernels: AVX-512 VNNI ([`avx512`]) and x86-64-v3, with or without AVX-VNNI
//! ([`avx2`]). Callers check [`super::simd_level`] first; every function here is `unsafe` only
//! because it needs its CPU features, and reads only inside the slices it is given (bounds are
//! asserted before the raw loops).

pub mod avx2;
pub mod avx512;

use half::f16;
use std::arch::x86_64::*;

/// Query-group sizes (query heads per KV head) with a register-resident attention kernel.
pub fn supports_group(group: usize) -> bool {
    (1..=8).contains(&group)
}

/// Expands to a `match` that calls `$f::<G>` for group sizes 1 to 8.
macro_rules! dispatch_group {
    ($group:expr, $f:ident::<G>($($arg:expr),*)) => {
        match $group {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            4 => $f::<4>($($arg),*),
            5 => $f::<5>($($arg),*),
            6 => $f::<6>($($arg),*),
            7 => $f::<7>($($arg),*),
            8 => $f::<8>($($arg),*),
            g => unreachable!("group size {g} has no SIMD kernel"),
        }
    };
}
pub(crate) use dispatch_group;

/// One f16 as f32, by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn f16_value(v: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(v.to_bits()))))
}
