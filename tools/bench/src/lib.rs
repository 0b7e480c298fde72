//! Hillside's lab, apart from the product as llama.cpp keeps `llama-bench`: benchmarks and the
//! fidelity evaluation. Each command measures one thing, prints a table and writes JSON through
//! one report writer ([`report`]); `docs/BENCHMARKS.md` says what each measures and its current
//! figures. It is a program of its own, `hillside-bench`, which the product does not link;
//! `hillside bench …` and `hillside eval …` run it.

mod decode;
mod docs;
mod engines;
pub mod eval;
pub mod fidelity;
mod harness;
mod ingest;
mod kernels;
mod kv;
mod prompt_cache;
mod recall;
pub mod report;
mod serve;
mod ui;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode speed (whole cache in memory unless --kv says otherwise), and the
    /// memory roofline.
    Decode(decode::DecodeArgs),
    /// One weight format's product kernel alone, one token at a time, with the weights in each
    /// level of the memory hierarchy (as llama.cpp's test-quantize-perf times its kernels).
    Kernels(kernels::KernelsArgs),
    /// Decode speed, cold-pool traffic and hot-pool hit rate of every KV store, plus a plot.
    Kv(kv::KvArgs),
    /// Smaller scoring copies of the keys (r of a head's dimensions, by PCA or by RoPE pairs):
    /// DRAM per token and recall of the exact top α, beside the store's full-rank copies.
    Recall(recall::RecallArgs),
    /// The OpenAI endpoint under load on loopback: requests/s, tokens/s, TTFT and inter-token
    /// latency at several numbers of concurrent clients.
    Serve(serve::ServeBenchArgs),
    /// Documents: time to a summary, the chunk phase batched against one after another, and a
    /// follow-up question's time to first token with and without K/V reuse.
    Docs(docs::DocsBenchArgs),
    /// Reading documents: each file in this process against the isolated reader, which reads
    /// every upload in a child process.
    Ingest(ingest::IngestBenchArgs),
    /// What the UI waits on: the page's files, and a chat's time to first token alone and while
    /// a document is summarized in the background.
    Ui(ui::UiBenchArgs),
}

/// Runs one of the benchmarks.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Decode(args) => decode::decode(&args),
        BenchCommand::Kernels(args) => kernels::kernels(&args),
        BenchCommand::Kv(args) => kv::kv(&args),
        BenchCommand::Recall(args) => recall::recall(&args),
        BenchCommand::Serve(args) => serve::serve(&args),
        BenchCommand::Docs(args) => docs::docs(&args),
        BenchCommand::Ingest(args) => ingest::ingest(&args),
        BenchCommand::Ui(args) => ui::ui(&args),
    }
}
