//! Every KV store on the real model against the full in-memory cache.

mod common;

use hillside_bench::fidelity::{kl_divergence, likely_deviation, teacher_forced, teacher_forced_from, TeacherForced};
use hillside_engine::kernels::attention::{attend, k_tile_index};
use hillside_engine::kv::cold::format::ColdType;
use hillside_engine::kv::cold::placement::PlacementKind;
use hillside_engine::kv::{
    HeadsPart, KvConfig, KvShape, KvStore, KvView, Queries, Selection, SelectorKind, StoreKind, TierStats,
};
use hillside_engine::sampling::argmax;
use hillside_engine::{generate, CancelFlag, ChatMessage, Engine, Event, GenerateParams, Logits, SamplingParams};

/// The `KvStore` methods that a test's wrapper of a store (its `inner`) passes on unchanged.
macro_rules! forward_to_inner {
    () => {
        fn shape(&self) -> KvShape {
            self.inner.shape()
        }
        fn len_tokens(&self) -> usize {
            self.inner.len_tokens()
        }
        fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> hillside_engine::error::Result<()> {
            self.inner.append(layer, k, v)
        }
        fn select(&mut self, layer: usize, queries: &Queries<'_>) -> hillside_engine::error::Result<Selection> {
            self.inner.select(layer, queries)
        }
        fn observe(&mut self, layer: usize, selection: &Selection) {
            self.inner.observe(layer, selection)
        }
        fn commit(&mut self, n_tokens: usize) -> hillside_engine::error::Result<()> {
            self.inner.commit(n_tokens)
        }
        fn truncate(&mut self, n_tokens: usize) -> usize {
            self.inner.truncate(n_tokens)
        }
        fn stats(&self) -> hillside_engine::kv::KvStats {
            self.inner.stats()
        }
    };
}

fn cold_dir(name: &str) -> common::Scratch {
    common::Scratch::new(&format!("kv-test-{name}"))
}

#[test]
fn offload_store_reproduces_the_full_cache_exactly_and_cleans_up() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[..30_000]).unwrap()[..600];
    let dir = cold_dir("offload");
    let offload = KvConfig { store: StoreKind::Offload, cold_dir: dir.to_path_buf(), ..KvConfig::default() };

    let mut full = engine.new_sequence(Some(1024));
    let mut cold = engine.new_sequence_with(&offload, Some(1024)).unwrap();
    assert_eq!(common::cold_files(&dir), 1, "one cold-pool file per sequence");
    // A chunked prompt, then teacher-forced single steps (crossing several group boundaries).
    for chunk in tokens[..500].chunks(128) {
        let a = engine.model().forward(chunk, full.kv.as_mut(), Logits::Last).unwrap();
        let b = engine.model().forward(chunk, cold.kv.as_mut(), Logits::Last).unwrap();
        assert_eq!(a, b, "prefill logits differ");
    }
    // Each decode step reads every (layer, KV head)'s cold groups, which lie one after another
    // in the file: one request each.
    let lanes = (cold.kv.shape().n_layers * cold.kv.shape().n_kv_heads) as u64;
    for &t in &tokens[500..] {
        let reads_before = cold.kv.stats().cold_reads;
        let a = engine.model().forward(&[t], full.kv.as_mut(), Logits::Last).unwrap();
        let b = engine.model().forward(&[t], cold.kv.as_mut(), Logits::Last).unwrap();
        assert_eq!(a, b, "decode logits differ");
        assert_eq!(cold.kv.stats().cold_reads - reads_before, lanes, "read requests of a decode step");
    }
    let stats = cold.kv.stats();
    assert_eq!(stats.tokens, 600);
    assert!(stats.cold_bytes_read > 0 && stats.cold_bytes >= 592 * 23_040, "{stats:?}");
    drop(cold);
    assert_eq!(common::cold_files(&dir), 0, "the cold file goes with the sequence");
}

#[test]
fn a_cold_pool_over_two_directories_gives_the_logits_of_one() {
    // HILOS's scale-out: the KV heads dealt across two directories (two SSDs; here one disk).
    // Where a head's groups lie changes no bit, and each directory serves its heads' reads.
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[20_000..50_000]).unwrap()[..640];
    let (one, a, b) = (cold_dir("one-dir"), cold_dir("two-dirs-a"), cold_dir("two-dirs-b"));
    for store in [StoreKind::Tiered, StoreKind::Offload] {
        let single = KvConfig { store, cold_dir: one.to_path_buf(), spare_copy: false, ..KvConfig::default() };
        let split = KvConfig { cold_dir: a.to_path_buf(), extra_cold_dirs: vec![b.to_path_buf()], ..single.clone() };
        let mut seq_one = engine.new_sequence_with(&single, Some(1024)).unwrap();
        let mut seq_two = engine.new_sequence_with(&split, Some(1024)).unwrap();
        assert_eq!((common::cold_files(&a), common::cold_files(&b)), (1, 1), "a file in each directory");
        for step in tokens[..600].chunks(200).chain(tokens[600..].chunks(1)) {
            let want = engine.model().forward(step, seq_one.kv.as_mut(), Logits::Last).unwrap();
            let got = engine.model().forward(step, seq_two.kv.as_mut(), Logits::Last).unwrap();
            assert_eq!(want, got, "{store:?}");
        }
        let (stats_one, stats_two) = (seq_one.kv.stats(), seq_two.kv.stats());
        assert_eq!(stats_one.cold_bytes_read, stats_two.cold_bytes_read, "{store:?}");
        // SmolLM2's 3 KV heads: 0 and 2 in the first directory, 1 in the second.
        let per_dir = &stats_two.cold_bytes_read_per_dir;
        assert_eq!(per_dir.iter().sum::<u64>(), stats_two.cold_bytes_read);
        assert!(per_dir[1] > 0 && per_dir[0] > per_dir[1], "{store:?}: {per_dir:?}");
        drop((seq_one, seq_two));
        assert_eq!(common::cold_files(&a) + common::cold_files(&b), 0);
    }
}

#[test]
fn a_q8_cold_pool_reads_five_eighths_of_the_bytes_and_stays_close_to_full() {
    // Offload attends to every token, so what differs from full is q8's rounding alone, and
    // every step reads the whole pool: exactly 2,560 bytes a group instead of 4,096.
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[60_000..90_000]).unwrap()[..640];
    let dir = cold_dir("q8");
    let offload = |cold_type| KvConfig {
        store: StoreKind::Offload,
        cold_dir: dir.to_path_buf(),
        cold_type,
        ..KvConfig::default()
    };
    let mut full = engine.new_sequence(Some(1024));
    let reference = teacher_forced(&engine, &mut full, tokens, 512, 256, |_| {}).unwrap();
    let mut read = Vec::new();
    for cold_type in [ColdType::F16, ColdType::Q8] {
        let mut seq = engine.new_sequence_with(&offload(cold_type), Some(1024)).unwrap();
        let run = teacher_forced(&engine, &mut seq, tokens, 512, 256, |_| {}).unwrap();
        let ppl_change = run.perplexity() / reference.perplexity() - 1.0;
        let agree = run.top1_agreement(&reference);
        eprintln!("{cold_type}: perplexity {:+.3}%, top-1 agreement {:.1}%", 100.0 * ppl_change, 100.0 * agree);
        if cold_type == ColdType::F16 {
            assert_eq!((ppl_change, agree), (0.0, 1.0), "f16 is exact");
        } else {
            // Measured here: −1.7% perplexity and 96.9% top-1 over these 128 tokens (a last-bit
            // difference alone flips about 2%); a wrong scale or a misplaced group is far off.
            assert!(ppl_change.abs() < 0.03 && agree >= 0.94, "q8: {:+.3}%, {agree}", 100.0 * ppl_change);
        }
        read.push(seq.kv.stats().cold_bytes_read);
    }
    assert_eq!(read[1] * 8, read[0] * 5, "q8 reads 2,560 bytes a group where f16 reads 4,096: {read:?}");

    // The tiered store stages q8 groups as the pool keeps them and decodes only the rows it
    // copies. Its selections come from the scoring keys, not the pool, so both types read
    // nearly the same groups (q8's rounding moves later queries a little); what differs is
    // the rounding of the rows read and of those promoted.
    let tiered = |cold_type| KvConfig {
        store: StoreKind::Tiered,
        cold_dir: dir.to_path_buf(),
        cold_type,
        spare_copy: false,
        ..KvConfig::default()
    };
    let mut runs = Vec::new();
    for cold_type in [ColdType::F16, ColdType::Q8] {
        let mut seq = engine.new_sequence_with(&tiered(cold_type), Some(1024)).unwrap();
        let run = teacher_forced(&engine, &mut seq, tokens, 512, 128, |_| {}).unwrap();
        let stats = seq.kv.stats();
        assert!(stats.tier.as_ref().unwrap().cold_hits > 0, "{cold_type}: rows came from the cold pool");
        runs.push((run, stats.cold_bytes_read));
    }
    let ((f16, f16_read), (q8, q8_read)) = (&runs[0], &runs[1]);
    let (ppl_change, agree) = (q8.perplexity() / f16.perplexity() - 1.0, q8.top1_agreement(f16));
    let nll_gap = q8.nll.iter().zip(&f16.nll).map(|(a, b)| (a - b).abs()).sum::<f64>() / q8.nll.len() as f64;
    eprintln!(
        "tiered q8 against tiered f16: perplexity {:+.3}%, top-1 agreement {:.1}%, mean |Δ log p| {nll_gap:.4}",
        100.0 * ppl_change,
        100.0 * agree
    );
    let read_share = *q8_read as f64 / *f16_read as f64;
    assert!((read_share - 0.625).abs() < 0.005, "the same groups, at 2,560 bytes instead of 4,096: {read_share}");
    // Measured here: +0.26% perplexity, 94.5% top-1 and a mean |Δ log p| of 0.070 over these
    // 128 tokens. Decoding each row's neighbour in its place (its K or its V) gave 0.14–0.17.
    assert!(
        ppl_change.abs() < 0.03 && agree >= 0.9 && nll_gap < 0.1,
        "tiered q8: {:+.3}%, {agree}, {nll_gap}",
        100.0 * ppl_change
    );
    assert_eq!(common::cold_files(&dir), 0);
}

#[test]
fn offload_store_reuses_and_truncates_prefixes_like_the_full_cache() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let dir = cold_dir("reuse");
    let offload = KvConfig { store: StoreKind::Offload, cold_dir: dir.to_path_buf(), ..KvConfig::default() };
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
    for question in
        ["What is the capital of Germany?", "What is the capital of Italy?", "What is the capital of Germany?"]
    {
        let (a, reused_a) = run(&mut full, question);
        let (b, reused_b) = run(&mut cold, question);
        assert_eq!(a, b, "{question}");
        assert_eq!(reused_a, reused_b);
    }
}

/// A store that attends itself, checked at every call: its output against attention over all
/// of its own K/V at once (the view it gathers for a saved prompt), with the step's real
/// queries — prompt chunks with their causal masks, and decode steps.
struct CheckedAttention {
    inner: Box<dyn KvStore>,
    seen: std::sync::Arc<std::sync::Mutex<Checked>>,
}

#[derive(Default)]
struct Checked {
    /// The largest difference seen, relative to the largest output value of its call.
    worst_relative: f32,
    calls: usize,
}

impl CheckedAttention {
    fn attention_over_everything(
        &mut self,
        layer: usize,
        q: &[f32],
        q_positions: &[usize],
        n_heads: usize,
    ) -> Vec<f32> {
        let shape = self.inner.shape();
        let (group, hd) = (n_heads / shape.n_kv_heads, shape.head_dim);
        let mut out = vec![0f32; q.len()];
        for head in 0..shape.n_kv_heads {
            let view = self.inner.gather(layer, &Selection::All, head..head + 1).unwrap();
            let columns = head * group * hd..(head + 1) * group * hd;
            let part_q: Vec<f32> =
                q.chunks_exact(n_heads * hd).flat_map(|row| &row[columns.clone()]).copied().collect();
            let mut part_out = vec![0f32; part_q.len()];
            attend(&part_q, q_positions, group, &view, &mut part_out);
            for (row, part) in out.chunks_exact_mut(n_heads * hd).zip(part_out.chunks_exact(group * hd)) {
                row[columns.clone()].copy_from_slice(part);
            }
        }
        out
    }
}

impl KvStore for CheckedAttention {
    forward_to_inner!();
    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        self.inner.parts(selection, cached_tokens)
    }
    fn attend(
        &mut self,
        layer: usize,
        queries: &Queries<'_>,
        out: &mut [f32],
    ) -> Option<hillside_engine::error::Result<()>> {
        if let Err(e) = self.inner.attend(layer, queries, out)? {
            return Some(Err(e));
        }
        let want = self.attention_over_everything(layer, queries.q, queries.positions, queries.n_heads);
        let worst = want.iter().zip(out.iter()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let scale = want.iter().map(|a| a.abs()).fold(f32::MIN_POSITIVE, f32::max);
        let mut seen = self.seen.lock().unwrap();
        seen.worst_relative = seen.worst_relative.max(worst / scale);
        seen.calls += 1;
        Some(Ok(()))
    }
    fn gather(
        &mut self,
        layer: usize,
        selection: &Selection,
        heads: std::ops::Range<usize>,
    ) -> hillside_engine::error::Result<hillside_engine::kv::KvView<'_>> {
        self.inner.gather(layer, selection, heads)
    }
}

#[test]
fn near_storage_attention_is_exact_and_hands_up_only_partials() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[90_000..120_000]).unwrap()[..700];
    let dir = cold_dir("near-storage");
    let config = |store| KvConfig { store, cold_dir: dir.to_path_buf(), ..KvConfig::default() };
    let shape = engine.model().kv_shape(1024);
    let seen = std::sync::Arc::default();
    let near = CheckedAttention {
        inner: config(StoreKind::NearStorage).build(shape, None).unwrap(),
        seen: std::sync::Arc::clone(&seen),
    };
    let mut near = hillside_engine::Sequence { kv: Box::new(near), tokens: Vec::new() };
    // A prompt in chunks (the later ones attend to spilled tokens on the storage side), then
    // 200 decode steps crossing a dozen spills.
    let exact = teacher_forced(&engine, &mut near, tokens, 500, 128, |_| {}).unwrap();
    let mut full = engine.new_sequence(Some(1024));
    let reference = teacher_forced(&engine, &mut full, tokens, 500, 128, |_| {}).unwrap();
    let mut offload = engine.new_sequence_with(&config(StoreKind::Offload), Some(1024)).unwrap();
    teacher_forced(&engine, &mut offload, tokens, 500, 128, |_| {}).unwrap();
    let (near_stats, offload_stats) = (near.kv.stats(), offload.kv.stats());

    // Every layer of every step: the merged partials are attention over every token at once,
    // up to the order of float sums.
    let seen: std::sync::MutexGuard<Checked> = seen.lock().unwrap();
    assert_eq!(seen.calls, 30 * (4 + 200));
    assert!(seen.worst_relative < 1e-5, "attention differs by {} of its largest value", seen.worst_relative);
    // End to end, those last-bit differences pass through the int8 roundings of later layers'
    // activations, as any other order of sums would (`hillside eval` measures the effect).
    let agree = exact.top1_agreement(&reference);
    eprintln!(
        "near-storage against full: perplexity {:+.2}%, top-1 {:.1}%",
        100.0 * (exact.perplexity() / reference.perplexity() - 1.0),
        100.0 * agree
    );
    assert!(agree >= 0.9, "top-1 agreement with full {agree}");

    // What crosses to the host: per layer and query row with cold tokens to attend (every row
    // after the first prompt chunk), n_heads × (head_dim + 2) floats; offload moves the cache.
    // The storage side reads the whole cache a step, as offload does; the check's gathers as much again.
    assert_eq!(near_stats.cold_bytes_read, 2 * offload_stats.cold_bytes_read);
    assert_eq!(near_stats.bytes_to_host, (700 - 128) * 30 * 9 * 66 * 4, "{near_stats:?}");
    assert!(
        8 * near_stats.bytes_to_host <= offload_stats.cold_bytes_read,
        "partials are under an eighth of offload's reads: {near_stats:?}"
    );
    assert_eq!(common::cold_files(&dir), 2, "near-storage and offload each have a pool file");
}

#[test]
fn with_memory_to_spare_the_tiered_store_attends_through_a_dense_copy_exactly_as_full() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[30_000..60_000]).unwrap()[..700];
    let dir = cold_dir("spare");
    let tiered = KvConfig { store: StoreKind::Tiered, cold_dir: dir.to_path_buf(), ..KvConfig::default() };
    let mut full = engine.new_sequence(Some(1024));
    let mut spare = engine.new_sequence_with(&tiered, Some(1024)).unwrap();
    for step in std::iter::once(&tokens[..600]).chain(tokens[600..].chunks(1)) {
        let a = engine.model().forward(step, full.kv.as_mut(), Logits::Last).unwrap();
        let b = engine.model().forward(step, spare.kv.as_mut(), Logits::Last).unwrap();
        assert_eq!(a, b, "the copy is the full cache: the logits are the same to the bit");
    }
    let stats = spare.kv.stats();
    let tier = stats.tier.clone().unwrap();
    // This machine has memory to spare (a 1,024-token cache is 24 MB): the copy was kept, every
    // decode step attended through it, and the tiers were filled all the same.
    assert_eq!((tier.spare_copy_steps, tier.spare_copy_bytes), (100, 700 * 23_040), "{tier:?}");
    assert_eq!((stats.cold_bytes_read, tier.hot_hits + tier.cold_hits), (0, 0), "nothing ranked or read: {stats:?}");
    assert!(stats.cold_bytes >= 688 * 23_040 && tier.hot_bytes > 0, "the tiers hold every token as well: {stats:?}");
    drop(spare);
    assert_eq!(common::cold_files(&dir), 0);
}

#[test]
fn a_tiered_stores_reads_come_in_pieces_whose_staging_the_budget_holds() {
    use hillside_engine::kv::stores::tiered::TieredKvStore;
    // A layer's cold pool takes 16 MiB, more than the read-ahead and a layer's own pieces stage
    // together, and in text order the tokens a step selects (their keys repeat every 13 tokens)
    // lie in every group of it: its reads take several pieces.
    const SHAPE: KvShape = KvShape { n_layers: 3, n_kv_heads: 4, head_dim: 128, max_tokens: 8192 };
    let dir = cold_dir("pieces");
    let config = KvConfig {
        store: StoreKind::Tiered,
        cold_dir: dir.to_path_buf(),
        hot_budget_bytes: Some(36_000_000),
        placement: PlacementKind::Position,
        spare_copy: false,
        ..KvConfig::default()
    };
    let mut store = TieredKvStore::new(SHAPE, &[dir.to_path_buf()], config.tiered_settings(SHAPE), None).unwrap();
    common::tagged::fill(&mut store, 8064, 896);
    for step in 0..4 {
        let read_before = store.stats().cold_bytes_read;
        common::tagged::decode_step(&mut store);
        let stats = store.stats();
        let tier = stats.tier.unwrap();
        assert!(tier.hot_bytes <= tier.hot_budget_bytes, "step {step}: over budget, read staging included: {tier:?}");
        if step == 0 {
            // Nothing was read before: each of the step's two sparse layers read most of its groups.
            let read = stats.cold_bytes_read - read_before;
            assert!(read > 24 << 20, "reads of several pieces: {read} bytes");
        }
    }
}

/// 1,536 tokens of the book and the full cache's teacher-forced pass over their last 256 (after a
/// 1,280-token prompt): the reference both the tiered store's fidelity tests compare with,
/// computed once for the two.
fn book_reference(engine: &Engine) -> (&'static [u32], &'static TeacherForced) {
    static REFERENCE: std::sync::OnceLock<(Vec<u32>, TeacherForced)> = std::sync::OnceLock::new();
    let (tokens, reference) = REFERENCE.get_or_init(|| {
        let text = common::shared_document("pride-and-prejudice.txt");
        let tokens = engine.tokenizer().encode(&text[50_000..90_000]).unwrap()[..1536].to_vec();
        let mut full = engine.new_sequence(Some(2048));
        let reference = teacher_forced(engine, &mut full, &tokens, 1280, 256, |_| {}).unwrap();
        (tokens, reference)
    });
    (tokens, reference)
}

#[test]
fn tiered_store_stays_close_to_full_within_its_budget() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let (tokens, reference) = book_reference(&engine);
    let dir = cold_dir("tiered");
    let tiered =
        KvConfig { store: StoreKind::Tiered, cold_dir: dir.to_path_buf(), spare_copy: false, ..KvConfig::default() };

    let mut seq = engine.new_sequence_with(&tiered, Some(2048)).unwrap();
    let mut checked = 0;
    let sparse = teacher_forced(&engine, &mut seq, tokens, 1280, 256, |s| {
        let tier = s.kv.stats().tier.unwrap();
        assert!(tier.hot_bytes <= tier.hot_budget_bytes, "hot pool over budget: {tier:?}");
        checked += 1;
    })
    .unwrap();
    let stats = seq.kv.stats();
    let tier = stats.tier.clone().unwrap();
    let agree = sparse.top1_agreement(reference);
    let ppl_ratio = sparse.perplexity() / reference.perplexity();
    eprintln!(
        "perplexity full {:.3}, tiered {:.3} ({:+.2}%), top-1 agreement {:.1}%, {tier:?}, cold read {} MB",
        reference.perplexity(),
        sparse.perplexity(),
        100.0 * (ppl_ratio - 1.0),
        100.0 * agree,
        stats.cold_bytes_read / 1_000_000
    );
    assert_eq!(checked, 256);
    assert!(tier.cold_hits > 0 && tier.promotions > 0 && tier.demotions > 0, "all tiers in play: {tier:?}");
    // Each layer's cold groups were read ahead from the groups its last selection needed, most
    // of them rightly: 68% here, where the page cache holds the pool and groups are read in
    // place (78% with the larger hot pool of before the budget set read staging and candidates
    // aside).
    assert!(
        tier.read_ahead_used > 0 && tier.read_ahead_used * 100 > tier.read_ahead_groups * 60,
        "read-ahead: {tier:?}"
    );
    // Measured here (α 0.2, INT4 keys, per-KV-head selection, 2K context): +0.27% perplexity,
    // 93.8% top-1 agreement. These bounds guard against regressions; `hillside eval` tracks the targets.
    assert!(ppl_ratio < 1.02, "tiered perplexity {:+.2}% above full", 100.0 * (ppl_ratio - 1.0));
    assert!(agree > 0.88, "top-1 agreement {agree}");
    drop(seq);
    assert_eq!(common::cold_files(&dir), 0);
}

/// A store that asks the model to attend to whole-cache selections in spans of `span` tokens,
/// however short the cache, and counts the spans it gathered.
struct InSpans {
    inner: Box<dyn KvStore>,
    span: usize,
    gathered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl KvStore for InSpans {
    forward_to_inner!();
    fn parts(&self, selection: &Selection, cached_tokens: usize) -> Vec<HeadsPart> {
        match selection {
            Selection::All => HeadsPart::each_head(self.inner.shape().n_kv_heads, cached_tokens, Some(self.span)),
            tokens => self.inner.parts(tokens, cached_tokens),
        }
    }
    fn gather(
        &mut self,
        layer: usize,
        selection: &Selection,
        heads: std::ops::Range<usize>,
    ) -> hillside_engine::error::Result<hillside_engine::kv::KvView<'_>> {
        if matches!(selection, Selection::Span(_)) {
            self.gathered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.gather(layer, selection, heads)
    }
}

#[test]
fn a_tiered_store_attends_to_a_long_cache_in_spans_as_to_one_view() {
    // A 32K prompt is attended to in spans of 4,096 tokens (the view holds one span of one
    // head); here spans of 100 tokens over a 600-token prompt in two chunks, and the dense
    // layer's decode steps, against the same store attending to each head's cache at once.
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[20_000..50_000]).unwrap()[..664];
    let dir = cold_dir("spans");
    let tiered =
        KvConfig { store: StoreKind::Tiered, cold_dir: dir.to_path_buf(), spare_copy: false, ..KvConfig::default() };
    let shape = engine.model().kv_shape(1024);
    let mut whole = engine.new_sequence_with(&tiered, Some(1024)).unwrap();
    let gathered = std::sync::Arc::default();
    let spans =
        InSpans { inner: tiered.build(shape, None).unwrap(), span: 100, gathered: std::sync::Arc::clone(&gathered) };
    let mut spans = hillside_engine::Sequence { kv: Box::new(spans), tokens: Vec::new() };
    let mut last = Vec::new();
    for seq in [&mut whole, &mut spans] {
        let mut logits = Vec::new();
        for chunk in tokens[..600].chunks(300) {
            logits = engine.model().forward(chunk, seq.kv.as_mut(), Logits::Last).unwrap();
            seq.tokens.extend_from_slice(chunk);
        }
        last.push(logits);
    }
    // Each span's view holds the rows, and names the positions, of those tokens in the whole
    // head's view: from the write-back window, the hot pool and the cold pool.
    for layer in [0, 1, 29] {
        for head in 0..3 {
            let rows = |view: &KvView<'_>| -> Vec<(u16, u16)> {
                (0..view.n_tokens)
                    .flat_map(|t| {
                        (0..64).map(move |d| (view.k[k_tile_index(t, d, 64)].to_bits(), view.v[t * 64 + d].to_bits()))
                    })
                    .collect()
            };
            let all = rows(&whole.kv.gather(layer, &Selection::All, head..head + 1).unwrap());
            for start in (0..600).step_by(100) {
                let view = whole.kv.gather(layer, &Selection::Span(start..start + 100), head..head + 1).unwrap();
                // The first span's slots are its positions; the others name theirs.
                let named: Vec<u32> = (start as u32..start as u32 + 100).collect();
                match view.positions {
                    None => assert_eq!(start, 0, "layer {layer} head {head}: a later span must name its positions"),
                    Some(positions) => assert_eq!(positions, &named[..], "layer {layer} head {head} span {start}"),
                }
                assert!(rows(&view) == all[start * 64..(start + 100) * 64], "layer {layer} head {head} span {start}");
            }
        }
    }
    let tier = whole.kv.stats().tier.unwrap();
    assert!(tier.hot_bytes > 0 && whole.kv.stats().cold_bytes > 0, "the spans came from every tier: {tier:?}");
    // The model merged each span's attention into the whole's: the same up to the order of
    // float sums (under 1e-6 of the largest value, measured layer by layer), which the int8
    // activations of later layers then round differently now and then. Measured: logits 0.9
    // apart at most (of 19.9), perplexity −0.09%, top-1 92%; with later spans' positions
    // not named (so queries saw later tokens), 15.0, +11.5% and 61%.
    let largest = last[0].iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = last[0].iter().zip(&last[1]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 0.2 * largest, "prompt logits differ by {worst} (largest {largest})");
    // 30 layers × 3 heads, in 3 spans for the first chunk and 6 for the second.
    assert_eq!(gathered.load(std::sync::atomic::Ordering::Relaxed), 30 * 3 * (3 + 6));
    let reference = teacher_forced_from(&engine, &mut whole, last[0].clone(), &tokens[600..], |_| {}).unwrap();
    let mut steps = 0;
    let run = teacher_forced_from(&engine, &mut spans, last[1].clone(), &tokens[600..], |_| steps += 1).unwrap();
    let agree = run.top1_agreement(&reference);
    let ppl_change = run.perplexity() / reference.perplexity() - 1.0;
    eprintln!("in spans against whole: perplexity {:+.3}%, top-1 {:.1}%", 100.0 * ppl_change, 100.0 * agree);
    assert!(agree >= 0.85 && ppl_change.abs() < 0.02, "{:+.3}%, {agree}", 100.0 * ppl_change);
    // Decode steps: only the dense layer 0 attends to every token, its 3 heads in 7 spans.
    assert_eq!(gathered.load(std::sync::atomic::Ordering::Relaxed), 30 * 3 * (3 + 6) + steps * 3 * 7);
    drop((whole, spans));
    assert_eq!(common::cold_files(&dir), 0);
}

#[test]
fn page_wise_and_sparf_selections_stay_close_to_full_and_pages_read_only_their_budget() {
    // The same teacher-forced pass with each step's top α chosen token by token and as whole
    // cold-pool pages. Token by token, the selection lies in pages holding few of its tokens;
    // as pages, a head's selection reads on average no more than its budget's worth (budget /
    // 16), as many as its pinned tokens fill and three that give fewer tokens (the sinks' own,
    // the last before the recent window, the one cut to fit). The ranked tokens it holds in
    // memory come along without a read. Attention over whole pages stays close to the full
    // cache.
    let engine = Engine::load(&common::model_path()).unwrap();
    let (tokens, reference) = book_reference(&engine);
    let alpha = 0.3;
    let run = |selector: SelectorKind| {
        let dir = cold_dir(&format!("selector-{selector}"));
        let config = KvConfig {
            store: StoreKind::Tiered,
            cold_dir: dir.to_path_buf(),
            alpha,
            selector,
            spare_copy: false,
            ..KvConfig::default()
        };
        let mut seq = engine.new_sequence_with(&config, Some(2048)).unwrap();
        let result = teacher_forced(&engine, &mut seq, tokens, 1280, 256, |_| {}).unwrap();
        let stats = seq.kv.stats();
        drop(seq);
        assert_eq!(common::cold_files(&dir), 0);
        (result, stats)
    };
    let (by_token, token_stats) = run(SelectorKind::Tokens);
    let (by_page, page_stats) = run(SelectorKind::Pages);
    // Pages read: hot rows come along for free (a head's ranked tokens held in memory).
    let pages_per_selection = |t: &TierStats| t.selected_cold_groups as f64 / t.selections as f64;
    let (token_tier, page_tier) = (token_stats.tier.unwrap(), page_stats.tier.unwrap());
    let pinned = KvConfig::default().sink_tokens + KvConfig::default().recent_tokens;
    let most_pages = (alpha * tokens.len() as f32 / 16.0).ceil() as f64 + pinned.div_ceil(16) as f64 + 3.0;
    eprintln!(
        "pages per head-selection: {:.1} token by token, {:.1} as pages (at most {most_pages}); cold MB read {} / {}; perplexity {:+.2}% / {:+.2}% over full",
        pages_per_selection(&token_tier),
        pages_per_selection(&page_tier),
        token_stats.cold_bytes_read / 1_000_000,
        page_stats.cold_bytes_read / 1_000_000,
        100.0 * (by_token.perplexity() / reference.perplexity() - 1.0),
        100.0 * (by_page.perplexity() / reference.perplexity() - 1.0),
    );
    assert!(pages_per_selection(&page_tier) <= most_pages, "{page_tier:?}");
    assert!(pages_per_selection(&token_tier) > 1.5 * pages_per_selection(&page_tier), "{token_tier:?}");
    assert!(page_stats.cold_bytes_read < token_stats.cold_bytes_read);
    // Measured here (2K eval, α 0.3): +0.95% perplexity, 92.5% top-1 agreement.
    assert!(
        by_page.perplexity() / reference.perplexity() < 1.03,
        "page-wise perplexity {} against {}",
        by_page.perplexity(),
        reference.perplexity()
    );
    assert!(by_page.top1_agreement(reference) > 0.88);

    // SparF: token by token as well, ranked on the query's 8 largest dimensions of 64. Another
    // ranking, so other tokens and other reads, and close to full still (2K eval, α 0.2:
    // +1.10% perplexity, 90.7% top-1, against +0.51% and 92.2% on every dimension).
    let (sparf, sparf_stats) = run(SelectorKind::Sparf);
    let sparf_tier = sparf_stats.tier.unwrap();
    eprintln!(
        "sparf: perplexity {:+.2}% over full, cold MB read {}",
        100.0 * (sparf.perplexity() / reference.perplexity() - 1.0),
        sparf_stats.cold_bytes_read / 1_000_000
    );
    assert_eq!(sparf_tier.selections, token_tier.selections, "as many selections of the same budget");
    assert_ne!(
        sparf_stats.cold_bytes_read, token_stats.cold_bytes_read,
        "the ranking on 8 dimensions chose other tokens"
    );
    assert!(sparf.perplexity() / reference.perplexity() < 1.03 && sparf.top1_agreement(reference) > 0.88);
}

#[test]
fn re_placing_the_cold_pool_by_hits_changes_no_logit() {
    // The same teacher-forced pass with the spilled tokens laid out by key, and laid out by key
    // then rewritten block by block in the order of their hits (8 decode steps in): the layout
    // is only where rows lie, so every logit must have the same bits. A row read from a wrong
    // slot after the rewrite would change them. Tokens are selected one by one here: page-wise
    // selection takes pages as the layout forms them, so it attends other tokens by design.
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[50_000..80_000]).unwrap()[..824];
    let run = |placement: PlacementKind| {
        let dir = cold_dir(&format!("placement-{placement}"));
        let config = KvConfig {
            store: StoreKind::Tiered,
            cold_dir: dir.to_path_buf(),
            hot_budget_bytes: Some(12_000_000),
            placement,
            selector: SelectorKind::Tokens,
            spare_copy: false,
            ..KvConfig::default()
        };
        let mut seq = engine.new_sequence_with(&config, Some(1024)).unwrap();
        let mut logits = Vec::new();
        for chunk in tokens[..800].chunks(256) {
            logits = engine.model().forward(chunk, seq.kv.as_mut(), Logits::Last).unwrap();
        }
        let mut steps = vec![logits];
        for &t in &tokens[800..] {
            steps.push(engine.model().forward(&[t], seq.kv.as_mut(), Logits::Last).unwrap());
        }
        let stats = seq.kv.stats();
        drop(seq);
        (steps, stats)
    };
    let (by_key, key_stats) = run(PlacementKind::Keys);
    let (by_hits, hit_stats) = run(PlacementKind::Hits);
    let (keys_tier, hits_tier) = (key_stats.tier.unwrap(), hit_stats.tier.unwrap());
    assert_eq!(keys_tier.relaid_blocks, 0);
    // 800 cold tokens: 3 whole blocks in each of the 29 sparse layers' 3 KV heads.
    assert!(
        hits_tier.relaid_blocks > 29 * 3 && hits_tier.relaid_blocks <= 29 * 3 * 3,
        "the cold blocks were rewritten: {hits_tier:?}"
    );
    assert!(hits_tier.cold_hits > 0, "the steps after the rewrite read cold rows: {hits_tier:?}");
    for (step, (a, b)) in by_key.iter().zip(&by_hits).enumerate() {
        assert!(a == b, "step {step}: logits differ after re-placement");
    }
}

#[test]
fn drop_store_keeps_a_fraction_and_pays_for_it_in_fidelity() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[200_000..240_000]).unwrap()[..896];
    let mut full = engine.new_sequence(Some(1024));
    let reference = teacher_forced(&engine, &mut full, tokens, 768, 256, |_| {}).unwrap();
    let config = KvConfig { store: StoreKind::Drop, ..KvConfig::default() };
    let mut seq = engine.new_sequence_with(&config, Some(1024)).unwrap();
    let dropped = teacher_forced(&engine, &mut seq, tokens, 768, 256, |_| {}).unwrap();
    let kept = seq.kv.stats().resident_bytes;
    eprintln!(
        "drop: perplexity {:.3} vs {:.3}, top-1 agreement {:.1}%, {} KB resident vs {} KB",
        dropped.perplexity(),
        reference.perplexity(),
        100.0 * dropped.top1_agreement(&reference),
        kept / 1000,
        full.kv.stats().resident_bytes / 1000
    );
    // α 0.2 + 68 pinned of 896 tokens: about a third of the rows, plus the working view.
    assert!(kept < full.kv.stats().resident_bytes * 3 / 4, "{kept}");
    assert!(dropped.perplexity() > reference.perplexity(), "dropping tokens cannot be free here");
    assert!(dropped.top1_agreement(&reference) > 0.6);
}

#[test]
fn the_fidelity_guard_widens_selections_that_hold_too_little_attention() {
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[300_000..330_000]).unwrap()[..800];
    let dir = cold_dir("guard");
    let run = |guard_mass: f32| {
        let config = KvConfig {
            store: StoreKind::Tiered,
            cold_dir: dir.to_path_buf(),
            guard_mass,
            spare_copy: false,
            ..KvConfig::default()
        };
        let mut seq = engine.new_sequence_with(&config, Some(1024)).unwrap();
        teacher_forced(&engine, &mut seq, tokens, 768, 256, |_| {}).unwrap();
        seq.kv.stats().tier.unwrap()
    };
    let (off, never, always) = (run(0.0), run(1e-9), run(1.0));
    assert_eq!((off.guard_checks, off.guard_widened), (0, 0), "off means off: {off:?}");
    assert!(never.guard_checks > 0 && never.guard_widened == 0, "{never:?}");
    // No top α can hold all of a softmax's mass, so a threshold of 1 widens every check.
    assert!(always.guard_widened == always.guard_checks && always.guard_checks == never.guard_checks, "{always:?}");
    assert!(
        always.hot_hits + always.cold_hits > never.hot_hits + never.cold_hits,
        "widened selections attend to more rows"
    );
}

#[test]
fn the_ideal_selector_captures_more_attention_than_the_scored_selection() {
    use hillside_bench::fidelity::{AttentionMassProbe, IdealSelector};
    let engine = Engine::load(&common::model_path()).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[400_000..430_000]).unwrap()[..900];
    let dir = cold_dir("ideal");
    let mass = |ideal: bool| {
        let budget = ideal.then_some(1 << 40); // every row hot: the ideal picks any token
        let config = KvConfig {
            store: StoreKind::Tiered,
            cold_dir: dir.to_path_buf(),
            hot_budget_bytes: budget,
            spare_copy: false,
            ..KvConfig::default()
        };
        let mut seq = engine.new_sequence_with(&config, Some(1024)).unwrap();
        if ideal {
            seq.kv = Box::new(IdealSelector::wrap(seq.kv, config.sink_tokens, config.recent_tokens));
        }
        let (probe, mass) = AttentionMassProbe::wrap(seq.kv);
        seq.kv = Box::new(probe);
        teacher_forced(&engine, &mut seq, tokens, 768, 256, |_| {}).unwrap();
        let mass = mass.lock().unwrap().clone();
        (mass.mean(), mass.per_step.len())
    };
    let ((scored, steps), (ideal, ideal_steps)) = (mass(false), mass(true));
    eprintln!("attention mass captured: scored {scored:.4}, ideal {ideal:.4}");
    assert_eq!((steps, ideal_steps), (132, 132), "every decode step is measured");
    // Same number of tokens per head, chosen by exact attention: more mass, short of all of it.
    assert!(ideal > scored && ideal < 1.0, "ideal {ideal} vs scored {scored}");
}

#[test]
fn attention_on_a_candle_device_gives_the_cpu_kernels_logits() {
    // The `cuda` build attends to the gathered working set as candle tensors in VRAM; here the
    // same code runs on candle's CPU device, through a whole prompt and tiered decode steps.
    let host = Engine::load(&common::model_path()).unwrap();
    let mut device = Engine::load(&common::model_path()).unwrap();
    device.set_attention(hillside_engine::device::Attention::Device(candle_core::Device::Cpu));
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &host.tokenizer().encode(&text[120_000..140_000]).unwrap()[..800];
    let dir = cold_dir("device");
    let tiered =
        KvConfig { store: StoreKind::Tiered, cold_dir: dir.to_path_buf(), spare_copy: false, ..KvConfig::default() };
    let mut a = host.new_sequence_with(&tiered, Some(1024)).unwrap();
    let mut b = device.new_sequence_with(&tiered, Some(1024)).unwrap();
    let (mut worst_kl, mut widest_flip) = (0f64, 0f64);
    for (i, step) in std::iter::once(&tokens[..768]).chain(tokens[768..].chunks(1)).enumerate() {
        let la = host.model().forward(step, a.kv.as_mut(), Logits::Last).unwrap();
        let lb = device.model().forward(step, b.kv.as_mut(), Logits::Last).unwrap();
        worst_kl = worst_kl.max(kl_divergence(&la, &lb));
        // Where the predictions differ, how far apart the host put the two tokens, against how
        // far the two paths' log-probabilities of the likely tokens are apart at this step.
        let flip = (la[argmax(&la) as usize] - la[argmax(&lb) as usize]) as f64;
        let deviation = likely_deviation(&la, &lb);
        widest_flip = widest_flip.max(flip);
        if flip > 0.0 {
            eprintln!("step {i}: the predictions differ, the host's logits {flip:.3} apart, the paths' log-probabilities by {deviation:.3}");
        }
        assert!(
            flip <= 2.0 * deviation,
            "step {i}: a prediction differs where the host's logits are {flip} apart (the paths differ by {deviation})"
        );
        if i > 0 {
            // Decode steps attend to a sparse selection: the tiered path ran on the device.
            let tier = b.kv.stats().tier.unwrap();
            assert!(tier.hot_hits + tier.cold_hits > 0, "{tier:?}");
        }
    }
    // The two paths differ in exp and summation order, and the int8 quantization of each
    // layer's activations turns such last-bit differences into whole quantization steps now
    // and then. Measured here: KL ≤ 0.013 (the engine against candle-transformers' reference
    // model: ≤ 0.0124); one or two of the 33 predictions differ, all near-ties: the host's two
    // best logits ≤ 0.05 apart at AVX-512 and portable, 0.24 at AVX2 on a step where the
    // paths' likely log-probabilities differ by 0.19 (0.18 at AVX-512 too). So the bound is per
    // step, as in the reference test: a flip only within twice that step's deviation.
    assert!(worst_kl < 0.03, "largest KL divergence {worst_kl}");
    eprintln!("worst KL {worst_kl:.5}, widest flip {widest_flip:.3}");
    drop((a, b));
    assert_eq!(common::cold_files(&dir), 0);
}
