//! llama.cpp's `llama-server` (built from the PyPI sdist by scripts/llama-cpp-build.sh, cached
//! outside the clone) on a free port of 127.0.0.1, killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct LlamaServer {
    pub child: Child,
    pub port: u16,
    /// One server at a time: several of them and Hillside's own work on two cores would make a
    /// test's requests wait out the client's hang timeout.
    _one_at_a_time: MutexGuard<'static, ()>,
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// llama.cpp's `tool` (llama-server, llama-logits): the path in `$env_var`, else built (once)
/// by the build script.
pub fn tool(tool: &str, env_var: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env_var) {
        return PathBuf::from(bin);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama-cpp-build.sh");
    let out = Command::new(script).args(["native", tool]).stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "building {tool} failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn binary() -> PathBuf {
    tool("llama-server", "HILLSIDE_LLAMA_SERVER")
}

/// llama.cpp's source tree, as the build script unpacks it from the sdist (its chat templates
/// are in `models/templates`).
pub fn llama_cpp_source() -> PathBuf {
    binary();
    PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hillside/llama.cpp/src")
}

impl LlamaServer {
    /// Serves `model` with llama-server's further `args`; returns once it is ready.
    pub fn start(model: &Path, args: &[&str]) -> Self {
        let one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let bin = binary();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(bin)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-t", "2", "--no-webui"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Self { child, port, _one_at_a_time: one_at_a_time };
        let deadline = Instant::now() + Duration::from_secs(120);
        while ureq::get(&format!("{}/health", server.url())).call().map_or(true, |r| r.status() != 200) {
            assert!(Instant::now() < deadline, "llama-server did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
