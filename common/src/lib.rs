//! What Hillside's programs share: the flags that choose a model, its KV store and its
//! sampling; the config file under them; the model registry; the local or remote engine; and the
//! server `hillside serve` and the desktop app start. The `hillside` command, the desktop app and
//! the lab (`hillside-bench`) are each built on it, as llama.cpp's tools are on `common`.

pub mod download;
pub mod engine_choice;
pub mod fit;
pub mod models;
pub mod serve;
pub mod shelf;

use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_config::DocumentsFile;
use hillside_documents::kv_cache::model_fingerprint;
use hillside_engine::kv::cold::format::ColdType;
use hillside_engine::kv::cold::placement::PlacementKind;
use hillside_engine::kv::{EvaluatorKind, KvConfig, SelectorKind, StoreKind};
use hillside_engine::score::KeyPrecision;
use hillside_engine::{Engine, GenerateParams};
use hillside_server::DocumentsConfig;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The flags every command of `hillside` and `hillside-bench` takes.
#[derive(Args)]
pub struct GlobalArgs {
    /// Compute threads (default: all cores).
    #[arg(long, global = true, env = "HILLSIDE_THREADS")]
    pub threads: Option<usize>,
    /// Config file [default: ~/.config/hillside/config.toml, if it exists].
    #[arg(long, global = true, env = "HILLSIDE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl GlobalArgs {
    /// Reads the config file and sizes the compute threads, before any command runs.
    pub fn apply(&self) -> Result<()> {
        let file = hillside_config::load(self.config.as_deref())?;
        if let Some(threads) = self.threads.or(file.threads) {
            rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().context("setting the thread count")?;
        }
        Ok(())
    }
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// A registry name (see `hillside models list`) or a path to a .gguf file or checkpoint folder.
    #[arg(long, short, env = "HILLSIDE_MODEL")]
    pub model: Option<String>,
    /// Context length in tokens (default: the model's).
    #[arg(long)]
    pub context: Option<usize>,
    /// Where the KV cache lives: full (all in memory) or tiered (hot pool in memory, cold pool
    /// on disk, attention over the top α). For comparison: offload (all on disk, read back each
    /// step), drop (only sinks, recent tokens and the top-α heavy hitters are kept; the rest is
    /// discarded) and near-storage (all on disk, as offload, with exact attention computed
    /// beside the cold pool: only partial outputs reach the host).
    /// [default: full]
    #[arg(long)]
    pub kv: Option<StoreKind>,
    /// Directory for cold-pool files, or several separated by commas (one per SSD: the KV heads
    /// are dealt across them) [default: ~/.cache/hillside/kv].
    #[arg(long, env = "HILLSIDE_COLD_DIR", value_delimiter = ',')]
    pub cold_dir: Vec<PathBuf>,
    /// Tiered: share of the cached tokens each step attends to [default: 0.2].
    #[arg(long)]
    pub alpha: Option<f32>,
    /// Tiered: DRAM budget in MB for hot K/V, scoring keys, the write-back window and read staging
    /// [default: a quarter of the full cache].
    #[arg(long)]
    pub hot_budget_mb: Option<usize>,
    /// Tiered: precision of the scoring copy of the keys: int8, int4, or auto (int8 for KV heads
    /// wider than 128 dimensions, as Gemma 3's, else int4) [default: auto].
    #[arg(long)]
    pub key_bits: Option<KeyPrecision>,
    /// Tiered: leading layers that attend to every token (of a model with windowed layers, its
    /// global ones) [default: 1].
    #[arg(long)]
    pub dense_layers: Option<usize>,
    /// Tiered: who scores cold tokens: host, storage (a worker beside the cold pool) or xrt
    /// (a SmartSSD's FPGA; the storage worker where there is none) [default: storage].
    #[arg(long)]
    pub evaluator: Option<EvaluatorKind>,
    #[command(flatten)]
    pub xrt: XrtArgs,
    /// Tiered: fidelity guard — widen a layer's selection, up to twice α, until each head's
    /// holds this share of its estimated attention (0: off) [default: 0].
    #[arg(long)]
    pub guard_mass: Option<f32>,
    /// Tiered: how spilled tokens are laid out in the cold pool's pages: keys (grouped by key
    /// similarity, so a page read serves tokens selected together), hits (by key, then re-placed
    /// a few decode steps in by how often each token was selected; pays off on long answers)
    /// or position [default: keys].
    #[arg(long)]
    pub placement: Option<PlacementKind>,
    /// Offload, tiered and near-storage: how the cold pool keeps K and V on disk: f16, or q8
    /// (8 bits a value, keys scaled per channel and values per token as in KIVI: 37.5% fewer
    /// bytes on every cold read) [default: f16].
    #[arg(long)]
    pub cold_type: Option<ColdType>,
    /// Tiered: what a decode step's budget selects: tokens (the best-scoring ones, one by one),
    /// riders (those, and the tokens ranked just below whose rows the step holds anyway: in a
    /// page it reads, or in memory), or pages (whole cold-pool pages holding the most estimated
    /// attention, every token in them attended: the step reads only as many pages as its
    /// budget; with them, the best-ranked tokens already in memory), or sparf (tokens one by
    /// one, scored on only the query's --sparf-dims largest dimensions, as InstInfer's SparF)
    /// [default: riders].
    #[arg(long)]
    pub selector: Option<SelectorKind>,
    /// Selector sparf: how many of the query's dimensions tokens are scored on [default: 8].
    #[arg(long)]
    pub sparf_dims: Option<usize>,
    /// Tiered: while the machine has room for the whole cache (beyond a 256 MB reserve, with
    /// no memory pressure), also keep it densely in memory and attend to all of it — exact,
    /// nothing read — and let it go once memory is short: true or false [default: true].
    #[arg(long)]
    pub spare_copy: Option<bool>,
    /// Near-storage: the share of layers that keep each token's layer input instead of its K
    /// and V, rebuilt on the host (HILOS's X-cache; 0.5 is the paper's choice); only models whose
    /// input is smaller than K plus V use it (not GQA models such as SmolLM2: `hillside devices`
    /// says). The rebuild runs on the CPU and costs more than the reads it saves unless the
    /// drive is very slow [default: 0].
    #[arg(long)]
    pub x_cache_share: Option<f64>,
    /// Where attention runs: cpu, or cuda (the decode working set in VRAM; needs a build with
    /// `--features cuda`).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
}

impl ModelArgs {
    /// The KV settings: these flags over the config file's `[kv]` table over the defaults.
    pub fn kv_config(&self) -> KvConfig {
        let mut c = hillside_config::get().kv.clone();
        set(&mut c.store, self.kv);
        if let Some((first, rest)) = self.cold_dir.split_first() {
            c.cold_dir = first.clone();
            c.extra_cold_dirs = rest.to_vec();
        }
        set(&mut c.alpha, self.alpha);
        set(&mut c.key_bits, self.key_bits);
        set(&mut c.dense_layers, self.dense_layers);
        set(&mut c.evaluator, self.evaluator);
        set(&mut c.guard_mass, self.guard_mass);
        set(&mut c.placement, self.placement);
        set(&mut c.cold_type, self.cold_type);
        set(&mut c.selector, self.selector);
        set(&mut c.sparf_dims, self.sparf_dims);
        set(&mut c.spare_copy, self.spare_copy);
        set(&mut c.x_cache_share, self.x_cache_share);
        self.xrt.apply(&mut c);
        if let Some(mb) = self.hot_budget_mb {
            c.hot_budget_bytes = Some(mb * 1_000_000);
        }
        c
    }

    pub fn model(&self) -> Option<&str> {
        self.model.as_deref().or(hillside_config::get().model.as_deref())
    }

    pub fn context(&self) -> Option<usize> {
        self.context.or(hillside_config::get().context)
    }

    /// These settings as flags, for a child process.
    pub fn to_flags(&self) -> Vec<String> {
        let c = self.kv_config();
        let mut flags = vec![
            format!("--alpha={}", c.alpha),
            format!("--key-bits={}", c.key_bits),
            format!("--dense-layers={}", c.dense_layers),
            format!("--evaluator={}", c.evaluator),
            format!("--guard-mass={}", c.guard_mass),
            format!("--placement={}", c.placement),
            format!("--cold-type={}", c.cold_type),
            format!("--selector={}", c.selector),
            format!("--sparf-dims={}", c.sparf_dims),
            format!("--spare-copy={}", c.spare_copy),
            format!("--x-cache-share={}", c.x_cache_share),
            format!(
                "--cold-dir={}",
                c.cold_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(",")
            ),
        ];
        if let Some(m) = self.model() {
            flags.push(format!("--model={m}"));
        }
        if let Some(bytes) = c.hot_budget_bytes {
            flags.push(format!("--hot-budget-mb={}", bytes / 1_000_000));
        }
        if let Some(library) = &c.xrt_library {
            flags.push(format!("--xrt-library={}", library.display()));
        }
        if let Some(xclbin) = &c.xrt_xclbin {
            flags.push(format!("--xclbin={}", xclbin.display()));
        }
        flags.push(format!("--xrt-device={}", c.xrt_device));
        flags.push(format!("--device={}", self.device));
        flags
    }

    /// A new sequence in the configured store.
    pub fn new_sequence(&self, engine: &Engine) -> Result<hillside_engine::Sequence> {
        Ok(engine.new_sequence_with(&self.kv_config(), self.context())?)
    }
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// 0 is greedy [default: 0.7]. This and the next four default to the config file's
    /// `[sampling]` keys where it sets them.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// [default: 40]
    #[arg(long)]
    pub top_k: Option<usize>,
    /// [default: 0.95]
    #[arg(long)]
    pub top_p: Option<f32>,
    /// [default: 0.05]
    #[arg(long)]
    pub min_p: Option<f32>,
    /// [default: 1.1]
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (not printed); repeatable.
    #[arg(long)]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// These flags over the config file's `[sampling]` over the engine's defaults.
    pub fn params(&self) -> GenerateParams {
        let mut sampling = hillside_config::get().sampling.params();
        set(&mut sampling.temperature, self.temperature);
        set(&mut sampling.top_k, self.top_k);
        set(&mut sampling.top_p, self.top_p);
        set(&mut sampling.min_p, self.min_p);
        set(&mut sampling.repeat_penalty, self.repeat_penalty);
        sampling.seed = self.seed;
        GenerateParams { max_tokens: self.max_tokens, stop: self.stop.clone(), sampling, ..GenerateParams::default() }
    }
}

/// Which XRT library, xclbin and card (flags over the config file's `[kv]` table).
#[derive(Args, Clone, Debug, Default)]
pub struct XrtArgs {
    /// Evaluator xrt: XRT's libxrt_coreutil.so (or the emulator built by `make -C fpga emu`)
    /// [default: $XILINX_XRT/lib, then /opt/xilinx/xrt/lib, then the system's].
    #[arg(long, env = "HILLSIDE_XRT_LIBRARY")]
    pub xrt_library: Option<PathBuf>,
    /// Evaluator xrt: the scoring kernel's xclbin [default: ~/.local/share/hillside/hillside_score.xclbin].
    #[arg(long, env = "HILLSIDE_XCLBIN")]
    pub xclbin: Option<PathBuf>,
    /// Evaluator xrt: which card [default: 0].
    #[arg(long)]
    pub xrt_device: Option<u32>,
}

impl XrtArgs {
    /// Applies the flags that were given to `kv`.
    pub fn apply(&self, kv: &mut hillside_engine::kv::KvConfig) {
        if self.xrt_library.is_some() {
            kv.xrt_library = self.xrt_library.clone();
        }
        if self.xclbin.is_some() {
            kv.xrt_xclbin = self.xclbin.clone();
        }
        if let Some(device) = self.xrt_device {
            kv.xrt_device = device;
        }
    }
}

/// Where documents are kept, for every command that uses them.
#[derive(Args, Clone, Default)]
pub struct DocumentsArgs {
    /// Folder of the document library and its kept K/V [default: ~/.local/share/hillside/documents].
    #[arg(long, env = "HILLSIDE_DOCUMENTS_DIR")]
    pub documents_dir: Option<PathBuf>,
    /// Disk the kept K/V of documents may take, in GB; the least recently used go first [default: 4].
    #[arg(long)]
    pub kv_quota_gb: Option<f64>,
    /// Largest document file, in MB [default: 256].
    #[arg(long)]
    pub max_file_mb: Option<u64>,
}

impl DocumentsArgs {
    /// These flags over the config file's `[documents]` table over the defaults, for `model`.
    pub fn config(&self, model: &Path) -> Result<DocumentsConfig> {
        self.config_for(local_model_key(model)?)
    }

    /// The same for the model `model_key` names (summaries are kept per model).
    pub fn config_for(&self, model_key: String) -> Result<DocumentsConfig> {
        let file = &hillside_config::get().documents;
        let dir = self.documents_dir.clone().or_else(|| file.dir.clone()).unwrap_or_else(DocumentsFile::default_dir);
        let quota_gb = self.kv_quota_gb.or(file.kv_quota_gb).unwrap_or(DocumentsFile::DEFAULT_KV_QUOTA_GB);
        if quota_gb.is_nan() || quota_gb < 0.0 {
            bail!("kv_quota_gb must be 0 or more");
        }
        Ok(DocumentsConfig {
            dir,
            kv_quota_bytes: (quota_gb * 1e9) as u64,
            max_file_bytes: self.max_file_mb.or(file.max_file_mb).unwrap_or(DocumentsFile::DEFAULT_MAX_FILE_MB)
                * 1_000_000,
            model_key,
        })
    }
}

/// What names the local model file `model` in the library (its kept summaries and K/V).
pub fn local_model_key(model: &Path) -> Result<String> {
    model_fingerprint(model).with_context(|| format!("reading {}", model.display()))
}

fn set<T>(slot: &mut T, flag: Option<T>) {
    if let Some(value) = flag {
        *slot = value;
    }
}

/// Loads the model named by `args` with a spinner on stderr.
pub fn load_engine(args: &ModelArgs) -> Result<Engine> {
    let path: PathBuf = models::resolve(args.model())?;
    let spinner = ProgressBar::new_spinner().with_message(format!("loading {}", path.display()));
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let engine = load_model(&path, args);
    spinner.finish_and_clear();
    engine
}

/// Loads the model file at `path` with the device and KV settings of `args`, refusing one whose
/// weights would not fit the memory free now.
pub fn load_model(path: &Path, args: &ModelArgs) -> Result<Engine> {
    refuse_what_cannot_fit(path, args)?;
    let mut engine = Engine::load(path).with_context(|| format!("loading {}", path.display()))?;
    if args.device == "cuda" {
        engine.set_attention(hillside_engine::device::Attention::cuda(0)?);
    }
    let c = &engine.model().config;
    tracing::info!(
        arch = c.architecture.name(),
        layers = c.n_layers,
        hidden = c.hidden_size,
        context = c.context_tokens,
        weights_mb = engine.model().weight_bytes() / 1_000_000,
        simd = hillside_engine::kernels::simd_level().name(),
        attention = engine.model().attention().name(),
        "model loaded"
    );
    let kv = args.kv_config();
    if kv.store == StoreKind::NearStorage {
        tracing::info!(x_cache = %kv.x_cache_plan(c.kv_shape(c.context_tokens), c.hidden_size), "near-storage attention");
    }
    Ok(engine)
}

/// Refuses a model whose weights alone would not fit the memory free now, before loading it
/// gets the process killed; warns where its K/V at the whole context would not (the cache
/// grows with the tokens, so a short conversation still runs).
fn refuse_what_cannot_fit(path: &std::path::Path, args: &ModelArgs) -> Result<()> {
    if !hillside_engine::model::gguf::is_gguf(path) {
        return Ok(());
    }
    let kv = args.kv_config();
    let fit = fit::estimate(path, args.context(), &kv)?;
    if fit.weights_bytes + fit.program_bytes > fit.memory_free_bytes {
        bail!("{}: {}", path.display(), fit.sentence());
    }
    let enough = match fit.verdict {
        fit::Verdict::Fits => true,
        fit::Verdict::FitsTiered { .. } => kv.store != StoreKind::Full,
        fit::Verdict::DoesNotFit => false,
    };
    if !enough {
        tracing::warn!("{} at {} tokens of context {}", path.display(), fit.context_tokens, fit.sentence());
    }
    Ok(())
}

/// Every file and folder this process makes is its owner's alone (0600, 0700), whoever made
/// it: Hillside's own files are created private anyway, this covers what libraries create.
pub fn private_by_default() {
    // SAFETY: umask only sets this process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

/// glibc raises its mmap threshold each time a large block is freed, after which the KV stores'
/// growing per-step buffers come from the heap and fragment it: at 8K tokens of tiered cache that
/// cost ~55 MB of peak RSS. A fixed threshold keeps large blocks in their own mappings, returned
/// to the system when freed. Fixing it also fixes the trim threshold at 128 KiB, and a decode
/// step's small buffers then gave the heap's top back and faulted it in again, layer after
/// layer (a tenth of a tiered step's host time at 8K): the heap keeps up to 16 MB free at its
/// top instead (peak RSS unchanged).
pub fn configure_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 * 1024 * 1024);
    }
}

/// Logs to stderr, filtered by `HILLSIDE_LOG` (warnings by default).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("HILLSIDE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
}
