//! Serving several sequences on one model: a bounded queue of requests, at most `max_live`
//! sequences alive at once, each in its own KV store, all advanced together one step per round
//! (a prompt chunk or a token each) on one worker thread, in one batched forward pass: the
//! weights are read once per round, not once per sequence (continuous batching: a sequence
//! joins the batch the round after it arrives and leaves it when it ends). A long prompt
//! delays the others by one chunk per round, not by its whole prefill, and by a shorter one
//! while another sequence waits on its next token ([`SchedulerConfig::shared_prefill_tokens`]).
//! Many requests of one task (a summary's chunks) form a [`Group`], which counts as one
//! request against the queue's limit and starts its members one at a time ([`wait_queue`]).
//!
//! A sequence ends when its generation does, when its owner cancels it, or the moment its owner
//! stops listening (a client that disconnects); a cancelled one's store, with any cold-pool
//! file, is dropped at its next turn, while one that finished is kept in the prefix cache
//! ([`prefix_cache`]) for the next request that starts the same way.
//!
//! A panic (a bug) in one sequence's step fails that sequence with the panic's message and
//! drops its store; the others go on. A panic outside any one sequence's work stops the worker:
//! the scheduler then says so ([`Scheduler::health`]) and refuses requests, rather than taking
//! them into a queue nobody serves.

mod kept_prefix;
mod prefix_cache;
mod totals;
mod wait_queue;

pub use kept_prefix::KeptPrefix;
pub use totals::Totals;

use crate::error::{Error, Result};
use crate::generate::{feed_batch, finished, CancelFlag, Event, GenerateParams, Generation, Next, Sequence, Summary};
use crate::kv::{KvConfig, KvStats};
use crate::{Engine, FinishReason};
use kept_prefix::shared_prefix;
use prefix_cache::PrefixCache;
use serde::Serialize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wait_queue::WaitQueue;

/// How often an idle worker lets cached sequences check whether memory has grown short.
const IDLE_TRIM_EVERY: Duration = crate::headroom::REMEASURE_AFTER;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences generating at once.
    pub max_live: usize,
    /// Requests waiting for a turn beyond those; more are refused.
    pub max_queued: usize,
    /// The store each sequence gets.
    pub kv: KvConfig,
    /// Each sequence's context in tokens (the model's when `None`).
    pub context_tokens: Option<usize>,
    /// Finished sequences kept so that a request sharing their prefix (the next turn of a
    /// conversation, another question on the same document) skips reading it again.
    pub cached_sequences: usize,
    /// While a sequence in a round waits on its next token (it is decoding, or its prompt ends
    /// within this many tokens), a longer prompt reads at most this many tokens in that round
    /// instead of its whole chunk, so that the round, and the other's wait, stays short (0: off).
    /// On 2 cores a 256-token chunk at 7K tokens of context takes most of a second.
    pub shared_prefill_tokens: usize,
}

/// [`SchedulerConfig::shared_prefill_tokens`]'s default.
pub const SHARED_PREFILL_TOKENS: usize = 64;

impl SchedulerConfig {
    /// For a program's own work rather than a server's clients (the CLI, the lab, tests):
    /// `max_live` sequences at once, and a queue no job of its own fills (a summary submits
    /// every chunk at once); nothing finished is kept unless `cached_sequences` is set after.
    pub fn own_work(kv: KvConfig, context_tokens: Option<usize>, max_live: usize) -> Self {
        Self {
            max_live,
            max_queued: OWN_WORK_QUEUE,
            kv,
            context_tokens,
            cached_sequences: 0,
            shared_prefill_tokens: SHARED_PREFILL_TOKENS,
        }
    }
}

/// [`SchedulerConfig::own_work`]'s queue: more than a long document's chunks.
const OWN_WORK_QUEUE: usize = 4096;

/// What a request's owner hears: its events, then exactly one `Done`.
#[derive(Debug)]
pub enum Update {
    Event(Event),
    Done(Result<Summary>),
}

/// Delivers a request's updates; returns `false` once nobody listens, which ends the sequence.
/// It runs on the worker thread, so it must not block.
pub type Sink = Box<dyn FnMut(Update) -> bool + Send>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {queued} requests are already waiting; retry shortly")]
    QueueFull { queued: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the engine stopped after an internal error (a bug; please report it): {0}")]
    EngineFailed(String),
}

/// A submitted request: its id and a way to stop it.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub id: u64,
    cancel: CancelFlag,
}

impl Ticket {
    pub fn cancel(&self) {
        self.cancel.cancel();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Prefill,
    Decode,
    /// Finished, kept for its prefix.
    Cached,
}

/// One request (or a cached sequence) as the worker last saw it (refreshed every round).
#[derive(Debug, Clone, Serialize)]
pub struct SequenceStats {
    /// The request's id (0 for a cached sequence).
    pub id: u64,
    pub phase: Phase,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Its KV store (not yet created while queued).
    pub kv: Option<KvStats>,
}

struct Job {
    id: u64,
    prompt: Vec<u32>,
    params: GenerateParams,
    sink: Sink,
    cancel: CancelFlag,
    prefix: Option<Box<dyn KeptPrefix>>,
}

struct Live {
    job: Job,
    seq: Sequence,
    generation: Generation,
    /// What this round runs for it.
    input: Vec<u32>,
    /// Its counters as last added to the scheduler's [`Totals`].
    counted: Totals,
}

struct State {
    queue: WaitQueue,
    /// Live and cached sequences, as of the last round.
    live: Vec<SequenceStats>,
    totals: Totals,
    accepting: bool,
    /// Why the worker stopped, if a panic escaped it.
    failed: Option<String>,
    /// Ends the worker: every sequence still there is cancelled.
    stop: bool,
    next_id: u64,
}

impl State {
    fn accepts(&self) -> Result<(), SubmitError> {
        if let Some(why) = &self.failed {
            return Err(SubmitError::EngineFailed(why.clone()));
        }
        if !self.accepting {
            return Err(SubmitError::ShuttingDown);
        }
        Ok(())
    }

    fn job(
        &mut self,
        prompt: Vec<u32>,
        prefix: Option<Box<dyn KeptPrefix>>,
        params: GenerateParams,
        sink: Sink,
    ) -> (Job, Ticket) {
        let id = self.next_id;
        self.next_id += 1;
        let cancel = CancelFlag::default();
        (Job { id, prompt, params, sink, cancel: cancel.clone(), prefix }, Ticket { id, cancel })
    }
}

/// Requests that count as one for the queue's limit (see [`Scheduler::open_group`]).
pub struct Group {
    shared: Arc<Shared>,
    id: u64,
}

impl Group {
    /// Queues a member; refused only when the scheduler stops taking requests.
    pub fn submit_with_prefix(
        &self,
        prompt: Vec<u32>,
        prefix: Option<Box<dyn KeptPrefix>>,
        params: GenerateParams,
        sink: Sink,
    ) -> Result<Ticket, SubmitError> {
        let mut state = self.shared.lock();
        state.accepts()?;
        let (job, ticket) = state.job(prompt, prefix, params, sink);
        state.queue.push_member(self.id, job);
        self.shared.changed.notify_all();
        Ok(ticket)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let waiting = self.shared.lock().queue.close_group(self.id);
        waiting.into_iter().for_each(finish_cancelled);
        self.shared.changed.notify_all();
    }
}

struct Shared {
    config: SchedulerConfig,
    state: Mutex<State>,
    /// Signalled when work arrives, when a round ends, and on stop.
    changed: Condvar,
}

impl Shared {
    /// An empty queue, accepting requests.
    fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                queue: WaitQueue::default(),
                live: Vec::new(),
                totals: Totals::default(),
                accepting: true,
                failed: None,
                stop: false,
                next_id: 1,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Scheduler {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the worker, after the start-up work the KV configuration needs (see
    /// [`KvConfig::start_up`]), so that it never stalls the sequences being served.
    pub fn start(engine: Arc<Engine>, mut config: SchedulerConfig) -> Self {
        if config.kv.startup.is_none() {
            config.kv = config.kv.start_up();
        }
        let shared = Arc::new(Shared::new(config));
        let worker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("hillside-scheduler".into())
                .spawn(move || {
                    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(&engine, &shared))) {
                        fail_worker(&shared, panic_message(&*panic));
                    }
                })
                .expect("starting the scheduler thread")
        };
        Self { shared, worker: Mutex::new(Some(worker)) }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.shared.config
    }

    /// Queues a generation of `prompt`; its updates go to `sink`.
    pub fn submit(&self, prompt: Vec<u32>, params: GenerateParams, sink: Sink) -> Result<Ticket, SubmitError> {
        self.submit_with_prefix(prompt, None, params, sink)
    }

    /// [`Scheduler::submit`] for a prompt whose first tokens' K/V may be kept elsewhere.
    pub fn submit_with_prefix(
        &self,
        prompt: Vec<u32>,
        prefix: Option<Box<dyn KeptPrefix>>,
        params: GenerateParams,
        sink: Sink,
    ) -> Result<Ticket, SubmitError> {
        let mut state = self.shared.lock();
        self.admit_one_more(&state)?;
        let (job, ticket) = state.job(prompt, prefix, params, sink);
        state.queue.push(job);
        self.shared.changed.notify_all();
        Ok(ticket)
    }

    /// Opens a group of requests that counts as one request for the queue's limit however many
    /// it holds (a summary's chunks): its members start one at a time as slots free, taking
    /// turns with the other requests. Dropping the group ends its members still waiting.
    pub fn open_group(&self) -> Result<Group, SubmitError> {
        let mut state = self.shared.lock();
        self.admit_one_more(&state)?;
        let id = state.next_id;
        state.next_id += 1;
        state.queue.open_group(id);
        Ok(Group { shared: self.shared.clone(), id })
    }

    /// Whether one more request may wait: a request may wait while every live slot is taken,
    /// up to `max_queued` of them.
    fn admit_one_more(&self, state: &State) -> Result<(), SubmitError> {
        state.accepts()?;
        let live = state.live.iter().filter(|s| s.phase != Phase::Cached).count();
        let free_slots = self.shared.config.max_live.saturating_sub(live);
        let queued = state.queue.counted();
        if queued >= self.shared.config.max_queued + free_slots {
            return Err(SubmitError::QueueFull { queued });
        }
        Ok(())
    }

    /// [`SubmitError::EngineFailed`], with the reason, once the worker has stopped after an
    /// internal error.
    pub fn health(&self) -> Result<(), SubmitError> {
        match &self.shared.lock().failed {
            Some(why) => Err(SubmitError::EngineFailed(why.clone())),
            None => Ok(()),
        }
    }

    /// Every request, live or queued, and every cached sequence, as of the last round.
    pub fn stats(&self) -> Vec<SequenceStats> {
        let state = self.shared.lock();
        let queued = state.queue.heads().map(|j| SequenceStats {
            id: j.id,
            phase: Phase::Queued,
            prompt_tokens: j.prompt.len(),
            generated_tokens: 0,
            kv: None,
        });
        state.live.iter().cloned().chain(queued).collect()
    }

    /// Counters summed over every sequence run so far, as of the last round.
    pub fn totals(&self) -> Totals {
        self.shared.lock().totals
    }

    /// Stops taking requests, lets those under way finish for up to `grace`, cancels the rest
    /// and waits for the worker, which drops every store (cold-pool files included).
    pub fn shutdown(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        let mut state = self.shared.lock();
        state.accepting = false;
        while !(state.queue.is_empty() && state.live.iter().all(|s| s.phase == Phase::Cached)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self.shared.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.stop = true;
        drop(state);
        self.shared.changed.notify_all();
        if let Some(worker) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown(Duration::ZERO);
    }
}

/// The worker: admit queued requests into free slots, give every live sequence one step, publish
/// what they hold; sleep when there is nothing to do.
fn run(engine: &Engine, shared: &Shared) {
    let mut live: Vec<Live> = Vec::new();
    let mut cache = PrefixCache::new(shared.config.cached_sequences);
    let mut totals = Totals::default();
    loop {
        let admitted: Vec<Job> = {
            let mut state = shared.lock();
            if !state.stop && live.is_empty() && state.queue.is_empty() {
                // Idle: wake now and then, so that cached sequences can give back memory that
                // has grown short (below) while no request comes.
                state = shared.changed.wait_timeout(state, IDLE_TRIM_EVERY).unwrap_or_else(|p| p.into_inner()).0;
            }
            if state.stop {
                let queued = state.queue.drain();
                drop(state);
                for job in queued {
                    finish_cancelled(job);
                }
                for mut l in live.drain(..) {
                    (l.job.sink)(Update::Done(Ok(l.generation.cancelled())));
                }
                shared.lock().live.clear();
                shared.changed.notify_all();
                return;
            }
            let free = shared.config.max_live.saturating_sub(live.len());
            let n = free.min(state.queue.len());
            (0..n).map_while(|_| state.queue.next()).collect()
        };
        if !admitted.is_empty() {
            for job in admitted {
                if let Some(l) = admit(engine, &shared.config, &mut cache, job) {
                    live.push(l);
                }
            }
            // Requests taken from the queue count as live from now, not after their first
            // round (a whole prefill chunk): until then the queue would admit past its limit,
            // and a shutdown would not wait for them.
            publish(shared, &mut live, &cache, &mut totals);
        }
        run_round(engine, shared, &mut live, &mut cache, &mut totals);
        cache.trim();
        publish(shared, &mut live, &cache, &mut totals);
    }
}

/// Shows the live sequences and the cached ones to the callers (admission, stats, shutdown),
/// and counts what the live ones grew by since the last time.
fn publish(shared: &Shared, live: &mut [Live], cache: &PrefixCache, totals: &mut Totals) {
    let cached = cache.sequences().iter().map(|seq| SequenceStats {
        id: 0,
        phase: Phase::Cached,
        prompt_tokens: seq.tokens.len(),
        generated_tokens: 0,
        kv: Some(seq.kv.stats()),
    });
    let mut stats: Vec<SequenceStats> = Vec::with_capacity(live.len() + cache.sequences().len());
    for l in live {
        let now = live_stats(l);
        l.counted = totals.add_growth(l.counted, Totals::of(&now));
        stats.push(now);
    }
    stats.extend(cached);
    let mut state = shared.lock();
    state.live = stats;
    state.totals = *totals;
    drop(state);
    shared.changed.notify_all();
}

/// Gives the job a sequence — the cached one sharing the longest prefix with its prompt, else a
/// new one — and starts its generation; a failure ends the job.
fn admit(engine: &Engine, config: &SchedulerConfig, cache: &mut PrefixCache, mut job: Job) -> Option<Live> {
    if job.cancel.is_cancelled() {
        finish_cancelled(job);
        return None;
    }
    let started = guarded(|| {
        let mut seq = match cache.take(&job.prompt) {
            Some(seq) => seq,
            None => engine.new_sequence_with(&config.kv, config.context_tokens)?,
        };
        if let Some(prefix) = job
            .prefix
            .as_mut()
            .filter(|p| p.tokens() < job.prompt.len() && shared_prefix(&seq.tokens, &job.prompt) < p.tokens())
        {
            // Loading the kept prefix stalls the other sequences for one disk read, not for
            // the prefill it replaces.
            let mut kept = engine.new_sequence_with(&config.kv, config.context_tokens)?;
            if prefix.load(&mut kept) {
                kept.tokens = job.prompt[..prefix.tokens()].to_vec();
                if !seq.tokens.is_empty() {
                    cache.put(seq);
                }
                seq = kept;
            }
        }
        if let Some(prefix) = &job.prefix {
            seq.kv.keep_prefix(prefix.tokens());
        }
        let (sink, cancel) = (&mut job.sink, &job.cancel);
        let generation = Generation::start(&mut seq, std::mem::take(&mut job.prompt), job.params.clone(), &mut |e| {
            forward(sink, cancel, e)
        })?;
        Ok((seq, generation))
    });
    match started {
        Ok((seq, generation)) => Some(Live { job, seq, generation, input: Vec::new(), counted: Totals::default() }),
        Err(e) => {
            (job.sink)(Update::Done(Err(e)));
            None
        }
    }
}

/// One step of every live sequence, batched: each says what it needs next (a prompt chunk or
/// its next token, whose text goes out now), all of it runs in one forward pass, and each
/// takes its logits. Sequences that ended, were cancelled or failed leave the batch; those that
/// finished go to the prefix cache (a cancelled one is freed at once: its client left).
fn run_round(engine: &Engine, shared: &Shared, live: &mut Vec<Live>, cache: &mut PrefixCache, totals: &mut Totals) {
    let shared_prefill_tokens = shared.config.shared_prefill_tokens;
    let mut finished = |mut l: Live, outcome: Result<Summary>| {
        totals.add_growth(l.counted, Totals::of(&live_stats(&l)));
        let keep = matches!(&outcome, Ok(s) if s.finish_reason != FinishReason::Cancelled);
        if keep {
            if let Some(prefix) = l.job.prefix.as_mut().filter(|p| l.seq.tokens.len() >= p.tokens()) {
                // Before the owner hears it is done, so that its next request finds the prefix.
                let _ = guarded(|| {
                    prefix.save(&mut l.seq);
                    Ok(())
                });
            }
        }
        // Before the owner hears it is done, so that what it reads next counts this sequence
        // as finished, its last token included.
        publish_finished(shared, &l, keep, *totals);
        // The store is cached or dropped (its cold-pool file with it) before the owner hears.
        let Live { mut job, seq, .. } = l;
        if keep {
            cache.put(seq);
        } else {
            drop(seq);
        }
        (job.sink)(Update::Done(outcome));
    };
    let mut batched = Vec::with_capacity(live.len());
    for mut l in live.drain(..) {
        if l.job.cancel.is_cancelled() {
            let summary = l.generation.cancelled();
            finished(l, Ok(summary));
            continue;
        }
        let (sink, cancel, generation, seq) = (&mut l.job.sink, &l.job.cancel, &mut l.generation, &l.seq);
        match guarded(|| generation.next_input(engine, seq, &mut |e| forward(sink, cancel, e))) {
            Ok(Next::Feed(tokens)) => {
                l.input = tokens;
                batched.push(l);
            }
            Ok(Next::Done(summary)) => finished(l, Ok(summary)),
            Err(e) => finished(l, Err(e)),
        }
    }
    let waits_on_a_token = |l: &Live| {
        !l.generation.is_prefilling()
            || l.generation.progress().0.saturating_sub(l.seq.tokens.len()) <= shared_prefill_tokens
    };
    if shared_prefill_tokens > 0 && batched.iter().any(waits_on_a_token) {
        // Each prompt resumes where its cache ends, so a shorter chunk loses nothing.
        batched
            .iter_mut()
            .filter(|l| l.generation.is_prefilling())
            .for_each(|l| l.input.truncate(shared_prefill_tokens));
    }
    let held: Vec<usize> = batched.iter().map(|l| l.seq.tokens.len()).collect();
    let mut batch: Vec<(&mut Sequence, &[u32])> = batched.iter_mut().map(|l| (&mut l.seq, &l.input[..])).collect();
    let outcome: Vec<Result<Vec<f32>>> = match guarded(|| feed_batch(engine, &mut batch)) {
        Ok(logits) => logits.into_iter().map(Ok).collect(),
        // One sequence's failure (its cold pool's disk is full, say, or a bug in its store)
        // must not end the others: roll every cache back to what it held (a panic skipped
        // that) and run each alone to find whose it was.
        Err(_) if batch.len() > 1 => {
            let solo = batch.iter_mut().zip(held);
            solo.map(|((seq, tokens), held)| guarded(|| seq.roll_back_to(held).and_then(|()| seq.feed(engine, tokens))))
                .collect()
        }
        Err(e) => vec![Err(e)],
    };
    for (mut l, outcome) in batched.into_iter().zip(outcome) {
        let (sink, cancel, generation, seq) = (&mut l.job.sink, &l.job.cancel, &mut l.generation, &l.seq);
        match outcome.and_then(|logits| {
            guarded(|| {
                generation.accept(seq, logits, &mut |e| forward(sink, cancel, e));
                Ok(())
            })
        }) {
            Ok(()) => live.push(l),
            Err(e) => finished(l, Err(e)),
        }
    }
}

/// Runs one sequence's work; a panic in it becomes that sequence's error.
fn guarded<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let message = panic_message(&*panic);
        tracing::error!(panic = %message, "a sequence's step panicked; failing that sequence");
        Err(Error::Internal(message))
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The worker stopped on a panic outside any one sequence: refuse new requests and end the
/// queued ones with the reason. (The live ones ended as the panic unwound: their owners hear
/// that their channel closed.)
fn fail_worker(shared: &Shared, why: String) {
    tracing::error!(panic = %why, "the scheduler stopped");
    let queued: Vec<Job> = {
        let mut state = shared.lock();
        state.failed = Some(why.clone());
        state.accepting = false;
        state.live.clear();
        state.queue.drain()
    };
    for mut job in queued {
        (job.sink)(Update::Done(Err(Error::Internal(why.clone()))));
    }
    shared.changed.notify_all();
}

fn forward(sink: &mut Sink, cancel: &CancelFlag, event: Event) {
    if !sink(Update::Event(event)) {
        cancel.cancel(); // nobody listens: end it at its next turn
    }
}

/// Ends a job that never started.
fn finish_cancelled(mut job: Job) {
    let summary = finished(&job.prompt, 0, Vec::new(), FinishReason::Cancelled, 0.0, 0.0);
    (job.sink)(Update::Done(Ok(summary)));
}

/// Shows a sequence that just left the batch as cached (or gone) and the totals with its last
/// growth, ahead of the round's full refresh.
fn publish_finished(shared: &Shared, l: &Live, kept: bool, totals: Totals) {
    let mut state = shared.lock();
    state.totals = totals;
    if kept {
        if let Some(seen) = state.live.iter_mut().find(|s| s.id == l.job.id) {
            *seen = SequenceStats {
                id: 0,
                phase: Phase::Cached,
                prompt_tokens: l.seq.tokens.len(),
                generated_tokens: 0,
                kv: Some(l.seq.kv.stats()),
            };
        }
    } else {
        state.live.retain(|s| s.id != l.job.id);
    }
}

fn live_stats(l: &Live) -> SequenceStats {
    let (prompt_tokens, generated_tokens) = l.generation.progress();
    SequenceStats {
        id: l.job.id,
        phase: if l.generation.is_prefilling() { Phase::Prefill } else { Phase::Decode },
        prompt_tokens,
        generated_tokens,
        kv: Some(l.seq.kv.stats()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_panicked_refuses_requests_and_ends_the_queued_ones() {
        let config = SchedulerConfig {
            max_live: 1,
            max_queued: 4,
            kv: KvConfig::default(),
            context_tokens: None,
            cached_sequences: 0,
            shared_prefill_tokens: SHARED_PREFILL_TOKENS,
        };
        let shared = Arc::new(Shared::new(config));
        // No worker thread: the queued request stays queued until the failure ends it.
        let scheduler = Scheduler { shared: shared.clone(), worker: Mutex::new(None) };
        let heard = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let heard = heard.clone();
            Box::new(move |u: Update| {
                if let Update::Done(result) = u {
                    heard.lock().unwrap().push(result.map(|_| ()).map_err(|e| e.to_string()));
                }
                true
            })
        };
        scheduler.submit(vec![1, 2, 3], GenerateParams::default(), sink).unwrap();
        assert!(scheduler.health().is_ok());
        let panic = catch_unwind(|| panic!("index out of bounds")).unwrap_err();
        fail_worker(&shared, panic_message(&*panic));
        let unhealthy = scheduler.health().unwrap_err();
        assert!(matches!(&unhealthy, SubmitError::EngineFailed(why) if why == "index out of bounds"), "{unhealthy}");
        let refused = scheduler.submit(vec![1], GenerateParams::default(), Box::new(|_| true)).unwrap_err();
        assert!(matches!(&refused, SubmitError::EngineFailed(why) if why == "index out of bounds"), "{refused}");
        let heard = heard.lock().unwrap();
        assert_eq!(heard.len(), 1, "the queued request heard its end");
        assert!(heard[0].as_ref().unwrap_err().contains("internal error") && scheduler.stats().is_empty());
    }
}
