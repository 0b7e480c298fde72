//! The generation loop: reuse the cached prefix, prefill the rest in bounded chunks, then decode
//! token by token, streaming text deltas, until a stop token, a stop string, the token limit,
//! the context limit or a cancel.

use crate::error::{Error, Result};
use crate::kv::KvStore;
use crate::model::Logits;
use crate::sampling::{Sampler, SamplingParams};
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
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self { max_tokens: 512, stop: Vec::new(), sampling: SamplingParams::default(), prefill_chunk_tokens: 256 }
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

    /// Drops the cache from `n_tokens` on, keeping `tokens` in step with it.
    fn truncate(&mut self, n_tokens: usize) {
        self.tokens.truncate(n_tokens);
        self.kv.truncate(n_tokens);
    }

    /// Runs `chunk` through the model; on failure the cache is rolled back to what it held.
    fn feed(&mut self, engine: &Engine, chunk: &[u32]) -> Result<Vec<f32>> {
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
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let tokenizer = engine.tokenizer();

    // Reuse the cached prefix; at least the last prompt token is run again for its logits.
    let reused = seq.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
    seq.truncate(reused);

    let prefill_start = Instant::now();
    let mut logits = Vec::new();
    on_event(Event::Prefill { done_tokens: reused, total_tokens: prompt.len() });
    for chunk in prompt[reused..].chunks(params.prefill_chunk_tokens) {
        if cancel.is_cancelled() {
            return Ok(finished(prompt, reused, Vec::new(), FinishReason::Cancelled, prefill_start.elapsed().as_secs_f64() * 1e3, 0.0));
        }
        logits = seq.feed(engine, chunk)?;
        on_event(Event::Prefill { done_tokens: seq.tokens.len(), total_tokens: prompt.len() });
    }
    let prefill_ms = prefill_start.elapsed().as_secs_f64() * 1e3;

    let decode_start = Instant::now();
    let mut generated: Vec<u32> = Vec::new();
    let mut text = TextStream::new();
    let mut stops = StopMatcher::new(&params.stop);
    let mut hit_stop_string = false;
    let reason = loop {
        let recent_start = seq.tokens.len().saturating_sub(params.sampling.repeat_last_n);
        let token = sampler.sample(&mut logits, &seq.tokens[recent_start..], &generated);
        if tokenizer.is_stop(token) {
            break FinishReason::Stop;
        }
        generated.push(token);
        if let Some(delta) = text.push(tokenizer, token)? {
            let (out, hit) = stops.push(&delta);
            if !out.is_empty() {
                on_event(Event::Text(out));
            }
            if hit {
                hit_stop_string = true;
                break FinishReason::Stop;
            }
        }
        if generated.len() >= params.max_tokens || seq.tokens.len() >= context {
            break FinishReason::Length;
        }
        if cancel.is_cancelled() {
            break FinishReason::Cancelled;
        }
        logits = seq.feed(engine, &[token])?;
    };
    if !hit_stop_string {
        // Text the detokenizer and the stop matcher still hold back belongs to the output.
        let mut tail = text.finish(tokenizer)?.map(|rest| stops.push(&rest).0).unwrap_or_default();
        tail.push_str(&stops.finish());
        if !tail.is_empty() {
            on_event(Event::Text(tail));
        }
    }
    Ok(finished(prompt, reused, generated, reason, prefill_ms, decode_start.elapsed().as_secs_f64() * 1e3))
}

fn finished(prompt: &[u32], reused: usize, completion: Vec<u32>, reason: FinishReason, prefill_ms: f64, decode_ms: f64) -> Summary {
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
            Err(_) => (None, Err(Error::Kv("the generation thread stopped unexpectedly".into()))),
        }
    }
}
