//! `hillside models pull` from a hub that misbehaves: a real HTTP server on 127.0.0.1 (set as
//! `HF_ENDPOINT`, as a mirror would be) that cuts the connection halfway, stalls until the pull
//! is killed, gives the wrong hash, or fills the disk. An interrupted download goes on from its
//! last byte with a Range request, and nothing is ever installed unless its SHA-256 is right.

mod hub;

use hub::{hub, model_bytes, read_request, sha256_hex, Answer, Hub};
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn pull(hub: &Hub, models: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hillside"));
    command
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("HILLSIDE_MODELS_DIR", models)
        .env("HF_HOME", models.join("no-hf-cache"))
        .args(["models", "pull", "someone/tiny-model", "--file", "tiny.gguf"]);
    command
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_download_cut_halfway_goes_on_from_its_last_byte_and_is_checked() {
    let body = model_bytes(3 << 20);
    let hub = hub(body.clone(), sha256_hex(&body), vec![Answer::CutHalfway, Answer::Serve], true);
    let models = tempfile::tempdir().unwrap();
    let out = pull(&hub, models.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let installed = models.path().join("tiny.gguf");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), installed.display().to_string());
    assert!(std::fs::read(&installed).unwrap() == body, "the file is the hub's, byte for byte");
    assert_eq!(files_in(models.path()), ["tiny.gguf"], "no part left behind");
    let gets: Vec<Option<String>> =
        hub.seen.lock().unwrap().iter().filter(|(m, _)| m == "GET").map(|(_, r)| r.clone()).collect();
    assert_eq!(gets, [None, Some(format!("bytes={}-", body.len() / 2))], "the second request asks for the rest");

    // Installed is installed: a second pull fetches nothing.
    let requests = hub.seen.lock().unwrap().len();
    let out = pull(&hub, models.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(hub.seen.lock().unwrap().len(), requests);

    // Listed among the installed models, apart from those available; `rm` deletes it.
    let hillside = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hillside"))
            .env("HILLSIDE_MODELS_DIR", models.path())
            .env("HF_HOME", models.path().join("no-hf-cache"))
            .args(args)
            .output()
            .unwrap()
    };
    let listed = String::from_utf8_lossy(&hillside(&["models", "list"]).stdout).into_owned();
    let (installed_rows, available) = listed.split_once("Available to pull").expect("two sections");
    assert!(installed_rows.lines().any(|l| l.trim_start().starts_with("tiny ") && l.contains("3 MB")), "{listed}");
    assert!(!available.contains("tiny"), "{listed}");
    assert!(available.contains("qwen3-30b-a3b") && available.contains("Apache-2.0"), "{listed}");
    let out = hillside(&["models", "rm", "tiny"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("deleted {}", installed.display()));
    assert_eq!(files_in(models.path()), Vec::<String>::new());
    let out = hillside(&["models", "rm", "tiny"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no model tiny"), "{}", stderr(&out));
}

#[test]
fn a_pull_killed_midway_resumes_at_the_next_pull() {
    let body = model_bytes(3 << 20);
    let hub = hub(body.clone(), sha256_hex(&body), vec![Answer::StallHalfway, Answer::Serve], true);
    let models = tempfile::tempdir().unwrap();
    let mut child = pull(&hub, models.path()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let part = models.path().join("tiny.gguf.part");
    let started = Instant::now();
    while part.metadata().map_or(0, |m| m.len()) < body.len() as u64 / 2 {
        assert!(started.elapsed() < Duration::from_secs(120), "half the file never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no chance to tidy up
    child.wait().unwrap();
    assert_eq!(files_in(models.path()), ["tiny.gguf.part"], "only the part, never the model");

    let out = pull(&hub, models.path()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(models.path().join("tiny.gguf")).unwrap() == body);
    assert_eq!(files_in(models.path()), ["tiny.gguf"]);
    let last = hub.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last, ("GET".to_string(), Some(format!("bytes={}-", body.len() / 2))));
}

#[test]
fn a_wrong_hash_is_refused_and_installs_nothing() {
    let body = model_bytes(1 << 20);
    let wrong = sha256_hex(b"another file");
    let hub = hub(body.clone(), wrong.clone(), vec![Answer::Serve], true);
    let models = tempfile::tempdir().unwrap();
    let out = pull(&hub, models.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("SHA-256") && err.contains(&wrong) && err.contains("Nothing was installed"), "{err}");
    assert_eq!(files_in(models.path()), Vec::<String>::new());

    // The user's own --sha256 is checked the same way, and the right one installs it.
    let out = pull(&hub, models.path()).args(["--sha256", &sha256_hex(&body)]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(files_in(models.path()), ["tiny.gguf"]);
}

#[test]
fn a_hub_out_of_reach_or_without_the_file_says_which() {
    let models = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_hillside"))
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{closed}"))
        .env("HILLSIDE_MODELS_DIR", models.path())
        .env("HF_HOME", models.path().join("no-hf-cache"))
        .args(["models", "pull", "someone/tiny-model", "--file", "tiny.gguf", "--sha256", &"0".repeat(64)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("offline"), "{}", stderr(&out));

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = read_request(&stream);
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let out = Command::new(env!("CARGO_BIN_EXE_hillside"))
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("HILLSIDE_MODELS_DIR", models.path())
        .env("HF_HOME", models.path().join("no-hf-cache"))
        .args(["models", "pull", "someone/tiny-model", "--file", "tiny.gguf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not exist (HTTP 404)"), "{}", stderr(&out));
    assert_eq!(files_in(models.path()), Vec::<String>::new());
}

/// Runs the pull in a new user and mount namespace, on a 2 MB tmpfs as the models dir, and
/// returns its output with what the folder held afterwards (the tmpfs goes with the namespace).
fn pull_on_a_small_disk(hub: &Hub, extra: &[&str]) -> (Output, String) {
    let scratch = tempfile::tempdir().unwrap();
    let models = scratch.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let script = r#"mount -t tmpfs -o size=2m hillside-test "$1" || exit 99
shift; dir=$1; shift
"$@"; code=$?
echo "left: $(ls -A "$dir" | tr '\n' ' ')" >&2
exit $code"#;
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"])
        .arg(&models)
        .arg(&models)
        .arg(env!("CARGO_BIN_EXE_hillside"))
        .args(["models", "pull", "someone/tiny-model", "--file", "tiny.gguf"])
        .args(extra)
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("HILLSIDE_MODELS_DIR", &models)
        .env("HF_HOME", scratch.path().join("no-hf-cache"))
        .output()
        .expect("unshare (util-linux) runs");
    assert_ne!(out.status.code(), Some(99), "mounting a tmpfs failed: {}", stderr(&out));
    let left = stderr(&out).lines().find_map(|l| l.strip_prefix("left: ")).unwrap_or_default().trim().to_string();
    (out, left)
}

#[test]
fn a_full_disk_is_refused_before_the_download_or_stops_it_with_nothing_installed() {
    let body = model_bytes(3 << 20);
    let sha = sha256_hex(&body);

    // The hub gives the size: refused before a byte is fetched.
    let sized = hub(body.clone(), sha.clone(), vec![Answer::Serve], true);
    let (out, left) = pull_on_a_small_disk(&sized, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not enough disk space"), "{}", stderr(&out));
    assert_eq!(left, "");
    assert!(sized.seen.lock().unwrap().iter().all(|(m, _)| m == "HEAD"), "no GET was sent");

    // It does not: the disk fills while the bytes arrive.
    let without_size = hub(body, sha.clone(), vec![Answer::Serve], false);
    let (out, left) = pull_on_a_small_disk(&without_size, &["--sha256", &sha]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("the disk filled up"), "{}", stderr(&out));
    assert_eq!(left, "tiny.gguf.part", "the part is kept for the next pull, and no model is installed");
}

#[test]
fn a_link_where_the_part_goes_is_refused_and_its_target_untouched() {
    let body = model_bytes(1 << 20);
    let hub = hub(body.clone(), sha256_hex(&body), vec![Answer::Serve], true);
    let models = tempfile::tempdir().unwrap();
    let victim = models.path().join("victim.txt");
    std::fs::write(&victim, b"the user's file").unwrap();
    std::os::unix::fs::symlink(&victim, models.path().join("tiny.gguf.part")).unwrap();
    let out = pull(&hub, models.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), b"the user's file");
    assert!(!models.path().join("tiny.gguf").exists());
}
