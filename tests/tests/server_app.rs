//! The routes the UI stands on, over real HTTP: conversations kept across a restart and found
//! by their words, the settings page's config file (validated field by field, comments kept),
//! the KV tier view's counters on the real model with a tiered store, and the UI's own files
//! with their security headers.

mod common;

use common::server::{agent, config, Server};
use common::Scratch;
use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::scheduler::SchedulerConfig;
use hillside_server::{ChosenPaths, DocumentsConfig, ServerConfig};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn with_data(dir: &Path) -> ServerConfig {
    let documents = DocumentsConfig {
        dir: dir.to_path_buf(),
        kv_quota_bytes: 1 << 30,
        max_file_bytes: 200_000,
        model_key: "smollm2-test".into(),
    };
    ServerConfig { documents: Some(documents), settings_file: Some(dir.join("config.toml")), ..config() }
}

#[test]
fn conversations_are_kept_across_a_restart_and_found_by_their_words() {
    let dir = Scratch::new("app-http-conversations");
    let id = {
        let s = Server::start(with_data(&dir));
        let (status, created) = s.post("/v1/hillside/conversations", &json!({"title": "GPL questions"}));
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_u64().unwrap();
        let messages = json!([{"role": "user", "content": "What is copyleft?"}, {"role": "assistant", "content": "A licence that keeps derived works free.", "meta": {"tokens_per_s": 41.5}}]);
        let (status, changed) =
            s.call("PATCH", &format!("/v1/hillside/conversations/{id}"), Some(&json!({"messages": messages})));
        assert_eq!((status, changed["title"].as_str()), (200, Some("GPL questions")), "{changed}");
        s.post("/v1/hillside/conversations", &json!({"title": "Another"}));
        id
    };
    let s = Server::start(with_data(&dir));
    let (_, one) = s.get(&format!("/v1/hillside/conversations/{id}"));
    assert_eq!(one["messages"][1]["meta"]["tokens_per_s"], 41.5, "{one}");
    let (_, all) = s.get("/v1/hillside/conversations");
    assert_eq!(all["data"].as_array().unwrap().len(), 2, "{all}");
    let (_, found) = s.get("/v1/hillside/conversations?q=COPYLEFT");
    assert_eq!(
        found["data"].as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect::<Vec<_>>(),
        vec![id],
        "{found}"
    );
    let (status, renamed) =
        s.call("PATCH", &format!("/v1/hillside/conversations/{id}"), Some(&json!({"title": "Copyleft"})));
    assert_eq!(
        (status, renamed["title"].as_str(), renamed["messages"].as_array().map(Vec::len)),
        (200, Some("Copyleft"), Some(2))
    );
    // A field the store does not know is a 400 that names it, and nothing changes.
    let (status, bad) = s.call("PATCH", &format!("/v1/hillside/conversations/{id}"), Some(&json!({"titel": "x"})));
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("titel"), "{bad}");
    // So is a meta that is not an object, and an id that is not one: JSON errors, as documented.
    let odd_meta = json!({"messages": [{"role": "user", "content": "hi", "meta": [null, null]}]});
    let (status, bad) = s.call("PATCH", &format!("/v1/hillside/conversations/{id}"), Some(&odd_meta));
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("messages[0].meta")), "{bad}");
    let (status, bad) = s.get("/v1/hillside/conversations/-1");
    assert_eq!((status, bad["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{bad}");
    assert_eq!(s.get(&format!("/v1/hillside/conversations/{id}")).1["messages"].as_array().map(Vec::len), Some(2));
    assert_eq!(s.call("DELETE", &format!("/v1/hillside/conversations/{id}"), None).0, 204);
    let (status, gone) = s.get(&format!("/v1/hillside/conversations/{id}"));
    assert_eq!((status, gone["error"]["code"].as_str()), (404, Some("conversation_not_found")));
    assert_eq!(s.call("DELETE", &format!("/v1/hillside/conversations/{id}"), None).0, 404);
    drop(s);
    // Without a data folder the routes say why.
    let bare = Server::start(config());
    let (status, off) = bare.get("/v1/hillside/conversations");
    assert_eq!((status, off["error"]["code"].as_str()), (503, Some("conversations_off")));
}

#[test]
fn the_desktop_server_reads_only_the_files_the_user_chose() {
    let dir = Scratch::new("app-http-chosen");
    std::fs::create_dir_all(dir.join("notes")).unwrap();
    let (chosen, other) = (dir.join("notes/chosen.txt"), dir.join("notes/other.txt"));
    std::fs::write(&chosen, "The chosen file talks about rivers and valleys.\n").unwrap();
    std::fs::write(&other, "A file nobody chose.\n").unwrap();
    let paths = Arc::new(ChosenPaths::default());
    paths.choose(&chosen);
    let mut config = with_data(&dir.join("data"));
    config.chosen_paths = Some(paths);
    let s = Server::start(config);
    for refused in [other.clone(), dir.join("notes/../notes/other.txt"), PathBuf::from("/etc/passwd")] {
        let (status, body) = s.post("/v1/hillside/documents", &json!({"path": refused}));
        assert_eq!((status, body["error"]["code"].as_str()), (403, Some("path_not_chosen")), "{body}");
    }
    // The JSON branch takes a path, not an upload's worth of JSON.
    let (status, e) = s.post("/v1/hillside/documents", &json!({"path": "a".repeat(100_000)}));
    assert_eq!((status, e["error"]["code"].as_str()), (413, Some("request_too_large")), "{e}");
    let (status, added) = s.post("/v1/hillside/documents", &json!({"path": dir.join("notes/../notes/chosen.txt")}));
    assert_eq!((status, added["name"].as_str()), (201, Some("chosen.txt")), "{added}");
    drop(s);
}

#[test]
fn settings_are_validated_and_saved_to_the_config_file() {
    let dir = Scratch::new("app-http-settings");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.toml");
    std::fs::write(&file, "# written by hand\ncontext = 4096\n").unwrap();
    let s = Server::start(with_data(&dir));
    let (status, report) = s.get("/v1/hillside/settings");
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["path"], file.display().to_string());
    let mut settings = report["settings"].clone();
    assert_eq!((settings["store"].as_str(), settings["require_api_key"].as_bool()), (Some("full"), Some(false)));

    for (field, wrong) in [
        ("alpha", json!(1.5)),
        ("cold_dir", json!("relative/kv")),
        ("port", json!(80)),
        ("top_p", json!(0)),
        ("model", json!("no-such-model")),
    ] {
        let mut bad = settings.clone();
        bad[field] = wrong;
        let (status, e) = s.call("PUT", "/v1/hillside/settings", Some(&bad));
        assert_eq!(
            (status, e["error"]["param"].as_str(), e["error"]["code"].as_str()),
            (400, Some(field), Some("invalid_setting")),
            "{e}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# written by hand\ncontext = 4096\n",
        "a refused change writes nothing"
    );

    settings["store"] = json!("tiered");
    settings["alpha"] = json!(0.1);
    settings["temperature"] = json!(0.2);
    settings["require_api_key"] = json!(true);
    let (status, saved) = s.call("PUT", "/v1/hillside/settings", Some(&settings));
    assert_eq!(status, 200, "{saved}");
    let key = saved["new_api_key"].as_str().expect("the new key, shown once").to_string();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# written by hand\ncontext = 4096\n"), "{text}");
    let back = hillside_config::read(&file).unwrap();
    assert_eq!((back.kv.store, back.kv.alpha, back.sampling.temperature), (StoreKind::Tiered, 0.1, Some(0.2)));
    assert_eq!(back.server.api_key.as_deref(), Some(key.as_str()));
    let (_, again) = s.get("/v1/hillside/settings");
    assert_eq!(again["settings"], settings);
    assert!(again.get("new_api_key").is_none(), "the key is shown only once: {again}");
}

#[test]
fn the_tier_view_counts_what_a_tiered_store_did() {
    let cold_dir = Scratch::new("app-http-tiers-cold");
    let kv = KvConfig {
        store: StoreKind::Tiered,
        cold_dir: cold_dir.to_path_buf(),
        hot_budget_bytes: Some(16_000_000),
        spare_copy: false,
        ..KvConfig::default()
    };
    let s = Server::start(ServerConfig {
        scheduler: SchedulerConfig { kv, cached_sequences: 1, ..config().scheduler },
        ..config()
    });
    let (_, before) = s.get("/v1/hillside/tiers");
    assert_eq!(
        (before["store"].as_str(), before["totals"]["generated_tokens"].as_u64()),
        (Some("tiered"), Some(0)),
        "{before}"
    );
    let prompt = "Once upon a time, in a valley between two rivers, ".repeat(40);
    let (status, reply) = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 40, "temperature": 0}));
    assert_eq!(status, 200, "{reply}");
    let generated = reply["usage"]["completion_tokens"].as_u64().unwrap();
    let (_, after) = s.get("/v1/hillside/tiers");
    let totals = &after["totals"];
    // Every generated token is counted once, the last one too (its sequence has left).
    assert_eq!(totals["generated_tokens"].as_u64(), Some(generated), "{after}");
    assert!(totals["hot_hits"].as_u64().unwrap() + totals["cold_hits"].as_u64().unwrap() > 0, "{after}");
    assert!(totals["score_blocks"].as_u64().unwrap() > 0, "the storage evaluator streamed score blocks: {after}");
    // The finished sequence is cached: its store still holds its tokens.
    assert_eq!(after["live_sequences"], 0);
    assert!(
        after["tokens"].as_u64().unwrap() > 400 && after["hot_budget_bytes"].as_u64() == Some(16_000_000),
        "{after}"
    );
    assert!(after["unix_ms"].as_u64() > before["unix_ms"].as_u64());
    drop(s);
}

#[test]
fn the_web_ui_is_served_with_a_strict_content_security_policy() {
    let s = Server::start(ServerConfig { api_key: Some("sk-ui".into()), ..config() });
    let mut page = agent().get(&s.url("/")).call().unwrap();
    let headers = page.headers().clone();
    let body = page.body_mut().read_to_string().unwrap();
    assert!(
        hillside_server::web_ui_is_built(),
        "the web UI is not built into the server: `make ui` builds it (make test does)"
    );
    // The page loads without the key (it asks for one when the API does), the API does not.
    assert_eq!(page.status().as_u16(), 200, "{body}");
    assert!(body.contains("<div id=\"app\""), "{body}");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    let script = body.split("src=\"").nth(1).and_then(|s| s.split('"').next()).expect("a script");
    let mut asset = agent().get(&s.url(script)).call().unwrap();
    assert_eq!(asset.status().as_u16(), 200);
    assert!(asset.headers()["content-type"].to_str().unwrap().starts_with("text/javascript"));
    assert!(asset.headers()["cache-control"].to_str().unwrap().contains("immutable"));
    assert!(!asset.body_mut().read_to_string().unwrap().is_empty());
    assert_eq!(agent().get(&s.url("/assets/nope.js")).call().unwrap().status().as_u16(), 404);
    assert_eq!(s.get("/v1/hillside/conversations").0, 401);
}
