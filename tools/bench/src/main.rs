//! `hillside-bench`: the lab's commands (which `hillside bench …` and `hillside eval …` run),
//! with the same global flags as `hillside`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use hillside_bench::BenchCommand;
use hillside_common::GlobalArgs;

#[derive(Parser)]
#[command(name = "hillside-bench", version, about = "Measure Hillside's engine, stores, server and app")]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
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
    cli.global.apply()?;
    match cli.command {
        Command::Bench(command) => hillside_bench::run(command),
        Command::Eval(args) => hillside_bench::eval::eval(&args),
    }
}
