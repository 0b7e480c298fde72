//! The disk-backed KV stores when their cold pool fails: a write error at a chosen layer and
//! group, a short read, a failed read-ahead, a damaged block under a truncation. Each step
//! either fails with a clear error and leaves the sequence as it was, or gives exactly the
//! logits a healthy store gives; never other text.
//!
//! Faults are injected only in builds with debug assertions (the engine's `kv::fault`): a
//! release build has no way to inject them, and these tests do not build there.
#![cfg(debug_assertions)]

mod common;

use hillside_engine::kv::cold::{ColdLayout, GROUP_TOKENS};
use hillside_engine::kv::fault::{self, ColdFaults, FailingRead, FailingWrite};
use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::{generate, CancelFlag, ChatMessage, Engine, Event, GenerateParams, SamplingParams, Sequence};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Linux's errno for an I/O error, and for a full disk.
const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn cold_dir(name: &str) -> common::Scratch {
    common::Scratch::new(&format!("fault-test-{name}"))
}

fn config(store: StoreKind, dir: &Path) -> KvConfig {
    KvConfig { store, cold_dir: dir.to_path_buf(), spare_copy: false, ..KvConfig::default() }
}

/// The one pool file in `dir`.
fn pool_file(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cold"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

#[test]
fn a_failed_spill_loses_nothing_and_the_logits_stay_a_healthy_stores() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[10_000..40_000]).unwrap()[..420];
    for (store, errno) in [(StoreKind::Offload, EIO), (StoreKind::Tiered, ENOSPC), (StoreKind::NearStorage, EIO)] {
        let (healthy_dir, faulty_dir) =
            (cold_dir(&format!("{store:?}-healthy")), cold_dir(&format!("{store:?}-faulty")));
        // Writes of layer 17's group 20 (tokens 320..336) fail twice (an I/O error, or a full
        // disk): the prompt chunk that spills them fails, and so does its first retry; the
        // second retry succeeds.
        fault::inject(
            &faulty_dir,
            ColdFaults {
                failing_write: Some(FailingWrite { layer: 17, group: 20, errno, times: AtomicUsize::new(2) }),
                ..ColdFaults::default()
            },
        );
        let mut healthy = engine.new_sequence_with(&config(store, &healthy_dir), Some(1024)).unwrap();
        let mut faulty = engine.new_sequence_with(&config(store, &faulty_dir), Some(1024)).unwrap();
        let failures = feed_beside_healthy(&format!("{store:?}"), &engine, &mut healthy, &mut faulty, tokens, |e| {
            let message = e.to_string();
            assert!(
                message.contains("cold pool: write failed") && message.contains(&format!("os error {errno}")),
                "{message}"
            );
            assert_eq!(e.is_storage_full(), errno == ENOSPC, "{message}");
            assert!(!message.contains(&*faulty_dir.to_string_lossy()), "no path in the message: {message}");
        });
        assert_eq!(failures, 2, "{store:?}: the injected writes failed the steps that spilled them");
        fault::clear(&faulty_dir);
        drop((healthy, faulty));
        for dir in [healthy_dir, faulty_dir] {
            assert_eq!(common::cold_files(&dir), 0);
        }
    }
}

/// Feeds `tokens` (all but the last 20 in chunks of 100, then those one at a time: 20 decode steps
/// read every spilled block back as well as 100 would) to a healthy sequence
/// and a faulty one side by side, running each step the faulty one fails again until it
/// succeeds. Each failure must pass `check` and leave the sequence as it was; each step's
/// logits must be the healthy sequence's. Returns how many steps failed.
fn feed_beside_healthy(
    what: &str,
    engine: &Engine,
    healthy: &mut Sequence,
    faulty: &mut Sequence,
    tokens: &[u32],
    mut check: impl FnMut(&hillside_engine::Error),
) -> usize {
    let mut failures = 0;
    let prompt = tokens.len() - 20;
    for step in tokens[..prompt].chunks(100).chain(tokens[prompt..].chunks(1)) {
        let want = healthy.feed(engine, step).unwrap();
        let got = loop {
            match faulty.feed(engine, step) {
                Ok(logits) => break logits,
                Err(e) => {
                    failures += 1;
                    check(&e);
                    assert_eq!(
                        faulty.tokens.len(),
                        healthy.tokens.len() - step.len(),
                        "{what}: a failed step leaves the sequence as it was"
                    );
                    assert_eq!(faulty.kv.len_tokens(), faulty.tokens.len());
                }
            }
        };
        assert_eq!(
            want,
            got,
            "{what}: after {} tokens the logits differ from the healthy store's",
            faulty.tokens.len()
        );
    }
    failures
}

/// Flips a byte of the cold pool's group (`layer`, `head`, `group`) behind the store's back.
fn damage_group(dir: &Path, layout: ColdLayout, layer: usize, head: usize, group: usize) {
    let index = layout.group_index(layer, head, group); // no block of this store was relocated
    let offset = (index * layout.group_bytes() + 100) as u64;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(pool_file(dir)).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x5a], offset).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn a_truncation_that_cannot_read_back_keeps_less_and_the_next_turn_answers_as_a_fresh_sequence() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let dir = cold_dir("truncate");
    let params = GenerateParams { max_tokens: 40, sampling: SamplingParams::greedy(), ..GenerateParams::default() };
    let run = |seq: &mut Sequence, prompt: &[u32]| {
        let mut text = String::new();
        let summary = generate(&engine, seq, prompt, &params, &CancelFlag::default(), &mut |e| {
            if let Event::Text(t) = e {
                text.push_str(&t);
            }
        })
        .unwrap();
        (text, summary.reused_tokens)
    };
    let first = engine
        .chat_prompt(&[ChatMessage::new("user", "Name three rivers of Europe and say where each one rises.")])
        .unwrap();
    let second = engine.chat_prompt(&[ChatMessage::new("user", "Name three rivers of Africa.")]).unwrap();
    let (fresh, _) = run(&mut engine.new_sequence(Some(1024)), &second);
    for store in [StoreKind::Offload, StoreKind::NearStorage] {
        let mut seq = engine.new_sequence_with(&config(store, &dir), Some(1024)).unwrap();
        run(&mut seq, &first);
        let shared = first.iter().zip(&second).take_while(|(a, b)| a == b).count();
        assert!(
            shared % GROUP_TOKENS != 0 && seq.kv.stats().cold_bytes > shared * 23_040,
            "the cut falls inside a spilled group"
        );
        // The next turn cuts the cache inside group `shared / 16`, which must be read back: damage it.
        let shape = engine.model().kv_shape(1024);
        let layout = ColdLayout::f16(shape.n_layers, shape.n_kv_heads, shape.head_dim, 1024 / GROUP_TOKENS);
        damage_group(&dir, layout, 12, 1, shared / GROUP_TOKENS);
        let (answer, reused) = run(&mut seq, &second);
        assert_eq!(
            reused,
            shared / GROUP_TOKENS * GROUP_TOKENS,
            "{store:?}: the sequence keeps the whole groups before the damaged one"
        );
        // Near-storage attention splits the sum where the cold pool ends, so its last bits
        // (and so its greedy text) follow what is cold: the reference is the same store given
        // the kept prefix, then the turn. Offload's attention is full's, bit for bit.
        let mut kept_first = engine.new_sequence_with(&config(store, &dir.join("reference")), Some(1024)).unwrap();
        kept_first.feed(&engine, &second[..reused]).unwrap();
        assert_eq!(answer, run(&mut kept_first, &second).0, "{store:?}");
        if store == StoreKind::Offload {
            assert_eq!(answer, fresh);
        }
    }
}

#[test]
fn a_short_read_fails_the_step_and_leaves_the_sequence_as_it_was() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[60_000..80_000]).unwrap()[..700];
    let dir = cold_dir("short-read");
    for store in [StoreKind::Offload, StoreKind::Tiered, StoreKind::NearStorage] {
        let mut seq = engine.new_sequence_with(&config(store, &dir), Some(1024)).unwrap();
        seq.feed(&engine, &tokens[..640]).unwrap();
        // The file loses everything past its first page: every later group reads short.
        std::fs::OpenOptions::new().write(true).open(pool_file(&dir)).unwrap().set_len(4096).unwrap();
        // Offload and near-storage read every group each step; tiered only the cold ones its
        // selection needs.
        let failed = tokens[640..].iter().find_map(|&t| seq.feed(&engine, &[t]).err().map(|e| (e, seq.tokens.len())));
        let (error, held) = failed.unwrap_or_else(|| panic!("{store:?}: no step read the cold pool"));
        let message = error.to_string();
        assert!(message.contains("cold pool: read failed"), "{store:?}: {message}");
        assert!(!message.contains(&*dir.to_string_lossy()), "no path in the message: {message}");
        assert_eq!(seq.kv.len_tokens(), held, "{store:?}: the failed step is rolled back");
    }
}

#[test]
fn a_failed_read_ahead_is_read_again_at_the_layers_turn() {
    // The tiered store reads a layer's likely groups while the layer before it computes. A read
    // of layer 10 fails once per step from the fifth decode step on: when it is the read-ahead
    // that fails, the layer reads those groups itself and the step goes on; when it is the
    // layer's own read, the step fails and is rolled back. Either way every step's logits are
    // a healthy store's.
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[20_000..50_000]).unwrap()[..650];
    let (healthy_dir, faulty_dir) = (cold_dir("read-ahead-healthy"), cold_dir("read-ahead-faulty"));
    let plan = fault::inject(
        &faulty_dir,
        ColdFaults {
            failing_read: Some(FailingRead { layer: 10, errno: EIO, times: AtomicUsize::new(0) }),
            ..ColdFaults::default()
        },
    );
    let failing = plan.failing_read.as_ref().unwrap();
    let mut healthy = engine.new_sequence_with(&config(StoreKind::Tiered, &healthy_dir), Some(1024)).unwrap();
    let mut faulty = engine.new_sequence_with(&config(StoreKind::Tiered, &faulty_dir), Some(1024)).unwrap();
    let (mut recovered, mut failed) = (0, 0);
    for (i, step) in tokens[..600].chunks(100).chain(tokens[600..].chunks(1)).enumerate() {
        let want = healthy.feed(&engine, step).unwrap();
        failing.times.store(usize::from(i >= 10), Ordering::Relaxed);
        let got = match faulty.feed(&engine, step) {
            Ok(logits) => {
                recovered += usize::from(failing.times.load(Ordering::Relaxed) == 0 && i >= 10);
                logits
            }
            Err(e) => {
                failed += 1;
                assert!(e.to_string().contains("cold pool: read failed"), "{e}");
                assert_eq!(
                    faulty.tokens.len(),
                    healthy.tokens.len() - step.len(),
                    "a failed step leaves the sequence as it was"
                );
                faulty.feed(&engine, step).unwrap()
            }
        };
        assert_eq!(want, got, "after {} tokens the logits differ from the healthy store's", faulty.tokens.len());
    }
    assert!(recovered > 0, "no read-ahead of layer 10 failed (own reads failed {failed} times)");
    fault::clear(&faulty_dir);
    drop((healthy, faulty));
}

/// Near-storage with the X-cache (SmolLM2 copied as multi-head attention, so that half its layers
/// keep their inputs in a pool file of their own): a failed spill of both pools loses nothing,
/// and a damaged or cut-short X pool fails the step with a clear error and rolls it back.
#[test]
fn the_x_cache_pool_fails_as_cleanly_as_the_k_v_pool() {
    let work = cold_dir("x-cache");
    let mha = work.join("smollm2-mha.gguf");
    assert_eq!(common::mha::write_mha_copy(&common::model_path(), &mha).unwrap(), (3, 9));
    let engine = Engine::load(&mha).unwrap();
    let c = &engine.model().config;
    let x_cache = |dir: &Path| KvConfig { x_cache_share: 0.5, ..config(StoreKind::NearStorage, dir) };
    let plan = x_cache(&work).x_cache_plan(c.kv_shape(1024), c.hidden_size);
    assert_eq!(plan.layers, 15, "{plan}");
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[10_000..40_000]).unwrap()[..420];

    // Writes of group 20 (tokens 320..336) of pool layer 5 fail once in each pool file: the X
    // of model layer 5, the K/V of model layer 20. The chunk that spills them fails; its retry
    // succeeds and every step's logits are the healthy store's.
    let (healthy_dir, faulty_dir) = (work.join("healthy"), work.join("faulty"));
    fault::inject(
        &faulty_dir,
        ColdFaults {
            failing_write: Some(FailingWrite { layer: 5, group: 20, errno: EIO, times: AtomicUsize::new(2) }),
            ..ColdFaults::default()
        },
    );
    let mut healthy = engine.new_sequence_with(&x_cache(&healthy_dir), Some(1024)).unwrap();
    let mut faulty = engine.new_sequence_with(&x_cache(&faulty_dir), Some(1024)).unwrap();
    assert_eq!(common::cold_files(&faulty_dir), 2, "a K/V pool and an X pool");
    let failures = feed_beside_healthy("X-cache", &engine, &mut healthy, &mut faulty, tokens, |e| {
        assert!(e.to_string().contains("cold pool: write failed"), "{e}")
    });
    assert_eq!(failures, 1, "both injected writes failed the one chunk that spilled them");
    fault::clear(&faulty_dir);
    drop(faulty);

    // The X pool is the smaller file (one lane per layer against nine): damage one of its
    // groups, and the next step, which reads every X, fails its checksum.
    let mut files: Vec<PathBuf> = std::fs::read_dir(&healthy_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cold"))
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let x_pool = std::fs::OpenOptions::new().read(true).write(true).open(&files[0]).unwrap();
    let held = healthy.tokens.len();
    x_pool.write_all_at(&[0xa5; 64], 3 * 20_480 + 100).unwrap();
    let error = healthy.feed(&engine, &tokens[..1]).unwrap_err().to_string();
    assert!(error.contains("cold pool block damaged: layer 0, KV head 0, tokens 48..64"), "{error}");
    assert_eq!((healthy.tokens.len(), healthy.kv.len_tokens()), (held, held), "the failed step is rolled back");
    // Cut short, it fails the step with a read error.
    x_pool.set_len(4096).unwrap();
    let error = healthy.feed(&engine, &tokens[..1]).unwrap_err().to_string();
    assert!(error.contains("cold pool: read failed") || error.contains("cold pool block damaged"), "{error}");
    drop(healthy);
    assert_eq!(
        common::cold_files(&healthy_dir) + common::cold_files(&faulty_dir),
        0,
        "the pool files go with their stores"
    );
}
