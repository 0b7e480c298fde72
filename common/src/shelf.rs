//! The server's view of this machine's models ([`ModelShelf`]): the registry, the models
//! folder and the fit estimate, as `hillside models` uses them, for the app's Models page.

use crate::download::{self, DownloadError, Progress};
use crate::fit::{self, Fit, Verdict};
use crate::models::{self, PullError};
use crate::{load_model, local_model_key, serve, ModelArgs};
use hillside_engine::model::gguf;
use hillside_server::shelf::{FitReport, LoadedModel, ModelShelf, PullProgress, PullRequest, ShelfError, ShelfModel};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub struct Shelf {
    /// The device and KV settings every model is loaded with (the server's).
    args: ModelArgs,
    /// Where hub models are fetched from.
    hub: String,
}

impl Shelf {
    pub fn new(args: ModelArgs, hub: String) -> Self {
        Self { args, hub }
    }
}

impl ModelShelf for Shelf {
    fn catalogue(&self, context_tokens: usize) -> Vec<ShelfModel> {
        let registry = models::registry();
        let kv = self.args.kv_config();
        let report = |fit: anyhow::Result<Fit>| fit.ok().map(|f| fit_report(&f));
        let mut installed = Vec::new();
        let mut available = Vec::new();
        for e in &registry.models {
            let path = e.installed_path();
            let size_bytes =
                path.as_ref().and_then(|p| std::fs::metadata(p).ok()).map_or(e.size_mb * 1_000_000, |m| m.len());
            let fit = report(fit::estimate_shape(&e.shape, size_bytes, context_tokens.min(e.context_tokens), &kv));
            let model = ShelfModel {
                name: e.name.clone(),
                description: Some(e.description.clone()),
                family: Some(e.family.clone()),
                format: Some(e.format.clone()),
                size_bytes,
                context_tokens: Some(e.context_tokens),
                licence: Some(e.licence.clone()),
                source: match &e.source.hf {
                    Some(repo) => format!("huggingface:{repo}"),
                    None => "pypi".into(),
                },
                installed: path.is_some(),
                path: path.map(|p| p.display().to_string()),
                default: e.name == registry.default,
                fit,
            };
            match model.installed {
                true => installed.push(model),
                false => available.push(model),
            }
        }
        for path in models::other_files(&models::models_dir(), &registry) {
            let header = fit::ModelShape::of_gguf(&path).ok();
            installed.push(ShelfModel {
                name: path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
                description: None,
                family: gguf::open(&path).ok().map(|f| f.config().architecture.name().to_string()),
                format: None,
                size_bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
                context_tokens: header.as_ref().map(|(_, trained)| *trained),
                licence: None,
                source: "file".into(),
                path: Some(path.display().to_string()),
                installed: true,
                default: false,
                fit: report(fit::estimate(&path, Some(context_tokens), &kv)),
            });
        }
        installed.extend(available);
        installed
    }

    fn installed(&self) -> Vec<String> {
        models::installed_names()
    }

    fn load(&self, name: &str) -> Result<LoadedModel, ShelfError> {
        // Installed models only: a client of the API must not make the server open other files.
        if !models::is_installed(name) {
            return Err(ShelfError::NotFound(match models::is_known(name) {
                true => format!("{name} is not downloaded: download it first"),
                false => format!("no model {name} is installed (see GET /v1/hillside/models)"),
            }));
        }
        let path = models::locate(Some(name)).map_err(|e| match models::is_known(name) {
            true => ShelfError::Refused(format!("{e:#}")),
            false => ShelfError::NotFound(format!("{e:#}")),
        })?;
        let args = ModelArgs { model: Some(name.to_string()), ..self.args.clone() };
        let engine = load_model(&path, &args).map_err(|e| ShelfError::Load(format!("{e:#}")))?;
        let model_key = local_model_key(&path).map_err(|e| ShelfError::Load(format!("{e:#}")))?;
        let (model_id, model_aliases) = serve::model_names(Some(name), &path);
        Ok(LoadedModel { engine: Arc::new(engine), model_id, model_aliases, model_key })
    }

    fn check_pull(&self, what: &PullRequest) -> Result<(), ShelfError> {
        match (models::is_known(&what.model), what.model.contains('/'), &what.file) {
            (true, _, _) | (false, true, Some(_)) => Ok(()),
            (false, true, None) => Err(ShelfError::NotFound(format!("name the file to fetch from {}", what.model))),
            (false, false, _) => Err(ShelfError::NotFound(format!(
                "unknown model {}: give a catalogue name (see GET /v1/hillside/models) or a Hugging Face repository with its file",
                what.model
            ))),
        }
    }

    fn pull(
        &self,
        what: &PullRequest,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<(), ShelfError> {
        let mut report = |p: &Progress| {
            progress(PullProgress { done_bytes: p.done_bytes, total_bytes: p.total_bytes, bytes_per_s: p.bytes_per_s })
        };
        let fetched =
            models::fetch(&self.hub, &what.model, what.file.as_deref(), what.sha256.as_deref(), cancel, &mut report);
        match fetched {
            Ok(_) => Ok(()),
            Err(PullError::Unknown(message)) => Err(ShelfError::NotFound(message)),
            Err(PullError::Download(e)) => {
                let network = matches!(e, DownloadError::Offline { .. } | DownloadError::Interrupted { .. });
                Err(ShelfError::Download { message: e.to_string(), network })
            }
            Err(e @ (PullError::Cancelled(_) | PullError::Failed(_))) => {
                Err(ShelfError::Download { message: e.to_string(), network: false })
            }
        }
    }

    fn remove(&self, name: &str) -> Result<(), ShelfError> {
        models::remove(name).map(drop).map_err(|e| match models::is_installed(name) {
            true => ShelfError::Refused(format!("{e:#}")),
            false => ShelfError::NotFound(format!("{e:#}")),
        })
    }

    fn models_dir(&self) -> PathBuf {
        models::models_dir()
    }

    fn disk_free_bytes(&self) -> Option<u64> {
        let dir = models::models_dir();
        dir.ancestors().find(|d| d.exists()).and_then(|d| download::free_bytes(d).ok())
    }

    fn import(&self, path: &Path, file_name: &str, take: bool) -> Result<String, ShelfError> {
        let registry = models::registry();
        if registry.models.iter().any(|e| e.file == file_name) {
            return Err(ShelfError::Refused(format!(
                "{file_name} is the file name of a catalogue model, which is installed only with its checked hash: pull it, or rename the file"
            )));
        }
        let file = gguf::open(path)
            .map_err(|e| ShelfError::Refused(format!("{file_name} is not a model file Hillside reads: {e}")))?;
        let architecture = file.config().architecture.name().to_string();
        let dir = models::models_dir();
        hillside_engine::private_files::create_dir(&dir)
            .map_err(|e| ShelfError::Refused(format!("creating {}: {e}", dir.display())))?;
        let dest = dir.join(file_name);
        if dest.exists() {
            return Err(ShelfError::Refused(format!(
                "a model named {file_name} is installed already: delete it first, or rename the file"
            )));
        }
        let write =
            |e: std::io::Error| ShelfError::Refused(format!("installing {file_name} into {}: {e}", dir.display()));
        if take {
            std::fs::rename(path, &dest).map_err(write)?;
        } else {
            // Copied beside its final name, so that a copy cut short is never listed.
            let need = std::fs::metadata(path).map_err(write)?.len();
            if self.disk_free_bytes().is_some_and(|free| free < need) {
                return Err(ShelfError::Refused(format!(
                    "not enough disk space for {file_name}: it takes {} and {} are free in {}",
                    fit::size_text(need),
                    fit::size_text(self.disk_free_bytes().unwrap_or(0)),
                    dir.display()
                )));
            }
            let part = download::part_path(&dest);
            let copied = std::fs::copy(path, &part)
                .and_then(|_| std::fs::set_permissions(&part, std::os::unix::fs::PermissionsExt::from_mode(0o600)))
                .and_then(|_| std::fs::rename(&part, &dest));
            if let Err(e) = copied {
                let _ = std::fs::remove_file(&part);
                return Err(write(e));
            }
        }
        tracing::info!(file = file_name, architecture, "imported a model");
        Ok(dest.file_stem().map_or_else(|| file_name.to_string(), |s| s.to_string_lossy().into_owned()))
    }
}

fn fit_report(fit: &Fit) -> FitReport {
    let (verdict, hot_bytes, cold_bytes) = match fit.verdict {
        Verdict::Fits => ("fits", None, None),
        Verdict::FitsTiered { hot_bytes, cold_bytes, .. } => ("fits_tiered", Some(hot_bytes), Some(cold_bytes)),
        Verdict::DoesNotFit => ("does_not_fit", None, None),
    };
    FitReport {
        verdict: verdict.into(),
        sentence: fit.sentence(),
        context_tokens: fit.context_tokens,
        weights_bytes: fit.weights_bytes,
        kv_bytes: fit.kv_bytes,
        memory_free_bytes: fit.memory_free_bytes,
        hot_bytes,
        cold_bytes,
    }
}
