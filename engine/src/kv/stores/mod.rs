//! The stores a sequence can be given, one file or folder each: what the user picks with `--kv`
//! (full, tiered, and the windowed layers' rings beside either), and the comparison stores the
//! benchmarks measure the tiered store against (drop, offload, near-storage, X-cache).

pub mod drop;
pub mod full;
pub mod near_storage;
pub mod offload;
pub mod sliding;
pub mod tiered;
pub mod x_cache;
