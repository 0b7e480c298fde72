//! `--prompt-cache DIR`: a long prompt's K/V kept on disk once computed and replayed into every
//! later store, all but the last prefill chunk, which is computed as usual (so the first logits,
//! and the store's prompt-time bookkeeping for that chunk, are real). A 32K prompt then costs one
//! prefill of minutes instead of one per store.

use anyhow::{Context, Result};
use hillside_common::ModelArgs;
use hillside_engine::kv::{snapshot, KvStore};
use hillside_engine::{Engine, Logits, Sequence};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Feeds `tokens` to a sequence from `new_sequence` in chunks of `chunk`, the part before the
/// last chunk replayed from `cache` where it holds it (and kept there once computed). A file
/// that fails its checksum is not replayed: the prompt is computed again on a fresh sequence.
/// Returns the sequence, the last token's logits and how many tokens were replayed.
pub fn feed_prompt(
    engine: &Engine,
    model: &ModelArgs,
    mut new_sequence: impl FnMut() -> Result<Sequence>,
    tokens: &[u32],
    chunk: usize,
    cache: Option<&Path>,
) -> Result<(Sequence, Vec<f32>, usize)> {
    let mut seq = new_sequence()?;
    let head = (tokens.len().saturating_sub(1) / chunk) * chunk;
    let cached = cache.filter(|_| head > 0).map(|dir| PromptSnapshot::new(dir, model, &tokens[..head]));
    let mut replayed_tokens = 0;
    if let Some(snapshot) = cached.as_ref().filter(|s| s.path.exists()) {
        match snapshot::load(&snapshot.path, &snapshot.tag, seq.kv.as_mut()) {
            Ok(n) => replayed_tokens = n,
            Err(e) => {
                eprintln!("not replaying {}: {e}; computing the prompt", snapshot.path.display());
                seq = new_sequence()?;
            }
        }
    }
    let mut logits = Vec::new();
    for piece in tokens[replayed_tokens..].chunks(chunk) {
        logits = engine.model().forward(piece, seq.kv.as_mut(), Logits::Last)?;
        if let Some(snapshot) = cached.as_ref().filter(|_| replayed_tokens == 0 && seq.kv.len_tokens() == head) {
            snapshot.save(seq.kv.as_mut(), head)?;
        }
    }
    seq.tokens = tokens.to_vec();
    Ok((seq, logits, replayed_tokens))
}

/// Where one prompt's K/V is kept: a file named by a hash of the model and the prompt's tokens,
/// which the snapshot also carries (a file for another prompt is refused).
struct PromptSnapshot {
    path: PathBuf,
    tag: [u8; 32],
}

impl PromptSnapshot {
    fn new(dir: &Path, model: &ModelArgs, tokens: &[u32]) -> Self {
        let mut hash = Sha256::new();
        hash.update(model.model().unwrap_or("default").as_bytes());
        hash.update((tokens.len() as u64).to_le_bytes());
        tokens.iter().for_each(|t| hash.update(t.to_le_bytes()));
        let tag: [u8; 32] = hash.finalize().into();
        let name: String = tag[..16].iter().map(|b| format!("{b:02x}")).collect();
        Self { path: dir.join(format!("prompt-{name}.kv")), tag }
    }

    fn save(&self, kv: &mut dyn KvStore, tokens: usize) -> Result<()> {
        std::fs::create_dir_all(self.path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("creating {}", self.path.display()))?;
        let bytes = snapshot::save(kv, tokens, &self.tag, &self.path)
            .with_context(|| format!("saving the prompt's K/V to {}", self.path.display()))?;
        eprintln!("kept the prompt's K/V ({tokens} tokens, {} MB) in {}", bytes / 1_000_000, self.path.display());
        Ok(())
    }
}
