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

/// Checks what a low-bit key scoring kernel reads — a query row of `hd` values per KV head
/// (`hd` a multiple of `hd_multiple`), a score per head and token in `out`, and every token's
/// key rows and scales inside `data` and `scales` — and returns the bytes of one key row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_row_bytes(data: &[u8], scales: &[f32], n_kv: usize, hd: usize, hd_multiple: usize, int4: bool, query_len: usize, tokens: &[u32], out_len: usize) -> usize {
    let row_bytes = if int4 { hd / 2 } else { hd };
    assert!(hd.is_multiple_of(hd_multiple) && query_len == n_kv * hd && out_len == n_kv * tokens.len());
    assert!(tokens.iter().all(|&t| (t as usize + 1) * n_kv * row_bytes <= data.len() && (t as usize + 1) * n_kv <= scales.len()));
    row_bytes
}

/// `query`'s even and odd dimensions, each in order.
pub(crate) fn even_and_odd(query: &[f32]) -> (Vec<f32>, Vec<f32>) {
    query.chunks_exact(2).map(|pair| (pair[0], pair[1])).unzip()
}
