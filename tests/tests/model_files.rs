//! Model files: bad ones fail with a clear error (never a panic), and tiny random-weight models
//! exercise shapes the default model does not have (qwen2 biases, dense safetensors weights).

mod common;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use common::rng::SplitMix64;
use common::Scratch;
use hillside_engine::kernels::matrix::Matrix;
use hillside_engine::model::{gguf, safetensors, Model};
use hillside_engine::{Engine, Error, Logits};
use std::collections::HashMap;
use std::path::Path;

/// The tiny models share the real tokenizer's vocabulary, so a checkpoint of one can be chatted with.
const VOCAB: usize = 49152;

fn load_err(path: &Path) -> String {
    match Engine::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_empty_and_foreign_files_are_clear_errors() {
    let dir = tempdir("bad-files");
    let real = std::fs::read(common::model_path()).unwrap();

    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    let msg = load_err(&truncated);
    assert!(msg.contains("truncated.gguf") && msg.contains("the file is truncated"), "{msg}");
    assert!(matches!(gguf::load(&truncated), Err(Error::BadModelFile { .. })), "{msg}");

    let header_only = dir.join("header-only.gguf");
    std::fs::write(&header_only, &real[..4096]).unwrap();
    assert!(load_err(&header_only).contains("header-only.gguf"));

    let text = dir.join("notes.gguf");
    std::fs::write(&text, "these are my notes, not a model\n").unwrap();
    assert!(load_err(&text).contains("not a GGUF file"), "{}", load_err(&text));

    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(load_err(&empty).contains("not a GGUF file"));

    assert!(load_err(&dir.join("missing.gguf")).contains("missing.gguf"));
}

#[test]
fn unknown_architectures_and_missing_tensors_are_named() {
    let dir = tempdir("bad-arch");
    let path = dir.join("mamba.gguf");
    write_gguf(&path, &[("general.architecture", Value::String("mamba".into()))], &[]);
    assert!(matches!(gguf::load(&path), Err(Error::UnsupportedArchitecture(a)) if a == "mamba"));

    let path = dir.join("empty-llama.gguf");
    write_gguf(&path, &tiny_metadata("llama", 2), &[]);
    match gguf::load(&path) {
        Err(Error::MissingTensor(name)) => assert_eq!(name, "token_embd.weight"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("loaded a model without tensors"),
    }
}

#[test]
fn a_layer_of_the_wrong_width_is_a_bad_model_file_not_a_panic() {
    let dir = tempdir("wrong-width");
    let path = dir.join("wrong-width.gguf");
    let mut tensors = tiny_tensors(false, 2);
    // Layer 1's K projection takes 128 inputs where the model's hidden size is 64: its rows
    // would be read past their ends by the fused q/k/v product.
    let k = tensors.iter_mut().find(|(n, _)| n == "blk.1.attn_k.weight").unwrap();
    k.1 = QTensor::quantize(&Tensor::rand(-0.3f32, 0.3, (32, 128), &Device::Cpu).unwrap(), GgmlDType::Q4_1).unwrap();
    write_gguf(&path, &tiny_metadata("llama", 2), &tensors);
    match gguf::load(&path) {
        Err(Error::BadModelFile { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains("layer 1") && reason.contains("64 and 128 columns"), "{reason}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("loaded a model whose K projection is 128 wide"),
    }
    // Also when the widths agree but the rows do not fit the metadata: rejected at load.
    let mut tensors = tiny_tensors(false, 2);
    let v = tensors.iter_mut().find(|(n, _)| n == "blk.0.attn_v.weight").unwrap();
    v.1 = QTensor::quantize(&Tensor::rand(-0.3f32, 0.3, (16, 64), &Device::Cpu).unwrap(), GgmlDType::Q4_1).unwrap();
    write_gguf(&path, &tiny_metadata("llama", 2), &tensors);
    let err = gguf::load(&path).err().expect("a short V projection");
    assert!(matches!(&err, Error::BadModelFile { reason, .. } if reason.contains("layer 0 qkv")), "{err}");
}

#[test]
fn tiny_qwen2_gguf_runs_with_biases_and_gqa() {
    let dir = tempdir("tiny-qwen2");
    let path = dir.join("tiny-qwen2.gguf");
    let tensors = tiny_tensors(true, 2);
    write_gguf(&path, &tiny_metadata("qwen2", 2), &tensors);
    let loaded = gguf::load(&path).unwrap();
    assert!(loaded.weights.blocks[0].attention.qkv_bias.is_some());
    check_consistent(&Model::new(loaded.config, loaded.weights));
}

#[test]
fn tiny_llama_safetensors_runs_on_dense_weights() {
    let dir = tempdir("tiny-llama-st");
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, t) in tiny_tensors(false, 2) {
        let w = t.dequantize(&Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        let hf = name
            .replace("token_embd.weight", "model.embed_tokens.weight")
            .replace("output_norm.weight", "model.norm.weight")
            .replace("blk.", "model.layers.")
            .replace("attn_q.", "self_attn.q_proj.")
            .replace("attn_k.", "self_attn.k_proj.")
            .replace("attn_v.", "self_attn.v_proj.")
            .replace("attn_output.", "self_attn.o_proj.")
            .replace("ffn_gate.", "mlp.gate_proj.")
            .replace("ffn_up.", "mlp.up_proj.")
            .replace("ffn_down.", "mlp.down_proj.")
            .replace("attn_norm.", "input_layernorm.")
            .replace("ffn_norm.", "post_attention_layernorm.");
        tensors.insert(hf, w);
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":49152,"max_position_embeddings":256,
            "rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":true}"#,
    )
    .unwrap();
    let (config, weights) = safetensors::load(&dir).unwrap();
    // BF16 stays 16-bit: two bytes a weight, as in the file.
    assert!(matches!(&weights.embedding, Matrix::Half(_)), "the embedding was widened");
    assert_eq!(weights.blocks[0].attention.output.weight_bytes(), 2 * 64 * 64);
    check_consistent(&Model::new(config, weights));

    // With tokenizer.json and tokenizer_config.json beside it, it is a whole model to chat with.
    let real = Engine::load(&common::model_path()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), real.tokenizer().to_json().unwrap()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\n' }}",
            "eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    let engine = Engine::load(&dir).unwrap();
    let text = "Tokenizer from tokenizer.json: café 123";
    assert_eq!(engine.tokenizer().encode(text).unwrap(), real.tokenizer().encode(text).unwrap());
    let prompt = engine.chat_prompt(&[hillside_engine::ChatMessage::new("user", "hi")]).unwrap();
    assert_eq!(prompt, real.tokenizer().encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").unwrap());
    let params = hillside_engine::GenerateParams { max_tokens: 5, ..Default::default() };
    let mut seq = engine.new_sequence(None);
    let summary =
        hillside_engine::generate(&engine, &mut seq, &prompt, &params, &Default::default(), &mut |_| {}).unwrap();
    assert!(summary.completion_tokens <= 5);
}

/// A llama-shaped file with a sliding window (Mistral's key) attends within it: the first token
/// lies beyond both layers' reach together (2 × 7 positions) from the last, so changing it
/// changes none of the last logits, where without the window it does; and one by one gives
/// what one pass gives.
#[test]
fn a_llama_file_with_a_sliding_window_forgets_what_lies_beyond_it() {
    let dir = tempdir("llama-window");
    let model = |window: Option<u32>| {
        let path = dir.join(format!("window-{window:?}.gguf"));
        let mut metadata = tiny_metadata("llama", 2);
        metadata.extend(window.map(|w| ("llama.attention.sliding_window", Value::U32(w))));
        write_gguf(&path, &metadata, &tiny_tensors(false, 2));
        let loaded = gguf::load(&path).unwrap();
        Model::new(loaded.config, loaded.weights)
    };
    let last_logits = |model: &Model, first: u32| {
        let tokens: Vec<u32> = std::iter::once(first).chain((1..30).map(|i| i * 37 % 128)).collect();
        let mut kv = hillside_engine::kv::FullKvStore::new(model.kv_shape(64));
        model.forward(&tokens, &mut kv, Logits::Last).unwrap()
    };
    let bits = |logits: Vec<f32>| logits.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let windowed = model(Some(8));
    assert_eq!(windowed.config.window_of(1), Some(8));
    assert_eq!(bits(last_logits(&windowed, 5)), bits(last_logits(&windowed, 99)), "the first token reached the last");
    let unwindowed = model(None);
    assert_ne!(bits(last_logits(&unwindowed, 5)), bits(last_logits(&unwindowed, 99)));
    check_consistent(&windowed);
}

/// Logits are finite and the same whether the tokens go through at once or one by one.
fn check_consistent(model: &Model) {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 128) as u32).collect();
    let mut kv = hillside_engine::kv::FullKvStore::new(model.kv_shape(64));
    let all = model.forward(&tokens, &mut kv, Logits::All).unwrap();
    assert!(all.iter().all(|l| l.is_finite()));
    let mut kv = hillside_engine::kv::FullKvStore::new(model.kv_shape(64));
    for (i, &t) in tokens.iter().enumerate() {
        let step = model.forward(&[t], &mut kv, Logits::Last).unwrap();
        let row = &all[i * VOCAB..][..VOCAB];
        let diff = step.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-3, "token {i}: one-by-one differs from one pass by {diff}");
    }
    // Past the store's limit: an error, not a panic.
    assert!(matches!(model.forward(&tokens, &mut kv, Logits::Last), Err(Error::ContextOverflow { .. })));
}

/// A scratch folder, created (the model files these tests write are up to 48 MB a run).
fn tempdir(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("test-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 2-layer model's metadata: hidden 64, 4 heads of 16 over `kv_heads` KV heads, FFN 96.
fn tiny_metadata(arch: &str, kv_heads: u32) -> Vec<(&'static str, Value)> {
    let key = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    vec![
        ("general.architecture", Value::String(arch.into())),
        (key("embedding_length"), Value::U32(64)),
        (key("feed_forward_length"), Value::U32(96)),
        (key("block_count"), Value::U32(2)),
        (key("attention.head_count"), Value::U32(4)),
        (key("attention.head_count_kv"), Value::U32(kv_heads)),
        (key("context_length"), Value::U32(256)),
        (key("vocab_size"), Value::U32(VOCAB as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("rope.freq_base"), Value::F32(10_000.0)),
    ]
}

/// Random weights for the model [`tiny_metadata`] describes, the same on every run (candle's
/// CPU `Tensor::rand` cannot be seeded): a test's margins do not move from one run to the next.
fn tiny_tensors(biases: bool, kv_heads: usize) -> Vec<(String, QTensor)> {
    let kv_dim = 16 * kv_heads;
    let rng = std::cell::RefCell::new(SplitMix64(0x9e37_79b9_7f4a_7c15));
    let uniform = |shape: &[usize], lo: f32, hi: f32| {
        let values: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.borrow_mut().uniform(lo, hi)).collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    };
    let q = |rows: usize, cols: usize| QTensor::quantize(&uniform(&[rows, cols], -0.3, 0.3), GgmlDType::Q4_1).unwrap();
    let f = |len: usize| QTensor::quantize(&uniform(&[len], 0.8, 1.2), GgmlDType::F32).unwrap();
    let mut out = vec![("token_embd.weight".to_string(), q(VOCAB, 64)), ("output_norm.weight".to_string(), f(64))];
    for l in 0..2 {
        let p = |n: &str| format!("blk.{l}.{n}");
        out.push((p("attn_q.weight"), q(64, 64)));
        out.push((p("attn_k.weight"), q(kv_dim, 64)));
        out.push((p("attn_v.weight"), q(kv_dim, 64)));
        out.push((p("attn_output.weight"), q(64, 64)));
        out.push((p("ffn_gate.weight"), q(96, 64)));
        out.push((p("ffn_up.weight"), q(96, 64)));
        out.push((p("ffn_down.weight"), q(64, 96)));
        out.push((p("attn_norm.weight"), f(64)));
        out.push((p("ffn_norm.weight"), f(64)));
        if biases {
            let b = |len: usize| QTensor::quantize(&uniform(&[len], -0.1, 0.1), GgmlDType::F32).unwrap();
            out.push((p("attn_q.bias"), b(64)));
            out.push((p("attn_k.bias"), b(kv_dim)));
            out.push((p("attn_v.bias"), b(kv_dim)));
        }
    }
    out
}

fn write_gguf(path: &Path, metadata: &[(&str, Value)], tensors: &[(String, QTensor)]) {
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta, &tensors).unwrap();
}

/// HILOS's X-cache, on a model with a KV head per query head: a token's layer input (64 values)
/// is half its K and V (128), so near-storage attention keeps the first layer's inputs instead,
/// and the host rebuilds K/V from them. The rebuilt K/V are the ones the model computed (up to
/// the f16 rounding of X), and the logits follow a store that keeps everything.
#[test]
fn x_cache_rebuilds_the_k_v_it_did_not_keep() {
    use hillside_engine::kv::{snapshot, FullKvStore, KvConfig, KvStore, Selection, StoreKind};
    let dir = tempdir("x-cache");
    let path = dir.join("tiny-mha.gguf");
    let tensors = tiny_tensors(true, 4);
    write_gguf(&path, &tiny_metadata("qwen2", 4), &tensors);
    let loaded = gguf::load(&path).unwrap();
    let model = Model::new(loaded.config, loaded.weights);
    let shape = model.kv_shape(256);
    let config = KvConfig {
        store: StoreKind::NearStorage,
        cold_dir: dir.join("cold"),
        x_cache_share: 0.5,
        ..Default::default()
    };
    let plan = config.x_cache_plan(shape, 64);
    assert_eq!((plan.layers, plan.input_values, plan.kv_values), (1, 64, 128), "{plan}");
    let with_grouped_heads = hillside_engine::kv::KvShape { n_kv_heads: 2, ..shape };
    assert_eq!(config.x_cache_plan(with_grouped_heads, 64).layers, 0, "off where X is no smaller than K and V");
    assert_eq!(KvConfig::default().x_cache_plan(shape, 64).layers, 0, "off unless asked for");

    let mut x_cache = config.build(shape, Some(model.kv_from_input())).unwrap();
    let mut full = FullKvStore::new(shape);
    let tokens: Vec<u32> = (0..200).map(|i| (i * 7919 % 4000) as u32).collect();
    let relative = |want: &[f32], got: &[f32]| {
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        want.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / scale
    };
    // A prompt in chunks, then decode steps; every commit spills whole groups to the cold pools.
    let run = |tokens: &[u32], kv: &mut dyn KvStore| -> Vec<Vec<f32>> {
        tokens[..150.min(tokens.len())]
            .chunks(64)
            .chain(tokens[150.min(tokens.len())..].chunks(1))
            .map(|c| model.forward(c, kv, Logits::All).unwrap())
            .collect()
    };
    // The first layer's K/V differ from the model's by the f16 rounding of X, which moves a few
    // of its int8-quantized values by a step; later layers and the logits carry that on (a
    // random-weight model amplifies it more than a trained one: `hillside eval` measures real ones).
    // The top token may change only where the full cache's two best logits lie closer than
    // twice the row's largest deviation (AVX2's rounding flips 11 of 100 such near ties here,
    // AVX-512's fewer); everywhere else it must stay.
    let compare_logits = |want: &[Vec<f32>], got: &[Vec<f32>]| {
        let (want, got) = (want.concat(), got.concat());
        let top = |row: &[f32]| row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
        let agree = want.chunks(VOCAB).zip(got.chunks(VOCAB)).filter(|(w, g)| top(w) == top(g)).count();
        let (rows, worst) = (want.len() / VOCAB, relative(&want, &got));
        eprintln!(
            "X-cache against full: top-1 agrees at {agree} of {rows} positions, logits off by {worst} of their largest"
        );
        assert!(worst < 0.1, "logits off by {worst} of their largest");
        assert!(5 * agree >= 4 * rows, "top-1 agrees at only {agree} of {rows}");
        for (i, (w, g)) in want.chunks(VOCAB).zip(got.chunks(VOCAB)).enumerate() {
            let best = top(w).unwrap();
            let second = w.iter().enumerate().filter(|&(j, _)| j != best).map(|(_, &x)| x).fold(f32::MIN, f32::max);
            let deviation = w.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            if w[best] - second > 2.0 * deviation {
                assert_eq!(
                    top(g),
                    Some(best),
                    "position {i}: the top token changed where it led by {}",
                    w[best] - second
                );
            }
        }
    };
    compare_logits(&run(&tokens, &mut full), &run(&tokens, &mut *x_cache));

    // Every layer's K/V as the store hands them to attention: layer 0's rebuilt from X.
    for layer in 0..2 {
        let all = 0..shape.n_kv_heads;
        let want = full.gather(layer, &Selection::All, all.clone()).unwrap();
        let (want_k, want_v, want_stride) = (want.k.to_vec(), want.v.to_vec(), want.head_stride_tokens);
        let got = x_cache.gather(layer, &Selection::All, all).unwrap();
        assert_eq!(got.n_tokens, 200);
        let (mut k_err, mut v_err, mut scale) = (0f32, 0f32, 0f32);
        for head in 0..shape.n_kv_heads {
            for t in 0..200 {
                for d in 0..16 {
                    let k_at = |stride: usize| {
                        head * stride * 16 + hillside_engine::kernels::attention::k_tile_index(t, d, 16)
                    };
                    let v_at = |stride: usize| (head * stride + t) * 16 + d;
                    k_err = k_err
                        .max((want_k[k_at(want_stride)].to_f32() - got.k[k_at(got.head_stride_tokens)].to_f32()).abs());
                    v_err = v_err
                        .max((want_v[v_at(want_stride)].to_f32() - got.v[v_at(got.head_stride_tokens)].to_f32()).abs());
                    scale = scale.max(want_k[k_at(want_stride)].to_f32().abs());
                }
            }
        }
        let tolerance = if layer == 0 { 0.01 } else { 0.05 };
        assert!(
            k_err < tolerance * scale && v_err < tolerance * scale,
            "layer {layer}: K off by {k_err}, V by {v_err} (largest K {scale})"
        );
    }

    // The cold pools hold X for layer 0 and K/V for layer 1: 192 bytes a token where K/V would take 256.
    let stats = x_cache.stats();
    assert_eq!(plan.bytes_per_token(), 2 * (64 + 128));
    assert_eq!(stats.cold_bytes, 192 * plan.bytes_per_token(), "{stats:?}");
    assert!(stats.bytes_to_host > stats.cold_bytes as u64, "X crosses to the host each step: {stats:?}");

    // A rollback keeps X and K/V in step: the tokens after the cut run again as they did.
    assert_eq!(x_cache.truncate(100), 100);
    assert_eq!(full.truncate(100), 100);
    compare_logits(&run(&tokens[100..], &mut full), &run(&tokens[100..], &mut *x_cache));

    // A saved prompt holds K/V, not X: replaying it into the X-cache is a clear error (the
    // caller computes the prompt afresh), never a layer with nothing in it.
    let saved = dir.join("prompt.kv");
    snapshot::save(&mut full, 200, &[7; 32], &saved).unwrap();
    let mut fresh = config.build(shape, Some(model.kv_from_input())).unwrap();
    let err = snapshot::load(&saved, &[7; 32], &mut *fresh).unwrap_err().to_string();
    assert!(err.contains("X-cache"), "{err}");
    drop((x_cache, fresh));
    assert_eq!(common::cold_files(&dir.join("cold")), 0, "the pool files go with their stores");
    std::fs::remove_dir_all(&dir).unwrap();
}
