//! `hillside eval`: how faithful each KV store is to the full cache, teacher-forced over a real
//! text. Prints a table and writes JSON.

use crate::fidelity::{teacher_forced_from, AttentionMass, AttentionMassProbe, IdealSelector, TeacherForced};
use crate::prompt_cache::feed_prompt;
use anyhow::{bail, Context, Result};
use clap::Args;
use hillside_common::{load_engine, ModelArgs};
use hillside_engine::kv::{KvStats, KvStore, SelectorKind, StoreKind};
use hillside_engine::Engine;
use serde::Serialize;
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct EvalArgs {
    /// Model and the sparse stores' settings (--kv is ignored: see --stores; --spare-copy is
    /// always false, so that tiered ranks and reads as it does when memory is short).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Stores to compare with `full` (which always runs first, as the reference).
    #[arg(long, value_delimiter = ',', default_values = ["tiered"])]
    pub stores: Vec<StoreKind>,
    /// Text to evaluate on (default: the shared pride-and-prejudice.txt).
    #[arg(long, conflicts_with = "suite")]
    pub text: Option<PathBuf>,
    /// Evaluates every text of the fidelity suite in FOLDER (default:
    /// ~/.cache/hillside/fidelity, which `scripts/fidelity-texts.py` builds the first time),
    /// each from its start (--skip-tokens is ignored), and reports each text and the worst.
    #[arg(long, num_args = 0..=1, value_name = "FOLDER")]
    pub suite: Option<Option<PathBuf>>,
    /// Tokens in the window.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Leading tokens of the window read as a prompt (not scored).
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,
    /// Tokens of the text skipped before the window (front matter).
    #[arg(long, default_value_t = 1000)]
    pub skip_tokens: usize,
    /// Contexts for passkey retrieval.
    #[arg(long, value_delimiter = ',', default_values_t = [1024, 2048, 4096, 8192])]
    pub passkey_contexts: Vec<usize>,
    /// Skip passkey retrieval.
    #[arg(long)]
    pub no_passkey: bool,
    /// Prompts for greedy continuations (0: skip them).
    #[arg(long, default_value_t = 20)]
    pub greedy_prompts: usize,
    /// Tokens of each greedy-continuation prompt.
    #[arg(long, default_value_t = 2048)]
    pub greedy_prompt_tokens: usize,
    /// Tokens each greedy continuation generates.
    #[arg(long, default_value_t = 32)]
    pub greedy_tokens: usize,
    /// Passkeys (random keys at random depths) per context.
    #[arg(long, default_value_t = 10)]
    pub passkey_trials: usize,
    #[arg(long, default_value = "eval.json")]
    pub json: PathBuf,
    /// Also run the ideal selector: the tiered store's α, sinks and recent window, with the
    /// rest chosen by exact attention (f32 keys, true softmax) — the ceiling of any scorer —
    /// teacher-forced and in the greedy continuations.
    #[arg(long)]
    pub ideal: bool,
    /// Skips measuring the attention mass each selection captured (a second, exact pass per
    /// sparse store).
    #[arg(long)]
    pub no_attention_mass: bool,
    /// Keeps the window's prompt K/V, and each passkey prompt's, in this folder and replays it
    /// into every store after the first (see `bench decode --prompt-cache`): one prefill instead
    /// of one per pass, for long windows scored over their last tokens (`--tokens 32768
    /// --prompt-tokens 32256`) and for passkeys at long contexts. A
    /// replayed prompt seeds the tiered store's hit table from its last chunk only.
    #[arg(long)]
    pub prompt_cache: Option<PathBuf>,
}

impl EvalArgs {
    /// `store` with these settings. Tiered never keeps a spare copy here: with one, it would
    /// attend to everything wherever memory is spare, and the evaluation is of its selection.
    fn kv_config(&self, store: StoreKind) -> hillside_engine::kv::KvConfig {
        hillside_engine::kv::KvConfig { store, spare_copy: false, ..self.model.kv_config() }
    }

    /// Teacher-forces `window` through the store `config` makes, its KV store first wrapped by
    /// `wrap` (a probe, the ideal selector): the prompt fed in 256-token chunks, replayed from
    /// `--prompt-cache` where it holds it.
    fn teacher_force(
        &self,
        engine: &Engine,
        config: &hillside_engine::kv::KvConfig,
        window: &[u32],
        wrap: impl Fn(Box<dyn KvStore>) -> Box<dyn KvStore>,
    ) -> Result<(TeacherForced, KvStats)> {
        let new_sequence = || {
            let mut seq = engine.new_sequence_with(config, Some(self.tokens))?;
            seq.kv = wrap(seq.kv);
            Ok(seq)
        };
        let prompt = &window[..self.prompt_tokens];
        let (mut seq, logits, _) =
            feed_prompt(engine, &self.model, new_sequence, prompt, 256, self.prompt_cache.as_deref())?;
        let run = teacher_forced_from(engine, &mut seq, logits, &window[self.prompt_tokens..], |_| {})?;
        Ok((run, seq.kv.stats()))
    }
}

#[derive(Serialize)]
struct PasskeyResult {
    store: StoreKind,
    context_tokens: usize,
    trials: usize,
    correct: usize,
    /// The trials answered wrong, with what the model said, so a miss can be replayed.
    misses: Vec<PasskeyMiss>,
}

#[derive(Serialize)]
struct PasskeyMiss {
    key: u64,
    depth: f64,
    answer: String,
}

/// A small deterministic generator for keys and depths (same trials for every store).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

const PASSKEY_INTRO: &str = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about it.\n";
const PASSKEY_FILLER: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

/// The landmark-attention passkey prompt: filler of about `context` tokens with the key at `depth` (0..1).
fn passkey_prompt(engine: &hillside_engine::Engine, context: usize, key: u64, depth: f64) -> Result<Vec<u32>> {
    let filler_tokens = engine.tokenizer().encode(PASSKEY_FILLER)?.len();
    let repeats = context.saturating_sub(96) / filler_tokens;
    let before = (repeats as f64 * depth) as usize;
    let text = format!(
        "{PASSKEY_INTRO}{}The pass key is {key}. Remember it. {key} is the pass key.\n{}\nWhat is the pass key? The pass key is",
        PASSKEY_FILLER.repeat(before),
        PASSKEY_FILLER.repeat(repeats - before)
    );
    Ok(engine.tokenizer().encode(&text)?)
}

fn passkey(engine: &hillside_engine::Engine, args: &EvalArgs, stores: &[StoreKind]) -> Result<Vec<PasskeyResult>> {
    let mut results = Vec::new();
    let contexts = if args.no_passkey { &[][..] } else { &args.passkey_contexts[..] };
    for &context in contexts {
        let mut rng = Lcg(context as u64);
        let trials: Vec<(u64, f64)> =
            (0..args.passkey_trials).map(|_| (10_000 + rng.next(90_000), rng.next(1000) as f64 / 1000.0)).collect();
        for &store in stores {
            let config = args.kv_config(store);
            let mut misses = Vec::new();
            for &(key, depth) in &trials {
                let prompt = passkey_prompt(engine, context, key, depth)?;
                // All but the question's last token, replayed from `--prompt-cache` where it
                // holds it; `generate` then runs that token and answers.
                let new_sequence = || Ok(engine.new_sequence_with(&config, Some(context))?);
                let (mut seq, _, _) = feed_prompt(
                    engine,
                    &args.model,
                    new_sequence,
                    &prompt[..prompt.len() - 1],
                    256,
                    args.prompt_cache.as_deref(),
                )?;
                let params = hillside_engine::GenerateParams {
                    max_tokens: 8,
                    sampling: hillside_engine::SamplingParams::greedy(),
                    ..Default::default()
                };
                let mut answer = String::new();
                hillside_engine::generate(engine, &mut seq, &prompt, &params, &Default::default(), &mut |e| {
                    if let hillside_engine::Event::Text(t) = e {
                        answer.push_str(&t);
                    }
                })?;
                if !answer.contains(&key.to_string()) {
                    eprintln!("passkey {context} tokens, {store}: missed {key} at depth {depth}: {answer:?}");
                    misses.push(PasskeyMiss { key, depth, answer });
                }
            }
            let correct = trials.len() - misses.len();
            eprintln!("passkey {context} tokens, {store}: {correct}/{}", trials.len());
            results.push(PasskeyResult { store, context_tokens: context, trials: trials.len(), correct, misses });
        }
    }
    Ok(results)
}

#[derive(Serialize)]
struct StoreResult {
    store: StoreKind,
    perplexity: f64,
    perplexity_change_pct: f64,
    top1_agreement: f64,
    /// Share of the exact attention mass the selection captured (decode steps with a sparse
    /// selection): the mean over steps, the lowest step, and the mean of each step's worst
    /// (layer, head).
    attention_mass_mean: Option<f64>,
    attention_mass_min: Option<f64>,
    attention_mass_worst_head_mean: Option<f64>,
    tokens_per_s: f64,
    stats: KvStats,
}

#[derive(Serialize)]
struct IdealResult {
    perplexity: f64,
    perplexity_change_pct: f64,
    top1_agreement: f64,
    /// Its greedy continuations against full's: what any selector at this α can reach.
    greedy: Option<GreedyAgreement>,
}

/// The ideal selector's store: a tiered store that holds every row, its top α token by token
/// (with every row hot, free riders would add the next α too).
fn ideal_config(args: &EvalArgs) -> hillside_engine::kv::KvConfig {
    hillside_engine::kv::KvConfig {
        hot_budget_bytes: Some(1 << 40),
        selector: SelectorKind::Tokens,
        ..args.kv_config(StoreKind::Tiered)
    }
}

/// `kv_store` under [`IdealSelector`], with the sinks and recent window the settings pin.
fn ideal_wrap(args: &EvalArgs, kv_store: Box<dyn KvStore>) -> Box<dyn KvStore> {
    let kv = args.model.kv_config();
    Box::new(IdealSelector::wrap(kv_store, kv.sink_tokens, kv.recent_tokens))
}

/// Teacher-forces the window with [`IdealSelector`] over a tiered store that holds every row.
fn ideal(engine: &Engine, args: &EvalArgs, window: &[u32], reference: &TeacherForced) -> Result<IdealResult> {
    eprintln!("ideal selector: {} teacher-forced tokens ...", args.tokens - args.prompt_tokens);
    let (run, _) = args.teacher_force(engine, &ideal_config(args), window, |kv_store| ideal_wrap(args, kv_store))?;
    Ok(IdealResult {
        perplexity: run.perplexity(),
        perplexity_change_pct: 100.0 * (run.perplexity() / reference.perplexity() - 1.0),
        top1_agreement: run.top1_agreement(reference),
        greedy: None,
    })
}

#[derive(Serialize)]
struct GreedyResult {
    store: StoreKind,
    #[serde(flatten)]
    agreement: GreedyAgreement,
}

/// How a store's greedy continuations compare with full's.
#[derive(Serialize, Clone, Copy)]
struct GreedyAgreement {
    prompts: usize,
    /// Continuations identical to `full`'s.
    identical: usize,
    /// Mean length of the prefix shared with `full`'s continuation.
    mean_matching_prefix: f64,
    tokens: usize,
}

impl GreedyAgreement {
    fn of(outputs: &[Vec<u32>], full: &[Vec<u32>], tokens: usize) -> Self {
        let prefix = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let matching: Vec<usize> = outputs.iter().zip(full).map(|(a, b)| prefix(a, b)).collect();
        Self {
            prompts: outputs.len(),
            identical: outputs.iter().zip(full).filter(|(a, b)| a == b).count(),
            mean_matching_prefix: matching.iter().sum::<usize>() as f64 / matching.len().max(1) as f64,
            tokens,
        }
    }
}

/// The greedy prompts: windows spread evenly over each document, shared out between documents.
fn greedy_prompts<'a>(args: &EvalArgs, documents: &'a [Vec<u32>]) -> Result<Vec<&'a [u32]>> {
    let len = args.greedy_prompt_tokens;
    let mut prompts = Vec::new();
    for (i, doc) in documents.iter().enumerate() {
        let share = args.greedy_prompts / documents.len() + usize::from(i < args.greedy_prompts % documents.len());
        if doc.len() < len + 1 {
            bail!("a document has {} tokens, fewer than a {len}-token greedy prompt", doc.len());
        }
        prompts.extend((0..share).map(|j| &doc[(doc.len() - len) * j / share.max(1)..][..len]));
    }
    Ok(prompts)
}

/// Each prompt's greedy continuation, in a sequence of the store `config` makes, its KV store
/// first wrapped by `wrap`.
fn continuations(
    engine: &Engine,
    args: &EvalArgs,
    prompts: &[&[u32]],
    config: &hillside_engine::kv::KvConfig,
    wrap: impl Fn(Box<dyn KvStore>) -> Box<dyn KvStore>,
) -> Result<Vec<Vec<u32>>> {
    let params = hillside_engine::GenerateParams {
        max_tokens: args.greedy_tokens,
        sampling: hillside_engine::SamplingParams::greedy(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for prompt in prompts {
        let mut seq = engine.new_sequence_with(config, Some(prompt.len() + args.greedy_tokens))?;
        seq.kv = wrap(seq.kv);
        let summary = hillside_engine::generate(engine, &mut seq, prompt, &params, &Default::default(), &mut |_| {})?;
        out.push(summary.completion_ids);
    }
    Ok(out)
}

/// Greedy continuations of `prompts` windows of the shared documents, each store against `full`
/// (the first), and the ideal selector's against `full`'s where `--ideal` asks.
fn greedy(
    engine: &Engine,
    args: &EvalArgs,
    stores: &[StoreKind],
    documents: &[Vec<u32>],
) -> Result<(Vec<GreedyResult>, Option<GreedyAgreement>)> {
    if args.greedy_prompts == 0 {
        return Ok((Vec::new(), None));
    }
    let prompts = greedy_prompts(args, documents)?;
    let len = args.greedy_prompt_tokens;
    let mut outputs: Vec<Vec<Vec<u32>>> = Vec::new();
    for &store in stores {
        eprintln!("{store}: {} greedy continuations of {len}-token prompts ...", prompts.len());
        outputs.push(continuations(engine, args, &prompts, &args.kv_config(store), |kv_store| kv_store)?);
    }
    let ideal = if args.ideal {
        eprintln!("ideal selector: {} greedy continuations of {len}-token prompts ...", prompts.len());
        let out = continuations(engine, args, &prompts, &ideal_config(args), |kv_store| ideal_wrap(args, kv_store))?;
        Some(GreedyAgreement::of(&out, &outputs[0], args.greedy_tokens))
    } else {
        None
    };
    let results = stores
        .iter()
        .zip(&outputs)
        .map(|(&store, out)| GreedyResult {
            store,
            agreement: GreedyAgreement::of(out, &outputs[0], args.greedy_tokens),
        })
        .collect();
    Ok((results, ideal))
}

/// One text's window and greedy prompts, ready to run.
struct Text {
    name: String,
    /// Every token of the text.
    tokens: Vec<u32>,
    /// Tokens skipped before the window (front matter).
    skip_tokens: usize,
    /// Documents the greedy prompts are spread over.
    greedy_documents: Vec<Vec<u32>>,
}

/// How one text went, store by store.
#[derive(Serialize)]
struct TextReport {
    text: String,
    window_tokens: usize,
    scored_tokens: usize,
    results: Vec<StoreResult>,
    /// The ideal selector (`--ideal`), teacher-forced over the same window.
    ideal: Option<IdealResult>,
    greedy: Vec<GreedyResult>,
}

#[derive(Serialize)]
struct Report {
    alpha: f32,
    #[serde(flatten)]
    text: TextReport,
    passkey: Vec<PasskeyResult>,
}

#[derive(Serialize)]
struct SuiteReport {
    alpha: f32,
    texts: Vec<TextReport>,
    /// Per store, its worst text on each measure.
    worst: Vec<Worst>,
    /// Fewest of the ideal selector's greedy continuations identical to full's (with `--ideal`).
    ideal_greedy_identical: Option<(usize, String)>,
    passkey: Vec<PasskeyResult>,
}

/// A store's worst figures over the suite, each with the text it came from.
#[derive(Serialize)]
struct Worst {
    store: StoreKind,
    perplexity_change_pct: (f64, String),
    top1_agreement: (f64, String),
    /// Points of top-1 agreement below the ideal selector's (with `--ideal`).
    top1_below_ideal: Option<(f64, String)>,
    /// Fewest greedy continuations identical to full's, of `greedy_prompts`.
    greedy_identical: Option<(usize, String)>,
    /// Summed over the texts' teacher-forced passes.
    cold_bytes_read: u64,
    tokens_per_s_mean: f64,
}

/// The GPL text beside the shared documents: greedy prompts come from both where it exists.
fn gpl_path(text: &std::path::Path) -> PathBuf {
    text.with_file_name("gpl-3.0.txt")
}

/// The text `--text` names (the shared book by default), its greedy prompts spread over it and
/// the GPL beside it.
fn single_text(engine: &Engine, args: &EvalArgs) -> Result<Text> {
    let path = args.text.clone().unwrap_or_else(|| crate::report::shared_document("pride-and-prejudice.txt"));
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("reading {} (choose a text with --text)", path.display()))
    };
    let tokens = engine.tokenizer().encode(&read(&path)?)?;
    let mut greedy_documents = vec![tokens.clone()];
    if let Some(gpl) = Some(gpl_path(&path)).filter(|p| p.exists() && *p != path) {
        greedy_documents.push(engine.tokenizer().encode(&read(&gpl)?)?);
    }
    Ok(Text { name: path.display().to_string(), tokens, skip_tokens: args.skip_tokens, greedy_documents })
}

/// The suite's texts in `folder`, by name: a `.txt` file is plain text, a `.chat.json` file a
/// conversation rendered with the model's chat template.
fn suite_texts(engine: &Engine, folder: &std::path::Path) -> Result<Vec<Text>> {
    let listing = std::fs::read_dir(folder).with_context(|| {
        format!("reading the fidelity suite in {} (scripts/fidelity-texts.py builds it)", folder.display())
    })?;
    let mut paths: Vec<PathBuf> = listing.map(|e| Ok(e?.path())).collect::<std::io::Result<_>>()?;
    paths.sort();
    let mut texts = Vec::new();
    for path in paths {
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let read = || std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()));
        let (name, tokens) = if let Some(name) = file_name.strip_suffix(".chat.json") {
            let messages: Vec<hillside_engine::ChatMessage> = serde_json::from_str(&read()?)
                .with_context(|| format!("{} is not a list of messages", path.display()))?;
            (name, engine.chat_prompt(&messages)?)
        } else if let Some(name) = file_name.strip_suffix(".txt") {
            (name, engine.tokenizer().encode_text(&read()?)?)
        } else {
            continue;
        };
        texts.push(Text { name: name.to_string(), greedy_documents: vec![tokens.clone()], tokens, skip_tokens: 0 });
    }
    if texts.is_empty() {
        bail!("{} holds no .txt or .chat.json texts (scripts/fidelity-texts.py builds the suite)", folder.display());
    }
    Ok(texts)
}

/// Every store teacher-forced over `text`'s window (full first, the reference), the ideal
/// selector where asked, and the greedy continuations.
fn evaluate(engine: &Engine, args: &EvalArgs, stores: &[StoreKind], text: &Text) -> Result<TextReport> {
    let all = &text.tokens;
    if all.len() < text.skip_tokens + args.tokens || args.prompt_tokens >= args.tokens {
        bail!(
            "{} has {} tokens; the window needs {} after skipping {}",
            text.name,
            all.len(),
            args.tokens,
            text.skip_tokens
        );
    }
    let window = &all[text.skip_tokens..text.skip_tokens + args.tokens];
    eprintln!("{}: {} tokens", text.name, all.len());
    let mut reference: Option<TeacherForced> = None;
    let mut results = Vec::new();
    for &store in stores {
        let config = args.kv_config(store);
        eprintln!("{store}: {} teacher-forced tokens ...", args.tokens - args.prompt_tokens);
        let start = Instant::now();
        let (run, stats) = args.teacher_force(engine, &config, window, |kv_store| kv_store)?;
        let seconds = start.elapsed().as_secs_f64();
        // The attention mass needs exact scores over every key: a second, slower pass, for
        // the stores that select (one that attends to every token holds all of the mass).
        let mass = if store.attends_to_every_token() || args.no_attention_mass {
            None
        } else {
            eprintln!("{store}: attention mass over the same tokens ...");
            // The probe of the sequence that ran (a failed replay starts a second one).
            let mass = RefCell::new(None);
            args.teacher_force(engine, &config, window, |kv_store| {
                let (probe, handle) = AttentionMassProbe::wrap(kv_store);
                *mass.borrow_mut() = Some(handle);
                Box::new(probe)
            })?;
            let mass = mass.into_inner().context("the attention probe never ran")?;
            let mass = mass.lock().map_err(|_| anyhow::anyhow!("attention probe poisoned"))?.clone();
            Some(mass)
        };
        let base = reference.get_or_insert_with(|| run.clone());
        results.push(StoreResult {
            store,
            perplexity: run.perplexity(),
            perplexity_change_pct: 100.0 * (run.perplexity() / base.perplexity() - 1.0),
            top1_agreement: run.top1_agreement(base),
            attention_mass_mean: mass.as_ref().map(AttentionMass::mean),
            attention_mass_min: mass.as_ref().map(AttentionMass::min),
            attention_mass_worst_head_mean: mass.as_ref().map(AttentionMass::mean_worst),
            tokens_per_s: run.nll.len() as f64 / seconds,
            stats,
        });
    }
    let mut ideal = match (&reference, args.ideal) {
        (Some(reference), true) => Some(ideal(engine, args, window, reference)?),
        _ => None,
    };
    let (greedy, ideal_greedy) = greedy(engine, args, stores, &text.greedy_documents)?;
    if let Some(ideal) = &mut ideal {
        ideal.greedy = ideal_greedy;
    }
    Ok(TextReport {
        text: text.name.clone(),
        window_tokens: args.tokens,
        scored_tokens: args.tokens - args.prompt_tokens,
        results,
        ideal,
        greedy,
    })
}

pub fn eval(args: &EvalArgs) -> Result<()> {
    let engine = load_engine(&args.model)?;
    let mut stores = vec![StoreKind::Full];
    stores.extend(args.stores.iter().copied().filter(|s| *s != StoreKind::Full));
    let alpha = args.model.kv_config().alpha;
    match &args.suite {
        None => {
            let text = evaluate(&engine, args, &stores, &single_text(&engine, args)?)?;
            let passkey = passkey(&engine, args, &stores)?;
            println!("hillside eval · {} tokens of {} · α {alpha}", text.window_tokens, text.text);
            print_text(&text, args);
            print_passkey(&passkey, &stores, args);
            crate::report::write_json(&args.json, &Report { alpha, text, passkey })?;
        }
        Some(folder) => {
            let folder = match folder {
                Some(folder) => folder.clone(),
                None => default_suite()?,
            };
            let mut texts = Vec::new();
            for text in suite_texts(&engine, &folder)? {
                let report = evaluate(&engine, args, &stores, &text)?;
                println!("hillside eval · {} tokens of {} · α {alpha}", report.window_tokens, report.text);
                print_text(&report, args);
                println!();
                texts.push(report);
            }
            let worst: Vec<Worst> = stores[1..].iter().map(|&store| worst_of(&texts, store)).collect();
            let ideal_greedy_identical = texts
                .iter()
                .filter_map(|t| Some((t.ideal.as_ref()?.greedy?.identical, t.text.clone())))
                .min_by_key(|g| g.0);
            print_worst(&worst, texts.len());
            if let Some((identical, text)) = &ideal_greedy_identical {
                println!("ideal selector: fewest greedy continuations identical to full's {identical} ({text})");
            }
            let passkey = passkey(&engine, args, &stores)?;
            print_passkey(&passkey, &stores, args);
            crate::report::write_json(
                &args.json,
                &SuiteReport { alpha, texts, worst, ideal_greedy_identical, passkey },
            )?;
        }
    }
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// `~/.cache/hillside/fidelity`, built there by `scripts/fidelity-texts.py` the first time.
fn default_suite() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set: name the suite's folder after --suite")?;
    let folder = PathBuf::from(home).join(".cache/hillside/fidelity");
    if !folder.exists() {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fidelity-texts.py");
        eprintln!("building the fidelity suite in {} ({}) ...", folder.display(), script.display());
        let status = std::process::Command::new(&script)
            .arg(&folder)
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() {
            bail!("{} failed ({status})", script.display());
        }
    }
    Ok(folder)
}

/// `store`'s worst figures over `texts`.
fn worst_of(texts: &[TextReport], store: StoreKind) -> Worst {
    let named = |t: &TextReport, v: f64| (v, t.text.clone());
    let rows: Vec<(&TextReport, &StoreResult)> =
        texts.iter().filter_map(|t| Some((t, t.results.iter().find(|r| r.store == store)?))).collect();
    let most = |pairs: Vec<(f64, String)>| pairs.into_iter().max_by(|a, b| a.0.total_cmp(&b.0));
    let least = |pairs: Vec<(f64, String)>| pairs.into_iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let perplexity = most(rows.iter().map(|(t, r)| named(t, r.perplexity_change_pct)).collect());
    let top1 = least(rows.iter().map(|(t, r)| named(t, r.top1_agreement)).collect());
    let below_ideal = most(
        rows.iter()
            .filter_map(|(t, r)| Some(named(t, 100.0 * (t.ideal.as_ref()?.top1_agreement - r.top1_agreement))))
            .collect(),
    );
    let greedy = texts
        .iter()
        .filter_map(|t| t.greedy.iter().find(|g| g.store == store).map(|g| (g.agreement.identical, t.text.clone())))
        .min_by_key(|g| g.0);
    Worst {
        store,
        perplexity_change_pct: perplexity.unwrap_or_default(),
        top1_agreement: top1.unwrap_or_default(),
        top1_below_ideal: below_ideal,
        greedy_identical: greedy,
        cold_bytes_read: rows.iter().map(|(_, r)| r.stats.cold_bytes_read).sum(),
        tokens_per_s_mean: rows.iter().map(|(_, r)| r.tokens_per_s).sum::<f64>() / rows.len().max(1) as f64,
    }
}

fn print_text(report: &TextReport, args: &EvalArgs) {
    println!(
        "{:<12} {:>11} {:>9} {:>8} {:>15} {:>9} {:>9} {:>12}",
        "store", "perplexity", "Δ", "top-1", "attn mass/min", "tok/s", "hot hit", "cold read"
    );
    for r in &report.results {
        let hit = r.stats.tier.as_ref().map_or("-".to_string(), |t| {
            format!("{:.1}%", 100.0 * t.hot_hits as f64 / (t.hot_hits + t.cold_hits).max(1) as f64)
        });
        let mass = match (r.attention_mass_mean, r.attention_mass_min) {
            (Some(mean), Some(min)) => format!("{:.1}%/{:.1}%", 100.0 * mean, 100.0 * min),
            _ => "-".to_string(),
        };
        println!(
            "{:<12} {:>11.3} {:>8.2}% {:>7.1}% {:>15} {:>9.1} {:>9} {:>9} MB",
            r.store.to_string(),
            r.perplexity,
            r.perplexity_change_pct,
            100.0 * r.top1_agreement,
            mass,
            r.tokens_per_s,
            hit,
            r.stats.cold_bytes_read / 1_000_000
        );
    }
    if let Some(i) = &report.ideal {
        println!(
            "{:<12} {:>11.3} {:>8.2}% {:>7.1}%",
            "ideal",
            i.perplexity,
            i.perplexity_change_pct,
            100.0 * i.top1_agreement
        );
    }
    if !report.greedy.is_empty() {
        println!(
            "greedy continuations ({} tokens after {}-token prompts) vs full",
            args.greedy_tokens, args.greedy_prompt_tokens
        );
        println!("{:<12} {:>10} {:>16}", "store", "identical", "matching prefix");
        let ideal = report.ideal.as_ref().and_then(|i| i.greedy).map(|g| ("ideal".to_string(), g));
        for (store, g) in report.greedy.iter().map(|g| (g.store.to_string(), g.agreement)).chain(ideal) {
            println!("{:<12} {:>10} {:>16.1}", store, format!("{}/{}", g.identical, g.prompts), g.mean_matching_prefix);
        }
    }
}

fn print_worst(worst: &[Worst], texts: usize) {
    println!("worst of {texts} texts");
    println!(
        "{:<12} {:>22} {:>22} {:>22} {:>22} {:>10} {:>9}",
        "store", "perplexity Δ", "top-1", "top-1 below ideal", "greedy identical", "cold read", "tok/s"
    );
    let at = |value: String, text: &str| format!("{value} ({text})");
    for w in worst {
        println!(
            "{:<12} {:>22} {:>22} {:>22} {:>22} {:>7} MB {:>9.1}",
            w.store.to_string(),
            at(format!("{:+.2}%", w.perplexity_change_pct.0), &w.perplexity_change_pct.1),
            at(format!("{:.1}%", 100.0 * w.top1_agreement.0), &w.top1_agreement.1),
            w.top1_below_ideal.as_ref().map_or("-".into(), |(v, t)| at(format!("{v:.1} pt"), t)),
            w.greedy_identical.as_ref().map_or("-".into(), |(v, t)| at(v.to_string(), t)),
            w.cold_bytes_read / 1_000_000,
            w.tokens_per_s_mean
        );
    }
}

fn print_passkey(passkey: &[PasskeyResult], stores: &[StoreKind], args: &EvalArgs) {
    if passkey.is_empty() {
        return;
    }
    println!("\npasskey retrieval (correct / trials)");
    print!("{:<12}", "store");
    for c in &args.passkey_contexts {
        print!(" {:>8}", c);
    }
    println!();
    for &store in stores {
        print!("{:<12}", store.to_string());
        for r in passkey.iter().filter(|r| r.store == store) {
            print!(" {:>8}", format!("{}/{}", r.correct, r.trials));
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(name: &str, perplexity_change_pct: f64, top1: f64, ideal_top1: f64, identical: usize) -> TextReport {
        let result = StoreResult {
            store: StoreKind::Tiered,
            perplexity: 10.0,
            perplexity_change_pct,
            top1_agreement: top1,
            attention_mass_mean: None,
            attention_mass_min: None,
            attention_mass_worst_head_mean: None,
            tokens_per_s: 10.0,
            stats: KvStats { cold_bytes_read: 1_000_000, ..KvStats::default() },
        };
        TextReport {
            text: name.to_string(),
            window_tokens: 2048,
            scored_tokens: 1792,
            results: vec![result],
            ideal: Some(IdealResult {
                perplexity: 10.0,
                perplexity_change_pct: 0.1,
                top1_agreement: ideal_top1,
                greedy: None,
            }),
            greedy: vec![GreedyResult {
                store: StoreKind::Tiered,
                agreement: GreedyAgreement { prompts: 20, identical, mean_matching_prefix: 20.0, tokens: 32 },
            }],
        }
    }

    #[test]
    fn greedy_agreement_counts_identical_continuations_and_the_shared_prefixes() {
        let full = [vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 9]];
        let other = [vec![1, 2, 3, 4], vec![5, 6, 0, 8], vec![0, 9]];
        let agreement = GreedyAgreement::of(&other, &full, 4);
        assert_eq!((agreement.prompts, agreement.identical), (3, 1));
        assert!((agreement.mean_matching_prefix - 2.0).abs() < 1e-12, "{}", agreement.mean_matching_prefix);
    }

    #[test]
    fn the_worst_of_a_suite_names_the_text_each_figure_came_from() {
        let texts = [text("verse", 0.4, 0.95, 0.96, 12), text("chat", 1.2, 0.97, 0.94, 7)];
        let worst = worst_of(&texts, StoreKind::Tiered);
        assert_eq!(worst.perplexity_change_pct, (1.2, "chat".to_string()));
        assert_eq!(worst.top1_agreement, (0.95, "verse".to_string()));
        let (below, text) = worst.top1_below_ideal.unwrap();
        assert!((below - 1.0).abs() < 1e-9 && text == "verse", "{below} {text}");
        assert_eq!(worst.greedy_identical, Some((7, "chat".to_string())));
        assert_eq!(worst.cold_bytes_read, 2_000_000);
        assert!(worst_of(&texts, StoreKind::Drop).greedy_identical.is_none(), "a store that did not run");
    }
}
