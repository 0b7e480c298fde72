//! Where a summary keeps each step it finishes (a chunk's note, a merge's), so that a summary
//! stopped by a crash, a kill or the user resumes where it stopped. Decoding is greedy, so the
//! steps left give what they would have, and the resumed summary is the one an uninterrupted
//! run writes.

use crate::library::Library;
use std::collections::BTreeMap;

pub trait Checkpoints {
    /// The notes kept for the summary planned as `plan_key`, by step.
    fn resume(&mut self, plan_key: &str) -> BTreeMap<String, String>;
    /// Keeps a finished step's note (the plan has `chunks` chunks). One that cannot be kept
    /// costs a later resume that step, not this summary: it is logged.
    fn keep(&mut self, plan_key: &str, chunks: usize, step: &str, note: &str);
}

/// Keeps nothing: every summary starts afresh.
pub struct NoCheckpoints;

impl Checkpoints for NoCheckpoints {
    fn resume(&mut self, _: &str) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn keep(&mut self, _: &str, _: usize, _: &str, _: &str) {}
}

/// Keeps them in the library, with the document, for the model `model_key`.
pub struct LibraryCheckpoints<'a> {
    pub library: &'a Library,
    pub id: &'a str,
    pub model_key: &'a str,
}

impl LibraryCheckpoints<'_> {
    fn key(&self, plan_key: &str) -> String {
        format!("{}:{plan_key}", self.model_key)
    }
}

impl Checkpoints for LibraryCheckpoints<'_> {
    fn resume(&mut self, plan_key: &str) -> BTreeMap<String, String> {
        match self.library.checkpoint(self.id) {
            Ok(Some(kept)) if kept.plan_key == self.key(plan_key) => kept.notes,
            Ok(_) => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(error = %e, document = self.id, "cannot read the summary's checkpoint; starting afresh");
                BTreeMap::new()
            }
        }
    }

    fn keep(&mut self, plan_key: &str, chunks: usize, step: &str, note: &str) {
        if let Err(e) = self.library.keep_step(self.id, &self.key(plan_key), chunks, step, note) {
            tracing::warn!(error = %e, document = self.id, step, "cannot keep a summary step");
        }
    }
}
