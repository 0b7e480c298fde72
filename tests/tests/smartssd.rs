//! The SmartSSD path end to end, through the XRT emulator in fpga/emu (built here with make): the
//! real model decodes with its cold pool scored by the FPGA kernel's own source behind XRT's C
//! API, and must select exactly what the storage evaluator selects. Then every way the card can
//! be missing or fail: the decode goes on, on the host.

mod common;

use hillside_bench::fidelity::{ExactKeys, SelectionWatch, Watched};
use hillside_engine::kv::{EvaluatorKind, KvConfig, KvStats, Selection, StoreKind};
use hillside_engine::score::xrt::{probe, XrtOptions};
use hillside_engine::{generate, CancelFlag, ChatMessage, Engine, Event, GenerateParams, SamplingParams, Sequence};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The emulator library, its build without `xrtRunWait`, and its xclbin.
struct Emulator {
    library: PathBuf,
    library_without_wait: PathBuf,
    xclbin: PathBuf,
}

fn emulator() -> &'static Emulator {
    static BUILT: OnceLock<Emulator> = OnceLock::new();
    BUILT.get_or_init(|| {
        let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fpga");
        let fpga = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fpga");
        let status = std::process::Command::new("make")
            .arg("-C")
            .arg(&fpga)
            .arg("emu")
            .arg(format!("BUILD={}", build.display()))
            .status()
            .unwrap();
        assert!(status.success(), "building the XRT emulator failed");
        // The probe looks for a card from its own process, `hillside-xrt-probe`.
        common::ensure_bin("hillside-engine", "hillside-xrt-probe");
        Emulator {
            library: build.join("emu/libxrt_coreutil.so"),
            library_without_wait: build.join("emu-no-wait/libxrt_coreutil.so"),
            xclbin: build.join("emu/hillside_score.xclbin"),
        }
    })
}

/// An emulator xclbin whose card fails every run after the first `runs`.
fn failing_xclbin(runs: usize) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("failing-after-{runs}.xclbin"));
    std::fs::write(
        &path,
        format!("xclbin2\0\nHillside scoring kernel, emulated\nkernels: hillside_score\nfail-after-runs: {runs}\n"),
    )
    .unwrap();
    path
}

/// Records every sparse selection the store makes.
struct SelectionLog(Arc<Mutex<Vec<(usize, Selection)>>>);

impl SelectionWatch for SelectionLog {
    fn select(&mut self, _: &ExactKeys, layer: usize, _: &[f32], _: &[usize], selection: Selection) -> Selection {
        if matches!(selection, Selection::Tokens { .. }) {
            self.0.lock().unwrap().push((layer, selection.clone()));
        }
        selection
    }
}

struct Decoded {
    text: String,
    selections: Vec<(usize, Selection)>,
    stats: KvStats,
}

/// Greedy answer to a question about 1,400 tokens of a real document, on a tiered store.
fn decode(engine: &Engine, config: &KvConfig) -> Decoded {
    let text = common::shared_document("pride-and-prejudice.txt");
    let document: String =
        engine.tokenizer().decode(&engine.tokenizer().encode(&text[120_000..140_000]).unwrap()[..1400]).unwrap();
    let prompt = engine
        .chat_prompt(&[ChatMessage::new("user", format!("{document}\n\nWho is speaking in the last paragraph?"))])
        .unwrap();
    let inner = engine.new_sequence_with(config, Some(2048)).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut seq = Sequence { kv: Box::new(Watched::new(inner.kv, SelectionLog(log.clone()))), tokens: inner.tokens };
    let params = GenerateParams { max_tokens: 40, sampling: SamplingParams::greedy(), ..GenerateParams::default() };
    let mut out = String::new();
    generate(engine, &mut seq, &prompt, &params, &CancelFlag::default(), &mut |e| {
        if let Event::Text(t) = e {
            out.push_str(&t);
        }
    })
    .unwrap();
    let stats = seq.kv.stats();
    drop(seq);
    let selections = std::mem::take(&mut *log.lock().unwrap());
    Decoded { text: out, selections, stats }
}

fn tiered(cold_dir: &Path, evaluator: EvaluatorKind, library: Option<&Path>, xclbin: Option<&Path>) -> KvConfig {
    KvConfig {
        store: StoreKind::Tiered,
        cold_dir: cold_dir.to_path_buf(),
        evaluator,
        xrt_library: library.map(Path::to_path_buf),
        xrt_xclbin: xclbin.map(Path::to_path_buf),
        spare_copy: false,
        ..KvConfig::default()
    }
}

/// The storage evaluator's decode, which every card decode must reproduce.
fn storage_reference() -> &'static Decoded {
    static REFERENCE: OnceLock<Decoded> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let engine = Engine::load(&common::model_path()).unwrap();
        let reference =
            decode(&engine, &tiered(&common::Scratch::new("smartssd-storage"), EvaluatorKind::Storage, None, None));
        assert_eq!(reference.stats.tier.as_ref().unwrap().device_tokens, 0);
        reference
    })
}

fn assert_same_decode(reference: &Decoded, other: &Decoded, what: &str) {
    assert!(!reference.selections.is_empty());
    assert_eq!(reference.selections.len(), other.selections.len(), "{what}: number of sparse selections");
    for (i, (a, b)) in reference.selections.iter().zip(&other.selections).enumerate() {
        assert!(a == b, "{what}: selection {i} (layer {}) differs", a.0);
    }
    assert_eq!(reference.text, other.text, "{what}: text");
}

#[test]
fn the_card_selects_exactly_what_the_storage_evaluator_selects() {
    let emu = emulator();
    let engine = Engine::load(&common::model_path()).unwrap();
    let storage = storage_reference();
    let cold = common::Scratch::new("smartssd-card");
    let config = tiered(&cold, EvaluatorKind::Xrt, Some(&emu.library), Some(&emu.xclbin));
    let card = decode(&engine, &config);
    assert_same_decode(storage, &card, "xrt evaluator");
    let tier = card.stats.tier.unwrap();
    eprintln!("card: {tier:?}\ntext: {}", card.text);
    // The card really scored: 5 whole chunks of 256 tokens were on the SSD for the decode steps.
    assert!(tier.device_tokens > 0 && tier.device_runs > 0 && !tier.device_failed, "{tier:?}");
    assert_eq!(common::cold_files(&config.cold_dir), 0, "cold pool (with its key chunks) removed");
}

#[test]
fn a_card_failing_mid_decode_hands_the_rest_to_the_host() {
    let emu = emulator();
    let engine = Engine::load(&common::model_path()).unwrap();
    let failing = decode(
        &engine,
        &tiered(
            &common::Scratch::new("smartssd-failing"),
            EvaluatorKind::Xrt,
            Some(&emu.library),
            Some(&failing_xclbin(200)),
        ),
    );
    assert_same_decode(storage_reference(), &failing, "card failing after 200 runs");
    let tier = failing.stats.tier.unwrap();
    assert!(tier.device_failed && tier.device_runs == 200, "the card ran 200 times, then the host took over: {tier:?}");
}

#[test]
fn a_missing_library_symbol_card_or_kernel_is_reported_and_the_storage_evaluator_takes_over() {
    let emu = emulator();
    let problem =
        |options: XrtOptions| probe(&options).problem.unwrap_or_else(|| panic!("{options:?} should not be usable"));
    let options = |library: &Path, xclbin: &Path, device| XrtOptions {
        library: Some(library.into()),
        xclbin: Some(xclbin.into()),
        device,
    };

    let found = probe(&options(&emu.library, &emu.xclbin, 0));
    assert_eq!((found.cards, found.p2p, found.problem.as_deref()), (1, true, None), "{found:?}");
    assert!(found.version.unwrap().contains("emulator"));

    let missing = problem(options(Path::new("/nonexistent/libxrt_coreutil.so"), &emu.xclbin, 0));
    assert!(missing.contains("cannot load /nonexistent/libxrt_coreutil.so"), "{missing}");
    let no_symbol = problem(options(&emu.library_without_wait, &emu.xclbin, 0));
    assert!(no_symbol.contains("lacks xrtRunWait"), "{no_symbol}");
    let no_card = problem(options(&emu.library, &emu.xclbin, 3));
    assert!(no_card.contains("no device 3 (XRT found 1)"), "{no_card}");
    let not_xclbin = problem(options(&emu.library, &emu.library, 0));
    assert!(not_xclbin.contains("loading") && not_xclbin.contains("libxrt_coreutil.so"), "{not_xclbin}");
    for text in [&missing, &no_symbol, &no_card, &not_xclbin] {
        assert!(!text.contains('\n'), "one line: {text}");
    }

    // A tiered store asked for the card decodes anyway, on the storage evaluator.
    let engine = Engine::load(&common::model_path()).unwrap();
    let fallback = decode(
        &engine,
        &tiered(
            &common::Scratch::new("smartssd-no-symbol"),
            EvaluatorKind::Xrt,
            Some(&emu.library_without_wait),
            Some(&emu.xclbin),
        ),
    );
    assert_same_decode(storage_reference(), &fallback, "missing symbol");
    assert_eq!(fallback.stats.tier.unwrap().device_runs, 0);
}
