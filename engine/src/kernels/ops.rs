//! Element-wise and per-row operations of the transformer block.
//!
//! They are plain loops written so the compiler vectorizes them (independent lanes, no
//! sequential float sums); [`multiversion`] compiles each a second time for x86-64-v3, so the
//! same source runs 8 lanes wide wherever the CPU has AVX2.

use super::parallel::{map_items, task_count};

/// Defines `fn $name(args) -> ret { body }` compiled twice: as is, and inside a function with
/// AVX2/FMA/F16C enabled that runs whenever the kernels' level has them. The body is an
/// `#[inline(always)]` function beside the AVX2 one, so it is always code-generated there (a
/// closure handed to a generic wrapper can land in another codegen unit and stay baseline).
macro_rules! multiversioned {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            fn v3($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::kernels::simd_level() != $crate::kernels::SimdLevel::Portable {
                // SAFETY: every level but Portable is x86-64-v3 or above, checked when chosen.
                return unsafe { v3($($arg),*) };
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversioned;

/// Lanes of the vectorizable reductions below (a multiple of every vector width in use).
const LANES: usize = 16;

/// Σ a·b with independent lane sums, so it vectorizes.
#[inline(always)]
pub(crate) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (xa, xb) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += xa[i] * xb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ x with independent lane sums, so it vectorizes.
#[inline(always)]
pub(crate) fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// max |x| with independent lane maxima, so it vectorizes.
#[inline(always)]
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(0f32, |a, v| a.max(v.abs()));
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i].abs() > acc[i] { c[i].abs() } else { acc[i] };
        }
    }
    acc.iter().fold(tail, |a, &v| a.max(v))
}

/// `x` rounded to the nearest integer, ties to even, for |x| < 2²²: added to 1.5·2²³, where a
/// float has no fraction bits left, and taken away again. (`f32::round_ties_even` is a libm
/// call unless the caller's target has SSE4.1: in baseline-compiled code such as the page votes
/// of the tiered store it cost more than the rest of [`exp_approx`], and kept loops from
/// vectorizing.)
#[inline(always)]
fn round_ties_even(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// e^x in straight-line float and integer arithmetic (2^n · e^r, |r| ≤ ln2/2, a degree-6
/// polynomial), so a loop of it vectorizes; relative error below 2e-7 over the float range.
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = round_ties_even(x * std::f32::consts::LOG2_E);
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut poly = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        poly = poly * r + c;
    }
    poly * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

multiversioned! {
    /// `out = x / rms(x) · weight` for each row of `x`.
    pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let dim = weight.len();
        for (row, dst) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let mean_square = dot_lanes(row, row) / dim as f32;
            let inv = 1.0 / (mean_square + eps).sqrt();
            for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
                *d = v * inv * w;
            }
        }
    }
}

multiversioned! {
    /// [`rms_norm`] in place: each row of `x` (rows of `weight.len()`) normalized and weighted.
    pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
        let dim = weight.len();
        for row in x.chunks_exact_mut(dim) {
            let mean_square = dot_lanes(row, row) / dim as f32;
            let inv = 1.0 / (mean_square + eps).sqrt();
            for (v, &w) in row.iter_mut().zip(weight) {
                *v = *v * inv * w;
            }
        }
    }
}

multiversioned! {
    /// Replaces each value with exp(value − max) and returns their sum.
    pub fn exp_shifted(row: &mut [f32], max: f32) -> f32 {
        row.iter_mut().for_each(|s| *s = exp_approx(*s - max));
        sum_lanes(row)
    }
}

/// SwiGLU in place: for rows laid out as `[gate (width) | up (width)]`, `silu(gate) · up` as
/// rows of `width` at the start of `gate_up`, returned (see [`gated_in_place`]).
pub fn swiglu_in_place(gate_up: &mut [f32], width: usize) -> &[f32] {
    gated_in_place(gate_up, width, swiglu_rows)
}

multiversioned! {
    fn swiglu_rows(gate_up: &mut [f32], width: usize) {
        for row in gate_up.chunks_exact_mut(2 * width) {
            let (gate, up) = row.split_at_mut(width);
            gate.iter_mut().zip(&*up).for_each(|(g, &u)| *g = *g / (1.0 + exp_approx(-*g)) * u);
        }
    }
}

/// gpt-oss's clamped SwiGLU in place, as [`swiglu_in_place`]: `g·σ(α·g) · (u + 1)` with
/// `g = min(gate, limit)` and `u = clamp(up, ±limit)` (α 1.702, limit 7: ggml's `swiglu_oai`).
pub fn swiglu_clamped_in_place(gate_up: &mut [f32], width: usize) -> &[f32] {
    gated_in_place(gate_up, width, swiglu_clamped_rows)
}

fn swiglu_clamped_rows(gate_up: &mut [f32], width: usize) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for row in gate_up.chunks_exact_mut(2 * width) {
        let (gate, up) = row.split_at_mut(width);
        for (g, &u) in gate.iter_mut().zip(&*up) {
            let x = g.min(LIMIT);
            *g = x / (1.0 + (-ALPHA * x).exp()) * (u.clamp(-LIMIT, LIMIT) + 1.0);
        }
    }
}

/// GeGLU in place, as [`swiglu_in_place`] with the tanh approximation of GELU on the gate:
/// `gelu(gate) · up` as rows of `width` at the start of `gate_up`, returned.
pub fn geglu_in_place(gate_up: &mut [f32], width: usize) -> &[f32] {
    gated_in_place(gate_up, width, geglu_rows)
}

multiversioned! {
    fn geglu_rows(gate_up: &mut [f32], width: usize) {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        for row in gate_up.chunks_exact_mut(2 * width) {
            let (gate, up) = row.split_at_mut(width);
            gate.iter_mut().zip(&*up).for_each(|(g, &u)| {
                let x = *g;
                // 0.5·x·(1 + tanh(y)) = x · σ(2y), one exponential.
                let y = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                *g = x / (1.0 + exp_approx(-2.0 * y)) * u;
            });
        }
    }
}

/// A gated activation in place: `gate_rows` puts each `[gate | up]` row's result in its gate
/// half, the rows spread over the compute threads (a prompt's would otherwise keep one core
/// busy while the others wait for the next product); then each result moves down to t·width,
/// in order, where only rows already moved lay, so the MLP needs no buffer of its own.
fn gated_in_place(gate_up: &mut [f32], width: usize, gate_rows: fn(&mut [f32], usize)) -> &[f32] {
    let n = gate_up.len() / (2 * width);
    let rows = &mut gate_up[..n * 2 * width];
    let tasks = task_count(n, GATED_ROWS_PER_TASK);
    if tasks > 1 {
        let runs: Vec<&mut [f32]> = rows.chunks_mut(n.div_ceil(tasks) * 2 * width).collect();
        map_items(runs, |run| gate_rows(run, width));
    } else {
        gate_rows(rows, width);
    }
    for t in 1..n {
        gate_up.copy_within(2 * t * width..(2 * t + 1) * width, t * width);
    }
    &gate_up[..n * width]
}

/// Rows a gated activation's task takes at least: fewer cost more to hand out than to compute.
const GATED_ROWS_PER_TASK: usize = 4;

multiversioned! {
    pub fn add_in_place(acc: &mut [f32], x: &[f32]) {
        acc.iter_mut().zip(x).for_each(|(a, b)| *a += b)
    }
}

pub fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_in_place_matches_the_formula_row_by_row() {
        let (n, width) = (5, 7);
        let gate_up: Vec<f32> = (0..n * 2 * width).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let expected: Vec<f32> = gate_up
            .chunks_exact(2 * width)
            .flat_map(|row| (0..width).map(move |i| row[i] / (1.0 + (-row[i]).exp()) * row[width + i]))
            .collect();
        let mut buf = gate_up.clone();
        for (got, want) in swiglu_in_place(&mut buf, width).iter().zip(&expected) {
            assert!((got - want).abs() <= 1e-6 * (1.0 + want.abs()), "{got} vs {want}");
        }
    }

    #[test]
    fn a_prompt_s_rows_gated_across_the_threads_are_each_row_s_alone() {
        // Enough rows for several tasks, with results moved down across the tasks' bounds.
        let (n, width) = (67, 24);
        let gate_up: Vec<f32> = (0..n * 2 * width).map(|i| (i as f32 * 0.23).sin() * 5.0).collect();
        type Gated = fn(&mut [f32], usize) -> &[f32];
        let gated: [Gated; 3] = [swiglu_in_place, geglu_in_place, swiglu_clamped_in_place];
        for gate in gated {
            let mut all = gate_up.clone();
            let together = gate(&mut all, width).to_vec();
            let alone: Vec<f32> =
                gate_up.chunks_exact(2 * width).flat_map(|row| gate(&mut row.to_vec(), width).to_vec()).collect();
            assert_eq!(together, alone);
        }
    }

    #[test]
    fn the_clamped_swiglu_clamps_the_gate_above_and_the_up_projection_both_ways() {
        let width = 4;
        let mut gate_up = vec![-2.0, 0.5, 9.0, 30.0, -20.0, 3.0, 8.0, -9.0];
        let silu = |x: f32| x / (1.0 + (-1.702 * x).exp());
        let expected = [silu(-2.0) * -6.0, silu(0.5) * 4.0, silu(7.0) * 8.0, silu(7.0) * -6.0];
        for (got, want) in swiglu_clamped_in_place(&mut gate_up, width).iter().zip(expected) {
            assert!((got - want).abs() <= 1e-6 * (1.0 + want.abs()), "{got} vs {want}");
        }
    }

    #[test]
    fn geglu_in_place_matches_the_tanh_formula() {
        let (n, width) = (3, 9);
        let gate_up: Vec<f32> = (0..n * 2 * width).map(|i| (i as f32 * 0.61).cos() * 4.0).collect();
        let gelu = |x: f32| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh());
        let expected: Vec<f32> = gate_up
            .chunks_exact(2 * width)
            .flat_map(|row| (0..width).map(move |i| gelu(row[i]) * row[width + i]))
            .collect();
        let mut buf = gate_up.clone();
        for (got, want) in geglu_in_place(&mut buf, width).iter().zip(&expected) {
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{got} vs {want}");
        }
    }

    #[test]
    fn rms_norm_in_place_is_rms_norm() {
        let x: Vec<f32> = (0..48).map(|i| (i as f32 * 0.3).sin()).collect();
        let w: Vec<f32> = (0..16).map(|i| 0.5 + i as f32 * 0.1).collect();
        let mut want = vec![0f32; x.len()];
        rms_norm(&x, &w, 1e-6, &mut want);
        let mut got = x.clone();
        rms_norm_in_place(&mut got, &w, 1e-6);
        assert_eq!(got, want);
    }

    #[test]
    fn exp_shifted_is_accurate_over_the_softmax_range() {
        // Through the loop the compiler vectorizes (x86-64-v3 where the CPU has it).
        let mut row: Vec<f32> = (0..2000).map(|i| -85.0 + i as f32 * 0.0437).collect();
        let want: Vec<f32> = row.iter().map(|x| (x - 1.5).exp()).collect();
        let sum = exp_shifted(&mut row, 1.5);
        for (i, (got, want)) in row.iter().zip(&want).enumerate() {
            assert!((got - want).abs() <= 2e-6 * want, "value {i}: {got} vs {want}");
        }
        assert!((sum - want.iter().sum::<f32>()).abs() <= 1e-5 * sum);
    }

    #[test]
    fn rounding_by_shifting_rounds_as_the_standard_library_does() {
        for i in -1000i32..=1000 {
            // Quarters, so that ties (halves) of both parities are among them.
            let x = i as f32 * 0.25 + [0.0, 1e-3, -1e-3][(i % 3).unsigned_abs() as usize];
            assert_eq!(round_ties_even(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn exp_is_accurate_over_the_softmax_range() {
        for i in 0..2000 {
            let x = -87.0 + i as f32 * 0.0874;
            let (got, want) = (exp_approx(x), x.exp());
            assert!((got - want).abs() <= 2e-6 * want, "exp({x}): {got} vs {want}");
        }
    }
}
