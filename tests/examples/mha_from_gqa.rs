//! Writes a copy of a grouped-query-attention GGUF model as multi-head attention (see
//! `tests/common/mha.rs`), for measuring the X-cache on real weights (`docs/BENCHMARKS.md`).
//!
//!     cargo run --release -p hillside-tests --example mha_from_gqa -- IN.gguf OUT.gguf

#[path = "../tests/common/mha.rs"]
mod mha;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, output] = &args[..] else {
        return Err("usage: mha_from_gqa IN.gguf OUT.gguf".into());
    };
    let (before, after) = mha::write_mha_copy(input.as_ref(), output.as_ref())?;
    eprintln!("{output}: {after} KV heads (was {before})");
    Ok(())
}
