//! Questions about a document reuse the K/V its summary computed: from memory in the same run,
//! from the file kept on disk after a restart, and never from a damaged file (it is rebuilt).
//! Each answer equals the one a fresh prefill gives (greedy).

mod common;

use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::library::Library;
use hillside_documents::questions::question;
use hillside_documents::summarize::{summarize, NoCheckpoints, Runner};
use hillside_documents::{read_bytes, Document, Limits};
use hillside_engine::kv::KvConfig;
use hillside_engine::scheduler::SchedulerConfig;
use hillside_engine::{CancelFlag, ChatMessage, Engine, Event, GenerateParams, SamplingParams, Summary};
use hillside_front::EngineFront;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const CONTEXT: usize = 2048;

fn front(engine: &Arc<Engine>, cached_sequences: usize) -> EngineFront {
    let config =
        SchedulerConfig { cached_sequences, ..SchedulerConfig::own_work(KvConfig::default(), Some(CONTEXT), 4) };
    EngineFront::start_local(engine.clone(), config)
}

/// The library and the K/V cache in `dir`, opened as a new process would.
fn open_cache(dir: &Path, quota_bytes: u64) -> Arc<DocumentKvCache> {
    let library = Arc::new(Library::open(&dir.join("library.redb")).unwrap());
    DocumentKvCache::open(library, &dir.join("kv"), quota_bytes, "smollm2-test").unwrap()
}

/// Asks `q` about `doc`; the answer and the generation's counters.
fn ask(runner: &Runner<'_>, doc: &Document, q: &str) -> (String, Summary) {
    let messages = [ChatMessage::new("user", q)];
    let asked = question(runner, &[("doc".to_string(), doc.clone())], &messages).unwrap();
    let params = GenerateParams { max_tokens: 40, sampling: SamplingParams::greedy(), ..GenerateParams::default() };
    let mut text = String::new();
    let done = runner
        .front
        .generate(asked.request, params, &CancelFlag::default(), &mut |event| {
            if let Event::Text(t) = event {
                text.push_str(&t);
            }
        })
        .unwrap();
    (text, done)
}

fn kv_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("kv")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

#[test]
fn a_follow_up_reuses_the_summarys_kv_in_the_same_run_after_a_restart_and_never_from_a_damaged_file() {
    let engine = Arc::new(Engine::load(&common::model_path()).unwrap());
    let gpl = common::shared_document("gpl-3.0.txt");
    let doc = read_bytes("gpl-start.txt", &gpl.as_bytes()[..6000], &Limits::default()).unwrap();
    let q = "Who may copy and distribute this license document?";
    let scratch = tempfile::Builder::new().prefix("hillside-questions-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();

    // Without any reuse: the answer every other run must give.
    let fresh = front(&engine, 0);
    let (expected, plain) = ask(&Runner { front: &fresh, context_tokens: CONTEXT, kv_cache: None }, &doc, q);
    assert_eq!(plain.reused_tokens, 0);
    drop(fresh);

    // The summary keeps the document's K/V; the question in the same run reuses it from memory.
    {
        let cache = open_cache(&dir, 1 << 30);
        let local = front(&engine, 4);
        let runner = Runner { front: &local, context_tokens: CONTEXT, kv_cache: Some(&cache) };
        summarize(&runner, &doc, "doc", &mut NoCheckpoints, &CancelFlag::default(), &mut |_| {}).unwrap();
        assert_eq!(cache.stats.saved.load(Ordering::Relaxed), 1);
        assert_eq!(kv_files(&dir).len(), 1, "{:?}", kv_files(&dir));
        let (answer, reused) = ask(&runner, &doc, q);
        assert_eq!(answer, expected);
        assert_eq!(reused.prompt_tokens, plain.prompt_tokens);
        assert!(
            reused.reused_tokens > 1000 && reused.prompt_tokens - reused.reused_tokens < 40,
            "only the question is prefilled: {reused:?}"
        );
        assert_eq!(cache.stats.loaded.load(Ordering::Relaxed), 0, "from memory, not from disk");
    }

    // After a restart: from the file.
    let reused_after_restart = {
        let cache = open_cache(&dir, 1 << 30);
        let local = front(&engine, 4);
        let runner = Runner { front: &local, context_tokens: CONTEXT, kv_cache: Some(&cache) };
        let (answer, reused) = ask(&runner, &doc, q);
        assert_eq!(answer, expected);
        assert_eq!(cache.stats.loaded.load(Ordering::Relaxed), 1);
        assert!(reused.prompt_tokens - reused.reused_tokens < 40, "only the question is prefilled: {reused:?}");
        reused.reused_tokens
    };

    // A damaged file is found out, never used: the question is prefilled whole, gives the same
    // answer, and the file is written anew.
    let file = kv_files(&dir).remove(0);
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    {
        let cache = open_cache(&dir, 1 << 30);
        let local = front(&engine, 0);
        let runner = Runner { front: &local, context_tokens: CONTEXT, kv_cache: Some(&cache) };
        let (answer, rebuilt) = ask(&runner, &doc, q);
        assert_eq!(answer, expected);
        assert_eq!(rebuilt.reused_tokens, 0);
        assert_eq!((cache.stats.damaged.load(Ordering::Relaxed), cache.stats.saved.load(Ordering::Relaxed)), (1, 1));
        let (_, again) = ask(&runner, &doc, q);
        assert_eq!(again.reused_tokens, reused_after_restart, "the rebuilt file is used");
    }

    // Another model's cache never matches the file.
    {
        let library = Arc::new(Library::open(&dir.join("library.redb")).unwrap());
        let cache = DocumentKvCache::open(library, &dir.join("kv"), 1 << 30, "another-model").unwrap();
        let local = front(&engine, 0);
        let runner = Runner { front: &local, context_tokens: CONTEXT, kv_cache: Some(&cache) };
        let (_, other) = ask(&runner, &doc, q);
        assert_eq!((other.reused_tokens, cache.stats.loaded.load(Ordering::Relaxed)), (0, 0));
        assert_eq!(cache.forget_document("doc"), 2, "both models' files go with the document");
        assert!(kv_files(&dir).is_empty());
    }
}

#[test]
fn the_quota_keeps_the_most_recently_used_files_and_a_killed_save_leaves_nothing_behind() {
    let engine = Arc::new(Engine::load(&common::model_path()).unwrap());
    let gpl = common::shared_document("gpl-3.0.txt");
    let scratch = tempfile::Builder::new().prefix("hillside-quota-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let docs: Vec<Document> = (0..3)
        .map(|i| {
            read_bytes(&format!("part{i}.txt"), &gpl.as_bytes()[i * 1500..(i + 1) * 1500], &Limits::default()).unwrap()
        })
        .collect();
    // Room for two files of these (~350 tokens × 23 KB each), not three.
    {
        let cache = open_cache(&dir, 20 << 20);
        let local = front(&engine, 0);
        let runner = Runner { front: &local, context_tokens: CONTEXT, kv_cache: Some(&cache) };
        for doc in &docs {
            ask(&runner, doc, "What is this about?");
        }
        let (files, bytes) = cache.usage();
        assert_eq!((files, cache.stats.evicted.load(Ordering::Relaxed)), (2, 1), "{bytes} bytes kept");
        assert!(bytes <= 20 << 20);
        let (_, first) = ask(&runner, &docs[0], "What is this about?");
        assert_eq!(first.reused_tokens, 0, "the least recently used went first");
        let (_, last) = ask(&runner, &docs[2], "What is this about?");
        assert!(last.reused_tokens > 300, "{last:?}");
    } // the process ends

    // What a save killed midway leaves (a partial file), and a file no entry names, are
    // removed when the cache opens.
    std::fs::write(dir.join("kv/0123.kv.partial"), b"half").unwrap();
    std::fs::write(dir.join("kv/4567.kv"), b"stray").unwrap();
    let reopened = open_cache(&dir, 20 << 20);
    assert_eq!(kv_files(&dir).len(), 2, "{:?}", kv_files(&dir));
    assert_eq!(reopened.usage().0, 2);
}
