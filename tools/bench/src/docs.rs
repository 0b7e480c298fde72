//! `hillside bench docs`: documents end to end — time to a summary (a document that fits the
//! context, and a book, with each KV store: its tokens read per second and peak RSS against a
//! bound that does not grow with the book), the chunk phase batched against the same chunks one
//! after another, and a follow-up question's time to first token without K/V reuse, with it
//! (in memory, as in the same run), and after a restart (from the kept file).

use crate::engines;
use crate::report::{cpu_name, peak_rss_mb};
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::engine_choice::EngineArgs;
use hillside_common::{load_engine, models, ModelArgs};
use hillside_documents::chunks::{cut, plan, Mode};
use hillside_documents::ingest::isolated::ProcessLimits;
use hillside_documents::kv_cache::{model_fingerprint, DocumentKvCache};
use hillside_documents::prompt::best_chunk;
use hillside_documents::questions::question;
use hillside_documents::sources::content_words;
use hillside_documents::summarize::{chunk_notes, fits_whole, summarize, NoCheckpoints, Runner, RESERVE_TOKENS};
use hillside_documents::{read_bytes, read_file, Document, DocumentService, DocumentsConfig, Limits};
use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::scheduler::SchedulerConfig;
use hillside_engine::{CancelFlag, ChatMessage, Engine, Event, GenerateParams, SamplingParams};
use hillside_front::{count_local_tokens, EngineFront};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct DocsBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// With `openai:URL`: only time to a summary of each document, here and on that engine
    /// (the same context and requests in flight), side by side.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// With --engine: the book's first this many bytes (a slice, so that both engines finish
    /// in minutes).
    #[arg(long, default_value_t = 60_000)]
    pub long_slice_bytes: usize,
    /// A document that fits the context, summarized in one pass and then asked about
    /// (default: the shared gpl-3.0.txt).
    #[arg(long)]
    pub whole: Option<PathBuf>,
    /// A book, far longer than the context, summarized hierarchically
    /// (default: the shared pride-and-prejudice.txt).
    #[arg(long)]
    pub long: Option<PathBuf>,
    /// The KV stores the book is summarized with, one run each.
    #[arg(long, value_delimiter = ',', default_value = "full,tiered")]
    pub book_stores: Vec<StoreKind>,
    /// Chunks of the long document run batched, then one after another.
    #[arg(long, default_value_t = 8)]
    pub chunks: usize,
    /// Contexts at which the chunk phase is timed (chunks are half the context) [default: 2048
    /// and the model's context].
    #[arg(long, value_delimiter = ',')]
    pub chunk_contexts: Vec<usize>,
    /// Sequences batched at once.
    #[arg(long, default_value_t = 4)]
    pub max_live: usize,
    /// Skip the book's summaries (they take many minutes).
    #[arg(long)]
    pub skip_long_summary: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench-docs.json")]
    pub json: PathBuf,
}

#[derive(Serialize)]
struct SummaryRun {
    name: String,
    tokens: usize,
    mode: &'static str,
    chunks: usize,
    seconds: f64,
    points: usize,
}

/// The book summarized with one KV store.
#[derive(Serialize)]
struct BookRun {
    store: StoreKind,
    #[serde(flatten)]
    summary: SummaryRun,
    /// The book's tokens over the time to its summary.
    tokens_read_per_s: f64,
    /// Peak RSS during this run alone.
    peak_rss_mb: f64,
    /// What it should stay within whatever the book's length: the model file, one batch of
    /// chunk sequences' full K/V, and a fixed margin.
    rss_bound_mb: f64,
}

/// Peak RSS may exceed the model and one batch of K/V by this much (runtime, tokenizer, text).
const RSS_MARGIN_MB: f64 = 512.0;

#[derive(Serialize)]
struct ChunkPhase {
    context: usize,
    chunks: usize,
    prompt_tokens: usize,
    generated_tokens: usize,
    /// Prompt and generated tokens of all the chunks.
    tokens: usize,
    batched_s: f64,
    sequential_s: f64,
    batched_tokens_per_s: f64,
    sequential_tokens_per_s: f64,
    speedup: f64,
}

#[derive(Serialize)]
struct FollowUp {
    question: String,
    prompt_tokens: usize,
    /// Of those, read from kept K/V (in memory, or from the file after a restart).
    reused_tokens_in_memory: usize,
    reused_tokens_after_restart: usize,
    /// Time to first token, from the question to the first token of the answer.
    without_reuse_ms: f64,
    in_memory_ms: f64,
    after_restart_ms: f64,
    kept_file_mb: f64,
    speedup_in_memory: f64,
    speedup_after_restart: f64,
}

/// How often a question goes to the chunk it was made from.
#[derive(Serialize)]
struct Routing {
    method: &'static str,
    context: usize,
    chunks: usize,
    questions: usize,
    recall_at_1: f64,
    us_per_question: f64,
}

#[derive(Serialize)]
struct Report {
    date: String,
    cpu: String,
    model: String,
    context: usize,
    kv_store: hillside_engine::kv::StoreKind,
    max_live: usize,
    whole: SummaryRun,
    follow_up: FollowUp,
    chunk_phase: Vec<ChunkPhase>,
    routing: Routing,
    book: Vec<BookRun>,
    peak_rss_mb: f64,
}

/// A scheduler for the benchmark, and the runner over it.
struct Bench<'a> {
    engine: &'a Arc<Engine>,
    model: &'a ModelArgs,
    context: usize,
}

impl Bench<'_> {
    fn config(&self, max_live: usize, cached_sequences: usize) -> SchedulerConfig {
        SchedulerConfig {
            cached_sequences,
            ..SchedulerConfig::own_work(self.model.kv_config(), Some(self.context), max_live)
        }
    }

    fn front(&self, max_live: usize, cached_sequences: usize) -> EngineFront {
        EngineFront::start_local(self.engine.clone(), self.config(max_live, cached_sequences))
    }

    fn runner<'s>(&self, front: &'s EngineFront, kv_cache: Option<&'s Arc<DocumentKvCache>>) -> Runner<'s> {
        Runner::new(front, Some(self.context), kv_cache)
    }

    fn summary(&self, runner: &Runner<'_>, doc: &Document) -> Result<SummaryRun> {
        let start = Instant::now();
        let summary = summarize(runner, doc, "bench", &mut NoCheckpoints, &CancelFlag::default(), &mut |_| {})?;
        let chunks = match &summary.plan.mode {
            Mode::Whole => 1,
            Mode::Hierarchical { chunks, .. } => chunks.len(),
        };
        let mode = summary.plan.mode.name();
        Ok(SummaryRun {
            name: doc.name.clone(),
            tokens: summary.plan.tokens,
            mode,
            chunks,
            seconds: start.elapsed().as_secs_f64(),
            points: summary.points.len(),
        })
    }
}

/// Starts this process's peak RSS afresh (Linux: `5` to `/proc/self/clear_refs`), so that each
/// run's own peak is read.
fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak RSS ({e}): the figures below include the runs before");
    }
}

/// Asks `q` about `doc`: time to the first token (ms), and the prompt and reused tokens.
fn first_token(runner: &Runner<'_>, doc: &Document, q: &str) -> Result<(f64, usize, usize)> {
    let start = Instant::now();
    let asked = question(runner, &[("bench".into(), doc.clone())], &[ChatMessage::new("user", q)])?;
    let params = GenerateParams { max_tokens: 16, sampling: SamplingParams::greedy(), ..GenerateParams::default() };
    let mut ttft = None;
    let done = runner.front.generate(asked.request, params, &CancelFlag::default(), &mut |event| {
        if matches!(event, Event::Text(_)) {
            ttft.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1e3);
        }
    })?;
    Ok((ttft.context("no text in the answer")?, done.prompt_tokens, done.reused_tokens))
}

pub fn docs(args: &DocsBenchArgs) -> Result<()> {
    let shared = crate::report::shared_document;
    let whole_path = args.whole.clone().unwrap_or_else(|| shared("gpl-3.0.txt"));
    let long_path = args.long.clone().unwrap_or_else(|| shared("pride-and-prejudice.txt"));
    let whole_doc = read_file(&whole_path, &Limits::default()).with_context(|| whole_path.display().to_string())?;
    let long_doc = read_file(&long_path, &Limits::default()).with_context(|| long_path.display().to_string())?;
    if let Some(remote) = args.engine.connect()? {
        let cut = long_doc.text.floor_char_boundary(args.long_slice_bytes.min(long_doc.text.len()));
        let slice =
            read_bytes(&format!("{}[..{cut}]", long_doc.name), &long_doc.text.as_bytes()[..cut], &Limits::default())?;
        return engines::compare(&args.model, &remote, &[whole_doc, slice], &args.json);
    }
    let model_path = models::resolve(args.model.model())?;
    let engine = Arc::new(load_engine(&args.model)?);
    let context =
        engine.model().kv_shape(args.model.context().unwrap_or(engine.model().config.context_tokens)).max_tokens;
    let bench = Bench { engine: &engine, model: &args.model, context };
    let count = |s: &str| count_local_tokens(&engine, s);
    if !fits_whole(count(&whole_doc.text), context) {
        bail!("{} does not fit a context of {context} tokens in one pass; pass a shorter --whole", whole_doc.name);
    }
    // Kept K/V on the disk the cold pool would use, not in a tmpfs.
    let dir = dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("hillside")
        .join(format!("bench-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let open_cache = |dir: &Path| -> Result<Arc<DocumentKvCache>> {
        let config = DocumentsConfig {
            dir: dir.to_path_buf(),
            kv_quota_bytes: u64::MAX,
            max_file_bytes: Limits::default().max_file_bytes,
            model_key: model_fingerprint(&model_path)?,
        };
        Ok(DocumentService::open(&config, ProcessLimits::default())?.kv)
    };
    let q = "Who is allowed to copy and distribute this document, and may they change it?";

    eprintln!("summarizing {} in one pass …", whole_doc.name);
    let (whole, in_memory) = {
        let cache = open_cache(&dir)?;
        let front = bench.front(args.max_live, 2);
        let runner = bench.runner(&front, Some(&cache));
        let whole = bench.summary(&runner, &whole_doc)?;
        (whole, first_token(&runner, &whole_doc, q)?)
    };
    eprintln!("asking without reuse, then after a restart …");
    let plain = first_token(&bench.runner(&bench.front(1, 0), None), &whole_doc, q)?;
    let (restarted, kept_bytes) = {
        let cache = open_cache(&dir)?; // as a new process opens it
        let front = bench.front(1, 0);
        let asked = first_token(&bench.runner(&front, Some(&cache)), &whole_doc, q)?;
        (asked, cache.usage().1)
    };
    std::fs::remove_dir_all(&dir).ok();
    let follow_up = FollowUp {
        question: q.into(),
        prompt_tokens: plain.1,
        reused_tokens_in_memory: in_memory.2,
        reused_tokens_after_restart: restarted.2,
        without_reuse_ms: plain.0,
        in_memory_ms: in_memory.0,
        after_restart_ms: restarted.0,
        kept_file_mb: kept_bytes as f64 / 1e6,
        speedup_in_memory: plain.0 / in_memory.0,
        speedup_after_restart: plain.0 / restarted.0,
    };

    let contexts =
        if args.chunk_contexts.is_empty() { vec![2048.min(context), context] } else { args.chunk_contexts.clone() };
    let mut chunk_phase = Vec::new();
    for chunk_context in contexts {
        let bench = Bench { context: chunk_context, ..bench };
        // The chunks a summary at this context reads (whether or not the whole would fit its levels).
        let chunks = cut(&long_doc, chunk_context / 2, &count);
        let some = &chunks[..args.chunks.min(chunks.len())];
        eprintln!(
            "the chunk phase at context {chunk_context}: {} chunks batched ({} at once), then one after another …",
            some.len(),
            args.max_live
        );
        let prompt_tokens: usize = some.iter().map(|c| count(&long_doc.text[c.clone()])).sum();
        let timed = |max_live: usize| -> Result<(f64, usize)> {
            let front = bench.front(max_live, 0);
            let start = Instant::now();
            let notes = chunk_notes(
                &bench.runner(&front, None),
                &long_doc,
                "bench",
                some,
                &CancelFlag::default(),
                &mut |_| {},
            )?;
            Ok((start.elapsed().as_secs_f64(), notes.iter().map(|n| count(n)).sum::<usize>()))
        };
        let (batched_s, generated_tokens) = timed(args.max_live)?;
        let (sequential_s, _) = timed(1)?;
        let tokens = prompt_tokens + generated_tokens;
        chunk_phase.push(ChunkPhase {
            context: chunk_context,
            chunks: some.len(),
            prompt_tokens,
            generated_tokens,
            tokens,
            batched_s,
            sequential_s,
            batched_tokens_per_s: tokens as f64 / batched_s,
            sequential_tokens_per_s: tokens as f64 / sequential_s,
            speedup: sequential_s / batched_s,
        });
    }
    let peak_so_far_mb = peak_rss_mb();
    let mut book = Vec::new();
    for &store in if args.skip_long_summary { &[][..] } else { &args.book_stores[..] } {
        eprintln!("summarizing all of {} with the {store:?} store …", long_doc.name);
        reset_peak_rss();
        let kv = KvConfig { store, ..args.model.kv_config() };
        let front = EngineFront::start_local(engine.clone(), SchedulerConfig { kv, ..bench.config(args.max_live, 0) });
        let summary = bench.summary(&bench.runner(&front, None), &long_doc)?;
        drop(front);
        let batch_kv_mb = (args.max_live * engine.model().kv_shape(context).bytes_per_token() * context) as f64 / 1e6;
        let model_mb = std::fs::metadata(&model_path).map_or(0, |m| m.len()) as f64 / 1e6;
        book.push(BookRun {
            store,
            tokens_read_per_s: summary.tokens as f64 / summary.seconds,
            peak_rss_mb: peak_rss_mb(),
            rss_bound_mb: model_mb + batch_kv_mb + RSS_MARGIN_MB,
            summary,
        });
    }

    let report = Report {
        date: crate::report::utc_now(),
        cpu: cpu_name(),
        model: model_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        context,
        kv_store: args.model.kv_config().store,
        max_live: args.max_live,
        whole,
        follow_up,
        chunk_phase,
        routing: routing(&long_doc, context, &count)?,
        book,
        peak_rss_mb: peak_so_far_mb.max(peak_rss_mb()),
    };
    print_table(&report);
    crate::report::write_json(&args.json, &report)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// Questions made of five content words of a sentence (a quarter, half and three quarters into
/// each chunk of `doc` at `context`), routed to a chunk lexically.
fn routing(doc: &Document, context: usize, count: &dyn Fn(&str) -> usize) -> Result<Routing> {
    let Mode::Hierarchical { chunks, .. } = plan(doc, context, RESERVE_TOKENS, count)?.mode else {
        bail!("{} fits a context of {context} tokens", doc.name);
    };
    let mut questions = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let text = &doc.text[chunk.clone()];
        for quarter in 1..4 {
            let at = text.floor_char_boundary(text.len() * quarter / 4);
            let sentence = text[at..].split_inclusive(['.', '?', '!']).nth(1).unwrap_or_default();
            let words: Vec<String> = content_words(sentence).take(5).collect();
            if words.len() == 5 {
                questions.push((i, format!("What does the book say about {}?", words.join(" "))));
            }
        }
    }
    let start = Instant::now();
    let hits = questions.iter().filter(|(i, q)| best_chunk(&doc.text, &chunks, q) == *i).count();
    let elapsed = start.elapsed().as_secs_f64();
    Ok(Routing {
        method: "lexical: the question's content words, weighted by inverse chunk frequency",
        context,
        chunks: chunks.len(),
        questions: questions.len(),
        recall_at_1: hits as f64 / questions.len().max(1) as f64,
        us_per_question: elapsed * 1e6 / questions.len().max(1) as f64,
    })
}

fn print_table(r: &Report) {
    println!(
        "{} on {}, context {}, {} store, {} sequences batched",
        r.model,
        r.cpu,
        r.context,
        serde_json::to_value(r.kv_store).unwrap_or_default().as_str().unwrap_or("?"),
        r.max_live
    );
    println!("{:<28} {:>9} {:>14} {:>9} {:>7}", "summary", "tokens", "mode", "seconds", "points");
    for s in std::iter::once(&r.whole).chain(r.book.iter().map(|b| &b.summary)) {
        let mode = if s.chunks > 1 { format!("{} ({})", s.mode, s.chunks) } else { s.mode.to_string() };
        println!("{:<28} {:>9} {:>14} {:>9.1} {:>7}", s.name, s.tokens, mode, s.seconds, s.points);
    }
    if !r.book.is_empty() {
        println!("{:<10} {:>12} {:>12} {:>14} {:>14}", "book store", "seconds", "tokens/s", "peak RSS MB", "bound MB");
        for b in &r.book {
            let store = serde_json::to_value(b.store).unwrap_or_default().as_str().unwrap_or("?").to_string();
            println!(
                "{:<10} {:>12.1} {:>12.0} {:>14.0} {:>14.0}",
                store, b.summary.seconds, b.tokens_read_per_s, b.peak_rss_mb, b.rss_bound_mb
            );
        }
    }
    println!(
        "{:<22} {:>7} {:>9} {:>10} {:>15} {:>15} {:>8}",
        "chunk phase", "chunks", "prompt", "generated", "batched", "one by one", "speedup"
    );
    for c in &r.chunk_phase {
        println!(
            "{:<22} {:>7} {:>9} {:>10} {:>6.1} s {:>4.0}/s {:>6.1} s {:>4.0}/s {:>7.2}x",
            format!("context {}", c.context),
            c.chunks,
            c.prompt_tokens,
            c.generated_tokens,
            c.batched_s,
            c.batched_tokens_per_s,
            c.sequential_s,
            c.sequential_tokens_per_s,
            c.speedup
        );
    }
    let g = &r.routing;
    println!(
        "routing at context {}: {} questions over {} chunks, recall@1 {:.2}, {:.0} µs each ({})",
        g.context, g.questions, g.chunks, g.recall_at_1, g.us_per_question, g.method
    );
    let f = &r.follow_up;
    println!("follow-up question ({} prompt tokens), time to first token:", f.prompt_tokens);
    println!("  without reuse          {:>8.0} ms", f.without_reuse_ms);
    println!(
        "  reused, in memory      {:>8.0} ms  ({:.0}x; {} tokens reused)",
        f.in_memory_ms, f.speedup_in_memory, f.reused_tokens_in_memory
    );
    println!(
        "  reused, after restart  {:>8.0} ms  ({:.0}x; {} tokens from a {:.0} MB file)",
        f.after_restart_ms, f.speedup_after_restart, f.reused_tokens_after_restart, f.kept_file_mb
    );
    println!("peak RSS {:.0} MB", r.peak_rss_mb);
}
