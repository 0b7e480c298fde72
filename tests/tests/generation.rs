//! Generation on the real model: streaming, stop strings, prefix reuse, chunked prefill,
//! cancellation and the context limit.

mod common;

use hillside_engine::{
    generate, CancelFlag, ChatMessage, Engine, Error, Event, FinishReason, GenerateParams, GenerationStream, Logits,
    SamplingParams,
};
use std::sync::Arc;

fn engine() -> Arc<Engine> {
    Arc::new(Engine::load(&common::model_path()).unwrap())
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, sampling: SamplingParams::greedy(), ..GenerateParams::default() }
}

fn texts(events: &[Event]) -> String {
    events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect()
}

#[test]
// (Greedy SmolLM2-135M drifts into French for "…of France?", in candle's reference too.)
fn answers_a_question_and_streams_exactly_the_decoded_text() {
    let engine = engine();
    let prompt = engine.chat_prompt(&[ChatMessage::new("user", "What is the capital of Germany?")]).unwrap();
    let stream = GenerationStream::spawn(engine.clone(), engine.new_sequence(Some(1024)), prompt, greedy(40));
    let events: Vec<Event> = stream.events.iter().collect();
    let (_, summary) = stream.finish();
    let summary = summary.unwrap();
    let streamed = texts(&events);
    assert!(streamed.contains("Berlin"), "{streamed:?}");
    assert_eq!(streamed, engine.tokenizer().decode(&summary.completion_ids).unwrap());
    assert!(matches!(events[0], Event::Prefill { .. }));
}

#[test]
fn stop_strings_end_the_reply_and_are_not_emitted() {
    let engine = engine();
    let prompt = engine.chat_prompt(&[ChatMessage::new("user", "Count from 1 to 10, separated by commas.")]).unwrap();
    let mut seq = engine.new_sequence(Some(1024));
    let mut events = Vec::new();
    let free =
        generate(&engine, &mut seq, &prompt, &greedy(60), &CancelFlag::default(), &mut |e| events.push(e)).unwrap();
    let full = texts(&events);
    assert!(full.contains('5'), "the model should count: {full:?}");
    let cut = full.find('5').unwrap();
    let params = GenerateParams { stop: vec!["5".into()], ..greedy(60) };
    let mut events = Vec::new();
    let stopped =
        generate(&engine, &mut seq, &prompt, &params, &CancelFlag::default(), &mut |e| events.push(e)).unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(texts(&events), full[..cut]);
    assert!(stopped.completion_tokens < free.completion_tokens);
    // The second run reused the cached prompt.
    assert_eq!(stopped.reused_tokens, prompt.len() - 1);
}

#[test]
fn chunked_prefill_gives_the_same_logits_as_one_pass() {
    let engine = engine();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[..20_000]).unwrap()[..700];
    let mut whole = engine.new_sequence(Some(1024));
    let one_pass = engine.model().forward(tokens, whole.kv.as_mut(), Logits::Last).unwrap();
    let mut chunked = engine.new_sequence(Some(1024));
    let mut logits = Vec::new();
    for chunk in tokens.chunks(64) {
        logits = engine.model().forward(chunk, chunked.kv.as_mut(), Logits::Last).unwrap();
    }
    let max_diff = one_pass.iter().zip(&logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "chunking changed the logits by {max_diff}");
}

#[test]
fn a_batch_of_sequences_gives_each_the_logits_it_gets_alone() {
    let engine = engine();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = engine.tokenizer().encode(&text[..10_000]).unwrap();
    let (a, b, c) = (&tokens[..300], &tokens[300..420], &tokens[500..580]);
    let alone = |prefix: &[u32], next: &[u32]| {
        let mut seq = engine.new_sequence(Some(1024));
        engine.model().forward(prefix, seq.kv.as_mut(), Logits::Last).unwrap();
        engine.model().forward(next, seq.kv.as_mut(), Logits::Last).unwrap()
    };
    // Two sequences decoding a token each and a third reading a prompt chunk, in one pass.
    let (mut sa, mut sb, mut sc) =
        (engine.new_sequence(Some(1024)), engine.new_sequence(Some(1024)), engine.new_sequence(Some(1024)));
    hillside_engine::feed_batch(&engine, &mut [(&mut sa, &a[..299]), (&mut sb, &b[..119])]).unwrap();
    let batched =
        hillside_engine::feed_batch(&engine, &mut [(&mut sa, &a[299..]), (&mut sb, &b[119..]), (&mut sc, c)]).unwrap();
    assert_eq!(batched[0], alone(&a[..299], &a[299..]), "batching must not change a sequence's logits");
    assert_eq!(batched[1], alone(&b[..119], &b[119..]));
    assert_eq!(batched[2], alone(&c[..0], c));
    assert_eq!((sa.tokens.len(), sb.tokens.len(), sc.tokens.len()), (300, 120, 80));
    // One sequence over its context fails the pass, and every cache is rolled back.
    let mut small = engine.new_sequence(Some(64));
    let err = hillside_engine::feed_batch(&engine, &mut [(&mut sa, &a[..1]), (&mut small, c)]).unwrap_err();
    assert!(matches!(err, Error::ContextOverflow { .. }), "{err}");
    assert_eq!((sa.tokens.len(), sa.kv.len_tokens(), small.kv.len_tokens()), (300, 300, 0));
}

#[test]
fn the_context_limit_is_a_clear_error_and_length_finishes_cleanly() {
    let engine = engine();
    let text = common::shared_document("gpl-3.0.txt");
    let prompt = engine.tokenizer().encode(&text).unwrap();
    let mut seq = engine.new_sequence(Some(256));
    let err = generate(&engine, &mut seq, &prompt, &greedy(8), &CancelFlag::default(), &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::ContextOverflow { context_tokens: 256, .. }), "{err}");
    assert!(err.to_string().contains("holds 256"), "{err}");
    assert!(seq.tokens.is_empty(), "a refused prompt leaves the sequence as it was");

    // A prompt that fits but leaves little room ends with `length` when the context fills.
    let summary =
        generate(&engine, &mut seq, &prompt[..250], &greedy(100), &CancelFlag::default(), &mut |_| {}).unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(seq.tokens.len(), 256);
}

#[test]
fn cancelling_or_dropping_the_receiver_stops_the_stream() {
    let engine = engine();
    let prompt = engine.chat_prompt(&[ChatMessage::new("user", "Write a long story about a lighthouse.")]).unwrap();
    let params = GenerateParams {
        max_tokens: 400,
        sampling: SamplingParams { seed: Some(1), ..SamplingParams::default() },
        ..GenerateParams::default()
    };
    let stream =
        GenerationStream::spawn(engine.clone(), engine.new_sequence(Some(1024)), prompt.clone(), params.clone());
    let mut seen = 0;
    for event in stream.events.iter() {
        if matches!(event, Event::Text(_)) {
            seen += 1;
            if seen == 3 {
                stream.cancel();
            }
        }
    }
    let (seq, summary) = stream.finish();
    let summary = summary.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Cancelled);
    assert!(summary.completion_tokens < 20, "stopped promptly: {}", summary.completion_tokens);
    assert!(seq.is_some());

    let stream = GenerationStream::spawn(engine.clone(), engine.new_sequence(Some(1024)), prompt, params);
    let first = stream.events.recv().unwrap();
    assert!(matches!(first, Event::Prefill { .. }));
    let (_, summary) = stream.finish(); // drops the receiver first
    assert_eq!(summary.unwrap().finish_reason, FinishReason::Cancelled);
}

/// A chat that is decoding while a long prompt arrives keeps streaming: the long prompt reads
/// `shared_prefill_tokens` a round beside it instead of whole 256-token chunks, so the chat's
/// twelve tokens come before the long prompt's one. With the sharing off, the chunks win.
#[test]
fn a_long_prompt_beside_a_decoding_chat_reads_a_slice_a_round() {
    use hillside_engine::kv::KvConfig;
    use hillside_engine::scheduler::{Scheduler, SchedulerConfig, Update};
    use std::sync::mpsc;
    let engine = engine();
    let chat = engine.chat_prompt(&[ChatMessage::new("user", "Count from 1 to 50, separated by commas.")]).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let long = engine.tokenizer().encode(&text[20_000..40_000]).unwrap()[..1536].to_vec();
    for (shared_prefill_tokens, chat_first) in [(64, true), (0, false)] {
        let config = SchedulerConfig {
            max_live: 2,
            max_queued: 2,
            kv: KvConfig::default(),
            context_tokens: Some(2048),
            cached_sequences: 0,
            shared_prefill_tokens,
        };
        let scheduler = Scheduler::start(engine.clone(), config);
        let (tx, rx) = mpsc::channel();
        for (name, prompt, max_tokens) in [("chat", &chat, 12), ("long", &long, 1)] {
            let tx = tx.clone();
            let sink = Box::new(move |u: Update| match u {
                Update::Done(done) => tx.send((name, done.map(|s| s.completion_tokens))).is_ok(),
                Update::Event(_) => true,
            });
            scheduler.submit(prompt.clone(), greedy(max_tokens), sink).unwrap();
        }
        let done: Vec<_> = rx.iter().take(2).map(|(name, tokens)| (name, tokens.unwrap())).collect();
        assert_eq!(done.iter().find(|(name, _)| *name == "chat").unwrap().1, 12, "the chat ran its length: {done:?}");
        assert_eq!(
            done[0].0 == "chat",
            chat_first,
            "shared_prefill_tokens {shared_prefill_tokens}: finished in the order {done:?}"
        );
    }
}

#[test]
fn a_finished_request_is_counted_before_its_owner_hears_it_is_done() {
    use hillside_engine::kv::KvConfig;
    use hillside_engine::scheduler::{Phase, Scheduler, SchedulerConfig, Update};
    use std::sync::mpsc;
    use std::time::Duration;
    let engine = engine();
    let prompt = engine.tokenizer().encode("Once upon a time, in a valley between two rivers,").unwrap();
    let config = SchedulerConfig {
        max_live: 1,
        max_queued: 1,
        kv: KvConfig::default(),
        context_tokens: Some(512),
        cached_sequences: 1,
        shared_prefill_tokens: 64,
    };
    let scheduler = Scheduler::start(engine, config);
    let (done_tx, done_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    // The owner reads the scheduler while the worker still waits in its callback: what it
    // sees must already hold the finished request.
    let sink = Box::new(move |u: Update| {
        if let Update::Done(done) = u {
            done_tx.send(done.map(|s| s.completion_tokens)).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(300));
        }
        true
    });
    scheduler.submit(prompt.clone(), greedy(8), sink).unwrap();
    let generated = done_rx.recv_timeout(Duration::from_secs(300)).unwrap().unwrap();
    let (totals, stats) = (scheduler.totals(), scheduler.stats());
    release_tx.send(()).unwrap();
    assert_eq!(totals.generated_tokens, generated as u64, "every generated token is counted, the last one too");
    assert!(stats.iter().all(|s| s.phase == Phase::Cached), "the finished request is no longer live: {stats:?}");
    assert!(stats.iter().any(|s| s.prompt_tokens >= prompt.len()), "the cached sequence holds its tokens: {stats:?}");
}

/// A group of eight requests counts as one against the queue's limit: it is taken whole, its
/// members start as slots free, and a request that arrives behind it gets the next free slot
/// rather than waiting for all of them.
#[test]
fn a_group_counts_as_one_queued_request_and_takes_turns_with_the_others() {
    use hillside_engine::kv::KvConfig;
    use hillside_engine::scheduler::{Scheduler, SchedulerConfig, SubmitError, Update};
    use std::sync::mpsc;
    use std::time::Duration;
    let engine = engine();
    let config = SchedulerConfig {
        max_live: 2,
        max_queued: 2,
        kv: KvConfig::default(),
        context_tokens: Some(512),
        cached_sequences: 0,
        shared_prefill_tokens: 64,
    };
    let scheduler = Scheduler::start(engine.clone(), config);
    let prompt = |i: usize| engine.tokenizer().encode(&format!("Write a line about the number {i}.")).unwrap();
    let (tx, rx) = mpsc::channel();
    let sink = |name: String| {
        let tx = tx.clone();
        Box::new(move |u: Update| match u {
            Update::Done(done) => tx.send((name.clone(), done.map(|s| s.completion_tokens))).is_ok(),
            Update::Event(_) => true,
        })
    };
    // A request whose second update holds the worker until the queue is filled, so that
    // nothing starts or ends meanwhile however busy the machine is. (Its first comes as it is
    // taken from the queue; by the second it counts as live.)
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = sink("holder".into());
    let (mut updates, mut hold) = (0, Some((held_tx, release_rx)));
    let holding = Box::new(move |u: Update| {
        updates += 1;
        if let Some((held, release)) = hold.take_if(|_| updates == 2) {
            held.send(()).unwrap();
            let _ = release.recv_timeout(Duration::from_secs(300));
        }
        holder(u)
    });
    scheduler.submit(prompt(99), greedy(16), holding).unwrap();
    held_rx.recv_timeout(Duration::from_secs(300)).unwrap();
    let group = scheduler.open_group().unwrap();
    for i in 0..8 {
        group.submit_with_prefix(prompt(i), None, greedy(16), sink(format!("member {i}"))).unwrap();
    }
    scheduler.submit(prompt(100), greedy(16), sink("chat".into())).unwrap();
    // The holder is live, so one slot is free: the group, the chat and a third fill it and the
    // queue's two places, and a fourth is refused.
    scheduler.submit(prompt(101), greedy(16), sink("other".into())).unwrap();
    assert!(matches!(
        scheduler.submit(prompt(102), greedy(1), sink("refused".into())),
        Err(SubmitError::QueueFull { .. })
    ));
    release_tx.send(()).unwrap();
    let done: Vec<String> = rx
        .iter()
        .take(11)
        .map(|(name, tokens)| {
            assert!(tokens.is_ok(), "{name}: {tokens:?}");
            name
        })
        .collect();
    let at = |name: &str| done.iter().position(|n| n == name).unwrap();
    assert!(
        at("chat") < at("member 7") && at("other") < at("member 7"),
        "the others did not wait for the whole group: {done:?}"
    );
    // A group dropped with members waiting ends them as cancelled.
    let group = scheduler.open_group().unwrap();
    for i in 0..6 {
        group.submit_with_prefix(prompt(i), None, greedy(64), sink(format!("dropped {i}"))).unwrap();
    }
    drop(group);
    let ended: Vec<usize> = rx.iter().take(6).map(|(_, tokens)| tokens.unwrap()).collect();
    assert!(ended.iter().filter(|&&t| t == 0).count() >= 4, "the waiting members ended unstarted: {ended:?}");
}
