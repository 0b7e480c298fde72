//! `hillside-bench` end to end, on the real default model. (`hillside bench …` and `hillside
//! eval …`, which run the same commands, are tested with the `hillside` binary.)

use std::process::Command;

fn lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hillside-bench"))
}

#[test]
fn bench_recall_measures_every_copy_and_full_rank_ranks_exactly() {
    let scratch = tempfile::Builder::new().prefix("hillside-bench-recall-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let json = dir.join("recall.json");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/pride-and-prejudice.txt");
    let out = lab()
        .args([
            "recall",
            "--tokens",
            "768",
            "--queries",
            "2",
            "--fit-tokens",
            "256",
            "--ranks",
            "8,64",
            "--text",
            text,
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("rope_pairs") && stdout.contains("pca"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let copies = report["copies"].as_array().unwrap();
    let copy = |method: &str, rank: u64| {
        copies
            .iter()
            .find(|c| c["method"] == method && c["rank"] == rank)
            .unwrap_or_else(|| panic!("no {method} at {rank}: {report}"))
    };
    let recall = |c: &serde_json::Value, key: &str| c[key].as_f64().unwrap();
    // All 64 dimensions in f32 are the exact scores, however they are projected.
    for method in ["pca", "rope_pairs"] {
        assert!(recall(copy(method, 64), "recall_f32") > 0.999, "{method}: {report}");
    }
    // The store's INT8 copy ranks nearly exactly; 8 of 64 dimensions cannot, and cost less.
    let (full, pairs_8) = (copy("full", 64), copy("rope_pairs", 8));
    assert!(recall(full, "recall_int8") >= 0.95, "{report}");
    assert!(recall(pairs_8, "recall_f32") < recall(full, "recall_int8"), "{report}");
    assert!(pairs_8["bytes_per_token_int4"].as_u64() < full["bytes_per_token_int4"].as_u64(), "{report}");
}
