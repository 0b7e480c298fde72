//! `hillside-bench` end to end, on the real default model. (`hillside bench …` and `hillside
//! eval …` hand over to this program; the `hillside` binary's tests check the handing over.)

use std::process::Command;

fn lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hillside-bench"))
}

/// Cold-pool files in `dir`.
fn cold_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".cold"))).count()
    })
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

/// `kv` runs each store's `decode` in a child process of the same program.
#[test]
fn kv_runs_each_store_in_a_child_of_the_same_program() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-bench-kv-").tempdir().unwrap();
    let dir = scratch.path();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/pride-and-prejudice.txt");
    let out = lab()
        .args(["kv", "--stores", "full,offload", "--contexts", "512", "--decode-tokens", "2", "--text", text])
        .arg("--cold-dir")
        .arg(dir.join("cold"))
        .arg("--json")
        .arg(dir.join("kv.json"))
        .arg("--plot")
        .arg(dir.join("kv.svg"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("kv.json")).unwrap()).unwrap();
    for store in ["full", "offload"] {
        let tokens_per_s = report[store]["decode"][0]["tokens_per_s"].as_f64();
        assert!(tokens_per_s.is_some_and(|t| t > 0.0), "{store}: {report}");
    }
    assert!(dir.join("kv.svg").is_file());
    assert_eq!(cold_files(&dir.join("cold")), 0);
}

#[test]
fn kernels_times_each_format_and_refuses_a_width_a_format_cannot_take() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-bench-kernels-").tempdir().unwrap();
    let json = scratch.path().join("kernels.json");
    let args = ["kernels", "--threads", "1", "--formats", "q4_0,q6_K", "--values", "512,4096", "--ms", "1"];
    let out = lab().args(args).args(["--cols", "256"]).arg("--json").arg(&json).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let shapes: Vec<_> = rows.iter().map(|r| (r["format"].as_str().unwrap(), r["rows"].as_u64().unwrap())).collect();
    assert_eq!(shapes, [("q4_0", 2), ("q4_0", 16), ("q6_K", 2), ("q6_K", 16)], "{report}");
    assert!(rows.iter().all(|r| r["ns_per_32_values"].as_f64().is_some_and(|ns| ns > 0.0)), "{report}");
    assert_eq!(report["threads"], 1);

    // Q6_K's super-blocks are 256 values: a row of 96 is refused, naming the format.
    let out = lab().args(args).args(["--cols", "96"]).arg("--json").arg(&json).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("q6_K takes rows of whole 256-value blocks"), "{stderr}");
}

#[test]
fn decode_keeps_the_prompt_and_replays_it_and_a_damaged_one_is_computed_again() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-prompt-cache-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let (cache, cold) = (dir.join("prompts"), dir.join("cold"));
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/pride-and-prejudice.txt");
    let run = |run: &str| {
        let json = dir.join(format!("{run}.json"));
        let out = lab()
            .args([
                "decode",
                "--kv",
                "tiered",
                "--prefill-tokens",
                "16",
                "--contexts",
                "1024",
                "--decode-tokens",
                "4",
                "--text",
                text,
            ])
            .arg("--prompt-cache")
            .arg(&cache)
            .arg("--cold-dir")
            .arg(&cold)
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{run}: {stderr}");
        let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (report["decode"][0]["prompt"]["replayed_tokens"].as_u64().unwrap(), stderr)
    };
    // The first run computes the prompt and keeps all of it but its last prefill chunk.
    let (replayed, _) = run("first");
    assert_eq!(replayed, 0);
    let kept: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    // The second replays it: the 1,020-token prompt less its last chunk (of 256) is 768 tokens.
    let (replayed, _) = run("second");
    assert_eq!(replayed, 768);
    // A damaged file is never replayed: the run says why, computes the prompt, and keeps a
    // sound copy again.
    let bytes = std::fs::read(&kept[0]).unwrap();
    std::fs::write(&kept[0], &bytes[..bytes.len() / 2]).unwrap();
    let (replayed, stderr) = run("damaged");
    assert_eq!(replayed, 0);
    assert!(stderr.contains("not replaying") && stderr.contains("computing the prompt"), "{stderr}");
    assert_eq!(std::fs::read(&kept[0]).unwrap().len(), bytes.len(), "the prompt is kept whole again");
    assert_eq!(run("after").0, 768);
    assert_eq!(cold_files(&cold), 0);
}

#[test]
fn eval_replays_the_kept_prompt_into_each_store_and_offload_scores_as_full() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-eval-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let (cache, json) = (dir.join("prompts"), dir.join("eval.json"));
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/pride-and-prejudice.txt");
    let out = lab()
        .args([
            "eval",
            "--stores",
            "offload",
            "--tokens",
            "640",
            "--prompt-tokens",
            "512",
            "--greedy-prompts",
            "0",
            "--text",
            text,
        ])
        .args(["--passkey-contexts", "640", "--passkey-trials", "1"])
        .arg("--prompt-cache")
        .arg(&cache)
        .arg("--cold-dir")
        .arg(dir.join("cold"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Full computed the window's prompt and the passkey's and kept them; offload replayed
    // them, and attends to every token.
    assert!(stderr.contains("kept the prompt's K/V (256 tokens"), "{stderr}");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2, "{stderr}");
    assert_eq!(stderr.matches("kept the prompt's K/V").count(), 2, "kept once each, replayed after: {stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(report["scored_tokens"], 128);
    assert_eq!((results[0]["store"].as_str(), results[1]["store"].as_str()), (Some("full"), Some("offload")));
    assert!(results[0]["perplexity"].as_f64().unwrap() > 1.0, "{report}");
    assert_eq!(results[1]["perplexity"], results[0]["perplexity"], "{report}");
    assert_eq!(results[1]["top1_agreement"], 1.0, "{report}");
    let passkeys = report["passkey"].as_array().unwrap();
    assert_eq!(passkeys.len(), 2, "{report}");
    assert_eq!(
        (passkeys[0]["correct"].as_u64(), passkeys[1]["correct"].as_u64()),
        (Some(1), Some(1)),
        "both find the key: {report}"
    );
    assert_eq!(cold_files(&dir.join("cold")), 0);
}
