//! Summaries, run through the engine's scheduler: a document that fits is summarized in one
//! prompt; a longer one chunk by chunk (the chunks are submitted together, so the scheduler
//! batches them: one forward pass per step for all of them), then merged in groups, each
//! chunk's points carried into the merge with the passage behind them as evidence (merging
//! summaries alone drifts from the text). Every final point comes with its sources.

use crate::chunks::{plan, Mode, Plan, TooLong, SUMMARY_WITH_EVIDENCE_TOKENS};
use crate::ingest::Document;
use crate::sources::{Source, SourceIndex};
use hillside_engine::scheduler::{Scheduler, Update};
use hillside_engine::{CancelFlag, ChatMessage, Engine, Event, GenerateParams, SamplingParams};
use std::sync::mpsc;

/// The most tokens a summary (of a chunk, a merge group or the whole) may take.
const SUMMARY_TOKENS: usize = 320;
/// Tokens kept free of the document in a prompt: the instructions (with the chat template's
/// own) and the answer.
const RESERVE_TOKENS: usize = SUMMARY_TOKENS + 128;
/// Bytes of a source passage carried into a merge as evidence.
const EVIDENCE_BYTES: usize = 240;
/// Points of one note carried into a merge.
const POINTS_PER_NOTE: usize = 6;
/// Sources kept per point.
const SOURCES_PER_POINT: usize = 3;

/// What a summary is doing, in order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum Progress {
    /// Before any work: the mode and the token count.
    Planned { plan: Plan },
    /// Prompt tokens read for chunk `chunk` of `chunks` (the whole text is one chunk).
    Prefill { chunk: usize, chunks: usize, done_tokens: usize, total_tokens: usize },
    /// A chunk's summary is done (`done` of `chunks`).
    ChunkSummarized { done: usize, chunks: usize },
    /// Merging `groups` groups at `level` (from 1).
    Merging { level: usize, groups: usize },
    Done,
}

/// One point of a summary and the passages it comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub text: String,
    pub sources: Vec<Source>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DocumentSummary {
    pub plan: Plan,
    pub points: Vec<Point>,
}

#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error(transparent)]
    TooLong(#[from] TooLong),
    #[error("the summary was cancelled")]
    Cancelled,
    #[error(transparent)]
    Engine(#[from] hillside_engine::Error),
    #[error("the engine refused the summary: {0}")]
    Refused(String),
    #[error("a context of {0} tokens is too small to merge summaries (two need about {min})", min = RESERVE_TOKENS + 2 * SUMMARY_WITH_EVIDENCE_TOKENS)]
    ContextTooSmall(usize),
}

/// Summarizes `doc` with the model `engine` holds, through `scheduler` (whose sequences have
/// `context_tokens`), reporting `on_progress`; stops early once `cancel` is set.
pub fn summarize(
    engine: &Engine,
    scheduler: &Scheduler,
    context_tokens: usize,
    doc: &Document,
    cancel: &CancelFlag,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<DocumentSummary, SummaryError> {
    let count = |s: &str| engine.tokenizer().encode(s).map_or(s.len() / 4, |t| t.len());
    let plan = plan(doc, context_tokens, RESERVE_TOKENS, &count)?;
    on_progress(Progress::Planned { plan: plan.clone() });
    let index = SourceIndex::new(doc);
    let text = match &plan.mode {
        Mode::Whole => {
            let prompt = instruction(&doc.text, "Summarize this document in 5 to 8 short bullet points, one per line, each starting with \"- \".");
            run_all(engine, scheduler, vec![prompt], cancel, on_progress)?.remove(0)
        }
        Mode::Hierarchical { chunks, .. } => {
            let prompts = chunks
                .iter()
                .map(|c| instruction(&doc.text[c.clone()], "Summarize this part of a longer document in 3 to 5 short bullet points, one per line, each starting with \"- \"."))
                .collect();
            let mut notes: Vec<String> = run_all(engine, scheduler, prompts, cancel, on_progress)?;
            let mut level = 0;
            while notes.len() > 1 {
                level += 1;
                let blocks: Vec<String> = notes.iter().map(|n| evidence_block(n, &index)).collect();
                let groups = token_groups(&blocks, context_tokens.saturating_sub(RESERVE_TOKENS), &count);
                if groups.len() >= notes.len() {
                    return Err(SummaryError::ContextTooSmall(context_tokens)); // merging would never end
                }
                on_progress(Progress::Merging { level, groups: groups.len() });
                let prompts = groups.iter().map(|g| merge_prompt(g)).collect();
                notes = run_all(engine, scheduler, prompts, cancel, &mut |_| {})?;
            }
            notes.remove(0)
        }
    };
    let points = points(&text).into_iter().map(|p| Point { sources: index.sources(&p, SOURCES_PER_POINT), text: p }).collect();
    on_progress(Progress::Done);
    Ok(DocumentSummary { plan, points })
}

fn instruction(text: &str, task: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", &format!("{task}\n\n---\n{}\n---", text.trim()))]
}

/// A note's points, each with the passage behind it quoted as evidence.
fn evidence_block(note: &str, index: &SourceIndex<'_>) -> String {
    let mut block = String::new();
    for point in points(note).into_iter().take(POINTS_PER_NOTE) {
        block.push_str(&format!("- {point}\n"));
        if let Some(source) = index.sources(&point, 1).first() {
            block.push_str(&format!("  Evidence: \"{}\"\n", index.passage_text(source, EVIDENCE_BYTES)));
        }
    }
    block
}

/// `blocks` packed in order into groups of at most `budget` tokens, each block cut to the
/// [`SUMMARY_WITH_EVIDENCE_TOKENS`] the plan counted on, so that no level takes more groups
/// than the plan said.
fn token_groups(blocks: &[String], budget: usize, count: &dyn Fn(&str) -> usize) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut used = 0;
    for block in blocks {
        let mut block = block.clone();
        while count(&block) > SUMMARY_WITH_EVIDENCE_TOKENS {
            block.truncate(block.floor_char_boundary(block.len() * 3 / 4));
        }
        let tokens = count(&block);
        match groups.last_mut() {
            Some(group) if used + tokens <= budget => {
                group.push(block);
                used += tokens;
            }
            _ => {
                groups.push(vec![block]);
                used = tokens;
            }
        }
    }
    groups
}

/// A merge of notes on consecutive parts, with their evidence.
fn merge_prompt(blocks: &[String]) -> Vec<ChatMessage> {
    let body: String = blocks.iter().enumerate().map(|(i, b)| format!("Part {}:\n{b}", i + 1)).collect();
    instruction(&body, "These are notes on consecutive parts of one document, each with a passage quoted from it as evidence. Summarize the whole document in 5 to 8 short bullet points, one per line, each starting with \"- \". Keep only what the evidence supports.")
}

/// The lines of a reply that are list items (or, if it has none, its sentences), each on one
/// line, a point said twice kept once.
pub fn points(reply: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    raw_points(reply)
        .into_iter()
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| seen.insert(p.to_lowercase()))
        .collect()
}

fn raw_points(reply: &str) -> Vec<String> {
    let items: Vec<String> = reply
        .lines()
        .map(str::trim)
        .filter_map(|l| {
            let rest = l.strip_prefix("- ").or_else(|| l.strip_prefix("* ")).or_else(|| l.strip_prefix("• ")).or_else(|| {
                let digits = l.bytes().take_while(u8::is_ascii_digit).count();
                (digits > 0).then(|| l[digits..].strip_prefix(". ")).flatten()
            })?;
            Some(rest.trim().to_string())
        })
        .filter(|p| !p.is_empty())
        .collect();
    if !items.is_empty() {
        return items;
    }
    reply.split_inclusive(". ").map(|s| s.trim().to_string()).filter(|s| s.len() > 2).collect()
}

/// Runs every prompt through the scheduler at once (it batches them) and returns the replies
/// in order; prefill progress is reported per prompt.
fn run_all(engine: &Engine, scheduler: &Scheduler, prompts: Vec<Vec<ChatMessage>>, cancel: &CancelFlag, on_progress: &mut dyn FnMut(Progress)) -> Result<Vec<String>, SummaryError> {
    let n = prompts.len();
    // Greedy, so a summary is reproducible; with llama.cpp's repeat penalty, without which a
    // small model over a long prompt says its first point again and again.
    let sampling = SamplingParams { repeat_penalty: 1.1, ..SamplingParams::greedy() };
    let params = GenerateParams { max_tokens: SUMMARY_TOKENS, sampling, ..GenerateParams::default() };
    let (tx, rx) = mpsc::channel::<(usize, Update)>();
    let mut tickets = Vec::with_capacity(n);
    for (i, messages) in prompts.iter().enumerate() {
        let tokens = engine.chat_prompt(messages)?;
        let tx = tx.clone();
        let ticket = scheduler.submit(tokens, params.clone(), Box::new(move |u| tx.send((i, u)).is_ok())).map_err(|e| SummaryError::Refused(e.to_string()))?;
        tickets.push(ticket);
    }
    drop(tx);
    let (mut replies, mut done) = (vec![String::new(); n], 0);
    let result = loop {
        if cancel.is_cancelled() {
            break Err(SummaryError::Cancelled);
        }
        let (i, update) = match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(received) => received,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break Err(SummaryError::Refused("the engine stopped".into())),
        };
        match update {
            Update::Event(Event::Prefill { done_tokens, total_tokens }) => {
                on_progress(Progress::Prefill { chunk: i + 1, chunks: n, done_tokens, total_tokens })
            }
            Update::Event(Event::Text(t)) => replies[i].push_str(&t),
            Update::Event(Event::Logprob(_)) => {}
            Update::Done(Ok(_)) => {
                done += 1;
                on_progress(Progress::ChunkSummarized { done, chunks: n });
                if done == n {
                    break Ok(());
                }
            }
            Update::Done(Err(e)) => break Err(e.into()),
        }
    };
    if result.is_err() {
        tickets.iter().for_each(|t| t.cancel());
    }
    result.map(|()| replies)
}
