//! Shared helpers for the end-to-end tests: where the real model and the shared documents are.

#![allow(dead_code)] // each test binary uses its own subset

pub mod hostile;
pub mod llama_server;
pub mod mha;
pub mod rng;
pub mod server;
pub mod tagged;

use std::path::{Path, PathBuf};

/// The default model, fetched by `make test` (`python3 models/fetch.py`).
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("HILLSIDE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(path.exists(), "model not found at {}: run `python3 models/fetch.py` (make test does)", path.display());
    path
}

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M, fetched by `make test` (`python3 models/fetch.py
/// qwen2.5-coder-0.5b-instruct`): the K-quant and qwen2 model.
pub fn qwen_model_path() -> PathBuf {
    let path = models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.exists(),
        "model not found at {}: run `python3 models/fetch.py qwen2.5-coder-0.5b-instruct` (make test does)",
        path.display()
    );
    path
}

/// Gemma 3 270M Q4_K_M, fetched by `make test` (`python3 models/fetch.py gemma-3-270m`): the
/// gemma3 family and a SentencePiece vocabulary, with real weights.
pub fn gemma_model_path() -> PathBuf {
    let path = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "model not found at {}: run `python3 models/fetch.py gemma-3-270m` (make test does)",
        path.display()
    );
    path
}

/// Where `models/fetch.py` puts models: `$HILLSIDE_MODELS_DIR`, else `$XDG_DATA_HOME/hillside/models`.
fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HILLSIDE_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".local/share"));
    data.join("hillside/models")
}

/// Cold-pool files in `dir` (the planner's cached profile may sit beside them).
pub fn cold_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".cold"))).count()
    })
}

/// A document from ../shared/data (never copied into the project).
pub fn shared_document(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The GPL's preamble and its sections before section `section` (a shorter document of the same
/// text, for tests whose length is not what they check).
pub fn gpl_before_section(section: usize) -> String {
    let mut gpl = shared_document("gpl-3.0.txt");
    let end = gpl.find(&format!("\n\n  {section}. ")).unwrap_or_else(|| panic!("no section {section} in the GPL"));
    gpl.truncate(end);
    gpl
}

/// A test's scratch folder under the system's temporary directory (named for the test, made
/// unique), removed with what it holds when the guard drops: when the test ends, passed,
/// failed or panicked.
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    pub fn new(name: &str) -> Self {
        Self(tempfile::Builder::new().prefix(&format!("hillside-{name}-")).tempdir().expect("a scratch folder"))
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds `bin` of `package` unless it sits one folder above this test binary (cargo's `deps/`),
/// where the code under test looks for it: `cargo test --workspace` builds it, `cargo test -p
/// hillside-tests` alone does not.
pub fn ensure_bin(package: &str, bin: &str) {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    if !deps.parent().unwrap().join(bin).is_file() {
        let mut cargo = std::process::Command::new(env!("CARGO"));
        cargo.args(["build", "-p", package, "--bin", bin]);
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        assert!(cargo.status().unwrap().success(), "building {bin} failed");
    }
}
