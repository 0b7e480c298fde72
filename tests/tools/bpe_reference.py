#!/usr/bin/env python3
"""An independent byte-level BPE tokenizer for the default model, written from the GPT-2 paper's
algorithm (not the `tokenizers` library the engine uses). It reads the vocabulary and merges
from the GGUF file with the `gguf` package (llama.cpp's own reader) and prints the ids of the
fixed strings in tests/tests/tokenizer.rs, which were produced by running:

    pip install gguf regex
    python3 tests/tools/bpe_reference.py ~/.local/share/hillside/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import sys

import regex
from gguf import GGUFReader

# SmolLM's pre-tokenizer: every digit alone, then GPT-2's split.
GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
STRINGS = [
    "Hello, world!",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "  leading spaces and\ttabs\nnewlines  ",
    "Numbers: 12345 and 3.14159, year 2026.",
    "Unicode: café, naïve, 日本語, emoji 🎉!",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def bpe(word, ranks):
    parts = list(word)
    while len(parts) > 1:
        pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)
        if rank == 1 << 30:
            break
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    return parts


def encode(text, vocab, ranks, byte_map):
    ids = []
    for piece in regex.split("(" + "|".join(map(regex.escape, SPECIAL)) + ")", text):
        if piece in SPECIAL:
            ids.append(vocab[piece])
            continue
        for digit_split in regex.split(r"(\p{N})", piece):
            for word in GPT2_SPLIT.findall(digit_split):
                mapped = "".join(byte_map[b] for b in word.encode("utf-8"))
                ids.extend(vocab[p] for p in bpe(mapped, ranks))
    return ids


def main():
    reader = GGUFReader(sys.argv[1])
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {m: i for i, m in enumerate(merges)}
    byte_map = bytes_to_unicode()
    for s in STRINGS:
        print(f"({s!r}, &{encode(s, vocab, ranks, byte_map)}),")


if __name__ == "__main__":
    main()
