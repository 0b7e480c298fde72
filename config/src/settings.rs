//! The settings page's view of the config file: the keys it shows, the check of each field, and
//! the edit that rewrites only the keys it changes.

use crate::{ConfigFileError, FileConfig, RemoteFile, ServerFile};
use hillside_engine::kv::{EvaluatorKind, StoreKind};
use hillside_engine::SamplingParams;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use toml_edit::{value, DocumentMut, Item, Table};
use utoipa::ToSchema;

fn names(names: &[&str]) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(names.iter().copied()))
        .build()
}

fn store_names() -> utoipa::openapi::Object {
    names(StoreKind::NAMES)
}

fn evaluator_names() -> utoipa::openapi::Object {
    names(EvaluatorKind::NAMES)
}

/// The settings page: what it shows and what it sends back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
// The schema states the bounds `check` holds, so that a client (or a fuzzer) can know what is
// accepted without sending it.
pub struct Settings {
    /// A registry name or a path to a model (`None`: the default model).
    #[schema(pattern = r"\S")]
    pub model: Option<String>,
    #[schema(schema_with = store_names)]
    pub store: StoreKind,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub alpha: f32,
    /// `None`: the planner's choice.
    #[schema(minimum = 1.0)]
    pub hot_budget_mb: Option<f64>,
    /// An absolute path.
    #[schema(value_type = String, pattern = "^/")]
    pub cold_dir: PathBuf,
    #[schema(schema_with = evaluator_names)]
    pub evaluator: EvaluatorKind,
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: f32,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: f32,
    pub top_k: usize,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: f32,
    #[schema(exclusive_minimum = 0.0)]
    pub repeat_penalty: f32,
    /// Ports below 1024 need root.
    #[schema(minimum = 1024)]
    pub port: u16,
    pub require_api_key: bool,
    /// `local`, or `openai:URL` for a remote OpenAI-compatible engine.
    #[schema(pattern = "^(local|openai:.+)$")]
    pub engine: String,
    /// The remote's model (`None`: the first it lists).
    #[schema(pattern = r"\S")]
    pub remote_model: Option<String>,
    /// Plain HTTP to a remote engine on another machine.
    pub allow_insecure_remote: bool,
    /// A new API key for the remote engine; never shown. Without one, the stored key stays only
    /// while the remote's scheme, host and port stay: it is not sent to a server it was not
    /// given for.
    #[serde(default, skip_serializing)]
    #[schema(write_only)]
    pub remote_api_key: Option<String>,
}

impl Settings {
    pub fn of(file: &FileConfig) -> Self {
        let sampling = file.sampling.params();
        Self {
            model: file.model.clone(),
            store: file.kv.store,
            alpha: file.kv.alpha,
            hot_budget_mb: file.kv.hot_budget_bytes.map(|b| b as f64 / 1e6),
            cold_dir: file.kv.cold_dir.clone(),
            evaluator: file.kv.evaluator,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            min_p: sampling.min_p,
            repeat_penalty: sampling.repeat_penalty,
            port: file.server.port.unwrap_or(ServerFile::DEFAULT_PORT),
            require_api_key: file.server.api_key.as_deref().is_some_and(|k| !k.is_empty()),
            engine: file.remote.engine.clone().unwrap_or_else(|| RemoteFile::LOCAL_ENGINE.into()),
            remote_model: file.remote.model.clone(),
            allow_insecure_remote: file.remote.allow_insecure.unwrap_or(false),
            remote_api_key: None,
        }
    }

    /// The first field that is wrong, and why (`installed`: the registry names installed).
    pub fn check(&self, installed: &[String]) -> Result<(), (&'static str, String)> {
        if let Some(model) = &self.model {
            let path = Path::new(model);
            let is_path = model.contains('/') || model.ends_with(".gguf");
            if model.trim().is_empty() {
                return Err(("model", "name a model, or leave it empty for the default".into()));
            }
            if is_path && !path.exists() {
                return Err(("model", format!("{model} does not exist")));
            }
            if !is_path && !installed.iter().any(|m| m == model) {
                return Err(("model", format!("{model} is not installed (hillside models pull {model} installs it)")));
            }
        }
        if !hillside_engine::kv::alpha_in_range(self.alpha) {
            return Err(("alpha", "α is the share of tokens each step attends to: more than 0, at most 1".into()));
        }
        if let Some(mb) = self.hot_budget_mb {
            if !(mb >= 1.0 && mb.is_finite()) {
                return Err((
                    "hot_budget_mb",
                    "the hot-pool budget must be at least 1 MB (or empty for the planner's choice)".into(),
                ));
            }
        }
        if !self.cold_dir.is_absolute() {
            return Err(("cold_dir", "the cold-pool directory must be an absolute path".into()));
        }
        let existing = self.cold_dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
        if !existing.is_dir() {
            return Err(("cold_dir", format!("{} is a file, not a directory", existing.display())));
        }
        let sampling = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            ..SamplingParams::default()
        };
        if let Err(e) = sampling.validate() {
            // The engine's message names the field first ("top_p must be in (0, 1]").
            let message = e.to_string();
            let field = ["temperature", "top_p", "min_p", "repeat_penalty"]
                .into_iter()
                .find(|f| message.contains(f))
                .unwrap_or("temperature");
            return Err((field, message.trim_start_matches("invalid generation parameter: ").to_string()));
        }
        if self.port < 1024 {
            return Err(("port", "use a port from 1024 to 65535 (lower ones need root)".into()));
        }
        if self.engine != RemoteFile::LOCAL_ENGINE {
            let Some(url) = self.engine.strip_prefix("openai:") else {
                return Err((
                    "engine",
                    "local, or openai: followed by the remote engine's URL (openai:https://host/v1)".into(),
                ));
            };
            hillside_remote::Endpoint::parse(url, self.allow_insecure_remote).map_err(|e| ("engine", e.to_string()))?;
        }
        if self.remote_model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err((
                "remote_model",
                "name one of the remote's models, or leave it empty for the first it lists".into(),
            ));
        }
        Ok(())
    }
}

/// Writes `settings` into the file at `path` (created, with its folder, if missing), changing
/// only their keys. Turning the API key on makes a new random key, which is returned (once) so
/// that the user can copy it; turning it off removes the key.
pub fn write(path: &Path, settings: &Settings) -> Result<Option<String>, ConfigFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(ConfigFileError::Read { path: path.into(), source }),
    };
    let mut doc: DocumentMut = text.parse().map_err(|source| ConfigFileError::NotToml { path: path.into(), source })?;
    match &settings.model {
        Some(m) => doc["model"] = value(m.as_str()),
        None => drop(doc.remove("model")),
    }
    let kv = table(&mut doc, "kv");
    kv["store"] = value(settings.store.to_string());
    kv["alpha"] = value(as_written(settings.alpha));
    match settings.hot_budget_mb {
        Some(mb) => kv["hot_budget_bytes"] = value((mb * 1e6).round() as i64),
        None => drop(kv.remove("hot_budget_bytes")),
    }
    kv["cold_dir"] = value(settings.cold_dir.to_string_lossy().as_ref());
    kv["evaluator"] = value(settings.evaluator.to_string());
    let sampling = table(&mut doc, "sampling");
    sampling["temperature"] = value(as_written(settings.temperature));
    sampling["top_p"] = value(as_written(settings.top_p));
    sampling["top_k"] = value(settings.top_k as i64);
    sampling["min_p"] = value(as_written(settings.min_p));
    sampling["repeat_penalty"] = value(as_written(settings.repeat_penalty));
    let server = table(&mut doc, "server");
    server["port"] = value(i64::from(settings.port));
    let had_key = server.get("api_key").and_then(Item::as_str).is_some_and(|k| !k.is_empty());
    let new_key = match (settings.require_api_key, had_key) {
        (true, false) => {
            let key = format!("hs-{:032x}", rand::random::<u128>());
            server["api_key"] = value(key.as_str());
            Some(key)
        }
        (false, _) => {
            server.remove("api_key");
            None
        }
        (true, true) => None,
    };
    let remote = table(&mut doc, "remote");
    let old_origin = remote.get("engine").and_then(Item::as_str).and_then(remote_origin);
    let new_origin = remote_origin(&settings.engine);
    match settings.remote_api_key.as_deref().map(str::trim) {
        Some(key) if !key.is_empty() => remote["api_key"] = value(key),
        _ if new_origin.is_some() && new_origin != old_origin => drop(remote.remove("api_key")),
        _ => {}
    }
    match settings.engine.as_str() {
        RemoteFile::LOCAL_ENGINE => drop(remote.remove("engine")),
        engine => remote["engine"] = value(engine),
    }
    match &settings.remote_model {
        Some(m) => remote["model"] = value(m.as_str()),
        None => drop(remote.remove("model")),
    }
    match settings.allow_insecure_remote {
        true => remote["allow_insecure"] = value(true),
        false => drop(remote.remove("allow_insecure")),
    }
    if remote.is_empty() {
        doc.remove("remote");
    }
    let text = doc.to_string();
    // What is written must read back: a key this code writes wrongly would stop every start.
    toml::from_str::<FileConfig>(&text).map_err(ConfigFileError::EditUnreadable)?;
    write_private(path, &text)?;
    Ok(new_key)
}

/// Where `openai:URL` sends requests (scheme, host and port, lower case); `None` for `local`.
fn remote_origin(engine: &str) -> Option<String> {
    let url = engine.strip_prefix("openai:")?.trim();
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials in the URL are not part of where it goes.
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    Some(format!("{}://{}", scheme.to_ascii_lowercase(), host.to_ascii_lowercase()))
}

/// `v` as the shortest decimal that reads back as the same f32 (0.2, not f32's nearest f64,
/// 0.20000000298023224), so the file keeps what the user wrote.
fn as_written(v: f32) -> f64 {
    v.to_string().parse().expect("an f32's decimal is an f64")
}

/// The `[name]` table, made if missing.
fn table<'d>(doc: &'d mut DocumentMut, name: &str) -> &'d mut Table {
    if !doc.contains_table(name) {
        doc[name] = Item::Table(Table::new());
    }
    doc[name].as_table_mut().expect("just made a table")
}

/// Replaces the file in one rename, readable by its owner only (it may hold the API key), never
/// writing through a link.
fn write_private(path: &Path, text: &str) -> Result<(), ConfigFileError> {
    let context = |source| ConfigFileError::Write { path: path.into(), source };
    if let Some(dir) = path.parent() {
        hillside_engine::private_files::create_dir(dir).map_err(context)?;
    }
    hillside_engine::private_files::replace(path, text.as_bytes()).map_err(context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read;

    #[test]
    fn the_readme_example_parses() {
        let readme = include_str!("../../README.md");
        let example =
            readme.split("```toml\n").nth(1).and_then(|s| s.split("```").next()).expect("a toml block in the README");
        let c: FileConfig = toml::from_str(example).unwrap();
        assert_eq!(c.kv.store, StoreKind::Tiered);
        assert_eq!(c.kv.hot_budget_bytes, Some(50_000_000));
        assert_eq!(
            (c.remote.engine.as_deref(), c.remote.concurrency),
            (Some("openai:https://gpu.example/v1"), Some(4))
        );
        assert_eq!(Settings::of(&c).check(&[c.model.clone().unwrap()]), Ok(()), "the example is a valid config");
    }

    #[test]
    fn an_edit_keeps_comments_and_other_keys_and_reads_back() {
        let scratch = tempfile::Builder::new().prefix("hillside-settings-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("config.toml");
        std::fs::write(&path, "# my laptop\ncontext = 4096\n\n[kv]\n# the fast disk\ncold_dir = \"/tmp\"\nrecent_tokens = 32\n\n[server]\nmax_live = 2\n").unwrap();
        let mut s = Settings::of(&read(&path).unwrap());
        s.store = StoreKind::Tiered;
        s.alpha = 0.1;
        s.hot_budget_mb = Some(50.0);
        s.temperature = 0.3;
        s.require_api_key = true;
        s.engine = "openai:https://gpu.example/v1".into();
        s.remote_model = Some("qwen".into());
        let key = write(&path, &s).unwrap().expect("a new key");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# my laptop") && text.contains("# the fast disk"), "{text}");
        // Numbers as the user would write them, not f32's nearest f64.
        assert!(text.contains("alpha = 0.1\n") && text.contains("temperature = 0.3\n"), "{text}");
        let back = read(&path).unwrap();
        assert_eq!((back.context, back.kv.recent_tokens, back.server.max_live), (Some(4096), 32, Some(2)));
        assert_eq!(back.kv.hot_budget_bytes, Some(50_000_000));
        assert_eq!(back.server.api_key.as_deref(), Some(key.as_str()));
        assert_eq!(Settings::of(&back), s);
        // Saving again keeps the key; turning it off removes it.
        assert_eq!(write(&path, &s).unwrap(), None);
        s.require_api_key = false;
        write(&path, &s).unwrap();
        assert_eq!(read(&path).unwrap().server.api_key, None);
        // Back to the local engine: the remote keys go, and so does the empty table.
        (s.engine, s.remote_model) = ("local".into(), None);
        write(&path, &s).unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains("[remote]"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A file broken by hand is named, and an edit leaves it as it was.
        std::fs::write(&path, "[kv\n").unwrap();
        assert!(matches!(read(&path), Err(ConfigFileError::Invalid { .. })));
        let refused = write(&path, &s).unwrap_err();
        assert!(matches!(&refused, ConfigFileError::NotToml { path: named, .. } if *named == path), "{refused}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[kv\n");
    }

    #[test]
    fn the_remote_key_goes_only_where_it_was_given_for() {
        let scratch = tempfile::Builder::new().prefix("hillside-settings-").tempdir().unwrap();
        let path = scratch.path().join("config.toml");
        std::fs::write(&path, "[remote]\nengine = \"openai:https://gpu.example/v1\"\napi_key = \"sk-remote\"\n")
            .unwrap();
        let key = |path: &Path| read(path).unwrap().remote.api_key;
        let mut s = Settings::of(&read(&path).unwrap());
        assert_eq!(s.remote_api_key, None, "the key is never shown");
        // Another path or model on the same server keeps it.
        s.engine = "openai:HTTPS://GPU.example/v2".into();
        s.remote_model = Some("qwen".into());
        write(&path, &s).unwrap();
        assert_eq!(key(&path).as_deref(), Some("sk-remote"));
        // Another host drops it, unless a key is given with it.
        s.engine = "openai:https://elsewhere.example/v1".into();
        write(&path, &s).unwrap();
        assert_eq!(key(&path), None);
        s.remote_api_key = Some("sk-new".into());
        write(&path, &s).unwrap();
        assert_eq!(key(&path).as_deref(), Some("sk-new"));
        // So do another port, and a scheme that is not the one it was given for.
        s.remote_api_key = None;
        for engine in ["openai:https://elsewhere.example:8443/v1", "openai:http://elsewhere.example/v1"] {
            std::fs::write(&path, "[remote]\nengine = \"openai:https://elsewhere.example/v1\"\napi_key = \"k\"\n")
                .unwrap();
            s.engine = engine.into();
            s.allow_insecure_remote = true;
            write(&path, &s).unwrap();
            assert_eq!(key(&path), None, "{engine}");
        }
    }

    #[test]
    fn each_wrong_field_is_named() {
        let good = Settings::of(&FileConfig::default());
        let installed = vec!["smollm2-135m-instruct".to_string()];
        assert_eq!(good.check(&installed), Ok(()));
        let field = |change: &dyn Fn(&mut Settings)| {
            let mut s = good.clone();
            change(&mut s);
            s.check(&installed).unwrap_err().0
        };
        assert_eq!(field(&|s| s.alpha = 0.0), "alpha");
        assert_eq!(field(&|s| s.alpha = 1.5), "alpha");
        assert_eq!(field(&|s| s.hot_budget_mb = Some(0.5)), "hot_budget_mb");
        assert_eq!(field(&|s| s.cold_dir = "relative/kv".into()), "cold_dir");
        assert_eq!(field(&|s| s.cold_dir = "/etc/hostname/kv".into()), "cold_dir");
        assert_eq!(field(&|s| s.top_p = 0.0), "top_p");
        assert_eq!(field(&|s| s.temperature = -1.0), "temperature");
        assert_eq!(field(&|s| s.repeat_penalty = 0.0), "repeat_penalty");
        assert_eq!(field(&|s| s.min_p = 2.0), "min_p");
        assert_eq!(field(&|s| s.port = 80), "port");
        assert_eq!(field(&|s| s.model = Some("llama-70b".into())), "model");
        assert_eq!(field(&|s| s.model = Some("/nowhere/m.gguf".into())), "model");
        assert_eq!(field(&|s| s.engine = "vllm".into()), "engine");
        assert_eq!(
            field(&|s| s.engine = "openai:http://10.0.0.5:8000/v1".into()),
            "engine",
            "plain HTTP to another machine"
        );
        assert_eq!(field(&|s| s.remote_model = Some(" ".into())), "remote_model");
        let mut remote = good.clone();
        (remote.engine, remote.allow_insecure_remote) = ("openai:http://10.0.0.5:8000/v1".into(), true);
        assert_eq!(remote.check(&installed), Ok(()), "allowed explicitly");
    }
}
