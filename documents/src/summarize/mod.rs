//! Summaries, run through the engine's scheduler: a document that fits is summarized in one
//! prompt; a longer one chunk by chunk, then merged in groups, each chunk's points carried into
//! the merge with the passage behind them as evidence (merging summaries alone drifts from the
//! text). Every final point comes with its sources.
//!
//! A summary is one job for the scheduler however long the document: its requests form one
//! [`Group`], which counts as one queued request and starts them as slots free, batched with
//! whatever else runs. On a remote engine ([`EngineFront::Remote`]) a few workers keep that many
//! requests in flight instead, for the remote to batch. Each step's note is kept as it finishes ([`Checkpoints`]), so that a
//! summary stopped by a crash, a kill or the user resumes where it stopped.

mod checkpoints;
mod pace;
mod remote_pool;

pub use checkpoints::{Checkpoints, LibraryCheckpoints, NoCheckpoints};

use crate::chunks::{merge_groups, plan, Mode, Plan, TooLong, SUMMARY_WITH_EVIDENCE_TOKENS};
use crate::ingest::Document;
use crate::kv_cache::DocumentKvCache;
use crate::prompt::{document_messages, document_prompt, PromptError};
use crate::sources::{Point, SourceIndex};
use hillside_engine::scheduler::{Group, Ticket, Update};
use hillside_engine::{CancelFlag, ChatMessage, Event, GenerateParams, SamplingParams};
pub use hillside_front::Request;
use hillside_front::{EngineFront, RemotePrompt};
use hillside_remote::RemoteError;
use pace::Pace;
use remote_pool::{RemotePool, Reply};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{mpsc, Arc};

/// The most tokens a summary (of a chunk, a merge group or the whole) may take.
const SUMMARY_TOKENS: usize = 320;
/// Tokens kept free of the document in a prompt: the instructions (with the chat template's
/// own) and the answer.
pub const RESERVE_TOKENS: usize = SUMMARY_TOKENS + 128;
/// Bytes of a source passage carried into a merge as evidence.
const EVIDENCE_BYTES: usize = 240;
/// Points of one note carried into a merge.
const POINTS_PER_NOTE: usize = 6;
/// Sources kept per point.
const SOURCES_PER_POINT: usize = 3;

const WHOLE_TASK: &str =
    "Summarize this document in 5 to 8 short bullet points, one per line, each starting with \"- \".";
const CHUNK_TASK: &str =
    "Summarize this part of a longer document in 3 to 5 short bullet points, one per line, each starting with \"- \".";
const MERGE_TASK: &str = "These are notes on consecutive parts of one document, each with a passage quoted from it as evidence. Summarize the whole document in 5 to 8 short bullet points, one per line, each starting with \"- \". Keep only what the evidence supports.";

/// Whether a document of `tokens` is summarized in one pass with `context_tokens`.
pub fn fits_whole(tokens: usize, context_tokens: usize) -> bool {
    tokens + RESERVE_TOKENS <= context_tokens
}

/// Plans the summary of `doc` with `context_tokens`, refusing, before any work, one that would
/// need more merge levels than allowed or a context too small to merge in.
pub fn plan_summary(
    doc: &Document,
    context_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> Result<Plan, SummaryError> {
    let plan = plan(doc, context_tokens, RESERVE_TOKENS, count)?;
    if matches!(plan.mode, Mode::Hierarchical { .. })
        && context_tokens < RESERVE_TOKENS + 2 * SUMMARY_WITH_EVIDENCE_TOKENS
    {
        return Err(SummaryError::ContextTooSmall(context_tokens));
    }
    Ok(plan)
}

/// What a summary is doing, in order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum Progress {
    /// Before any work: the mode and the token count.
    Planned {
        #[serde(flatten)]
        plan: Plan,
    },
    /// A summary stopped before goes on: these steps were kept.
    Resumed {
        chunks_done: usize,
        merges_done: usize,
    },
    /// Prompt tokens read for chunk `chunk` of `chunks` (the whole text is one chunk).
    Prefill {
        chunk: usize,
        chunks: usize,
        done_tokens: usize,
        total_tokens: usize,
    },
    /// A chunk's summary is done (`done` of `chunks`, `tokens_read` of the document's tokens);
    /// `eta_s` is the time left at this run's pace.
    ChunkSummarized {
        done: usize,
        chunks: usize,
        tokens_read: usize,
        elapsed_s: f64,
        eta_s: Option<f64>,
    },
    /// Merging `groups` groups at `level` (from 1).
    Merging {
        level: usize,
        groups: usize,
    },
    /// A merge group of `level` is done (`done` of `groups`).
    Merged {
        level: usize,
        done: usize,
        groups: usize,
        elapsed_s: f64,
        eta_s: Option<f64>,
    },
    /// The summary's text as it is written — the whole-text pass, or the last merge — piece by
    /// piece; its points and their sources come when it is done.
    Writing {
        text: String,
    },
    Done,
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
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("the engine refused the summary: {0}")]
    Refused(String),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("a context of {0} tokens is too small to merge summaries (two need about {min})", min = RESERVE_TOKENS + 2 * SUMMARY_WITH_EVIDENCE_TOKENS)]
    ContextTooSmall(usize),
}

/// What summaries and questions run on.
pub struct Runner<'a> {
    pub front: &'a EngineFront,
    /// Tokens of each sequence's context (the scheduler's, or the remote's).
    pub context_tokens: usize,
    /// Where documents' K/V is kept for the questions that follow (local engine only); `None`
    /// keeps nothing.
    pub kv_cache: Option<&'a Arc<DocumentKvCache>>,
}

impl<'a> Runner<'a> {
    /// Runs on `front` with its context as `setting` makes it, keeping documents' K/V in
    /// `kv_cache` (on the local engine only).
    pub fn new(front: &'a EngineFront, setting: Option<usize>, kv_cache: Option<&'a Arc<DocumentKvCache>>) -> Self {
        let kv_cache = kv_cache.filter(|_| front.local().is_some());
        Self { front, context_tokens: front.context_tokens(setting), kv_cache }
    }

    pub fn count_tokens(&self, text: &str) -> usize {
        self.front.count_tokens(text)
    }

    /// A prompt on `excerpts` ((name, text) pairs, from the library's document `ids`), with its
    /// document prefix kept if the runner keeps any.
    pub(crate) fn document_request(
        &self,
        ids: &[String],
        excerpts: &[(&str, &str)],
        messages: &[ChatMessage],
    ) -> Result<Request, PromptError> {
        match self.front.local() {
            Some((engine, _)) => {
                let prompt = document_prompt(engine, excerpts, messages)?;
                let prefix = self.kv_cache.map(|cache| cache.prefix(ids, &prompt.tokens[..prompt.prefix_tokens]));
                let reasoning = engine.tokenizer().reasoning_format_after(&prompt.tokens);
                Ok(Request::Local { tokens: prompt.tokens, prefix, reasoning })
            }
            // The documents come first here too: a remote that caches prefixes (vLLM,
            // llama.cpp) reads a document once for its summary and the questions after.
            None => Ok(Request::Remote(RemotePrompt::Chat(document_messages(excerpts, messages)?))),
        }
    }
}

/// Summarizes `doc` (the library's document `id`) through `runner`, reporting `on_progress`;
/// resumes from the steps `checkpoints` kept and keeps each new one; stops early once `cancel`
/// is set.
pub fn summarize(
    runner: &Runner<'_>,
    doc: &Document,
    id: &str,
    checkpoints: &mut dyn Checkpoints,
    cancel: &CancelFlag,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<DocumentSummary, SummaryError> {
    let (context_tokens, count) = (runner.context_tokens, |s: &str| runner.count_tokens(s));
    let plan = plan_summary(doc, context_tokens, &count)?;
    on_progress(Progress::Planned { plan: plan.clone() });
    let index = SourceIndex::new(doc);
    let mut job = Job::open(runner, &plan, checkpoints, cancel)?;
    let text = match &plan.mode {
        Mode::Whole => {
            let request = || {
                runner.document_request(
                    &[id.to_string()],
                    &[(doc.name.as_str(), &doc.text)],
                    &[ChatMessage::new("user", WHOLE_TASK)],
                )
            };
            job.run(&["whole".to_string()], Step::Whole, &|_| Ok(request()?), on_progress)?.remove(0)
        }
        Mode::Hierarchical { chunks, .. } => {
            let kept = |prefix: &str| job.kept.keys().filter(|k| k.starts_with(prefix)).count();
            let (chunks_done, merges_done) = (kept("chunk "), kept("merge "));
            if chunks_done + merges_done > 0 {
                on_progress(Progress::Resumed { chunks_done, merges_done });
            }
            let mut notes = job.chunk_notes(doc, id, chunks, on_progress)?;
            let mut level = 0;
            while notes.len() > 1 {
                level += 1;
                let blocks: Vec<String> = notes.iter().map(|n| evidence_block(n, &index)).collect();
                let groups = token_groups(&blocks, context_tokens.saturating_sub(RESERVE_TOKENS), &count);
                if groups.len() >= notes.len() {
                    return Err(SummaryError::ContextTooSmall(context_tokens)); // merging would never end
                }
                on_progress(Progress::Merging { level, groups: groups.len() });
                job.pace.steps_left(
                    groups.len() + merge_groups(groups.len(), context_tokens, RESERVE_TOKENS).iter().sum::<usize>(),
                );
                let keys: Vec<String> = (0..groups.len()).map(|g| format!("merge {level}.{g}")).collect();
                let request = |g: usize| Ok(runner.front.chat_request(merge_prompt(&groups[g]))?);
                notes = job.run(&keys, Step::Merge { level, last: groups.len() == 1 }, &request, on_progress)?;
            }
            notes.remove(0)
        }
    };
    let points =
        points(&text).into_iter().map(|p| Point { sources: index.sources(&p, SOURCES_PER_POINT), text: p }).collect();
    on_progress(Progress::Done);
    Ok(DocumentSummary { plan, points })
}

/// The chunk phase of a hierarchical summary on its own (for benchmarks): each of `chunks`
/// (byte ranges of `doc`, the library's document `id`) summarized, nothing kept.
pub fn chunk_notes(
    runner: &Runner<'_>,
    doc: &Document,
    id: &str,
    chunks: &[Range<usize>],
    cancel: &CancelFlag,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<Vec<String>, SummaryError> {
    let plan = Plan { tokens: 0, mode: Mode::Hierarchical { chunks: chunks.to_vec(), levels: 0 } };
    Job::open(runner, &plan, &mut NoCheckpoints, cancel)?.chunk_notes(doc, id, chunks, on_progress)
}

/// What a summary's requests are, for their progress.
#[derive(Clone, Copy)]
enum Step {
    Whole,
    Chunk,
    /// A merge group of `level`; `last` when it is the only one, whose text is the summary.
    Merge {
        level: usize,
        last: bool,
    },
}

/// One summary's requests: one scheduler group (on the local engine), its kept steps, its pace.
struct Job<'r, 'a> {
    runner: &'r Runner<'a>,
    group: Option<Group>,
    checkpoints: &'r mut dyn Checkpoints,
    cancel: &'r CancelFlag,
    plan_key: String,
    chunks: usize,
    kept: BTreeMap<String, String>,
    pace: Pace,
    /// The document's tokens, each chunk's (their sum may differ by a few: a text tokenized in
    /// pieces) and how many of them the chunks done so far hold.
    tokens: usize,
    chunk_tokens: Vec<usize>,
    chunk_tokens_read: usize,
}

impl<'r, 'a> Job<'r, 'a> {
    fn open(
        runner: &'r Runner<'a>,
        plan: &Plan,
        checkpoints: &'r mut dyn Checkpoints,
        cancel: &'r CancelFlag,
    ) -> Result<Self, SummaryError> {
        let group = match runner.front.local() {
            Some((_, scheduler)) => Some(scheduler.open_group().map_err(|e| SummaryError::Refused(e.to_string()))?),
            None => None,
        };
        let plan_key = plan_key(plan, runner.context_tokens);
        let kept = checkpoints.resume(&plan_key);
        let (chunks, steps) = match &plan.mode {
            Mode::Whole => (1, 1),
            Mode::Hierarchical { chunks, .. } => (
                chunks.len(),
                chunks.len() + merge_groups(chunks.len(), runner.context_tokens, RESERVE_TOKENS).iter().sum::<usize>(),
            ),
        };
        Ok(Self {
            runner,
            group,
            checkpoints,
            cancel,
            plan_key,
            chunks,
            kept,
            pace: Pace::new(steps),
            tokens: plan.tokens,
            chunk_tokens: Vec::new(),
            chunk_tokens_read: 0,
        })
    }

    fn chunk_notes(
        &mut self,
        doc: &Document,
        id: &str,
        chunks: &[Range<usize>],
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<String>, SummaryError> {
        let ids = [id.to_string()];
        let runner = self.runner;
        self.chunk_tokens = chunks.iter().map(|c| runner.count_tokens(&doc.text[c.clone()])).collect();
        let keys: Vec<String> = (0..chunks.len()).map(|i| format!("chunk {i}")).collect();
        let request = |i: usize| {
            Ok(runner.document_request(
                &ids,
                &[(doc.name.as_str(), &doc.text[chunks[i].clone()])],
                &[ChatMessage::new("user", CHUNK_TASK)],
            )?)
        };
        self.run(&keys, Step::Chunk, &request, on_progress)
    }

    /// The notes of the steps `keys`: those kept, and the others run through the group (their
    /// requests made by `request`, all submitted at once: the group starts them as slots free),
    /// each kept as it finishes.
    fn run(
        &mut self,
        keys: &[String],
        step: Step,
        request: &dyn Fn(usize) -> Result<Request, SummaryError>,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<String>, SummaryError> {
        let n = keys.len();
        let mut notes: Vec<Option<String>> = keys.iter().map(|k| self.kept.get(k).cloned()).collect();
        let mut done = 0;
        for i in (0..n).filter(|&i| notes[i].is_some()) {
            done += 1;
            self.pace.step_kept();
            self.chunk_tokens_read +=
                self.chunk_tokens.get(i).copied().filter(|_| matches!(step, Step::Chunk)).unwrap_or(0);
        }
        // Greedy, so a summary is reproducible (and a resumed one the same); with llama.cpp's
        // repeat penalty, without which a small model over a long prompt says its first point
        // again and again.
        let sampling = SamplingParams { repeat_penalty: 1.1, ..SamplingParams::greedy() };
        let params = GenerateParams { max_tokens: SUMMARY_TOKENS, sampling, ..GenerateParams::default() };
        let (tx, rx) = mpsc::channel::<(usize, Reply)>();
        let mut running = Running::default();
        let mut remote_requests = Vec::new();
        for i in (0..n).filter(|&i| notes[i].is_none()) {
            match request(i)? {
                Request::Local { tokens, prefix, reasoning } => {
                    let tx = tx.clone();
                    let sink = Box::new(move |u| tx.send((i, Reply::Update(u))).is_ok());
                    let group = self.group.as_ref().expect("a local request runs in a group");
                    let params = GenerateParams { reasoning, ..params.clone() };
                    running.tickets.push(
                        group
                            .submit_with_prefix(tokens, prefix, params, sink)
                            .map_err(|e| SummaryError::Refused(e.to_string()))?,
                    );
                }
                Request::Remote(prompt) => remote_requests.push((i, prompt)),
            }
        }
        if let Some(remote) = self.runner.front.remote() {
            running.pool = Some(RemotePool::start(remote, remote_requests, params.clone(), tx.clone()));
        }
        drop(tx);
        let mut replies = vec![String::new(); n];
        let writes = matches!(step, Step::Whole | Step::Merge { last: true, .. });
        let result = loop {
            if done == n {
                break Ok(());
            }
            if self.cancel.is_cancelled() {
                break Err(SummaryError::Cancelled);
            }
            let (i, update) = match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok((i, Reply::Update(update))) => (i, update),
                Ok((_, Reply::Failed(e))) => break Err(e.into()),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(SummaryError::Refused("the engine stopped".into()))
                }
            };
            match update {
                Update::Event(Event::Prefill { done_tokens, total_tokens })
                    if matches!(step, Step::Whole | Step::Chunk) =>
                {
                    on_progress(Progress::Prefill { chunk: i + 1, chunks: n, done_tokens, total_tokens })
                }
                Update::Event(Event::Text(t)) => {
                    if writes {
                        on_progress(Progress::Writing { text: t.clone() });
                    }
                    replies[i].push_str(&t)
                }
                Update::Event(_) => {}
                Update::Done(Ok(_)) => {
                    let note = std::mem::take(&mut replies[i]);
                    self.checkpoints.keep(&self.plan_key, self.chunks, &keys[i], &note);
                    notes[i] = Some(note);
                    done += 1;
                    self.pace.step_done();
                    let (elapsed_s, eta_s) = (self.pace.elapsed_s(), self.pace.eta_s());
                    match step {
                        Step::Chunk => {
                            self.chunk_tokens_read += self.chunk_tokens.get(i).copied().unwrap_or(0);
                            on_progress(Progress::ChunkSummarized {
                                done,
                                chunks: n,
                                tokens_read: self.tokens_read(),
                                elapsed_s,
                                eta_s,
                            })
                        }
                        Step::Merge { level, .. } => {
                            on_progress(Progress::Merged { level, done, groups: n, elapsed_s, eta_s })
                        }
                        Step::Whole => {}
                    }
                }
                Update::Done(Err(e)) => break Err(e.into()),
            }
        };
        if result.is_err() {
            running.stop();
        }
        result.map(|()| notes.into_iter().map(|n| n.expect("every step done")).collect())
    }
}

/// A step's requests in flight: the local scheduler's tickets, or the remote's workers.
#[derive(Default)]
struct Running {
    tickets: Vec<Ticket>,
    pool: Option<RemotePool>,
}

impl Running {
    fn stop(&mut self) {
        self.tickets.iter().for_each(Ticket::cancel);
        self.pool = None;
    }
}

impl Job<'_, '_> {
    /// The document's tokens the chunks done so far hold, in the document's own count.
    fn tokens_read(&self) -> usize {
        let all: usize = self.chunk_tokens.iter().sum();
        (self.tokens as u128 * self.chunk_tokens_read as u128 / all.max(1) as u128) as usize
    }
}

/// What a summary's kept steps were made for: the plan, the context, the prompts and the
/// length of an answer (the model is the [`Checkpoints`]' to add).
fn plan_key(plan: &Plan, context_tokens: usize) -> String {
    let mut hash = Sha256::new();
    for part in [
        serde_json::to_string(plan).unwrap_or_default(),
        context_tokens.to_string(),
        SUMMARY_TOKENS.to_string(),
        WHOLE_TASK.into(),
        CHUNK_TASK.into(),
        MERGE_TASK.into(),
    ] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
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
    vec![ChatMessage::new("user", format!("{MERGE_TASK}\n\n---\n{body}\n---"))]
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
    let item = |l: &str| -> Option<String> {
        let rest =
            l.strip_prefix("- ").or_else(|| l.strip_prefix("* ")).or_else(|| l.strip_prefix("• ")).or_else(|| {
                let digits = l.bytes().take_while(u8::is_ascii_digit).count();
                (digits > 0).then(|| l[digits..].strip_prefix(". ")).flatten()
            })?;
        Some(rest.trim().to_string())
    };
    let mut items: Vec<String> = Vec::new();
    // Whether the line before was part of an item: a model wraps long items onto more lines.
    let mut in_item = false;
    for line in reply.lines().map(str::trim) {
        match item(line) {
            Some(text) => {
                items.push(text);
                in_item = true;
            }
            None if line.is_empty() => in_item = false,
            None if in_item => {
                let last = items.last_mut().expect("in an item");
                last.push(' ');
                last.push_str(line);
            }
            None => {}
        }
    }
    items.retain(|p| !p.is_empty());
    if !items.is_empty() {
        return items;
    }
    reply.split_inclusive(". ").map(|s| s.trim().to_string()).filter(|s| s.len() > 2).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_list_items_with_their_wrapped_lines_each_said_once() {
        let reply = "Here is the summary:\n- The GPL is a free software license for the GNU General Public\n  License family.\n2. Anyone may copy it.\n\nThat is all.\n* anyone may  copy it.";
        assert_eq!(
            points(reply),
            ["The GPL is a free software license for the GNU General Public License family.", "Anyone may copy it."]
        );
        assert_eq!(points("It is short. It has no list."), ["It is short.", "It has no list."]);
    }
}
