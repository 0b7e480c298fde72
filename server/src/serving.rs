//! The model a server answers with. A request takes the one in force when it starts and keeps
//! it to its end, so that switching to another model (`POST /v1/hillside/models/{name}/load`)
//! never changes a reply midway: requests in flight finish on the model they started on, the
//! next ones get the new model, and the old one is unloaded once its last request is done.

use crate::backend;
use crate::error::ApiError;
use hillside_documents::kv_cache::DocumentKvCache;
use hillside_documents::summarize::Runner;
use hillside_engine::scheduler::{Scheduler, SchedulerConfig};
use hillside_engine::Engine;
use hillside_front::EngineFront;
use std::sync::Arc;

pub struct Serving {
    pub front: EngineFront,
    /// The id clients name the model by (a registry name, or the file's stem).
    pub model_id: String,
    /// Other names accepted for it (its file name).
    pub model_aliases: Vec<String>,
    /// Names the model in the library's kept summaries.
    pub model_key: String,
    /// Documents' kept K/V for this model; `None` without a data folder.
    kept_kv: Option<Arc<DocumentKvCache>>,
    /// The scheduler's context setting (`None`: the model's own).
    context_setting: Option<usize>,
}

impl Serving {
    /// Serves `engine` through a scheduler of its own (or a remote engine as it is).
    pub fn new(
        engine: crate::EngineChoice,
        scheduler: &SchedulerConfig,
        names: (String, Vec<String>),
        model_key: String,
        kept_kv: Option<Arc<DocumentKvCache>>,
    ) -> Self {
        let front = match engine {
            crate::EngineChoice::Local(engine) => EngineFront::start_local(engine, scheduler.clone()),
            crate::EngineChoice::Remote(remote) => EngineFront::Remote(remote),
        };
        let (model_id, model_aliases) = names;
        Self { front, model_id, model_aliases, model_key, kept_kv, context_setting: scheduler.context_tokens }
    }

    /// The local engine and its scheduler; on a remote engine, the error for a route that
    /// needs them.
    pub fn local(&self) -> Result<(&Arc<Engine>, &Scheduler), ApiError> {
        self.front.local().ok_or_else(|| backend::needs_local_engine(&self.front))
    }

    /// The local engine's scheduler; `None` on a remote engine.
    pub fn scheduler(&self) -> Option<&Scheduler> {
        self.local().ok().map(|(_, scheduler)| scheduler)
    }

    /// Whether `name` is one of the model's names.
    pub fn answers_to(&self, name: &str) -> bool {
        name == self.model_id || self.model_aliases.iter().any(|a| a == name)
    }

    /// Each sequence's context in tokens (on a remote engine, each request's).
    pub fn context_tokens(&self) -> usize {
        self.front.context_tokens(self.context_setting)
    }

    /// What summaries and questions run on; with `keep_kv`, documents' K/V is kept for the
    /// questions that follow (local engine only).
    pub fn runner(&self, keep_kv: bool) -> Runner<'_> {
        Runner::new(&self.front, self.context_setting, self.kept_kv.as_ref().filter(|_| keep_kv))
    }

    /// Documents' kept K/V for this model.
    pub fn kept_kv(&self) -> Option<&Arc<DocumentKvCache>> {
        self.kept_kv.as_ref()
    }
}
