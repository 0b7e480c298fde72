//! `hillside-bench`: the lab's commands on their own (as `hillside bench …` and `hillside eval …`
//! run them), with the same global flags as `hillside`.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use hillside_bench::BenchCommand;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "hillside-bench", version, about = "Measure Hillside's engine, stores, server and app")]
struct Cli {
    /// Compute threads (default: all cores).
    #[arg(long, global = true, env = "HILLSIDE_THREADS")]
    threads: Option<usize>,
    /// Config file [default: ~/.config/hillside/config.toml, if it exists].
    #[arg(long, global = true, env = "HILLSIDE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Bench(BenchCommand),
    /// How faithful the sparse KV stores are to the full cache (perplexity, top-1 agreement).
    Eval(hillside_bench::eval::EvalArgs),
}

fn main() {
    hillside_common::configure_allocator();
    hillside_common::init_logging();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let file = hillside_common::config::load(cli.config.as_deref())?;
    if let Some(threads) = cli.threads.or(file.threads) {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().context("setting the thread count")?;
    }
    match cli.command {
        Command::Bench(command) => hillside_bench::run(command),
        Command::Eval(args) => hillside_bench::eval::eval(&args),
    }
}
