//! The cold pool's two read paths under a real memory cgroup: with memory to spare its reads go
//! through the page cache, under a cap they go direct, and when the cap is lifted they switch
//! back; every token reads back the same on either path. And a tiered store's spare copy: kept
//! while memory is spare, let go under a cap, with every token still read back as itself.
//!
//! The capped parts run in a child process (this test binary again), moved into a cgroup the
//! test makes, so that the cap applies to the pool and to nothing else.

mod common;

use hillside_engine::headroom::MemoryCap;
use hillside_engine::kv::backing::DiskBacking;
use hillside_engine::kv::cold::format::ColdType;
use hillside_engine::kv::cold::placement::PlacementKind;
use hillside_engine::kv::cold::GROUP_TOKENS;
use hillside_engine::kv::KvShape;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const SHAPE: KvShape = KvShape { n_layers: 4, n_kv_heads: 2, head_dim: 64, max_tokens: 8192 };
const CHILD: &str = "HILLSIDE_DUAL_PATH_CHILD";

/// Token t's V values in (layer, head): t mod 2048 (f16-exact; a slot never leaves its block of
/// 256 tokens, so two tokens that share the value are never confused).
fn push(b: &mut DiskBacking, tokens: std::ops::Range<usize>) {
    let per_token = SHAPE.n_kv_heads * SHAPE.head_dim;
    for layer in 0..SHAPE.n_layers {
        let k: Vec<f32> = tokens.clone().flat_map(|t| (0..per_token).map(move |i| ((t * 7 + i) % 13) as f32)).collect();
        let v: Vec<f32> = tokens.clone().flat_map(|t| std::iter::repeat_n((t % 2048) as f32, per_token)).collect();
        b.append(layer, &k, &v).unwrap();
    }
    b.commit(tokens.len(), |_, _, _, _, _| {}).unwrap();
}

/// Reads every spilled token back from its slot; panics on the first that is not itself.
fn check_every_token(b: &DiskBacking) {
    let hd = SHAPE.head_dim;
    let mut page = b.cold().buffer(1);
    for (layer, head) in (0..SHAPE.n_layers).flat_map(|l| (0..SHAPE.n_kv_heads).map(move |h| (l, h))) {
        for t in (0..b.cold_end()).step_by(5) {
            let slot = b.slot(layer, head, t);
            b.cold().read_groups(layer, head, slot / GROUP_TOKENS, 1, page.as_bytes_mut()).unwrap();
            let v = half::f16::from_bits(page.as_u16()[GROUP_TOKENS * hd + slot % GROUP_TOKENS * hd]).to_f32();
            assert_eq!(v, (t % 2048) as f32, "layer {layer} head {head} token {t}");
        }
    }
}

/// Spills 2,048 tokens, reads them all back, and says how the reads went: (regions read
/// through the page cache, bytes read that way).
fn run_pool(b: &mut DiskBacking, tokens: std::ops::Range<usize>) -> (usize, u64) {
    for chunk in tokens.clone().step_by(256) {
        push(b, chunk..(chunk + 256).min(tokens.end));
    }
    let before = b.cached_reads().2;
    check_every_token(b);
    let (lanes, _, cached) = b.cached_reads();
    (lanes, cached - before)
}

fn cold_dir(name: &str) -> std::path::PathBuf {
    // On the disk, not /tmp (which may be tmpfs, where every read is buffered).
    let dir = std::env::current_dir().unwrap().join("target").join(format!("dual-path-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn cold_reads_use_the_page_cache_when_memory_is_free_and_go_direct_under_a_cgroup_cap() {
    if std::env::var_os(CHILD).is_some() {
        return capped_child();
    }
    // Free memory: the page cache serves every region.
    let dir = cold_dir("free");
    let mut b = DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Keys, ColdType::F16).unwrap();
    let (lanes, cached) = run_pool(&mut b, 0..2048);
    assert_eq!(lanes, SHAPE.n_layers * SHAPE.n_kv_heads, "this machine has memory to spare");
    assert!(cached > 0);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);

    // The same in a child under a 160 MB cap, then with the cap lifted.
    let mut child = CappedChild::start(
        "cold_reads_use_the_page_cache_when_memory_is_free_and_go_direct_under_a_cgroup_cap",
        CHILD,
        160 << 20,
    );
    let capped = child.report("go", "dual-path ");
    assert!(
        capped.contains("lanes 0 ") && capped.contains("cached_bytes 0 ") && capped.contains("cgroup_limited true"),
        "under the cap: {capped}"
    );
    child.cap.set_limit(8 << 30).unwrap();
    let lifted = child.report("lifted", "dual-path ");
    assert!(lifted.contains("lanes 8 ") && !lifted.contains("cached_bytes 0 "), "with the cap lifted: {lifted}");
    assert!(child.process.wait().unwrap().success(), "every token read back on both paths");
}

/// This test binary run again as a child, for one test, with `env_var` set, in a memory cgroup
/// of its own; the parent tells it when to go on and reads its reports.
struct CappedChild {
    cap: MemoryCap,
    process: Child,
    to_child: ChildStdin,
    from_child: BufReader<ChildStdout>,
}

impl CappedChild {
    fn start(test: &str, env_var: &str, limit_bytes: u64) -> Self {
        let cap = MemoryCap::create(&format!("hillside-{test}"), limit_bytes)
            .expect("making a memory cgroup (the test needs root and a memory controller)");
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture"])
            .env(env_var, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        cap.add(process.id()).unwrap();
        let (to_child, from_child) = (process.stdin.take().unwrap(), BufReader::new(process.stdout.take().unwrap()));
        Self { cap, process, to_child, from_child }
    }

    /// Sends `word`, then returns the child's next line that starts with `prefix`.
    fn report(&mut self, word: &str, prefix: &str) -> String {
        writeln!(self.to_child, "{word}").unwrap();
        let mut line = String::new();
        while !line.starts_with(prefix) {
            line.clear();
            assert!(self.from_child.read_line(&mut line).unwrap() > 0, "the child ended early");
        }
        line
    }
}

/// The child's side of [`CappedChild::report`]: waits for the parent's word.
fn wait_for_parent() {
    std::io::stdin().lock().read_line(&mut String::new()).unwrap();
}

/// The child's part: waits to be moved into the cgroup, runs the pool, reports, waits for the
/// cap to be lifted, and runs it again past the next re-check.
fn capped_child() {
    wait_for_parent();
    let dir = cold_dir("capped");
    let mut b = DiskBacking::new(SHAPE, std::slice::from_ref(&dir), 0, PlacementKind::Keys, ColdType::F16).unwrap();
    let report = |(lanes, cached): (usize, u64)| {
        let headroom = hillside_engine::headroom::Headroom::measure();
        println!(
            "dual-path lanes {lanes} cached_bytes {cached} cgroup_limited {} headroom_mb {}",
            headroom.cgroup_limited,
            headroom.bytes >> 20
        );
    };
    report(run_pool(&mut b, 0..2048));
    wait_for_parent();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // past the read path's re-check
    report(run_pool(&mut b, 2048..4096));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

const SPARE_CHILD: &str = "HILLSIDE_SPARE_COPY_CHILD";

#[test]
fn a_tiered_stores_spare_copy_goes_under_a_cgroup_cap_and_its_steps_rank_and_read_every_token_back() {
    if std::env::var_os(SPARE_CHILD).is_some() {
        return spare_copy_child();
    }
    // The child starts under a cap far above its needs, so it keeps the copy, then the cap
    // drops below the reserve that memory must leave spare.
    let test = "a_tiered_stores_spare_copy_goes_under_a_cgroup_cap_and_its_steps_rank_and_read_every_token_back";
    let mut child = CappedChild::start(test, SPARE_CHILD, 8 << 30);
    let spare = child.report("go", "spare-copy ");
    assert!(
        spare.contains("ranked 0 ") && !spare.contains("bytes 0 "),
        "with memory to spare, steps attend through the copy: {spare}"
    );
    child.cap.set_limit(160 << 20).unwrap();
    let capped = child.report("capped", "spare-copy ");
    assert!(capped.contains("idle-bytes 0 "), "an idle store lets the copy go without waiting for a step: {capped}");
    assert!(
        capped.contains("bytes 0 ") && !capped.contains("ranked 0 "),
        "under the cap the copy is gone and steps rank: {capped}"
    );
    assert!(child.process.wait().unwrap().success(), "every token a step attended to read back as itself");
}

/// The child's part: a tiered store of 2,048 tokens, four decode steps with memory to spare;
/// once capped (past the next measurement) trimmed while idle, as a cached sequence is, then
/// four more steps; each step's view checked token by token.
fn spare_copy_child() {
    use hillside_engine::kv::stores::tiered::TieredKvStore;
    use hillside_engine::kv::{KvConfig, KvStore, StoreKind};
    wait_for_parent();
    let dir = cold_dir("spare-copy");
    let config = KvConfig {
        store: StoreKind::Tiered,
        cold_dir: dir.clone(),
        hot_budget_bytes: Some(18_500_000),
        ..KvConfig::default()
    };
    let mut store = TieredKvStore::new(SHAPE, std::slice::from_ref(&dir), config.tiered_settings(SHAPE), None).unwrap();
    common::tagged::fill(&mut store, 2048, 256);
    let spare_bytes = |store: &TieredKvStore| store.stats().tier.unwrap().spare_copy_bytes;
    let report = |store: &TieredKvStore, idle_bytes: usize, ranked: usize| {
        let tier = store.stats().tier.unwrap();
        println!(
            "spare-copy idle-bytes {idle_bytes} ranked {ranked} bytes {} steps {}",
            tier.spare_copy_bytes, tier.spare_copy_steps
        );
    };
    let ranked: usize = (0..4).map(|_| common::tagged::decode_step(&mut store)).sum();
    report(&store, spare_bytes(&store), ranked);
    wait_for_parent();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // past the next measurement
    store.trim();
    let idle_bytes = spare_bytes(&store);
    let ranked: usize = (0..4).map(|_| common::tagged::decode_step(&mut store)).sum();
    report(&store, idle_bytes, ranked);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
