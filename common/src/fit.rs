//! Will a model fit on this machine? Its weights (the file), its K/V at the context asked for
//! (a windowed layer holds its window only), and what the program itself takes, against the
//! memory this process could use now; where that falls short, the tiered store's DRAM with its
//! cold pool on the disk.

use anyhow::{bail, Context, Result};
use hillside_engine::headroom::{Headroom, HEADROOM_RESERVE_BYTES};
use hillside_engine::kv::{KvConfig, KvShape};
use hillside_engine::model::gguf;
use serde::Serialize;
use std::path::Path;

/// What the program takes beside the weights and the K/V: its code, activations and scratch,
/// and per vocabulary entry the tokenizer's tables and the logits. Fitted to the shared models'
/// peak RSS (`cli/tests/model_fit.rs`), whose vocabularies span 49K to 262K entries.
const PROGRAM_BYTES: u64 = 16_000_000;
const PROGRAM_BYTES_PER_VOCAB_ENTRY: u64 = 220;

#[derive(Debug, Serialize)]
pub struct Fit {
    pub context_tokens: usize,
    pub weights_bytes: u64,
    /// The full cache's f16 K/V with every position of the context filled.
    pub kv_bytes: u64,
    pub program_bytes: u64,
    /// What this process could use now, less what is left to everyone else.
    pub memory_free_bytes: u64,
    pub verdict: Verdict,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Fits,
    FitsTiered { hot_bytes: u64, cold_bytes: u64, disk_free_bytes: u64 },
    DoesNotFit,
}

impl Fit {
    pub fn total_bytes(&self) -> u64 {
        self.weights_bytes + self.kv_bytes + self.program_bytes
    }

    /// The verdict as a sentence, with its numbers.
    pub fn sentence(&self) -> String {
        match &self.verdict {
            Verdict::Fits => format!("fits: it needs {} and {} are free", size_text(self.total_bytes()), size_text(self.memory_free_bytes)),
            Verdict::FitsTiered { hot_bytes, cold_bytes, .. } => format!(
                "fits with the tiered store (hot pool {}, cold pool {} on disk): the full cache would need {} and {} are free; run it with --kv tiered",
                size_text(*hot_bytes),
                size_text(*cold_bytes),
                size_text(self.total_bytes()),
                size_text(self.memory_free_bytes)
            ),
            Verdict::DoesNotFit if self.weights_bytes + self.program_bytes > self.memory_free_bytes => format!(
                "does not fit: its weights alone take {} and {} are free; pick a smaller model or free some memory",
                size_text(self.weights_bytes + self.program_bytes),
                size_text(self.memory_free_bytes)
            ),
            Verdict::DoesNotFit => format!(
                "does not fit: it needs {} ({} of weights) and {} are free, too little even for the tiered store; try a shorter --context or a smaller model",
                size_text(self.total_bytes()),
                size_text(self.weights_bytes),
                size_text(self.memory_free_bytes)
            ),
        }
    }
}

/// What the estimate needs of a model: the GGUF header's, or the catalogue's before a download.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct ModelShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// Tokens a windowed layer keeps, where the model has windowed layers.
    #[serde(default)]
    pub window_tokens: Option<usize>,
    /// The layers that attend to the whole context (all of them without a window).
    #[serde(default)]
    pub global_layers: Option<usize>,
}

impl ModelShape {
    /// The shape a GGUF's header gives, and the context it was trained for.
    pub fn of_gguf(path: &Path) -> Result<(Self, usize)> {
        let file = gguf::open(path).with_context(|| format!("reading {}", path.display()))?;
        let c = file.config();
        let shape = Self {
            layers: c.n_layers,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
            window_tokens: c.sliding_window.as_ref().map(|w| w.tokens),
            global_layers: c.sliding_window.as_ref().map(|w| w.layers.iter().filter(|&&windowed| !windowed).count()),
        };
        Ok((shape, c.context_tokens))
    }
}

/// The fit of the GGUF at `path` at `context` tokens (the model's own length if `None`), with
/// the cold pool where `kv` puts it.
pub fn estimate(path: &Path, context: Option<usize>, kv: &KvConfig) -> Result<Fit> {
    let (shape, trained_tokens) = ModelShape::of_gguf(path)?;
    let weights_bytes = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    estimate_shape(&shape, weights_bytes, context.unwrap_or(trained_tokens).min(trained_tokens), kv)
}

/// The fit of a model of `shape` whose file takes `weights_bytes`, at `context_tokens`.
pub fn estimate_shape(shape: &ModelShape, weights_bytes: u64, context_tokens: usize, kv: &KvConfig) -> Result<Fit> {
    if context_tokens == 0 {
        bail!("--context must be positive");
    }
    let row_bytes = (2 * shape.kv_heads * shape.head_dim * 2) as u64;
    let global_layers = shape.global_layers.unwrap_or(shape.layers).min(shape.layers);
    let window_tokens = shape.window_tokens.unwrap_or(0).min(context_tokens);
    let ring_bytes = (shape.layers - global_layers) as u64 * window_tokens as u64 * row_bytes;
    let global_bytes = global_layers as u64 * context_tokens as u64 * row_bytes;
    let program_bytes = PROGRAM_BYTES + PROGRAM_BYTES_PER_VOCAB_ENTRY * shape.vocab as u64;
    let memory_free_bytes = Headroom::measure().bytes.saturating_sub(HEADROOM_RESERVE_BYTES);
    let mut fit = Fit {
        context_tokens,
        weights_bytes,
        kv_bytes: global_bytes + ring_bytes,
        program_bytes,
        memory_free_bytes,
        verdict: Verdict::DoesNotFit,
    };
    fit.verdict = if fit.total_bytes() <= memory_free_bytes {
        Verdict::Fits
    } else if global_layers == 0 {
        Verdict::DoesNotFit
    } else {
        // The global layers go to the tiered store: its hot budget in DRAM, all of their K/V
        // in the cold pool. The rings stay in DRAM.
        let tiered_shape = KvShape {
            n_layers: global_layers,
            n_kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            max_tokens: context_tokens,
        };
        let hot_bytes = kv.tiered_settings(tiered_shape).hot_budget_bytes as u64;
        // The cold dir is made when a sequence starts: the disk is the one its nearest parent is on.
        let disk_free_bytes = kv
            .cold_dir
            .ancestors()
            .find(|dir| dir.exists())
            .and_then(|dir| crate::download::free_bytes(dir).ok())
            .unwrap_or(0);
        let dram = weights_bytes + program_bytes + ring_bytes + hot_bytes;
        if dram <= memory_free_bytes && global_bytes <= disk_free_bytes {
            Verdict::FitsTiered { hot_bytes, cold_bytes: global_bytes, disk_free_bytes }
        } else {
            Verdict::DoesNotFit
        }
    };
    Ok(fit)
}

/// A size as people read it: whole MB (10⁶ bytes, rounded, at least 1) under a GB, else GB to
/// a tenth.
pub fn size_text(bytes: u64) -> String {
    if bytes < 1_000_000_000 {
        format!("{} MB", (bytes.div_ceil(500_000) / 2).max(1))
    } else {
        format!("{:.1} GB", bytes as f64 / 1e9)
    }
}
