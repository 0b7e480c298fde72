//! Every model family against llama.cpp on the same file (llama.cpp is the oracle: libllama
//! from the same PyPI sdist, through tests/tools/llama-logits.c). A small GGUF with random
//! weights per family, written by tests/tools/tiny_gguf.py with the family's real tensor names
//! and metadata: the same tokens, logits at every position of a prompt within a bound, and 64
//! greedy tokens identical. Gemma 3 270M with its real weights: SentencePiece tokens equal to
//! llama.cpp's on text in several scripts, and perplexity and top-1 agreement on a book.

mod common;

use common::llama_server::{self, LlamaServer};
use hillside_bench::fidelity::{kl_divergence, log_prob, teacher_forced, top_margin};
use hillside_engine::kv::{KvConfig, StoreKind};
use hillside_engine::sampling::argmax;
use hillside_engine::text::reasoning::{Parts, ReasoningSplit};
use hillside_engine::{ChatMessage, Engine, Logits, ReasoningFormat};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The oracle's binary: `$HILLSIDE_LLAMA_LOGITS`, else built (once) by the build script.
fn llama_logits() -> PathBuf {
    llama_server::tool("llama-logits", "HILLSIDE_LLAMA_LOGITS")
}

/// Runs the oracle on `model` with `input` on its standard input; its standard output.
fn oracle(model: &Path, args: &[&str], input: &str) -> String {
    let mut child = Command::new(llama_logits())
        .arg(model)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("llama-logits");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "llama-logits {args:?} failed on {}", model.display());
    String::from_utf8(out.stdout).unwrap()
}

fn ids(line: &str) -> Vec<u32> {
    line.split_whitespace().map(|t| t.parse().unwrap()).collect()
}

fn joined(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// A random-weight GGUF of `family` in `dir`, with SmolLM2's vocabulary, its matrices in the
/// `formats` tiny_gguf.py names (`mixed`: Q8_0 and Q4_0; `table`: IQ4_NL, IQ4_XS and MXFP4).
fn tiny_model(family: &str, formats: &str, dir: &Path) -> PathBuf {
    tiny_model_with(family, formats, dir, &[])
}

/// [`tiny_model`], with tiny_gguf.py's further `args`.
fn tiny_model_with(family: &str, formats: &str, dir: &Path, args: &[&std::ffi::OsStr]) -> PathBuf {
    let path = dir.join(format!("tiny-{family}-{formats}.gguf"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/tiny-gguf.sh");
    let status = Command::new(script)
        .arg(family)
        .arg(&path)
        .args(args)
        .args(["--formats", formats, "--vocab-from"])
        .arg(common::model_path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "writing the tiny {family} model failed");
    path
}

/// Largest KL of one position's next-token distribution that the tiny models may show against
/// llama.cpp's: both quantize activations to 8 bits per 32 values and keep K/V in f16, in
/// another order of summation (measured here: at most 0.016, over decode steps of the experts).
const KL_LIMIT: f64 = 0.03;
/// Positions of a mixture of experts' test that may exceed [`KL_LIMIT`]: where a token's router
/// scores two experts within rounding of each other, the engines may pick different ones.
const ROUTING_TIES: usize = 2;
/// Where llama.cpp's top token leads its second by less than this many logits, our greedy text
/// may take the other one: random weights spread 49,152 logits so that a step in a few dozen
/// has two within the engines' rounding of each other (llama.cpp's own two attention kernels
/// disagree there too).
const NEAR_TIE_LOGITS: f32 = 0.25;

/// llama.cpp's greedy continuation of `prompt` for `steps` tokens, and its logits (`vocab` a
/// row) at every prompt position, then at every step.
fn llama_cpp_greedy(model: &Path, prompt: &[u32], steps: usize, dir: &Path) -> (Vec<u32>, Vec<f32>) {
    let logits_file = dir.join("logits.f32");
    let greedy = ids(&oracle(model, &["eval", logits_file.to_str().unwrap(), &steps.to_string()], &joined(prompt)));
    let raw = std::fs::read(&logits_file).unwrap();
    (greedy, raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

/// How many of llama.cpp's greedy tokens `theirs` our own greedy text from `prompt` repeats;
/// where the two part, llama.cpp's lead there (from `their_logits`, as [`llama_cpp_greedy`]
/// gives them) must be a near tie.
fn same_greedy_tokens(engine: &Engine, prompt: &[u32], theirs: &[u32], their_logits: &[f32], what: &str) -> usize {
    let vocab = engine.model().config.vocab_size;
    let mut seq = engine.new_sequence(Some(1024));
    let mut logits = engine.model().forward(prompt, seq.kv.as_mut(), Logits::Last).unwrap();
    for (same, &expected) in theirs.iter().enumerate() {
        let next = argmax(&logits);
        if next != expected {
            let lead = top_margin(&their_logits[(prompt.len() - 1 + same) * vocab..][..vocab]);
            assert!(
                lead < NEAR_TIE_LOGITS,
                "{what}: greedy text parts from llama.cpp's at token {same}, where its lead was {lead}"
            );
            return same;
        }
        logits = engine.model().forward(&[next], seq.kv.as_mut(), Logits::Last).unwrap();
    }
    theirs.len()
}

/// The family's tiny model through Hillside and llama.cpp: the same tokens; a prompt's logits
/// at every position, then 64 decode steps on llama.cpp's greedy tokens, each within
/// [`KL_LIMIT`]; and our own greedy text, identical to llama.cpp's but where the two part at a
/// near tie.
fn matches_llama_cpp(family: &str, formats: &str) {
    let dir = common::Scratch::new(&format!("family-{family}-{formats}"));
    let path = tiny_model(family, formats, &dir);
    let engine = Engine::load(&path).unwrap_or_else(|e| panic!("{family}: {e}"));
    let text = common::shared_document("pride-and-prejudice.txt");
    let start = text.find("It is a truth universally acknowledged").expect("opening line");
    let passage = &text[start..start + 400];
    let theirs_ids = ids(&oracle(&path, &["tokenize"], passage));
    let ours_ids = engine.tokenizer().encode(passage).unwrap();
    assert_eq!(ours_ids, theirs_ids, "{family}: tokens differ from llama.cpp's");
    let prompt = &ours_ids[..ours_ids.len().min(80)];

    const STEPS: usize = 64;
    let (greedy_theirs, theirs) = llama_cpp_greedy(&path, prompt, STEPS, &dir);
    let vocab = engine.model().config.vocab_size;
    assert_eq!(theirs.len(), (prompt.len() + STEPS) * vocab, "{family}: llama.cpp's logits");
    let row = |i: usize| &theirs[i * vocab..][..vocab];

    // The prompt in two chunks, then llama.cpp's greedy tokens one by one (past the end of a
    // windowed layer's ring, which then holds its keys out of order).
    let mut seq = engine.new_sequence(Some(1024));
    let (first, second) = prompt.split_at(prompt.len() / 2);
    let mut ours = engine.model().forward(first, seq.kv.as_mut(), Logits::All).unwrap();
    ours.extend(engine.model().forward(second, seq.kv.as_mut(), Logits::All).unwrap());
    for &token in &greedy_theirs {
        ours.extend(engine.model().forward(&[token], seq.kv.as_mut(), Logits::Last).unwrap());
    }
    let mut worst = 0f64;
    let mut routing_ties = Vec::new();
    for (i, o) in ours.chunks_exact(vocab).enumerate() {
        let d = kl_divergence(row(i), o);
        let at =
            if i < prompt.len() { format!("prompt position {i}") } else { format!("decode step {}", i - prompt.len()) };
        if d >= KL_LIMIT && engine.model().config.experts.is_some() && routing_ties.len() < ROUTING_TIES {
            routing_ties.push(format!("{at}: KL {d}"));
            continue;
        }
        worst = worst.max(d);
        assert!(d < KL_LIMIT, "{family}: {at}: KL {d} against llama.cpp (and at {routing_ties:?})");
        if top_margin(row(i)) >= NEAR_TIE_LOGITS {
            assert_eq!(
                argmax(o),
                argmax(row(i)),
                "{family}: {at}: another top token where llama.cpp's leads by {}",
                top_margin(row(i))
            );
        }
    }

    let same = same_greedy_tokens(&engine, prompt, &greedy_theirs, &theirs, family);
    eprintln!(
        "{family}: worst KL {worst:.5} over {} prompt positions and {STEPS} decode steps (routing ties: {routing_ties:?}); \
         greedy text identical for {same} of {STEPS} tokens",
        prompt.len()
    );
}

#[test]
fn llama_matches_llama_cpp() {
    matches_llama_cpp("llama", "mixed");
}

#[test]
fn qwen2_matches_llama_cpp() {
    matches_llama_cpp("qwen2", "mixed");
}

#[test]
fn qwen3_matches_llama_cpp() {
    matches_llama_cpp("qwen3", "mixed");
}

/// Eight routed experts, two a token, renormalized.
#[test]
fn qwen3moe_matches_llama_cpp() {
    matches_llama_cpp("qwen3moe", "mixed");
}

/// Experts in MXFP4 (as gpt-oss keeps them), attention and the rest in MXFP4 and IQ4_NL: the
/// kernels read the 4-bit table formats as the file has them.
#[test]
fn mxfp4_and_iq4_nl_match_llama_cpp() {
    matches_llama_cpp("qwen3moe", "table");
}

/// IQ4_XS super-blocks are read as the eight IQ4_NL blocks they stand for (each sub-block's
/// scale rounded to f16): our logits on an IQ4_XS file are those on its IQ4_NL twin to the bit,
/// and the twin's match llama.cpp's. (llama.cpp multiplies IQ4_XS itself by activations
/// quantized in 256-value blocks, coarser than the 32-value ones both engines use for IQ4_NL:
/// against it directly the worst KL was 0.059, where the twin's stays under the bound.)
#[test]
fn iq4_xs_reads_as_its_iq4_nl_blocks_which_match_llama_cpp() {
    matches_llama_cpp("llama", "iq4xs-as-nl");
    let dir = common::Scratch::new("family-iq4xs");
    let logits = |formats: &str| {
        let engine = Engine::load(&tiny_model("llama", formats, &dir)).unwrap();
        let tokens: Vec<u32> = (100..160).collect();
        let mut seq = engine.new_sequence(Some(256));
        engine.model().forward(&tokens, seq.kv.as_mut(), Logits::All).unwrap()
    };
    let (super_blocks, blocks) = (logits("iq4xs"), logits("iq4xs-as-nl"));
    assert_eq!(super_blocks.len(), blocks.len());
    assert!(
        super_blocks.iter().zip(&blocks).all(|(a, b)| a.to_bits() == b.to_bits()),
        "IQ4_XS differs from its IQ4_NL twin"
    );
}

/// Fused q/k/v and gate/up projections.
#[test]
fn phi3_matches_llama_cpp() {
    matches_llama_cpp("phi3", "mixed");
}

/// Windowed layers (a window of 24 over an 80-token prompt and 64 more), the global sixth layer
/// with its own rotary base, post-norms, GELU and the embedding scale.
#[test]
fn gemma3_matches_llama_cpp() {
    matches_llama_cpp("gemma3", "mixed");
}

/// Windowed layers (24 tokens) in turn with global ones, q/k/v and output biases, a sink logit
/// per head in every softmax, YaRN, and MXFP4 experts with biases through the clamped SwiGLU,
/// weighted by the softmax of the chosen experts' logits.
#[test]
fn gpt_oss_matches_llama_cpp() {
    matches_llama_cpp("gpt-oss", "mixed");
}

/// gpt-oss's sinks in the stores that attend or select themselves: near-storage attention
/// merges them beside its partials, so its text is the full cache's up to the order of float
/// sums; the tiered store's fidelity guard counts them in the mass it estimates.
#[test]
fn gpt_oss_sinks_enter_near_storage_attention_and_the_tiered_guard() {
    let dir = common::Scratch::new("family-sinks");
    let path = tiny_model("gpt-oss", "mixed", &dir);
    let engine = Engine::load(&path).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let tokens = &engine.tokenizer().encode(&text[40_000..50_000]).unwrap()[..400];
    let config = |store| KvConfig {
        store,
        cold_dir: dir.join("cold"),
        dense_layers: 0,
        guard_mass: 0.99,
        spare_copy: false,
        ..KvConfig::default()
    };
    // A prompt in chunks, then decode steps, as the cold pool fills behind them.
    let run = |kv: &KvConfig| {
        let mut seq = engine.new_sequence_with(kv, Some(1024)).unwrap();
        let scored = teacher_forced(&engine, &mut seq, tokens, 200, 64, |_| {}).unwrap();
        (scored, seq.kv.stats())
    };
    let (full, _) = run(&KvConfig::default());
    let (near, near_stats) = run(&config(StoreKind::NearStorage));
    assert!(near_stats.bytes_to_host > 0, "the global layers attended beside the cold pool");
    // Random weights make the int8 roundings of later layers' activations turn last-bit
    // differences into large ones: measured at AVX2 (where the sums' order differs from the
    // full cache's), a mean of 0.004 nats a token, top-1 all equal; with the sinks left out of
    // the merge, 0.025–0.038 and 96.5% (at AVX2 and portable).
    let mean_change = full.nll.iter().zip(&near.nll).map(|(a, b)| (a - b).abs()).sum::<f64>() / full.nll.len() as f64;
    let agree = near.top1_agreement(&full);
    assert!(
        mean_change < 0.01 && agree >= 0.99,
        "near storage against the full cache: {mean_change} nats a token, top-1 {agree}"
    );

    let (tiered, tiered_stats) = run(&config(StoreKind::Tiered));
    let tier = tiered_stats.tier.expect("the tiered store's counters");
    assert!(tier.guard_checks > 0, "the guard weighed the selections");
    assert!(tiered.nll.iter().all(|l| l.is_finite()));
}

/// Text in several scripts, with runs of whitespace, digits and contractions.
const SCRIPTS: [&str; 8] = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "  two spaces,\ttabs,\n\nblank lines\n   and indented code: fn main() { println!(\"hi\"); }",
    "Größe, Ärger und Öl — naïve façade, déjà vu; «guillemets» and “quotes”. HTML's <b>BOLD</b>'S 12345678",
    "Война и мир — роман Льва Николаевича Толстого.",
    "東京は日本の首都です。人口は約1400万人。",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "مرحبا بالعالم، هذا اختبار.",
    "Emoji 🦀🚀 and rare characters: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, ꙮ, \u{1}\u{7f}",
];

/// o200k's pre-tokenizer split (gpt-oss's `gpt-4o`), over SmolLM2's pieces in the tiny gpt-oss
/// file, on text in several scripts, as llama.cpp tokenizes it.
#[test]
fn o200k_split_tokens_match_llama_cpp_in_several_scripts() {
    let dir = common::Scratch::new("family-o200k");
    let path = tiny_model("gpt-oss", "mixed", &dir);
    let engine = Engine::load(&path).unwrap();
    for text in SCRIPTS {
        let theirs = ids(&oracle(&path, &["tokenize"], text));
        let ours = engine.tokenizer().encode(text).unwrap();
        assert_eq!(ours, theirs, "tokens of {text:?}");
        assert_eq!(engine.tokenizer().decode(&ours).unwrap(), text);
    }
}

/// Gemma's SentencePiece vocabulary (262,144 pieces, byte fallback, user-defined whitespace
/// tokens) on text in several scripts, as llama.cpp tokenizes it.
#[test]
fn gemma_tokens_match_llama_cpp_in_several_scripts() {
    let path = common::gemma_model_path();
    let engine = Engine::load(&path).unwrap();
    let turn = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";
    for text in SCRIPTS.into_iter().chain([turn]) {
        let theirs = ids(&oracle(&path, &["tokenize"], text));
        let ours = engine.tokenizer().encode(text).unwrap();
        assert_eq!(ours, theirs, "tokens of {text:?}");
        // And back: the text again (after the BOS the tokenizer adds).
        assert_eq!(
            engine.tokenizer().decode(&ours).unwrap(),
            text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")
        );
    }
}

/// llama.cpp's `score` lines: per position, its top token, the next token's log-probability,
/// and the top token's lead over the second.
fn scores(model: &Path, tokens: &[u32], flash_attention: &str) -> Vec<(u32, f64, f32)> {
    let mut child = Command::new(llama_logits())
        .arg(model)
        .arg("score")
        .env("LLAMA_LOGITS_FLASH_ATTN", flash_attention)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(joined(tokens).as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "llama-logits score failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

fn perplexity(log_probs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = log_probs.fold((0.0, 0usize), |(s, n), lp| (s + lp, n + 1));
    (-sum / n as f64).exp()
}

/// Gemma 3 270M's real weights on 2,048 tokens of a book against llama.cpp on the same file:
/// perplexity within 0.5%; the same top token wherever llama.cpp's leads by a logit, but at no
/// more than one position in a thousand; and top-1 agreement no more than 2 points below
/// llama.cpp's with its own two attention kernels (flash attention on and off), measured beside
/// it, since this small model has many near ties.
/// 2,048 tokens, not 512: a token's log-probability moves by 0.08 on average between any two
/// sound kernels here (llama.cpp's two, or two of our SIMD levels), which leaves a 512-token
/// perplexity uncertain by about 0.45%, as wide as the bound. In the book's first 40 tokens it
/// moves twice as much (0.17 between llama.cpp's two kernels), and there a lead of a logit can
/// go: with AVX2's order of the attention sums rather than the portable one, position 17's
/// 1.24-logit lead turns.
#[test]
fn gemma3_270m_perplexity_matches_llama_cpp() {
    let path = common::gemma_model_path();
    let engine = Engine::load(&path).unwrap();
    let text = common::shared_document("pride-and-prejudice.txt");
    let start = text.find("It is a truth universally acknowledged").expect("opening line");
    let tokens: Vec<u32> = engine.tokenizer().encode(&text[start..start + 16000]).unwrap()[..2048].to_vec();
    let (theirs, theirs_other_kernel) = (scores(&path, &tokens, "1"), scores(&path, &tokens, "0"));
    assert_eq!(theirs.len(), tokens.len() - 1);

    let mut seq = engine.new_sequence(Some(4096));
    let vocab = engine.model().config.vocab_size;
    let ours = engine.model().forward(&tokens, seq.kv.as_mut(), Logits::All).unwrap();
    let rows = || ours.chunks_exact(vocab).take(tokens.len() - 1);
    let ppl_ours = perplexity(rows().enumerate().map(|(i, row)| log_prob(row, tokens[i + 1])));
    let (ppl_theirs, ppl_other) =
        (perplexity(theirs.iter().map(|t| t.1)), perplexity(theirs_other_kernel.iter().map(|t| t.1)));
    let n = theirs.len() as f64;
    let same_top = rows().zip(&theirs).filter(|(row, t)| argmax(row) == t.0).count() as f64 / n;
    let same_top_llama = theirs.iter().zip(&theirs_other_kernel).filter(|(a, b)| a.0 == b.0).count() as f64 / n;
    eprintln!(
        "gemma 3 270M: perplexity {ppl_ours:.4} (llama.cpp {ppl_theirs:.4}; without flash attention {ppl_other:.4}), \
         same top token {:.2}% (llama.cpp's two kernels: {:.2}%)",
        100.0 * same_top,
        100.0 * same_top_llama
    );
    assert!((ppl_ours / ppl_theirs - 1.0).abs() < 0.005, "perplexity {ppl_ours} against llama.cpp's {ppl_theirs}");
    let other_top: Vec<String> = rows()
        .zip(&theirs)
        .enumerate()
        .filter(|(_, (row, t))| t.2 > 1.0 && argmax(row) != t.0)
        .map(|(i, (row, t))| format!("position {i}: ours {}, llama.cpp's {} leads by {} logits", argmax(row), t.0, t.2))
        .collect();
    assert!(other_top.len() <= tokens.len() / 1000, "another top token where llama.cpp's leads: {other_top:#?}");
    assert!(same_top >= same_top_llama - 0.02, "top-1 agreement {same_top}, llama.cpp with itself {same_top_llama}");

    // 64 greedy tokens after the book's first 32, as llama.cpp writes them (but at a near tie).
    let prompt = &tokens[..32];
    let dir = common::Scratch::new("gemma-greedy");
    let (greedy_theirs, theirs_logits) = llama_cpp_greedy(&path, prompt, 64, &dir);
    let same = same_greedy_tokens(&engine, prompt, &greedy_theirs, &theirs_logits, "gemma 3 270M");
    eprintln!("gemma 3 270M: greedy text identical to llama.cpp's for {same} of 64 tokens");
}

/// gpt-oss's own chat template (harmony's, as llama.cpp's sdist ships it) rendered as llama.cpp's
/// server renders it; a harmony reply keeps its markers through the tokenizer, so the reasoning
/// can be split from the answer; and `<|end|>` ends a message, not the turn.
#[test]
fn gpt_oss_chat_template_and_reply_markers_are_as_llama_cpp_has_them() {
    let dir = common::Scratch::new("family-harmony");
    let template = llama_server::llama_cpp_source().join("models/templates/openai-gpt-oss-120b.jinja");
    let path = tiny_model_with("gpt-oss", "mixed", &dir, &["--chat-template".as_ref(), template.as_os_str()]);
    let engine = Engine::load(&path).unwrap();
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "What is 2 + 2?"),
    ];
    let server = LlamaServer::start(&path, &["--jinja", "-c", "2048"]);
    let theirs: serde_json::Value = ureq::post(&format!("{}/apply-template", server.url()))
        .send_json(serde_json::json!({ "messages": messages }))
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    let ours = engine.chat_text(&messages).unwrap();
    assert!(ours.contains("<|start|>developer<|message|># Instructions\n\nBe brief."), "{ours}");
    assert_eq!(ours, theirs["prompt"].as_str().unwrap());

    let tokenizer = engine.tokenizer();
    assert_eq!(tokenizer.reasoning_format(), ReasoningFormat::Harmony);
    let id = |t: &str| tokenizer.token_id(t).unwrap();
    assert!(tokenizer.is_stop(id("<|return|>")) && tokenizer.is_stop(id("<|call|>")));
    assert!(!tokenizer.is_stop(id("<|end|>")), "<|end|> ends the reasoning; the answer follows");
    let reply = "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>4";
    let ids = tokenizer.encode(reply).unwrap();
    assert!(ids.contains(&id("<|channel|>")), "the markers are single tokens: {ids:?}");
    assert_eq!(tokenizer.decode(&ids).unwrap(), reply);
    let mut split = ReasoningSplit::new(tokenizer.reasoning_format());
    assert_eq!(split.push(reply), Parts { reasoning: "Add them.".into(), content: "4".into() });
}

/// A thinking model over HTTP: a template that opens `<think>` for the model (as Qwen3's thinking
/// models' do), a tiny Qwen3 that never closes it in a few greedy tokens: chat returns all of it
/// as `reasoning_content`, streamed and whole, and an empty answer; a raw completion of the same
/// prompt returns the same text as plain text.
#[test]
fn a_thinking_model_s_reasoning_comes_apart_from_its_answer_over_http() {
    let dir = common::Scratch::new("family-thinking");
    let template = dir.join("thinking.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    )
    .unwrap();
    let path = tiny_model_with("qwen3", "mixed", &dir, &["--chat-template".as_ref(), template.as_os_str()]);
    let engine = std::sync::Arc::new(Engine::load(&path).unwrap());
    assert_eq!(engine.tokenizer().reasoning_format(), ReasoningFormat::Think);
    let server = common::server::Server::start_on(engine.clone(), common::server::config());
    let ask = serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0});

    let (status, whole) = server.post("/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().expect("reasoning_content").to_string();
    assert!(!reasoning.is_empty() && !reasoning.contains("</think>"), "{message}");
    assert_eq!(message["content"], "", "the model never closed its reasoning: no answer");

    let mut streamed = (String::new(), String::new());
    let mut streaming = ask.clone();
    streaming["stream"] = true.into();
    for payload in server.stream("/v1/chat/completions", &streaming) {
        let Ok(chunk) = serde_json::from_str::<serde_json::Value>(&payload) else { continue };
        let delta = &chunk["choices"][0]["delta"];
        streamed.0 += delta["reasoning_content"].as_str().unwrap_or("");
        streamed.1 += delta["content"].as_str().unwrap_or("");
    }
    assert_eq!(streamed, (reasoning.clone(), String::new()));

    // A client that writes the template itself asks for its control strings to be read as such.
    let prompt = engine.chat_text(&[ChatMessage::new("user", "Hi")]).unwrap();
    let (status, raw) = server.post(
        "/v1/completions",
        &serde_json::json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "parse_special": true}),
    );
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw["choices"][0]["text"].as_str().unwrap().trim_start(), reasoning);
}

/// A file of a family Hillside does not run: the error names it, lists the families that run
/// and says how to use it anyway (another engine behind `--engine openai:`).
#[test]
fn an_unknown_family_is_named_with_the_supported_ones_and_the_way_out() {
    let dir = common::Scratch::new("unknown-family");
    let path = tiny_model("llama", "mixed", &dir);
    let mut bytes = std::fs::read(&path).unwrap();
    // The architecture's value, "llama", becomes "mamba" (same length, same header).
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    bytes[at..at + 5].copy_from_slice(b"mamba");
    std::fs::write(&path, bytes).unwrap();
    let err = Engine::load(&path).err().expect("a mamba file loaded").to_string();
    for part in ["'mamba'", "llama, qwen2, qwen3, qwen3moe, gemma3, phi3, gpt-oss", "--engine openai:"] {
        assert!(err.contains(part), "{err}");
    }
}
