//! `hillside bench …` and `hillside eval …`: the lab is a program of its own, `hillside-bench`,
//! which the product does not link. These commands hand over to it, found beside this program
//! or else on `PATH`, as `git foo` runs `git-foo`.

use anyhow::{bail, Context, Result};
use hillside_common::GlobalArgs;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

const LAB: &str = "hillside-bench";

/// Replaces this process with the lab's, running `args` with this run's global flags.
pub fn run(global: &GlobalArgs, args: Vec<OsString>) -> Result<()> {
    let Some(lab) = find() else {
        let here = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "hillside".into());
        bail!(
            "the lab's commands are a program of their own, {LAB}, which is neither beside {here} nor on PATH \
             (build it with `cargo build --release -p {LAB}`)"
        );
    };
    let mut command = Command::new(&lab);
    command.args(args);
    // The flags given before the command reach the lab the way it reads them too.
    if let Some(threads) = global.threads {
        command.env("HILLSIDE_THREADS", threads.to_string());
    }
    if let Some(config) = &global.config {
        command.env("HILLSIDE_CONFIG", config);
    }
    let error = command.exec();
    Err(error).with_context(|| format!("running {}", lab.display()))
}

/// The lab beside this program (the same build), else the first on `PATH`.
fn find() -> Option<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join(LAB)));
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    beside.into_iter().chain(on_path.map(|dir| dir.join(LAB))).find(|p| p.is_file())
}
