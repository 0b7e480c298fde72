//! The generation loop: reuse the cached prefix, prefill the rest in bounded chunks, then decode
//! token by token, streaming text deltas, until a stop token, a stop string, the token limit,
//! the context limit or a cancel.

use crate::error::{Error, Result};
use crate::kv::KvStore;
use crate::model::{BatchItem, Logits};
use crate::sampling::{Sampler, SamplingParams};
use crate::text::reasoning::{ReasoningFormat, ReasoningSplit};
use crate::text::stop::StopMatcher;
use crate::text::stream::TextStream;
use crate::Engine;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// Prompt tokens run through the model at once; bounds prefill memory.
    pub prefill_chunk_tokens: usize,
    /// Report each drawn token's log-probability and this many alternatives (`Event::Logprob`).
    pub logprobs: Option<usize>,
    /// How the model marks its reasoning, to send it apart (`Event::Reasoning`) from the answer;
    /// `None` sends all text as answer. Chat asks for the tokenizer's format, raw completions not.
    pub reasoning: ReasoningFormat,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            prefill_chunk_tokens: 256,
            logprobs: None,
            reasoning: ReasoningFormat::None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Prompt tokens processed so far (cached ones count as done).
    Prefill { done_tokens: usize, total_tokens: usize },
    /// A piece of generated text, whole characters only.
    Text(String),
    /// A piece of the model's reasoning, before its answer (see [`GenerateParams::reasoning`]).
    Reasoning(String),
    /// A token was drawn (sent before its text, when `GenerateParams::logprobs` asks for it).
    Logprob(TokenLogprob),
}

/// A drawn token's log-probability under the model (before penalties and temperature), with
/// the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
    /// Best first: (token, text, log-probability).
    pub top: Vec<(u32, String, f32)>,
}

impl TokenLogprob {
    fn of(tokenizer: &crate::Tokenizer, logits: &[f32], token: u32, top_n: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_total = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
        let text = |id: u32| tokenizer.decode(&[id]).unwrap_or_default();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let top_n = top_n.min(order.len());
        if top_n > 0 {
            order.select_nth_unstable_by(top_n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            order.truncate(top_n);
            order.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        } else {
            order.clear();
        }
        Self {
            token,
            text: text(token),
            logprob: logits[token as usize] - log_total,
            top: order.into_iter().map(|id| (id, text(id), logits[id as usize] - log_total)).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V were already cached.
    pub reused_tokens: usize,
    pub completion_tokens: usize,
    /// The generated token ids (stop tokens excluded).
    pub completion_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

impl Summary {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        (self.prompt_tokens - self.reused_tokens) as f64 / (self.prefill_ms / 1e3).max(1e-9)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        // The first token comes from the prefill's logits; each later one costs a decode step.
        self.completion_tokens.saturating_sub(1) as f64 / (self.decode_ms / 1e3).max(1e-9)
    }
}

/// One conversation's cache and the tokens it holds.
pub struct Sequence {
    pub kv: Box<dyn KvStore>,
    /// Exactly the tokens whose K/V `kv` holds.
    pub tokens: Vec<u32>,
}

impl Sequence {
    pub fn max_tokens(&self) -> usize {
        self.kv.shape().max_tokens
    }

    /// Drops the cache from `n_tokens` on, keeping `tokens` in step with what it kept (fewer
    /// when part of the cache could not be read back); returns that count.
    fn truncate(&mut self, n_tokens: usize) -> usize {
        let kept = self.kv.truncate(n_tokens);
        self.tokens.truncate(kept);
        kept
    }

    /// Rolls the cache back to the `held` tokens it had before a step that did not finish (one
    /// that failed or panicked midway). `Err` if part of them could not be kept: the sequence
    /// cannot go on where it was.
    pub(crate) fn roll_back_to(&mut self, held: usize) -> Result<()> {
        match self.truncate(held) {
            kept if kept == held => Ok(()),
            kept => Err(Error::TokensLost { lost: held - kept, held }),
        }
    }

    /// Runs `chunk` through the model; on failure the cache is rolled back to what it held.
    pub fn feed(&mut self, engine: &Engine, chunk: &[u32]) -> Result<Vec<f32>> {
        match engine.model().forward(chunk, self.kv.as_mut(), Logits::Last) {
            Ok(logits) => {
                self.tokens.extend_from_slice(chunk);
                Ok(logits)
            }
            Err(e) => {
                let held = self.tokens.len();
                self.truncate(held);
                Err(e)
            }
        }
    }
}

/// A cancel switch shared between the generating thread and whoever wants it to stop.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Generates a continuation of `prompt` in `seq`, calling `on_event` as it goes.
pub fn generate(
    engine: &Engine,
    seq: &mut Sequence,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: &CancelFlag,
    on_event: &mut dyn FnMut(Event),
) -> Result<Summary> {
    let mut generation = Generation::start(seq, prompt.to_vec(), params.clone(), on_event)?;
    loop {
        if cancel.is_cancelled() {
            return Ok(generation.cancelled());
        }
        if let Some(summary) = generation.step(engine, seq, on_event)? {
            return Ok(summary);
        }
    }
}

/// What a generation needs next.
#[derive(Debug)]
pub enum Next {
    /// Run these tokens.
    Feed(Vec<u32>),
    Done(Summary),
}

/// Runs each sequence's tokens in one batched forward pass and returns each one's logits. On
/// an error every cache is rolled back to what it held before.
pub fn feed_batch(engine: &Engine, batch: &mut [(&mut Sequence, &[u32])]) -> Result<Vec<Vec<f32>>> {
    let mut items: Vec<BatchItem<'_>> =
        batch.iter_mut().map(|(seq, tokens)| BatchItem { tokens, kv: seq.kv.as_mut() }).collect();
    let result = engine.model().forward_batch(&mut items, Logits::Last);
    drop(items);
    for (seq, tokens) in batch.iter_mut() {
        match &result {
            Ok(_) => seq.tokens.extend_from_slice(tokens),
            Err(_) => {
                let held = seq.tokens.len();
                seq.truncate(held);
            }
        }
    }
    result
}

/// One generation in progress, advanced a step at a time (a prompt chunk or one token), so a
/// scheduler can run many sequences' steps together in one batch.
pub struct Generation {
    prompt: Vec<u32>,
    params: GenerateParams,
    sampler: Sampler,
    reused: usize,
    /// Logits of the last token run; the next token is drawn from them.
    logits: Vec<f32>,
    generated: Vec<u32>,
    text: TextStream,
    reasoning: ReasoningSplit,
    stops: StopMatcher,
    started: Instant,
    /// Set when the prompt is done.
    prefill_ms: Option<f64>,
}

impl Generation {
    /// Checks the request and rolls `seq` back to the longest cached prefix of `prompt`.
    pub fn start(
        seq: &mut Sequence,
        prompt: Vec<u32>,
        params: GenerateParams,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Self> {
        let context = seq.max_tokens();
        if prompt.is_empty() {
            return Err(Error::InvalidParameter("the prompt is empty".into()));
        }
        if prompt.len() >= context {
            return Err(Error::ContextOverflow { prompt_tokens: prompt.len(), context_tokens: context });
        }
        if params.max_tokens == 0 || params.prefill_chunk_tokens == 0 {
            return Err(Error::InvalidParameter("max_tokens and prefill_chunk_tokens must be at least 1".into()));
        }
        let sampler = Sampler::new(params.sampling.clone())?;
        // Reuse the cached prefix; at least the last prompt token is run again for its logits.
        let shared = seq.tokens.iter().zip(&prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        let reused = seq.truncate(shared);
        on_event(Event::Prefill { done_tokens: reused, total_tokens: prompt.len() });
        Ok(Self {
            stops: StopMatcher::new(&params.stop),
            reasoning: ReasoningSplit::new(params.reasoning),
            prompt,
            params,
            sampler,
            reused,
            logits: Vec::new(),
            generated: Vec::new(),
            text: TextStream::new(),
            started: Instant::now(),
            prefill_ms: None,
        })
    }

    /// Prompt tokens, and tokens generated so far.
    pub fn progress(&self) -> (usize, usize) {
        (self.prompt.len(), self.generated.len())
    }

    pub fn is_prefilling(&self) -> bool {
        self.prefill_ms.is_none()
    }

    /// Runs the next prompt chunk, or draws a token and runs it. Returns the summary once the
    /// generation has ended.
    pub fn step(
        &mut self,
        engine: &Engine,
        seq: &mut Sequence,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Option<Summary>> {
        match self.next_input(engine, seq, on_event)? {
            Next::Done(summary) => Ok(Some(summary)),
            Next::Feed(tokens) => {
                let logits = seq.feed(engine, &tokens)?;
                self.accept(seq, logits, on_event);
                Ok(None)
            }
        }
    }

    /// What to run next: the next prompt chunk, or the token drawn from the last logits (its
    /// text is sent now). `Done` once the generation has ended; the last token drawn is not
    /// run, as nothing would read its logits. Run the tokens (alone with [`Sequence::feed`] or
    /// batched with others' with [`feed_batch`]), then hand the logits to [`Self::accept`].
    pub fn next_input(&mut self, engine: &Engine, seq: &Sequence, on_event: &mut dyn FnMut(Event)) -> Result<Next> {
        if self.prefill_ms.is_none() {
            let done = seq.tokens.len();
            let end = (done + self.params.prefill_chunk_tokens).min(self.prompt.len());
            return Ok(Next::Feed(self.prompt[done..end].to_vec()));
        }
        let tokenizer = engine.tokenizer();
        let recent_start = seq.tokens.len().saturating_sub(self.params.sampling.repeat_last_n);
        let raw = self.params.logprobs.map(|_| self.logits.clone());
        let token = self.sampler.sample(&mut self.logits, &seq.tokens[recent_start..], &self.generated);
        if let (Some(raw), Some(top)) = (raw, self.params.logprobs) {
            on_event(Event::Logprob(TokenLogprob::of(tokenizer, &raw, token, top)));
        }
        if tokenizer.is_stop(token) {
            return self.finish(tokenizer, FinishReason::Stop, on_event).map(Next::Done);
        }
        self.generated.push(token);
        if let Some(delta) = self.text.push(tokenizer, token)? {
            let parts = self.reasoning.push(&delta);
            if !parts.reasoning.is_empty() {
                on_event(Event::Reasoning(parts.reasoning));
            }
            let (out, hit) = self.stops.push(&parts.content);
            if !out.is_empty() {
                on_event(Event::Text(out));
            }
            if hit {
                return Ok(Next::Done(self.summary(FinishReason::Stop)));
            }
        }
        if self.generated.len() >= self.params.max_tokens || seq.tokens.len() >= seq.max_tokens() {
            return self.finish(tokenizer, FinishReason::Length, on_event).map(Next::Done);
        }
        Ok(Next::Feed(vec![token]))
    }

    /// Takes the logits of the tokens [`Self::next_input`] asked for, now that `seq` holds them.
    pub fn accept(&mut self, seq: &Sequence, logits: Vec<f32>, on_event: &mut dyn FnMut(Event)) {
        self.logits = logits;
        if self.prefill_ms.is_none() {
            let done = seq.tokens.len();
            on_event(Event::Prefill { done_tokens: done, total_tokens: self.prompt.len() });
            if done == self.prompt.len() {
                self.prefill_ms = Some(self.started.elapsed().as_secs_f64() * 1e3);
                self.started = Instant::now();
            }
        }
    }

    /// The summary of a generation stopped from outside.
    pub fn cancelled(&self) -> Summary {
        self.summary(FinishReason::Cancelled)
    }

    /// Releases the text the detokenizer and the stop matcher still hold back: it belongs to
    /// the output (unless a stop string ended it, when it is the stop string itself).
    fn finish(
        &mut self,
        tokenizer: &crate::Tokenizer,
        reason: FinishReason,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Summary> {
        let mut parts = self.text.finish(tokenizer)?.map(|rest| self.reasoning.push(&rest)).unwrap_or_default();
        let last = self.reasoning.finish();
        parts.reasoning.push_str(&last.reasoning);
        parts.content.push_str(&last.content);
        if !parts.reasoning.is_empty() {
            on_event(Event::Reasoning(parts.reasoning));
        }
        let mut tail = self.stops.push(&parts.content).0;
        tail.push_str(&self.stops.finish());
        if !tail.is_empty() {
            on_event(Event::Text(tail));
        }
        Ok(self.summary(reason))
    }

    fn summary(&self, reason: FinishReason) -> Summary {
        let elapsed_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let (prefill_ms, decode_ms) = match self.prefill_ms {
            Some(p) => (p, elapsed_ms),
            None => (elapsed_ms, 0.0),
        };
        finished(&self.prompt, self.reused, self.generated.clone(), reason, prefill_ms, decode_ms)
    }
}

pub(crate) fn finished(
    prompt: &[u32],
    reused: usize,
    completion: Vec<u32>,
    reason: FinishReason,
    prefill_ms: f64,
    decode_ms: f64,
) -> Summary {
    Summary {
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        completion_tokens: completion.len(),
        completion_ids: completion,
        finish_reason: reason,
        prefill_ms,
        decode_ms,
    }
}

/// A generation running on its own thread: events arrive on `events`; dropping the receiver or
/// calling `cancel` stops it at the next token.
pub struct GenerationStream {
    pub events: mpsc::Receiver<Event>,
    cancel: CancelFlag,
    worker: std::thread::JoinHandle<(Sequence, Result<Summary>)>,
}

impl GenerationStream {
    pub fn spawn(engine: Arc<Engine>, mut seq: Sequence, prompt: Vec<u32>, params: GenerateParams) -> Self {
        let (tx, events) = mpsc::sync_channel(64);
        let cancel = CancelFlag::default();
        let flag = cancel.clone();
        let worker = std::thread::spawn(move || {
            let mut on_event = |event: Event| {
                if tx.send(event).is_err() {
                    flag.cancel(); // nobody is listening any more
                }
            };
            let result = generate(&engine, &mut seq, &prompt, &params, &flag, &mut on_event);
            (seq, result)
        });
        Self { events, cancel, worker }
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the end; returns the sequence (for reuse; `None` if the thread died) and the summary.
    pub fn finish(self) -> (Option<Sequence>, Result<Summary>) {
        drop(self.events);
        match self.worker.join() {
            Ok((seq, result)) => (Some(seq), result),
            Err(_) => (None, Err(Error::Internal("the generation thread stopped unexpectedly".into()))),
        }
    }
}
