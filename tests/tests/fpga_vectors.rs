//! Test vectors for the FPGA scoring kernel's C simulation (`fpga/`, run by `make test`), made by
//! the Rust reference scorer (`hillside_engine::score::contract`). The committed files must be
//! exactly what the reference produces now; `HILLSIDE_WRITE_FPGA_VECTORS=1` rewrites them.
//!
//! File format (little-endian): "HSKV", then u32 version, bits, head_dim, n_heads, n_tokens,
//! block_tokens, first_position; the keys (each head's region padded to 64-byte words), the
//! scales (f32, `[head][token]`), the query (i8, `[head][head_dim]`), and the expected score
//! blocks: `[head][token]` (u32 position, f32 score) pairs.

mod common;

use common::rng::SplitMix64;
use hillside_engine::score::contract::{head_region_bytes, reference_scores, row_bytes, supports};
use hillside_engine::score::KeyBits;
use std::path::PathBuf;

/// Shapes covered: both precisions, both head sizes, one or several heads, lengths that are and
/// are not multiples of the block.
const CASES: &[(KeyBits, usize, usize, usize, usize)] = &[
    // (bits, head_dim, n_heads, n_tokens, block_tokens)
    (KeyBits::Int8, 64, 1, 1, 32),
    (KeyBits::Int8, 64, 3, 100, 32),
    (KeyBits::Int4, 64, 3, 100, 32),
    (KeyBits::Int4, 64, 1, 1000, 64),
    (KeyBits::Int8, 128, 2, 257, 32),
    (KeyBits::Int4, 128, 2, 77, 16),
    (KeyBits::Int4, 64, 3, 31, 32),
];

fn vector(case: usize) -> Vec<u8> {
    let (bits, head_dim, n_heads, n_tokens, block_tokens) = CASES[case];
    assert!(supports(bits, head_dim));
    let first_position = 1000 * case as u32;
    let mut rng = SplitMix64(case as u64 + 1);
    let (rb, region) = (row_bytes(bits, head_dim), head_region_bytes(bits, head_dim, n_tokens));
    let mut keys = vec![0u8; n_heads * region];
    for h in 0..n_heads {
        for t in 0..n_tokens {
            let row = &mut keys[h * region + t * rb..][..rb];
            match bits {
                KeyBits::Int8 => row.iter_mut().for_each(|b| *b = rng.level(127) as i8 as u8),
                KeyBits::Int4 => row.iter_mut().for_each(|b| {
                    let (lo, hi) = (rng.level(7) as u8 & 0x0f, rng.level(7) as u8 & 0x0f);
                    *b = lo | (hi << 4);
                }),
            }
        }
    }
    let scales: Vec<f32> = (0..n_heads * n_tokens).map(|_| (rng.next() % 1_000_000) as f32 / 7e6 + 1e-3).collect();
    let query: Vec<i8> = (0..n_heads * head_dim).map(|_| rng.level(127) as i8).collect();
    let expected = reference_scores(bits, head_dim, n_tokens, &keys, &scales, &query);

    let mut out = b"HSKV".to_vec();
    let bits_n: u32 = if bits == KeyBits::Int8 { 8 } else { 4 };
    for v in [1, bits_n, head_dim as u32, n_heads as u32, n_tokens as u32, block_tokens as u32, first_position] {
        out.extend(v.to_le_bytes());
    }
    out.extend(&keys);
    scales.iter().for_each(|s| out.extend(s.to_le_bytes()));
    out.extend(query.iter().map(|&q| q as u8));
    for (i, score) in expected.iter().enumerate() {
        out.extend((first_position + (i % n_tokens) as u32).to_le_bytes());
        out.extend(score.to_le_bytes());
    }
    out
}

#[test]
fn committed_fpga_vectors_match_the_reference_scorer() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fpga/testdata");
    let write = std::env::var_os("HILLSIDE_WRITE_FPGA_VECTORS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for case in 0..CASES.len() {
        let path = dir.join(format!("case-{case}.bin"));
        let want = vector(case);
        if write {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (HILLSIDE_WRITE_FPGA_VECTORS=1 writes it)", path.display()));
        assert!(have == want, "{} is stale: the reference scorer now produces other vectors (HILLSIDE_WRITE_FPGA_VECTORS=1 rewrites them)", path.display());
    }
}
