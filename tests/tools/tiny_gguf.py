#!/usr/bin/env python3
"""Writes a small GGUF with random weights for one model family, with the family's real tensor
names and metadata (written with the `gguf` package from PyPI), for the families' tests to run
through Hillside and through llama.cpp side by side.

    tiny_gguf.py FAMILY OUT.gguf --vocab-from REAL.gguf [--seed N] [--formats mixed|table|iq4xs|iq4xs-as-nl]
                 [--chat-template FILE]
    tiny_gguf.py --real-shape gpt-oss-20b OUT.gguf --vocab-from REAL.gguf [--blocks N]

The vocabulary and tokenizer metadata are copied from a real GGUF (SmolLM2's byte-level BPE;
gpt-oss's file with o200k's pre-tokenizer split; the tokens a family adds, such as harmony's
and Qwen3's reasoning markers, after them), so both engines tokenize alike; the weights are random (never a claim about quality). The
matrices are Q8_0 and Q4_0 (`mixed`), MXFP4 and IQ4_NL (`table`, MXFP4 experts as gpt-oss has
them), IQ4_XS wherever a row is whole 256-value super-blocks (`iq4xs`), or those IQ4_XS
matrices written as the IQ4_NL blocks they stand for, each with its f16 scale (`iq4xs-as-nl`);
norms F32, as quantized files mix them.

`--real-shape` writes a named model's shapes instead (its widths, heads, experts and vocabulary
size, the vocabulary padded with placeholder tokens; `--blocks` cuts its depth), with random
block bytes in the formats its published file uses, for speed runs beside llama.cpp
(`scripts/bench-vs-llama.sh`): such weights decode to noise, fine for timing and nothing else.
"""
import argparse
import struct
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, RopeScalingType
from gguf.quants import quantize

# hidden, heads, kv heads, head size, feed-forward width, blocks
SHAPES = {
    "llama": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, blocks=3),
    "qwen2": dict(hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, blocks=3),
    "qwen3": dict(hidden=256, heads=4, kv_heads=2, head_dim=128, ffn=512, blocks=3),
    # Eight experts, two used per token, each 192 wide.
    "qwen3moe": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, blocks=3, experts=8, used=2, expert_ffn=192),
    "phi3": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, blocks=3),
    # Seven blocks, global at 2 and 6 (a flag per layer), windowed at the others.
    "gemma3": dict(hidden=256, heads=4, kv_heads=1, head_dim=128, ffn=768, blocks=7),
    # Four blocks, windowed and global in turn; eight experts, two used (gpt-oss-20b: 32, 4).
    "gpt-oss": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, blocks=4, experts=8, used=2, expert_ffn=192),
}
WINDOW_TOKENS = 24

# Published models' shapes and the formats of their usual GGUF (Q4_K_M: Q4_K with a Q6_K head;
# gpt-oss: MXFP4 experts, the rest Q8_0). `rope`: base; `yarn`: (factor, original context).
REAL_SHAPES = {
    "qwen3-0.6b": dict(family="qwen3", hidden=1024, heads=16, kv_heads=8, head_dim=128, ffn=3072, blocks=28,
                       vocab=151936, rope=1_000_000.0, tied=True),
    "qwen3-30b-a3b": dict(family="qwen3moe", hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144, blocks=48,
                          experts=128, used=8, expert_ffn=768, vocab=151936, rope=1_000_000.0, tied=False),
    "gpt-oss-20b": dict(family="gpt-oss", hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880, blocks=24,
                        experts=32, used=4, expert_ffn=2880, vocab=201088, rope=150_000.0, yarn=(32.0, 4096),
                        window=128, tied=False),
    "phi-4": dict(family="phi3", hidden=5120, heads=40, kv_heads=10, head_dim=128, ffn=17920, blocks=40,
                  vocab=100352, rope=250_000.0, tied=False),
    # The dense sizes people run (issue 67), with Q4_K_M's Q6_K layers (`more_bits`).
    "qwen2.5-1.5b": dict(family="qwen2", hidden=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960, blocks=28,
                         vocab=151936, rope=1_000_000.0, tied=True),
    "qwen2.5-3b": dict(family="qwen2", hidden=2048, heads=16, kv_heads=2, head_dim=128, ffn=11008, blocks=36,
                       vocab=151936, rope=1_000_000.0, tied=True),
    "qwen2.5-7b": dict(family="qwen2", hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, blocks=28,
                       vocab=152064, rope=1_000_000.0, tied=False),
    "llama-3.2-3b": dict(family="llama", hidden=3072, heads=24, kv_heads=8, head_dim=128, ffn=8192, blocks=28,
                         vocab=128256, rope=500_000.0, tied=True),
    "llama-3.1-8b": dict(family="llama", hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, blocks=32,
                         vocab=128256, rope=500_000.0, tied=False),
}


def more_bits(layer: int, layers: int) -> bool:
    """Whether Q4_K_M gives a layer's attn_v and ffn_down Q6_K (llama.cpp's `use_more_bits`)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2

Q = GGMLQuantizationType
# The projections' formats by tensor name, for --formats table and iq4xs.
FORMATS = {
    "table": {
        "attn_q": Q.MXFP4, "attn_k": Q.IQ4_NL, "attn_v": Q.MXFP4, "attn_output": Q.IQ4_NL,
        "ffn_gate": Q.MXFP4, "ffn_up": Q.IQ4_NL, "ffn_down": Q.MXFP4,
        "ffn_gate_exps": Q.MXFP4, "ffn_up_exps": Q.MXFP4, "ffn_down_exps": Q.MXFP4,
    },
    "iq4xs": {"attn_q": Q.IQ4_XS, "attn_output": Q.IQ4_XS, "ffn_gate": Q.IQ4_XS, "ffn_up": Q.IQ4_XS},
}
FORMATS["iq4xs-as-nl"] = FORMATS["iq4xs"]
# ggml's kvalues_iq4nl.
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def iq4_codes(blocks: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The nearest IQ4_NL value's index for each of `blocks` (n × 32) at scales `d` (n × 1),
    packed as ggml does: value j in the low nibble of byte j, value j+16 in its high one."""
    q = np.abs(d[..., None] * IQ4_NL_VALUES - blocks[..., None]).argmin(-1).astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def quantize_iq4(x: np.ndarray, qtype) -> np.ndarray:
    """IQ4_NL or IQ4_XS blocks of `x` (gguf-py only reads them): a plain nearest-value encoding,
    which any reader must decode as ggml does."""
    if qtype == Q.IQ4_NL:
        blocks = x.reshape(-1, 32)
        d = (np.abs(blocks).max(-1, keepdims=True) / 127).astype(np.float16)
        out = np.concatenate([d.view(np.uint8), iq4_codes(blocks, d.astype(np.float32))], axis=-1)
    else:
        sub = x.reshape(-1, 8, 32)
        want = np.abs(sub).max(-1) / 127
        d = (want.max(-1, keepdims=True) / 31).astype(np.float16)
        df = d.astype(np.float32)
        ls = np.clip(np.round(want / np.where(df > 0, df, 1)), 0, 31).astype(np.int32) + 32
        qs = iq4_codes(sub.reshape(-1, 32), (df * (ls - 32)).reshape(-1, 1)).reshape(-1, 128)
        high = sum(((ls[:, i] >> 4) & 3) << (2 * i) for i in range(8)).astype(np.uint16)
        low = np.stack([(ls[:, 2 * j] & 0xF) | ((ls[:, 2 * j + 1] & 0xF) << 4) for j in range(4)], -1).astype(np.uint8)
        out = np.concatenate([d.view(np.uint8), high.reshape(-1, 1).view(np.uint8), low, qs], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


def iq4_xs_as_nl(xs: np.ndarray) -> np.ndarray:
    """IQ4_XS super-blocks as the eight IQ4_NL blocks they stand for: each sub-block's scale
    d·(ls − 32) rounded to f16, its nibbles as they are."""
    b = xs.reshape(-1, 136)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    high = b[:, 2:4].copy().view(np.uint16).astype(np.int32)
    low = b[:, 4:8].astype(np.int32)
    ls = np.stack([((low[:, i // 2] >> (4 * (i % 2))) & 0xF) | (((high[:, 0] >> (2 * i)) & 3) << 4) for i in range(8)], -1)
    scales = (d * (ls - 32)).astype(np.float16).reshape(-1, 1)
    nl = np.concatenate([scales.view(np.uint8), b[:, 8:].reshape(-1, 16)], axis=-1)
    return nl.reshape(*xs.shape[:-1], -1)


def encode(x: np.ndarray, qtype) -> np.ndarray:
    return quantize_iq4(x, qtype) if qtype in (Q.IQ4_NL, Q.IQ4_XS) else quantize(x, qtype)


def random_blocks(rng, shape: tuple, qtype) -> np.ndarray:
    """Random bytes in `qtype`'s blocks for a matrix of `shape`, each block's scales set so the
    values stay small and finite."""
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (*shape[:-1], shape[-1] // block, size), dtype=np.uint8)
    f16 = lambda x: np.frombuffer(np.float16(x).tobytes(), dtype=np.uint8)
    # Where each format keeps its f16 scale (and minimum), as ggml lays its blocks out.
    if qtype in (Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K):
        data[..., 0:2] = f16(0.002)
    if qtype in (Q.Q4_K, Q.Q5_K):
        data[..., 2:4] = f16(0.001)
    if qtype == Q.Q6_K:
        data[..., size - 2 : size] = f16(0.0002)
    if qtype == Q.MXFP4:
        data[..., 0] = rng.integers(118, 122, data.shape[:-1], dtype=np.uint8)
    return data.reshape(*shape[:-1], -1)


TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 3, 4
# Tokens a family's vocabulary adds, with their types: the control tokens of OpenAI's harmony
# format (gpt-oss), and Qwen3's reasoning tags, which are text.
ADDED_TOKENS = {
    "gpt-oss": [(t, TOKEN_TYPE_CONTROL) for t in
                ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]],
    "qwen3": [("<think>", TOKEN_TYPE_USER_DEFINED), ("</think>", TOKEN_TYPE_USER_DEFINED)],
}


# The numeric metadata types: their struct code and numpy dtype.
SCALARS = {
    GGUFValueType.UINT8: ("B", np.uint8), GGUFValueType.INT8: ("b", np.int8),
    GGUFValueType.UINT16: ("H", np.uint16), GGUFValueType.INT16: ("h", np.int16),
    GGUFValueType.UINT32: ("I", np.uint32), GGUFValueType.INT32: ("i", np.int32),
    GGUFValueType.FLOAT32: ("f", np.float32), GGUFValueType.BOOL: ("?", np.bool_),
    GGUFValueType.UINT64: ("Q", np.uint64), GGUFValueType.INT64: ("q", np.int64),
    GGUFValueType.FLOAT64: ("d", np.float64),
}


def read_metadata(source: str) -> list:
    """The metadata of a GGUF file as (name, type, value), read straight
    from its header: the `gguf` package's reader makes a numpy view of every string of a
    vocabulary, which took most of a tiny model's writing time."""
    data = open(source, "rb").read()
    at = 0

    def take(code: str):
        nonlocal at
        (value,) = struct.unpack_from("<" + code, data, at)
        at += struct.calcsize(code)
        return value

    def string() -> str:
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n:at].decode("utf-8")

    magic, _version, _tensors, n_kv = struct.unpack_from("<4sIQQ", data)
    if magic != b"GGUF":
        sys.exit(f"{source}: not a GGUF file")
    at = struct.calcsize("<4sIQQ")
    fields = []
    for _ in range(n_kv):
        name, kind = string(), GGUFValueType(take("I"))
        if kind == GGUFValueType.ARRAY:
            inner, n = GGUFValueType(take("I")), take("Q")
            if inner == GGUFValueType.STRING:
                value = [string() for _ in range(n)]
            else:
                dtype = np.dtype(SCALARS[inner][1]).newbyteorder("<")
                value = np.frombuffer(data, dtype, n, at).tolist()
                at += n * dtype.itemsize
            fields.append((name, kind, value))
        elif kind == GGUFValueType.STRING:
            fields.append((name, kind, string()))
        else:
            fields.append((name, kind, take(SCALARS[kind][0])))
    return fields


def copy_vocabulary(writer: GGUFWriter, source: str, pre: str | None = None, pad_to: int = 0, added=()) -> int:
    """Copies the tokenizer's metadata from `source`, with `pre` as its pre-tokenizer if given,
    then the `added` (token, type) pairs, then placeholder tokens up to `pad_to`."""
    fields = [f for f in read_metadata(source) if f[0].startswith("tokenizer.") and f[0] != "tokenizer.chat_template"]
    n_vocab = next(len(value) for name, _, value in fields if name == "tokenizer.ggml.tokens")
    padding = max(pad_to - n_vocab - len(added), 0)
    for name, kind, value in fields:
        if kind == GGUFValueType.ARRAY:
            if len(value) == n_vocab:
                if name == "tokenizer.ggml.tokens":
                    value += [t for t, _ in added] + [f"<pad{i}>" for i in range(padding)]
                elif name == "tokenizer.ggml.token_type":
                    value += [kind for _, kind in added] + [TOKEN_TYPE_NORMAL] * padding
                else:
                    value += [0.0] * (len(added) + padding)
            writer.add_array(name, value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, pre if pre and name == "tokenizer.ggml.pre" else value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(name, bool(value))
        else:
            writer.add_uint32(name, int(value))
    return n_vocab + len(added) + padding


def add_shape(w: GGUFWriter, context: int, hidden: int, ffn: int, blocks: int, heads: int, kv_heads: int,
              head_dim: int, rope_base: float) -> None:
    """The metadata of a model's widths, depth, heads and RoPE base."""
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_block_count(blocks)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(rope_base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("family", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--vocab-from", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--formats", choices=["mixed", *FORMATS], default="mixed")
    ap.add_argument("--chat-template", help="a Jinja file to give the model as its chat template")
    ap.add_argument("--real-shape", choices=sorted(REAL_SHAPES))
    ap.add_argument("--blocks", type=int, help="with --real-shape: how many of its blocks to keep")
    ap.add_argument("--quant", choices=["q4_k_m", "q4_0", "q8_0"], default="q4_k_m",
                    help="with --real-shape of a llama or qwen2 model: its file's formats (q4_0: Q4_0 with a Q6_K "
                         "head, as llama.cpp's quantizer writes it; q8_0: Q8_0 throughout)")
    args = ap.parse_args()
    if (args.family is None) == (args.real_shape is None):
        ap.error("give a family or --real-shape")
    if args.real_shape:
        return write_real_shape(args)
    s = SHAPES[args.family]
    rng = np.random.default_rng(args.seed)
    arch = args.family
    w = GGUFWriter(args.out, arch)
    # gpt-oss's files split text as o200k does (`gpt-4o`), here over SmolLM2's pieces.
    n_vocab = copy_vocabulary(w, args.vocab_from, pre="gpt-4o" if arch == "gpt-oss" else None, added=ADDED_TOKENS.get(arch, []))
    if args.chat_template:
        w.add_chat_template(open(args.chat_template, encoding="utf-8").read())
    hidden, heads, kv_heads, hd, ffn, blocks = (s[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "blocks"))
    add_shape(w, 4096, hidden, ffn, blocks, heads, kv_heads, hd, 1_000_000.0 if arch in ("qwen3", "gemma3") else 10_000.0)
    if arch in ("qwen3", "gpt-oss"):
        # YaRN, as Qwen3's long-context files have it: a fourfold context over 4,096 tokens.
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    if arch == "gpt-oss":
        w.add_sliding_window(WINDOW_TOKENS)
    if arch == "gemma3":
        w.add_sliding_window(WINDOW_TOKENS)
        # A flag per layer (as llama.cpp's converter writes newer files), not the default
        # period: global layers 2 and 6 here, where the period of six would make only 5 global.
        w.add_array(f"{arch}.attention.sliding_window_pattern", [i not in (2, 6) for i in range(s["blocks"])])
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])

    def format_of(name: str, qtype):
        kind = name.split(".")[-2]
        return FORMATS.get(args.formats, {}).get(kind, qtype)

    # The added tokens' rows come from a stream of their own, so that the rest of a family's
    # weights stay the ones its test was measured with (a mixture of experts' routing ties
    # depend on every draw).
    added_rng = np.random.default_rng(args.seed + 1)
    n_added = len(ADDED_TOKENS.get(arch, []))

    def normal(rows: int, cols: int) -> np.ndarray:
        if rows != n_vocab or not n_added:
            return rng.standard_normal((rows, cols), dtype=np.float32)
        base = rng.standard_normal((rows - n_added, cols), dtype=np.float32)
        return np.concatenate([base, added_rng.standard_normal((n_added, cols), dtype=np.float32)])

    def matrix(name: str, rows: int, cols: int, qtype=GGMLQuantizationType.Q8_0, gain: float = 1.0) -> None:
        # Scaled so each product keeps its inputs' magnitude: the logits stay far from ties.
        x = normal(rows, cols) * (gain / np.sqrt(cols))
        qtype = format_of(name, qtype)
        if args.formats == "iq4xs-as-nl" and qtype == Q.IQ4_XS:
            w.add_tensor(name, iq4_xs_as_nl(encode(x, qtype)), raw_dtype=Q.IQ4_NL)
        else:
            w.add_tensor(name, encode(x, qtype), raw_dtype=qtype)

    def vector(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    w.add_tensor(
        "token_embd.weight",
        quantize(normal(n_vocab, hidden), GGMLQuantizationType.Q8_0),
        raw_dtype=GGMLQuantizationType.Q8_0,
    )
    vector("output_norm.weight", hidden)
    # An output head of its own (the families' loaders take one, or tie it to the embedding):
    # with the embedding as head, a random model only repeats the token it was given.
    matrix("output.weight", n_vocab, hidden, gain=4.0)
    for i in range(blocks):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", hidden)
        # gpt-oss names its norm before the experts post_attention_norm.
        vector(p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"), hidden)
        # Q4_0 in some projections, Q8_0 in others, as a quantized file mixes them.
        if arch == "phi3":
            # Fused: q, k and v in one projection.
            matrix(p + "attn_qkv.weight", (heads + 2 * kv_heads) * hd, hidden, gain=2.0)
        else:
            matrix(p + "attn_q.weight", heads * hd, hidden, GGMLQuantizationType.Q4_0, gain=2.0)
            matrix(p + "attn_k.weight", kv_heads * hd, hidden, gain=2.0)
            matrix(p + "attn_v.weight", kv_heads * hd, hidden)
        matrix(p + "attn_output.weight", hidden, heads * hd)
        if arch == "gpt-oss":
            vector(p + "attn_output.bias", hidden, around=0.0)
            # Sinks of the size real ones have: a head's sink takes a share of its softmax.
            w.add_tensor(p + "attn_sinks.weight", rng.normal(1.0, 1.5, heads).astype(np.float32))
        if arch in ("qwen2", "gpt-oss"):
            for proj, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                vector(p + f"attn_{proj}.bias", n, around=0.0)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
        if arch == "gemma3":
            vector(p + "post_attention_norm.weight", hidden)
            vector(p + "post_ffw_norm.weight", hidden)

        if "experts" in s:
            e, f = s["experts"], s["expert_ffn"]
            # The router in F32, as converted files keep it, spread wide so that each token's
            # choice of experts is clear-cut.
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, hidden)) * 0.5).astype(np.float32))
            if arch == "gpt-oss":
                vector(p + "ffn_gate_inp.bias", e, around=0.0)
                # Biases of the size that makes the clamps at ±7 bite now and then.
                for name, n in (("ffn_gate_exps", f), ("ffn_up_exps", f), ("ffn_down_exps", hidden)):
                    w.add_tensor(p + name + ".bias", (3.0 * rng.standard_normal((e, n))).astype(np.float32))
            for name, rows, cols, qtype in (
                ("ffn_gate_exps", f, hidden, GGMLQuantizationType.Q8_0),
                ("ffn_up_exps", f, hidden, GGMLQuantizationType.Q4_0),
                ("ffn_down_exps", hidden, f, GGMLQuantizationType.Q8_0),
            ):
                x = rng.standard_normal((e, rows, cols), dtype=np.float32) / np.sqrt(cols)
                # gpt-oss ships its experts in MXFP4.
                qtype = Q.MXFP4 if arch == "gpt-oss" else format_of(p + name + ".weight", qtype)
                w.add_tensor(p + name + ".weight", encode(x, qtype), raw_dtype=qtype)
            continue
        if arch == "phi3":
            # Fused: the gate, then the up projection.
            matrix(p + "ffn_up.weight", 2 * ffn, hidden, GGMLQuantizationType.Q4_0)
        else:
            matrix(p + "ffn_gate.weight", ffn, hidden)
            matrix(p + "ffn_up.weight", ffn, hidden, GGMLQuantizationType.Q4_0)
        matrix(p + "ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(args.out)


def write_real_shape(args) -> None:
    s = REAL_SHAPES[args.real_shape]
    rng = np.random.default_rng(args.seed)
    arch = s["family"]
    hidden, heads, kv_heads, hd, ffn, vocab = (s[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"))
    blocks = min(args.blocks or s["blocks"], s["blocks"])
    w = GGUFWriter(args.out, arch)
    w.add_name(f"{args.real_shape} shapes, {blocks} blocks, random weights")
    copy_vocabulary(w, args.vocab_from, pre="gpt-4o" if arch == "gpt-oss" else None, pad_to=vocab, added=ADDED_TOKENS.get(arch, []))
    add_shape(w, 32768, hidden, ffn, blocks, heads, kv_heads, hd, s["rope"])
    if "yarn" in s:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn"][0])
        w.add_rope_scaling_orig_ctx_len(s["yarn"][1])
    if "window" in s:
        w.add_sliding_window(s["window"])
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    dense = Q.Q8_0 if arch == "gpt-oss" else Q.Q4_K
    head = Q.Q8_0 if arch == "gpt-oss" else Q.Q6_K
    if args.quant != "q4_k_m":
        if arch not in ("llama", "qwen2"):
            sys.exit(f"--quant {args.quant}: only the llama and qwen2 shapes take it")
        dense = Q.Q4_0 if args.quant == "q4_0" else Q.Q8_0
        head = Q.Q6_K if args.quant == "q4_0" else Q.Q8_0

    def matrix(name: str, rows: int, cols: int, qtype=dense) -> None:
        w.add_tensor(name, random_blocks(rng, (rows, cols), qtype), raw_dtype=qtype)

    def vector(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden)
    vector("output_norm.weight", hidden)
    if not s["tied"]:
        matrix("output.weight", vocab, hidden, head)
    for i in range(blocks):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", hidden)
        vector(p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"), hidden)
        # Q4_K_M's attn_v and ffn_down are Q6_K in some layers (kept Q4_K in the families whose
        # speed rows were first measured without them).
        sixes = arch in ("llama", "qwen2") and args.quant == "q4_k_m" and more_bits(i, s["blocks"])
        if arch == "phi3":
            matrix(p + "attn_qkv.weight", (heads + 2 * kv_heads) * hd, hidden)
        else:
            for proj, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                matrix(p + f"attn_{proj}.weight", n, hidden, Q.Q6_K if proj == "v" and sixes else dense)
        matrix(p + "attn_output.weight", hidden, heads * hd)
        if arch == "qwen2":
            for proj, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                vector(p + f"attn_{proj}.bias", n, around=0.0)
        if arch in ("qwen3", "qwen3moe"):
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
        if arch == "gpt-oss":
            vector(p + "attn_output.bias", hidden, around=0.0)
            w.add_tensor(p + "attn_sinks.weight", rng.normal(1.0, 1.5, heads).astype(np.float32))
            for proj, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                vector(p + f"attn_{proj}.bias", n, around=0.0)
        if "experts" in s:
            e, f = s["experts"], s["expert_ffn"]
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, hidden)) * 0.5).astype(np.float32))
            experts = Q.MXFP4 if arch == "gpt-oss" else Q.Q4_K
            for name, rows, cols in (("ffn_gate_exps", f, hidden), ("ffn_up_exps", f, hidden), ("ffn_down_exps", hidden, f)):
                w.add_tensor(p + name + ".weight", random_blocks(rng, (e, rows, cols), experts), raw_dtype=experts)
                if arch == "gpt-oss":
                    w.add_tensor(p + name + ".bias", (0.1 * rng.standard_normal((e, rows))).astype(np.float32))
            if arch == "gpt-oss":
                vector(p + "ffn_gate_inp.bias", e, around=0.0)
            continue
        if arch == "phi3":
            matrix(p + "ffn_up.weight", 2 * ffn, hidden)
        else:
            matrix(p + "ffn_gate.weight", ffn, hidden)
            matrix(p + "ffn_up.weight", ffn, hidden)
        matrix(p + "ffn_down.weight", hidden, ffn, Q.Q6_K if sixes else dense)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(args.out)


if __name__ == "__main__":
    sys.exit(main())
