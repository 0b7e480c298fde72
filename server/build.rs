//! Embeds the web UI's built files (`ui/dist`, which `make ui` builds) so that `hillside serve`
//! serves it at `/`. Without them the server still builds, and `/` says how to build the UI.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dist = manifest.join("../ui/dist");
    // A folder is watched whole; one that does not exist yet reruns this every build.
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    collect(&dist, &dist, &mut files);
    files.sort();
    let mut code = String::from("pub static FILES: &[(&str, &[u8])] = &[\n");
    for (name, path) in &files {
        code += &format!("    ({name:?}, include_bytes!({path:?})),\n");
    }
    code += "];\n";
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("web_ui_files.rs");
    std::fs::write(out, code).expect("writing the embedded file list");
}

/// Every file under `dir`, as (path relative to `root` with `/`, absolute path).
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let name = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            let absolute = path.canonicalize().unwrap_or(path);
            files.push((name, absolute.to_string_lossy().into_owned()));
        }
    }
}
