//! x86-64 kernels: AVX-512 VNNI ([`avx512`]) and x86-64-v3, with or without AVX-VNNI
//! ([`avx2`]); the quantized products' one-token kernels in [`avx2`] and [`k_quant`], a prompt's
//! tiles in [`uq_groups`] and [`k_quant`], each built for every level's dot product. Callers
//! check [`super::simd_level`] first; every function here is `unsafe` only because it needs its
//! CPU features, and reads only inside the slices it is given (bounds are asserted before the raw
//! loops).

pub mod avx2;
pub mod avx512;
pub mod k_quant;
pub mod uq_groups;

use super::quant::QuantBits;
use half::f16;
use std::arch::x86_64::*;

/// `rows` split into consecutive blocks of at most `max` rows, as near equal as they can be
/// (14 rows at most 6 a block are 5 + 5 + 4, not 6 + 6 + 2: a short block wastes registers).
pub(crate) fn row_blocks(rows: usize, max: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let blocks = rows.div_ceil(max);
    let (base, extra) = (rows / blocks.max(1), rows % blocks.max(1));
    (0..blocks).scan(0, move |start, b| {
        let len = base + usize::from(b < extra);
        *start += len;
        Some(*start - len..*start)
    })
}

/// Expands to a `match` that calls `$f::<R>` (or `$f::<R, C>`) for a row count of 1 to 12.
macro_rules! dispatch_rows {
    ($rows:expr, $f:ident::<R $(, $c:literal)?>($($arg:expr),*)) => {
        match $rows {
            1 => $f::<1 $(, $c)?>($($arg),*),
            2 => $f::<2 $(, $c)?>($($arg),*),
            3 => $f::<3 $(, $c)?>($($arg),*),
            4 => $f::<4 $(, $c)?>($($arg),*),
            5 => $f::<5 $(, $c)?>($($arg),*),
            6 => $f::<6 $(, $c)?>($($arg),*),
            7 => $f::<7 $(, $c)?>($($arg),*),
            8 => $f::<8 $(, $c)?>($($arg),*),
            9 => $f::<9 $(, $c)?>($($arg),*),
            10 => $f::<10 $(, $c)?>($($arg),*),
            11 => $f::<11 $(, $c)?>($($arg),*),
            12 => $f::<12 $(, $c)?>($($arg),*),
            r => unreachable!("a block of {r} rows has no kernel"),
        }
    };
}
pub(crate) use dispatch_rows;

/// The weight format a kernel instance takes as its `BITS` (a [`QuantBits`] as `u8`).
#[inline(always)]
pub(crate) const fn format_of(bits: u8) -> QuantBits {
    if bits == QuantBits::Four as u8 {
        QuantBits::Four
    } else if bits == QuantBits::Five as u8 {
        QuantBits::Five
    } else if bits == QuantBits::FourTable as u8 {
        QuantBits::FourTable
    } else {
        QuantBits::Eight
    }
}

/// How far ahead of its loads a one-token product asks for the weights: it streams them once,
/// and one core's loads alone leave the memory's bandwidth idle while each waits.
const PREFETCH_BYTES: usize = 4096;

/// Asks for the cache lines `PREFETCH_BYTES` past bytes `from..from + len` of a weight row
/// (past the row's end lie the next rows').
#[inline(always)]
pub(crate) fn prefetch_ahead(row: *const u8, from: usize, len: usize) {
    for line in (0..len).step_by(64) {
        // SAFETY: a prefetch never faults, wherever the address lies.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(from + PREFETCH_BYTES + line).cast()) };
    }
}

/// Asks the L2 for the part of the next pass that matches bytes `from..from + len` of this
/// pass's rows. A pass's `rows` rows lie one after another from `first_row`, so the next pass is
/// one region of `rows · row_bytes` bytes, walked here in step with this pass's super-blocks: one
/// sequential stream a pass ahead, where requests a few KiB ahead in each row made four streams
/// that Zen 4 read from memory at half the rate. Into the L2 rather than the L1: a pass of wide
/// Q6_K rows (17 KiB) ahead of the one being read would push it out of a 32 KiB L1.
#[inline(always)]
pub(crate) fn prefetch_next_pass(first_row: *const u8, from: usize, len: usize, row_bytes: usize, rows: usize) {
    let next = first_row.wrapping_add(rows * row_bytes + rows * from);
    for line in (0..rows * len).step_by(64) {
        // SAFETY: a prefetch never faults, wherever the address lies.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(line).cast()) };
    }
}

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
pub(crate) fn key_row_bytes(
    data: &[u8],
    scales: &[f32],
    n_kv: usize,
    hd: usize,
    hd_multiple: usize,
    int4: bool,
    query_len: usize,
    tokens: &[u32],
    out_len: usize,
) -> usize {
    let row_bytes = if int4 { hd / 2 } else { hd };
    assert!(hd.is_multiple_of(hd_multiple) && query_len == n_kv * hd && out_len == n_kv * tokens.len());
    assert!(tokens
        .iter()
        .all(|&t| (t as usize + 1) * n_kv * row_bytes <= data.len() && (t as usize + 1) * n_kv <= scales.len()));
    row_bytes
}

/// `query`'s even and odd dimensions, each in order.
pub(crate) fn even_and_odd(query: &[f32]) -> (Vec<f32>, Vec<f32>) {
    query.chunks_exact(2).map(|pair| (pair[0], pair[1])).unzip()
}

#[cfg(test)]
mod tests {
    use super::row_blocks;

    #[test]
    fn row_blocks_cover_every_row_in_near_equal_blocks() {
        let blocks = |rows, max| row_blocks(rows, max).map(|b| b.len()).collect::<Vec<_>>();
        assert_eq!(blocks(14, 6), [5, 5, 4]);
        assert_eq!(blocks(12, 6), [6, 6]);
        assert_eq!(blocks(3, 8), [3]);
        assert_eq!(blocks(0, 6), Vec::<usize>::new());
        for rows in 1..40 {
            let all: Vec<_> = row_blocks(rows, 6).collect();
            assert_eq!(all.first().unwrap().start, 0);
            assert_eq!(all.last().unwrap().end, rows);
            assert!(all.windows(2).all(|w| w[0].end == w[1].start));
            assert!(all.iter().all(|b| (1..=6).contains(&b.len())));
        }
    }
}
