//! The cold pool's two read paths under a real memory cgroup: with memory to spare its reads go
//! through the page cache, under a cap they go direct, and when the cap is lifted they switch
//! back; every token reads back the same on either path.
//!
//! The capped part runs in a child process (this test binary again), moved into a cgroup the
//! test makes, so that the cap applies to the pool and to nothing else.

use hillside_engine::kv::backing::DiskBacking;
use hillside_engine::kv::cold::GROUP_TOKENS;
use hillside_engine::kv::headroom::MemoryCap;
use hillside_engine::kv::placement::PlacementKind;
use hillside_engine::kv::KvShape;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

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
    let mut b = DiskBacking::new(SHAPE, &dir, 0, PlacementKind::Keys).unwrap();
    let (lanes, cached) = run_pool(&mut b, 0..2048);
    assert_eq!(lanes, SHAPE.n_layers * SHAPE.n_kv_heads, "this machine has memory to spare");
    assert!(cached > 0);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);

    // The same in a child under a 160 MB cap, then with the cap lifted.
    let cap = MemoryCap::create("hillside-dual-path-test", 160 << 20).expect("making a memory cgroup (the test needs root and a memory controller)");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cold_reads_use_the_page_cache_when_memory_is_free_and_go_direct_under_a_cgroup_cap", "--nocapture"])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cap.add(child.id()).unwrap();
    let (mut to_child, mut from_child) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
    let mut next_report = || {
        let mut line = String::new();
        while !line.starts_with("dual-path ") {
            line.clear();
            assert!(from_child.read_line(&mut line).unwrap() > 0, "the child ended early");
        }
        line
    };
    writeln!(to_child, "go").unwrap();
    let capped = next_report();
    assert!(capped.contains("lanes 0 ") && capped.contains("cached_bytes 0 ") && capped.contains("cgroup_limited true"), "under the cap: {capped}");
    cap.set_limit(8 << 30).unwrap();
    writeln!(to_child, "lifted").unwrap();
    let lifted = next_report();
    assert!(lifted.contains("lanes 8 ") && !lifted.contains("cached_bytes 0 "), "with the cap lifted: {lifted}");
    assert!(child.wait().unwrap().success(), "every token read back on both paths");
}

/// The child's part: waits to be moved into the cgroup, runs the pool, reports, waits for the
/// cap to be lifted, and runs it again past the next re-check.
fn capped_child() {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    let dir = cold_dir("capped");
    let mut b = DiskBacking::new(SHAPE, &dir, 0, PlacementKind::Keys).unwrap();
    let report = |(lanes, cached): (usize, u64)| {
        let headroom = hillside_engine::kv::headroom::Headroom::measure();
        println!("dual-path lanes {lanes} cached_bytes {cached} cgroup_limited {} headroom_mb {}", headroom.cgroup_limited, headroom.bytes >> 20);
    };
    report(run_pool(&mut b, 0..2048));
    line.clear();
    stdin.read_line(&mut line).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // past the read path's re-check
    report(run_pool(&mut b, 2048..4096));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
