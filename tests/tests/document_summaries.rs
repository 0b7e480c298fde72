//! Document summaries on the real model, through the real scheduler: the GPL's opening sections in one pass with
//! sources that check out, and a hierarchical summary whose chunks run as one batch.

mod common;

use hillside_documents::chunks::Mode;
use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::library::Library;
use hillside_documents::questions::question;
use hillside_documents::sources::content_words;
use hillside_documents::summarize::{summarize, NoCheckpoints, Progress, Runner};
use hillside_documents::{read_bytes, Limits};
use hillside_engine::kv::KvConfig;
use hillside_engine::scheduler::{SchedulerConfig, Update};
use hillside_engine::{CancelFlag, ChatMessage, Engine, GenerateParams};
use hillside_front::EngineFront;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn local(engine: &Arc<Engine>, context: usize) -> EngineFront {
    let config = SchedulerConfig::own_work(KvConfig::default(), Some(context), 4);
    EngineFront::start_local(engine.clone(), config)
}

fn runner(front: &EngineFront, context_tokens: usize) -> Runner<'_> {
    Runner { front, context_tokens, kv_cache: None }
}

#[test]
fn the_gpl_is_summarized_in_one_pass_with_sources_holding_each_points_words() {
    let engine = Arc::new(Engine::load(&common::model_path()).unwrap());
    // Its preamble and first five sections, about 2,300 tokens.
    let doc = read_bytes("gpl-3.0.txt", common::gpl_before_section(5).as_bytes(), &Limits::default()).unwrap();
    let front = local(&engine, 4096);
    let mut progress = Vec::new();
    let summary = summarize(&runner(&front, 4096), &doc, "doc", &mut NoCheckpoints, &CancelFlag::default(), &mut |p| {
        progress.push(p)
    })
    .unwrap();
    eprintln!("{} tokens; points:", summary.plan.tokens);
    for p in &summary.points {
        eprintln!("- {} ({} sources)", p.text, p.sources.len());
    }
    assert_eq!(summary.plan.mode, Mode::Whole);
    assert!(
        matches!(progress.first(), Some(Progress::Planned { .. })) && progress.last() == Some(&Progress::Done),
        "{progress:?}"
    );
    assert!(summary.points.len() >= 2, "{:?}", summary.points);
    // The text was streamed as it was written, and the points are made of it.
    let written: String = progress
        .iter()
        .filter_map(|p| if let Progress::Writing { text } = p { Some(text.as_str()) } else { None })
        .collect();
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(summary.points.iter().all(|p| squeeze(&written).contains(&squeeze(&p.text))), "{written}");
    // A point the text does not hold gets no source (a 135M model says such things); the
    // others must show the passages they come from.
    assert!(summary.points.iter().any(|p| !p.sources.is_empty()), "{:?}", summary.points);
    for point in &summary.points {
        if point.sources.is_empty() {
            continue;
        }
        // The passages hold the words the point is built from: half of them, or of one of its
        // sentences (a point written as a paragraph is traced sentence by sentence).
        let spans: HashSet<String> =
            point.sources.iter().flat_map(|s| content_words(&doc.text[s.bytes.clone()]).collect::<Vec<_>>()).collect();
        let half_held = |text: &str| {
            let words: HashSet<String> = content_words(text).collect();
            !words.is_empty() && 2 * words.iter().filter(|w| spans.contains(*w)).count() >= words.len()
        };
        assert!(
            half_held(&point.text) || point.text.split_inclusive(['.', '?', '!']).any(half_held),
            "{:?}: its sources hold too few of its words",
            point.text
        );
    }
}

#[test]
fn a_long_text_is_summarized_in_chunks_batched_then_merged_with_progress_in_order() {
    let engine = Arc::new(Engine::load(&common::model_path()).unwrap());
    let text = common::shared_document("pride-and-prejudice.txt");
    // About 4,800 tokens into a 2,048-token context: five chunks of at most 1,024 tokens, whose
    // notes with their evidence may take two levels of merges.
    let start = text.find("It is a truth universally acknowledged").unwrap();
    let doc = read_bytes("pride.txt", &text.as_bytes()[start..start + 21_000], &Limits::default()).unwrap();
    let front = local(&engine, 2048);
    let scheduler = front.local().expect("the local engine").1;
    let scratch = tempfile::Builder::new().prefix("hillside-chunks-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let library = Arc::new(Library::open(&dir.join("library.redb")).unwrap());
    let cache = DocumentKvCache::open(library, &dir.join("kv"), 1 << 30, "smollm2-test").unwrap();
    let runner = Runner { kv_cache: Some(&cache), ..runner(&front, 2048) };
    let mut progress = Vec::new();
    let summary =
        summarize(&runner, &doc, "doc", &mut NoCheckpoints, &CancelFlag::default(), &mut |p| progress.push(p)).unwrap();
    let Mode::Hierarchical { chunks, levels } = &summary.plan.mode else { panic!("{:?}", summary.plan) };
    assert!(chunks.len() >= 4 && *levels >= 2, "{} chunks, {levels} levels planned", chunks.len());
    // Planned, then every chunk's prefill and summary, then the merges, then done.
    let stage = |p: &Progress| match p {
        Progress::Planned { .. } => 0,
        Progress::Resumed { .. } | Progress::Prefill { .. } | Progress::ChunkSummarized { .. } => 1,
        Progress::Merging { .. } | Progress::Merged { .. } | Progress::Writing { .. } => 2,
        Progress::Done => 3,
    };
    assert!(progress.windows(2).all(|w| stage(&w[0]) <= stage(&w[1])), "{progress:?}");
    let summarized = progress.iter().filter(|p| matches!(p, Progress::ChunkSummarized { .. })).count();
    assert_eq!(summarized, chunks.len());
    let merges: Vec<usize> = progress
        .iter()
        .filter_map(|p| if let Progress::Merging { level, .. } = p { Some(*level) } else { None })
        .collect();
    // The plan's levels are a bound: notes shorter than it counted on merge in fewer.
    assert!(!merges.is_empty() && merges.len() <= *levels, "{merges:?}, {levels} planned");
    assert!(merges.iter().enumerate().all(|(i, &level)| level == i + 1), "{merges:?}");
    assert!(!summary.points.is_empty() && summary.points.iter().any(|p| !p.sources.is_empty()), "{:?}", summary.points);

    // Each chunk's K/V was kept; a question goes to the chunk holding its words and prefills
    // only itself.
    assert_eq!(cache.stats.saved.load(Ordering::Relaxed), chunks.len() as u64);
    let third = &doc.text[chunks[2].clone()];
    let name = third
        .split_whitespace()
        .find(|w| w.len() > 5 && w.chars().all(char::is_alphabetic) && w.starts_with(char::is_uppercase))
        .unwrap_or("Bennet");
    let asked = format!("What does the text say about {name}?");
    let q = question(&runner, &[("doc".to_string(), doc.clone())], &[ChatMessage::new("user", &asked)]).unwrap();
    let chunk = q.excerpts[0].chunk.expect("a chunk, not the whole text");
    assert!(doc.text[chunks[chunk - 1].clone()].contains(name), "{asked} went to chunk {chunk}");
    let (tx, rx) = std::sync::mpsc::channel();
    let params = GenerateParams { max_tokens: 8, ..GenerateParams::default() };
    let (tokens, prefix) = q.request.into_local().expect("a local runner's request");
    scheduler.submit_with_prefix(tokens, prefix, params, Box::new(move |u| tx.send(u).is_ok())).unwrap();
    let done = loop {
        if let Update::Done(done) = rx.recv().unwrap() {
            break done.unwrap();
        }
    };
    assert!(done.prompt_tokens - done.reused_tokens < 40, "{done:?}");
    assert_eq!(cache.stats.loaded.load(Ordering::Relaxed), 1, "the chunk's K/V came from its file");
    drop(cache);
}

#[test]
fn a_cancelled_summary_ends_at_once_and_leaves_no_sequence_behind() {
    let engine = Arc::new(Engine::load(&common::model_path()).unwrap());
    let text = common::shared_document("pride-and-prejudice.txt");
    let doc = read_bytes("pride.txt", &text.as_bytes()[..34_000], &Limits::default()).unwrap();
    let front = local(&engine, 2048);
    let scheduler = front.local().expect("the local engine").1;
    let cancel = CancelFlag::default();
    let mut seen = Vec::new();
    let result = summarize(&runner(&front, 2048), &doc, "doc", &mut NoCheckpoints, &cancel, &mut |p| {
        if matches!(p, Progress::Prefill { done_tokens, .. } if done_tokens > 0) {
            cancel.cancel(); // mid-prefill of the batched chunks
        }
        seen.push(p);
    });
    assert!(matches!(result, Err(hillside_documents::summarize::SummaryError::Cancelled)), "{result:?}");
    assert!(!seen.iter().any(|p| matches!(p, Progress::ChunkSummarized { .. } | Progress::Done)), "{seen:?}");
    // Every chunk's sequence is cancelled and dropped within a round or two.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !scheduler.stats().is_empty() {
        assert!(std::time::Instant::now() < deadline, "sequences left: {:?}", scheduler.stats());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
