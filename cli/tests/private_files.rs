//! Every file and folder a full run of `hillside serve` leaves is its user's alone: the config
//! the settings page wrote, the library, the conversations, a summary's kept K/V, the cold pool's
//! files (while a reply streams) and the start-up profile, which is never read or written
//! through a link someone put in its place.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn agent() -> ureq::Agent {
    // Only catches a hang.
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

/// Every file and folder under `root` (itself included) with its permission bits and whether
/// it is a folder; links (Hillside makes none) are left out.
fn modes(root: &Path) -> Vec<(PathBuf, u32, bool)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue }; // gone meanwhile
        if meta.is_symlink() {
            continue;
        }
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        found.push((path, meta.permissions().mode() & 0o777, meta.is_dir()));
    }
    found
}

#[test]
fn every_file_a_full_run_leaves_is_private() {
    let scratch = tempfile::Builder::new().prefix("hillside-private-").tempdir().unwrap();
    let root = scratch.path();
    let (cold, data, config) = (root.join("cold"), root.join("data"), root.join("etc/config.toml"));
    // Someone else's file, and links to it where the cold pool's profiles go.
    let elsewhere = root.join("elsewhere.json");
    std::fs::write(&elsewhere, "not Hillside's").unwrap();
    std::fs::create_dir(&cold).unwrap();
    // A config file the user made by hand (and so with their usual mode).
    std::fs::create_dir(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "context = 2048\n").unwrap();
    let links: Vec<PathBuf> =
        ["int4", "int8"].iter().map(|b| cold.join(format!("hillside-profile-{b}.json"))).collect();
    for link in &links {
        std::os::unix::fs::symlink(&elsewhere, link).unwrap();
    }

    let mut child = Command::new(env!("CARGO_BIN_EXE_hillside"))
        .args(["serve", "--port", "0", "--kv", "tiered", "--context", "2048", "--shutdown-grace-s", "1"])
        .arg("--cold-dir")
        .arg(&cold)
        .arg("--documents-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let (mut banner, mut link) = (String::new(), String::new());
    stdout.read_line(&mut banner).unwrap();
    stdout.read_line(&mut link).unwrap();
    let base = format!("http://{}", banner.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap());
    let secret = link.split("#secret=").nth(1).unwrap_or_else(|| panic!("{link:?}")).trim().to_string();
    let call = |method: &str, path: &str, body: Value| -> (u16, String) {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("Content-Type", "application/json")
            .header("X-Hillside-Control", &secret)
            .body(body.to_string())
            .unwrap();
        let mut reply = agent().run(request).unwrap();
        (reply.status().as_u16(), reply.body_mut().read_to_string().unwrap())
    };

    // The settings page saves the config; a document is added and summarized (its K/V kept);
    // the UI keeps a conversation.
    let (status, settings) = call("GET", "/v1/hillside/settings", Value::Null);
    assert_eq!(status, 200, "{settings}");
    let mut settings: Value = serde_json::from_str(&settings).unwrap();
    settings["settings"]["temperature"] = json!(0.3);
    let (status, saved) = call("PUT", "/v1/hillside/settings", settings["settings"].clone());
    assert_eq!(status, 200, "{saved}");
    let notes = "The river meets the sea at the old mill. The miller keeps bees and sells honey on Fridays.";
    let boundary = "hillside-private-boundary";
    let body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\nContent-Type: text/plain\r\n\r\n{notes}\r\n--{boundary}--\r\n");
    let mut added = agent()
        .post(format!("{base}/v1/hillside/documents"))
        .header("Content-Type", format!("multipart/form-data; boundary={boundary}"))
        .send(body)
        .unwrap();
    let added: Value = serde_json::from_str(&added.body_mut().read_to_string().unwrap()).unwrap();
    let id = added["id"].as_str().unwrap_or_else(|| panic!("{added}"));
    let (status, summary) = call("POST", &format!("/v1/hillside/documents/{id}/summary"), Value::Null);
    assert_eq!(status, 200, "{summary}");
    let (status, conversation) = call("POST", "/v1/hillside/conversations", json!({"title": "Bees"}));
    assert_eq!(status, 201, "{conversation}");

    // A reply streaming: its cold-pool file exists now.
    let mut reply = agent()
        .post(format!("{base}/v1/completions"))
        .header("Content-Type", "application/json")
        .send(json!({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true}).to_string())
        .unwrap();
    let mut first = [0u8; 64];
    let _ = reply.body_mut().as_reader().read(&mut first).unwrap();
    let during = modes(&cold);
    assert!(during.iter().any(|(p, ..)| p.extension().is_some_and(|e| e == "cold")), "{during:?}");
    drop(reply);
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(child.wait().unwrap().success(), "{log}");

    let mut left: Vec<(PathBuf, u32, bool)> = during;
    left.extend(modes(&data));
    left.extend(modes(&config));
    for (path, mode, is_dir) in &left {
        if path == &cold {
            continue; // the test made it
        }
        let want = if *is_dir { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} is {mode:o}", path.display());
    }
    let names = |root: &Path| modes(root).iter().map(|(p, ..)| p.display().to_string()).collect::<Vec<_>>().join(" ");
    let everything = format!("{} {}", names(&data), names(&config));
    for kind in ["library.redb", "conversations.redb", ".kv", "config.toml"] {
        assert!(everything.contains(kind), "the run left a {kind}: {everything}");
    }
    // The profiles were written in place of the links, never through them.
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "not Hillside's");
    let replaced: Vec<&PathBuf> =
        links.iter().filter(|l| std::fs::symlink_metadata(l).is_ok_and(|m| m.file_type().is_file())).collect();
    assert!(!replaced.is_empty(), "a profile was measured and saved: {log}");
    for profile in replaced {
        assert_eq!(std::fs::metadata(profile).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
