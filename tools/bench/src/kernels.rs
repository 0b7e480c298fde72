//! `hillside bench kernels`: one weight format's product kernel alone, as llama.cpp's
//! `test-quantize-perf --op vec_dot_q` times its `ggml_vec_dot_*` kernels: one token's
//! activations, quantized beforehand, against a matrix of `--values` weights (rows of
//! `--cols`), at the SIMD level in force, on the compute threads (`--threads 1` for the
//! single-core figure that `scripts/kernels-vs-llama.sh` sets beside llama.cpp's). The sizes
//! default to llama.cpp's L1, L2, L3 and memory sizes, so the kernel is timed with its weights in
//! each level of the hierarchy. The weights are random blocks (with finite scales): a kernel's
//! speed does not depend on the values. `--tokens N` times a prompt's product instead (N tokens
//! against the matrix, tiled as prefill tiles them), the kernel that bounds prefill.

use crate::report::{cpu_name, utc_now, write_json};
use anyhow::{bail, Result};
use clap::Args;
use hillside_engine::kernels::matrix::Matrix;
use hillside_engine::kernels::quant::{GgufBlockFormat, QuantizedActivations, BLOCK};
use hillside_engine::kernels::{simd_level, spin_pool::pool};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The formats, by the names ggml gives them.
const FORMATS: [(&str, GgufBlockFormat); 11] = [
    ("q4_0", GgufBlockFormat::Q4_0),
    ("q4_1", GgufBlockFormat::Q4_1),
    ("q5_0", GgufBlockFormat::Q5_0),
    ("q5_1", GgufBlockFormat::Q5_1),
    ("q8_0", GgufBlockFormat::Q8_0),
    ("q4_K", GgufBlockFormat::Q4K),
    ("q5_K", GgufBlockFormat::Q5K),
    ("q6_K", GgufBlockFormat::Q6K),
    ("iq4_nl", GgufBlockFormat::Iq4Nl),
    ("iq4_xs", GgufBlockFormat::Iq4Xs),
    ("mxfp4", GgufBlockFormat::Mxfp4),
];

#[derive(Args)]
pub struct KernelsArgs {
    /// Weight formats (ggml's names).
    #[arg(long, value_delimiter = ',', default_value = "q4_1,q5_0,q8_0,q4_K,q6_K")]
    pub formats: Vec<String>,
    /// Weights per matrix; the defaults are llama.cpp's L1, L2, L3 and memory sizes.
    #[arg(long, value_delimiter = ',', default_value = "4096,65536,655360,65536000")]
    pub values: Vec<usize>,
    /// Weights a row: whole blocks of every format asked for (K-quants take 256 values a
    /// block). Qwen2.5-0.5B's rows are 896 and 4,864 wide, SmolLM2-135M's 576 and 1,536.
    #[arg(long, default_value_t = 4096)]
    pub cols: usize,
    /// Tokens multiplied at once: 1 for decode's product, a prompt's length for prefill's.
    #[arg(long, default_value_t = 1)]
    pub tokens: usize,
    /// Time spent on each figure, of which the fastest fifth is kept.
    #[arg(long, default_value_t = 300)]
    pub ms: u64,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-kernels.json")]
    pub json: PathBuf,
}

#[derive(Serialize)]
struct Row {
    format: String,
    values: usize,
    rows: usize,
    cols: usize,
    /// Bytes the kernel streams: the weights as Hillside keeps them.
    weight_bytes: usize,
    tokens: usize,
    /// Per token: a prompt's product reads each weight once for all its tokens.
    ns_per_32_values: f64,
    weight_gb_per_s: f64,
    /// Weight-by-activation products a second, in billions (weights × tokens / s).
    giga_products_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    command: &'static str,
    date: String,
    cpu: String,
    simd: &'static str,
    threads: usize,
    rows: Vec<Row>,
}

pub fn kernels(args: &KernelsArgs) -> Result<()> {
    if args.cols == 0 || args.tokens == 0 {
        bail!("--cols and --tokens must be positive");
    }
    // Every format is checked against the width before anything is timed.
    let mut formats = Vec::new();
    for name in &args.formats {
        let Some(&(name, format)) = FORMATS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) else {
            let known: Vec<&str> = FORMATS.iter().map(|(n, _)| *n).collect();
            bail!("unknown format {name:?} (one of {})", known.join(", "));
        };
        if !args.cols.is_multiple_of(format.block_values()) {
            bail!("{name} takes rows of whole {}-value blocks; --cols {} is not one", format.block_values(), args.cols);
        }
        formats.push((name, format));
    }
    let mut rows = Vec::new();
    for (name, format) in formats {
        for &values in &args.values {
            let cols = args.cols;
            let n_rows = (values / cols).max(1);
            let raw = random_blocks(format, n_rows * cols, 0x5eed ^ values as u64);
            let matrix = Matrix::from_gguf_blocks(format, &raw, n_rows, cols).expect("whole blocks of a known size");
            drop(raw);
            let tokens = args.tokens;
            let x: Vec<f32> = (0..cols * tokens).map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0).collect();
            let mut quantized = QuantizedActivations::default();
            matrix.quantize_activations(&x, tokens, &mut quantized);
            let mut out = vec![0f32; n_rows * tokens];
            let seconds = fastest_fifth(Duration::from_millis(args.ms), || {
                matrix.product_of_quantized(&quantized, &mut out);
                std::hint::black_box(&out);
            });
            let total_values = n_rows * cols;
            rows.push(Row {
                format: name.to_string(),
                values: total_values,
                rows: n_rows,
                cols,
                weight_bytes: matrix.weight_bytes(),
                tokens,
                ns_per_32_values: seconds * 1e9 * BLOCK as f64 / (total_values * tokens) as f64,
                weight_gb_per_s: matrix.weight_bytes() as f64 / seconds / 1e9,
                giga_products_per_s: (total_values * tokens) as f64 / seconds / 1e9,
            });
        }
    }
    let report = Report {
        command: "kernels",
        date: utc_now(),
        cpu: cpu_name(),
        simd: simd_level().name(),
        threads: pool().threads(),
        rows,
    };
    println!(
        "hillside bench kernels · {} · {} · {} thread{} · {} (activations quantized beforehand)",
        report.cpu,
        report.simd,
        report.threads,
        if report.threads == 1 { "" } else { "s" },
        match args.tokens {
            1 => "one token's product".to_string(),
            n => format!("a {n}-token prompt's product"),
        }
    );
    println!();
    println!("| format | weights | matrix | MB | ns / 32 weights / token | GB/s | G products/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &report.rows {
        println!(
            "| {} | {} | {} × {} | {:.2} | {:.3} | {:.1} | {:.1} |",
            r.format,
            r.values,
            r.rows,
            r.cols,
            r.weight_bytes as f64 / 1e6,
            r.ns_per_32_values,
            r.weight_gb_per_s,
            r.giga_products_per_s
        );
    }
    write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// Seconds a call takes: calls are timed for `budget` (at least five), and the mean of the
/// fastest fifth is kept, so that an interruption by the OS does not count.
fn fastest_fifth(budget: Duration, mut call: impl FnMut()) -> f64 {
    call();
    let started = Instant::now();
    let mut times = Vec::new();
    while times.len() < 5 || started.elapsed() < budget {
        let t = Instant::now();
        call();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let kept = &times[..times.len().div_ceil(5)];
    kept.iter().sum::<f64>() / kept.len() as f64
}

/// `values` weights of `format` as the file stores them: random bytes, with every scale a
/// small finite f16 (random bits there could be infinities or NaN), and MXFP4's an exponent
/// near 2⁻⁶.
fn random_blocks(format: GgufBlockFormat, values: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let bytes = format.block_bytes();
    let mut raw: Vec<u8> = (0..values / format.block_values() * bytes).map(|_| next() as u8).collect();
    // Where each block's f16 scales lie (d, and the minimum or offset where there is one).
    let scale_offsets: &[usize] = match format {
        GgufBlockFormat::Q4_1 | GgufBlockFormat::Q5_1 | GgufBlockFormat::Q4K | GgufBlockFormat::Q5K => &[0, 2],
        GgufBlockFormat::Q6K => &[208],
        _ => &[0],
    };
    for block in raw.chunks_exact_mut(bytes) {
        if format == GgufBlockFormat::Mxfp4 {
            block[0] = 118 + (next() % 8) as u8;
            continue;
        }
        for &at in scale_offsets {
            let scale = half::f16::from_f32((next() % 1000 + 1) as f32 / 100_000.0);
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_give_finite_products_in_every_format() {
        for (name, format) in FORMATS {
            let (rows, cols) = (3, 512);
            let raw = random_blocks(format, rows * cols, 1);
            let w = Matrix::from_gguf_blocks(format, &raw, rows, cols).expect(name);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut row);
                assert!(row.iter().all(|v| v.is_finite()), "{name}: row {r} has a value that is not finite");
                assert!(row.iter().any(|&v| v != 0.0), "{name}: row {r} is all zeros");
            }
        }
    }

    #[test]
    fn the_fastest_fifth_of_the_calls_is_kept() {
        let mut calls = 0;
        let seconds = fastest_fifth(Duration::ZERO, || {
            calls += 1;
            // The first timed call (the second in all) is slow, as an interruption would be.
            std::thread::sleep(Duration::from_millis(if calls == 2 { 50 } else { 1 }));
        });
        assert_eq!(calls, 6, "one warm-up call and the five timed");
        assert!(seconds < 0.04, "the slow call was kept: {seconds} s");
    }
}
