//! `hillside`: chat with a local model, generate text, serve it (the OpenAI-compatible API and
//! the web UI), manage models and documents; and hand over to the lab (`hillside-bench`) for
//! benchmarks and evaluation.

mod chat;
mod devices;
mod docs;
mod lab;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use hillside_common::{
    configure_allocator, engine_choice, init_logging, models, private_by_default, serve, GlobalArgs, ModelArgs,
    SamplingArgs,
};
use hillside_engine::scheduler::SchedulerConfig;
use hillside_front::EngineFront;
use std::sync::Arc;

/// The local engine `model` names, behind a scheduler for this program's own work: `max_live`
/// sequences at once, `cached_sequences` finished ones kept for the next request's prefix.
fn local_front(model: &ModelArgs, max_live: usize, cached_sequences: usize) -> Result<EngineFront> {
    let config =
        SchedulerConfig { cached_sequences, ..SchedulerConfig::own_work(model.kv_config(), model.context(), max_live) };
    Ok(EngineFront::start_local(Arc::new(hillside_common::load_engine(model)?), config))
}

fn main() {
    configure_allocator();
    private_by_default();
    init_logging();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[derive(Parser)]
#[command(name = "hillside", version, about = "A local LLM for long documents")]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Chat in the terminal (streams; /reset starts over, /exit or Ctrl-D quits).
    Chat(ChatArgs),
    /// Continue one prompt and exit.
    Generate(GenerateArgs),
    /// List, fetch, delete and locate models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// How faithful the sparse KV stores are to the full cache (perplexity, top-1 agreement,
    /// greedy continuations, passkeys): runs the lab, `hillside-bench eval`.
    #[command(disable_help_flag = true)]
    Eval {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Serve an OpenAI-compatible API on 127.0.0.1 (chat and text completions, streamed or not,
    /// and documents to summarize and ask about).
    Serve(serve::ServeArgs),
    /// Summarize documents (text, Markdown, HTML, PDF, DOCX, EPUB) with the sources of each
    /// point; several files, or a folder, go as one batch. Adds them to the library.
    Summarize(docs::SummarizeArgs),
    /// Ask a question about a document (a file, or a library id); its kept K/V is reused.
    Ask(docs::AskArgs),
    /// The document library.
    Docs {
        #[command(subcommand)]
        command: docs::DocsCommand,
    },
    /// Storage-side scoring hardware: XRT, SmartSSD cards, the kernel's xclbin, P2P.
    Devices(devices::DevicesArgs),
    /// Measure the engine, the stores, the server and the app: runs the lab, `hillside-bench`
    /// (`hillside bench --help` lists its benchmarks).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// The installed models, then those available to pull, each with whether it fits.
    List {
        /// Tokens of context the FITS column is for.
        #[arg(long, default_value_t = 8192)]
        context: usize,
    },
    /// Fetch a model: a registry name, or a Hugging Face repo with --file. An interrupted
    /// download goes on from where it stopped; the file counts as installed once its SHA-256 is
    /// checked.
    Pull {
        name: String,
        /// The file of the repository (a repo given as ORG/NAME).
        #[arg(long)]
        file: Option<String>,
        /// The SHA-256 the file must have, where the hub gives none.
        #[arg(long)]
        sha256: Option<String>,
    },
    /// Delete an installed model (and an unfinished download of it) from the models folder.
    Rm { name: String },
    /// Whether a model fits this machine's free memory at a context: its weights, its K/V and
    /// the program; or with the tiered store's cold pool on the disk. A model not yet
    /// downloaded is estimated from the catalogue.
    Fit {
        /// A catalogue name or a .gguf path (default: the default model).
        name: Option<String>,
        /// Tokens of context (default: the model's own length).
        #[arg(long)]
        context: Option<usize>,
        /// Print the estimate as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the path of an installed model (fetching the default if needed).
    Path { name: Option<String> },
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: engine_choice::EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt (a user message, unless --raw).
    #[arg(long, short)]
    pub prompt: String,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
}

fn run(cli: Cli) -> Result<()> {
    cli.global.apply()?;
    match cli.command {
        Command::Chat(args) => chat::chat(&args),
        Command::Generate(args) => chat::generate_once(&args),
        Command::Models { command } => match command {
            ModelsCommand::List { context } => {
                models::list(context);
                Ok(())
            }
            ModelsCommand::Pull { name, file, sha256 } => {
                println!("{}", models::pull(&name, file.as_deref(), sha256.as_deref())?.display());
                Ok(())
            }
            ModelsCommand::Rm { name } => {
                for path in models::remove(&name)? {
                    println!("deleted {}", path.display());
                }
                Ok(())
            }
            ModelsCommand::Fit { name, context, json } => {
                let (what, fit) = models::fit(name.as_deref(), context, &Default::default())?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&fit)?);
                } else {
                    println!("{what} at {} tokens of context:", fit.context_tokens);
                    println!("  weights      {:>8} MB", fit.weights_bytes.div_ceil(1_000_000));
                    println!("  K/V          {:>8} MB (full cache, f16)", fit.kv_bytes.div_ceil(1_000_000));
                    println!("  the program  {:>8} MB", fit.program_bytes / 1_000_000);
                    println!("{}", fit.sentence());
                }
                Ok(())
            }
            ModelsCommand::Path { name } => {
                println!("{}", models::resolve(name.as_deref())?.display());
                Ok(())
            }
        },
        Command::Eval { args } => lab::run(&cli.global, ["eval".into()].into_iter().chain(args).collect()),
        Command::Serve(args) => serve::serve(&args),
        Command::Summarize(args) => docs::summarize_files(&args),
        Command::Ask(args) => docs::ask(&args),
        Command::Docs { command } => docs::docs(&command),
        Command::Devices(args) => devices::devices(&args),
        Command::Bench { args } => lab::run(&cli.global, args),
    }
}
