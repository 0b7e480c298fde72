//! `hillside devices`: what storage-side scoring hardware this machine has — the XRT library,
//! its cards, whether the scoring kernel's xclbin loads, whether peer-to-peer buffers work — and
//! so which evaluator a tiered store with `--evaluator xrt` will really use — and whether the
//! model's shapes let near-storage attention keep layer inputs instead of K/V (the X-cache).

use anyhow::Result;
use clap::Args;
use hillside_common::{models, XrtArgs};
use hillside_engine::score::xrt::{probe, XrtOptions};
use std::path::PathBuf;

#[derive(Args)]
pub struct DevicesArgs {
    #[command(flatten)]
    pub xrt: XrtArgs,
    /// The model the X-cache line is about: a registry name or a path [default: the configured one].
    #[arg(long, short, env = "HILLSIDE_MODEL")]
    pub model: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn devices(args: &DevicesArgs) -> Result<()> {
    let mut kv = hillside_config::get().kv.clone();
    args.xrt.apply(&mut kv);
    let options: XrtOptions = kv.xrt_options();
    let found = probe(&options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(());
    }
    let show = |p: &Option<PathBuf>| p.as_ref().map_or("-".to_string(), |p| p.display().to_string());
    println!("XRT library  {} ({})", found.library.display(), found.version.as_deref().unwrap_or("not loaded"));
    println!("cards        {}", found.cards);
    println!("xclbin       {}", show(&found.xclbin));
    println!("P2P          {}", if found.p2p { "enabled" } else { "no" });
    match &found.problem {
        None => println!("evaluator    xrt: card {} scores the cold pool", options.device),
        Some(problem) => {
            println!("status       {problem}");
            println!("evaluator    storage (a host worker over the cold pool): --evaluator xrt falls back to it");
        }
    }
    println!("X-cache      {}", x_cache_line(args.model.as_deref().or(hillside_config::get().model.as_deref()), &kv));
    Ok(())
}

/// Whether near-storage stores for `model` keep layer inputs, and why, from its shapes alone.
fn x_cache_line(model: Option<&str>, kv: &hillside_engine::kv::KvConfig) -> String {
    let path = match models::resolve(model) {
        Ok(path) => path,
        Err(e) => return format!("no model to decide for ({e})"),
    };
    match hillside_engine::model::read_config(&path) {
        Ok(c) => format!("{}; model {}", kv.x_cache_plan(c.kv_shape(c.context_tokens), c.hidden_size), path.display()),
        Err(e) => format!("cannot tell: {e}"),
    }
}
