//! Every KV store on the real model against the full in-memory cache.

mod common;

use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::{generate, CancelFlag, ChatMessage, Engine, Event, GenerateParams, Logits, SamplingParams};

fn cold_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hillside-kv-test-{name}-{}", std::process::id()))
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn offload_store_reproduces_the_full_cache_exactly_and_cleans_up() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[..30_000]).unwrap()[..600];
    let dir = cold_dir("offload");
    let offload = KvConfig { store: StoreKind::Offload, cold_dir: dir.clone() };

    let mut full = engine.new_sequence(Some(1024));
    let mut cold = engine.new_sequence_with(&offload, Some(1024)).unwrap();
    assert_eq!(files_in(&dir), 1, "one cold-pool file per sequence");
    // A chunked prompt, then teacher-forced single steps (crossing several group boundaries).
    for chunk in tokens[..500].chunks(128) {
        let a = engine.model().forward(chunk, full.kv.as_mut(), Logits::Last).unwrap();
        let b = engine.model().forward(chunk, cold.kv.as_mut(), Logits::Last).unwrap();
        assert_eq!(a, b, "prefill logits differ");
    }
    for &t in &tokens[500..] {
        let a = engine.model().forward(&[t], full.kv.as_mut(), Logits::Last).unwrap();
        let b = engine.model().forward(&[t], cold.kv.as_mut(), Logits::Last).unwrap();
        assert_eq!(a, b, "decode logits differ");
    }
    let stats = cold.kv.stats();
    assert_eq!(stats.tokens, 600);
    assert!(stats.cold_bytes_read > 0 && stats.cold_bytes >= 592 * 23_040, "{stats:?}");
    drop(cold);
    assert_eq!(files_in(&dir), 0, "the cold file goes with the sequence");
}

#[test]
fn offload_store_reuses_and_truncates_prefixes_like_the_full_cache() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let dir = cold_dir("reuse");
    let offload = KvConfig { store: StoreKind::Offload, cold_dir: dir.clone() };
    let params = GenerateParams { max_tokens: 24, sampling: SamplingParams::greedy(), ..GenerateParams::default() };
    let run = |seq: &mut hillside_engine::Sequence, question: &str| {
        let prompt = engine.chat_prompt(&[ChatMessage::new("user", question)]).unwrap();
        let mut text = String::new();
        let summary = generate(&engine, seq, &prompt, &params, &CancelFlag::default(), &mut |e| {
            if let Event::Text(t) = e {
                text.push_str(&t);
            }
        })
        .unwrap();
        (text, summary.reused_tokens)
    };
    let mut full = engine.new_sequence(Some(1024));
    let mut cold = engine.new_sequence_with(&offload, Some(1024)).unwrap();
    for question in ["What is the capital of Germany?", "What is the capital of Italy?", "What is the capital of Germany?"] {
        let (a, reused_a) = run(&mut full, question);
        let (b, reused_b) = run(&mut cold, question);
        assert_eq!(a, b, "{question}");
        assert_eq!(reused_a, reused_b);
    }
}
