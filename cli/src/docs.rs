//! `hillside summarize`, `hillside ask` and `hillside docs`: documents from the command line, on
//! the same library and kept K/V as `hillside serve` (one Hillside at a time holds the library).

use crate::local_front;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use hillside_common::engine_choice::EngineArgs;
use hillside_common::{local_model_key, models, DocumentsArgs, ModelArgs};
use hillside_documents::chunks::Mode;
use hillside_documents::ingest::isolated::ProcessLimits;
use hillside_documents::service::AskError;
use hillside_documents::sources::Source;
use hillside_documents::summarize::{DocumentSummary, Progress, Runner};
use hillside_documents::{Document, DocumentService, Locator};
use hillside_engine::{CancelFlag, ChatMessage, Event};
use hillside_front::EngineFront;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The library and its kept K/V for the model `model_key` names, and the key.
fn open(args: &DocumentsArgs, model_key: String) -> Result<(DocumentService, String)> {
    let config = args.config_for(model_key)?;
    let service = DocumentService::open(&config, ProcessLimits::default()).map_err(|e| match e.is_in_use() {
        true => anyhow::anyhow!("{e} (is another Hillside, such as `hillside serve`, using it?)"),
        false => e.into(),
    })?;
    Ok((service, config.model_key))
}

#[derive(Args)]
pub struct SummarizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub documents: DocumentsArgs,
    /// Files, or folders (every file in them); several go as one batch.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print the summaries as JSON (points with their sources) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct AskArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub documents: DocumentsArgs,
    /// A file, or the id of a document in the library.
    pub document: String,
    pub question: String,
    /// Most tokens in the answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
}

#[derive(Subcommand)]
pub enum DocsCommand {
    /// The documents in the library, the most recently used first.
    List {
        #[command(flatten)]
        documents: DocumentsArgs,
        /// The model (a registry name or a path) whose kept K/V is listed or removed.
        #[arg(long, short, env = "HILLSIDE_MODEL")]
        model: Option<String>,
    },
    /// Forget documents (and their kept K/V).
    Rm {
        #[command(flatten)]
        documents: DocumentsArgs,
        /// The model (a registry name or a path) whose kept K/V is listed or removed.
        #[arg(long, short, env = "HILLSIDE_MODEL")]
        model: Option<String>,
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// Every file named, folders expanded (their files in name order, hidden ones skipped).
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Adds the file at `path` (read in the sandboxed reader, as the server reads an upload): its id
/// and document.
fn add(service: &DocumentService, runner: &Runner<'_>, path: &Path) -> Result<(String, Document)> {
    let added = service.add_file(runner, path)?;
    Ok((added.entry.id, added.document))
}

pub fn summarize_files(args: &SummarizeArgs) -> Result<()> {
    let files = expand(&args.files)?;
    if files.is_empty() {
        bail!("no files to summarize");
    }
    with_runner(&args.model, &args.engine, &args.documents, |runner, service, model_key| {
        summarize_with(args, &files, runner, service, model_key)
    })
}

/// Runs `work` with a runner on the engine `engine` chooses (the local one loads `model`), the
/// documents, and the key their summaries are kept under.
fn with_runner<T>(
    model: &ModelArgs,
    engine: &EngineArgs,
    documents: &DocumentsArgs,
    work: impl FnOnce(&Runner<'_>, &DocumentService, &str) -> Result<T>,
) -> Result<T> {
    let remote = engine.connect()?;
    let model_key = match &remote {
        Some(remote) => format!("remote {} {}", remote.url(), remote.model()),
        None => local_model_key(&models::resolve(model.model())?)?,
    };
    // The library first: one in use by another Hillside is refused before a model loads.
    let (service, model_key) = open(documents, model_key)?;
    let front = match remote {
        Some(remote) => EngineFront::Remote(remote),
        None => local_front(model, 4, 0)?,
    };
    work(&Runner::new(&front, model.context(), Some(&service.kv)), &service, &model_key)
}

fn summarize_with(
    args: &SummarizeArgs,
    files: &[PathBuf],
    runner: &Runner<'_>,
    service: &DocumentService,
    model_key: &str,
) -> Result<()> {
    // Unreadable files are reported and skipped; the others go on.
    let mut docs = Vec::new();
    let mut failed = 0;
    for path in files {
        match add(service, runner, path) {
            Ok(doc) => docs.push(doc),
            Err(e) => {
                eprintln!("{}: {e:#}", path.display());
                failed += 1;
            }
        }
    }
    let bars = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:24!} {bar:30} {percent:>3}% {msg}").expect("valid template");
    // One thread per document: their requests reach the scheduler together, which batches them.
    let results: Vec<Result<DocumentSummary>> = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .iter()
            .map(|(id, doc)| {
                let bar = bars.add(ProgressBar::new(100).with_style(style.clone()).with_prefix(doc.name.clone()));
                scope.spawn(move || {
                    let mut prefilled: Vec<usize> = Vec::new();
                    let summary = service.summarize(runner, id, doc, model_key, &CancelFlag::default(), &mut |p| {
                        show(&bar, &mut prefilled, p)
                    });
                    bar.finish();
                    summary.map_err(anyhow::Error::from)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the summary thread panicked"))))
            .collect()
    });
    let mut out = std::io::stdout().lock();
    let mut all_json = Vec::new();
    for ((id, doc), result) in docs.iter().zip(results) {
        match result {
            Ok(summary) => {
                if args.json {
                    all_json.push(
                        serde_json::json!({"id": id, "name": doc.name, "plan": summary.plan, "points": summary.points}),
                    );
                    continue;
                }
                writeln!(out, "\n{} ({id})", doc.name)?;
                for point in &summary.points {
                    let cited: Vec<String> = point.sources.iter().map(|s| cite(&doc.text, s)).collect();
                    let cited = if cited.is_empty() { String::new() } else { format!(" [{}]", cited.join("; ")) };
                    writeln!(out, "- {}{cited}", point.text)?;
                }
            }
            Err(e) => {
                eprintln!("{}: {e:#}", doc.name);
                failed += 1;
            }
        }
    }
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&all_json)?)?;
    }
    if failed > 0 {
        bail!("{failed} of {} files could not be summarized", files.len());
    }
    Ok(())
}

/// Where a source is, as a reader finds it: its page or section, else its line.
fn cite(text: &str, source: &Source) -> String {
    match &source.locator {
        Some(Locator::Page(p)) => format!("p. {p}"),
        Some(Locator::Heading(h)) => format!("§ {h}"),
        None => format!("l. {}", text[..source.bytes.start].matches('\n').count() + 1),
    }
}

/// A progress event on `bar`: the plan first, then prefill % over every chunk, then the stages.
fn show(bar: &ProgressBar, prefilled: &mut Vec<usize>, progress: Progress) {
    match progress {
        Progress::Planned { plan } => {
            let mode = match &plan.mode {
                Mode::Whole => "whole text".to_string(),
                Mode::Hierarchical { chunks, levels } => {
                    format!("hierarchical: {} chunks, up to {levels} merge levels", chunks.len())
                }
            };
            // Said before any work, also where the bars are hidden (stderr is not a terminal).
            let line = format!("{}: {} tokens, {mode}", bar.prefix(), plan.tokens);
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            bar.set_length(plan.tokens.max(1) as u64);
            bar.set_message("reading");
        }
        Progress::Resumed { chunks_done, merges_done } => {
            bar.println(format!("{}: resumed, {chunks_done} chunks and {merges_done} merges kept", bar.prefix()))
        }
        Progress::Prefill { chunk, chunks, done_tokens, .. } => {
            prefilled.resize(chunks, 0);
            prefilled[chunk - 1] = done_tokens;
            bar.set_position(bar.position().max(prefilled.iter().sum::<usize>() as u64));
            bar.set_message(if chunks > 1 { format!("reading {chunks} chunks") } else { "reading".into() });
        }
        Progress::ChunkSummarized { done, chunks, tokens_read, eta_s, .. } => {
            bar.set_position(tokens_read as u64);
            bar.set_message(format!("summarized chunk {done}/{chunks}{}", left(eta_s)));
        }
        Progress::Merging { level, groups } => bar.set_message(format!("merging (level {level}, {groups} groups)")),
        Progress::Merged { level, done, groups, eta_s, .. } => {
            bar.set_message(format!("merged {done}/{groups} at level {level}{}", left(eta_s)))
        }
        // The points are printed, with their sources, once the summary is done.
        Progress::Writing { .. } => bar.set_message("writing the summary"),
        Progress::Done => bar.set_message("done"),
    }
}

/// ", about 3 min left", from an estimate in seconds.
fn left(eta_s: Option<f64>) -> String {
    match eta_s {
        Some(s) if s >= 90.0 => format!(", about {:.0} min left", s / 60.0),
        Some(s) => format!(", about {s:.0} s left"),
        None => String::new(),
    }
}

pub fn ask(args: &AskArgs) -> Result<()> {
    with_runner(&args.model, &args.engine, &args.documents, |runner, service, _| {
        let id = match Path::new(&args.document).exists() {
            true => add(service, runner, Path::new(&args.document))?.0,
            false => args.document.clone(),
        };
        let asked = match service.question(runner, &[id], &[ChatMessage::new("user", &args.question)]) {
            Err(AskError::Unknown { .. }) => {
                bail!("{} is neither a file nor a document id (see `hillside docs list`)", args.document)
            }
            asked => asked?,
        };
        if let Some(chunk) = asked.excerpts[0].chunk {
            eprintln!("(asking chunk {chunk} of {}: the one that best matches the question)", asked.excerpts[0].chunks);
        }
        let params = hillside_engine::GenerateParams {
            max_tokens: args.max_tokens,
            sampling: hillside_engine::SamplingParams { temperature: 0.0, ..Default::default() },
            ..Default::default()
        };
        let mut out = std::io::stdout().lock();
        let mut write_error = None;
        let stop = CancelFlag::default();
        let done = runner.front.generate(asked.request, params, &stop, &mut |event| {
            if let Event::Text(t) = event {
                if let Err(e) = write!(out, "{t}").and_then(|()| out.flush()) {
                    write_error = Some(e);
                    stop.cancel();
                }
            }
        });
        if let Some(e) = write_error {
            return Err(e.into());
        }
        let done = done?;
        writeln!(out)?;
        let reused = match runner.front.remote() {
            None => "from the document's kept K/V",
            Some(_) => "from the remote engine's prefix cache",
        };
        eprintln!(
            "({} prompt tokens, {} of them reused {reused}; first token after {:.0} ms)",
            done.prompt_tokens, done.reused_tokens, done.prefill_ms
        );
        Ok(())
    })
}

pub fn docs(command: &DocsCommand) -> Result<()> {
    let (documents, model) = match command {
        DocsCommand::List { documents, model } | DocsCommand::Rm { documents, model, .. } => (documents, model),
    };
    let model_path = models::resolve(model.as_deref().or(hillside_config::get().model.as_deref()))?;
    let (service, _) = open(documents, local_model_key(&model_path)?)?;
    match command {
        DocsCommand::List { .. } => {
            let entries = service.library.list()?;
            if entries.is_empty() {
                println!("no documents yet: `hillside summarize FILE` adds one");
                return Ok(());
            }
            println!("{:<16}  {:<32}  {:<8}  {:>9}  {:>10}  summary", "id", "name", "format", "tokens", "size");
            for e in entries {
                let format = serde_json::to_value(e.format)?.as_str().unwrap_or_default().to_string();
                let tokens = e.tokens.map_or("-".into(), |t| t.to_string());
                let summary = e.summary.as_ref().map_or("no".to_string(), |p| format!("{} points", p.len()));
                println!(
                    "{:<16}  {:<32}  {:<8}  {:>9}  {:>8}kB  {summary}",
                    e.id,
                    e.name,
                    format,
                    tokens,
                    e.size_bytes / 1000
                );
            }
            let (files, bytes) = service.kv.usage();
            println!("kept K/V: {files} files, {:.1} MB", bytes as f64 / 1e6);
        }
        DocsCommand::Rm { ids, .. } => {
            for id in ids {
                let Some(kv_files) = service.remove(id)? else {
                    bail!("no document {id} (see `hillside docs list`)");
                };
                println!("removed {id} ({kv_files} kept K/V files)");
            }
        }
    }
    Ok(())
}
