#!/usr/bin/env bash
# Hillside against llama.cpp on the same GGUF, threads and contexts, in one run.
#
#   scripts/bench-vs-llama.sh [--level avx2|native] [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
#                             [--contexts 512,4096,8192] [--prefill 512,8192] [--threads 2] [--decode-tokens 32]
#
# llama.cpp's `llama-bench` is built once by `llama-cpp-build.sh` (from the PyPI sdist):
#   native  against Hillside at the CPU's best level;
#   avx2    against HILLSIDE_SIMD=avx2, so an AVX-512 machine can time the AVX2-only path of both.
# Prints one table of tokens/s and Hillside/llama.cpp ratios and writes it as JSON
# (bench-vs-llama-<level>.json). Ratios from one run only: both sides run back to back.
set -euo pipefail

level=native
models=smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct
contexts=512,4096,8192
prefills=512,8192
threads=2
decode_tokens=32
while [ $# -gt 0 ]; do
  case "$1" in
    --level) level=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --prefill) prefills=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --decode-tokens) decode_tokens=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/beside-llama.sh"
beside_llama "$level" llama-bench
bench_bin=$llama_tool
models_dir=${HILLSIDE_MODELS_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/hillside/models}

# One llama-bench figure: tokens/s of a prompt (-p N) or of decoding at a depth (-n N -d D).
llama_tps() {
  "$bench_bin" -m "$1" -t "$threads" -r 2 -o json "${@:2}" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

rows=()
IFS=, read -ra model_list <<< "$models"
IFS=, read -ra prefill_list <<< "$prefills"
IFS=, read -ra context_list <<< "$contexts"
for model in "${model_list[@]}"; do
  file=$(python3 -c 'import json,sys; print(next(m["file"] for m in json.load(open(sys.argv[1]))["models"] if m["name"] == sys.argv[2]))' "$root/models/registry.json" "$model")
  path=$models_dir/$file
  [ -f "$path" ] || python3 "$root/models/fetch.py" "$model" >&2
  for p in "${prefill_list[@]}"; do
    echo "$model: prefill $p ..." >&2
    HILLSIDE_SIMD=$hillside_simd "$hillside" bench decode --model "$model" --threads "$threads" \
      --prefill-tokens "$p" --contexts 2 --decode-tokens 1 --json "$work/h.json" >/dev/null 2>&1
    ours=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill"]["tokens_per_s"])' "$work/h.json")
    theirs=$(llama_tps "$path" -p "$p" -n 0)
    rows+=("$model prefill $p $ours $theirs")
  done
  for c in "${context_list[@]}"; do
    echo "$model: decode at $c ..." >&2
    HILLSIDE_SIMD=$hillside_simd "$hillside" bench decode --model "$model" --threads "$threads" \
      --prefill-tokens 1 --contexts "$c" --decode-tokens "$decode_tokens" --json "$work/h.json" >/dev/null 2>&1
    ours=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["decode"][0]["tokens_per_s"])' "$work/h.json")
    theirs=$(llama_tps "$path" -p 0 -n "$decode_tokens" -d "$((c - decode_tokens))")
    rows+=("$model decode $c $ours $theirs")
  done
done

# The level each side ran at: Hillside says which kernels it chose; llama.cpp's is what its
# build enabled.
ours_simd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$work/h.json")
theirs_simd=$(llama_simd "$level")
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys, datetime
level, threads, cpu, cpu_id, flags, ours_simd, theirs_simd, commit, out = sys.argv[1:10]
rows = []
for line in sys.stdin:
    model, kind, tokens, ours, theirs = line.split()
    rows.append(dict(model=model, figure=kind, tokens=int(tokens), hillside_tokens_per_s=float(ours),
                     llama_cpp_tokens_per_s=float(theirs), ratio=float(ours) / float(theirs)))
print(f"# {cpu} ({cpu_id}; {flags.strip()}), {threads} threads, level {level}")
print(f"# SIMD: Hillside {ours_simd} (commit {commit}), llama.cpp {theirs_simd.strip()}")
print(f"| model | figure | tokens | Hillside tok/s | llama.cpp tok/s | ratio |")
print(f"| --- | --- | ---: | ---: | ---: | ---: |")
for r in rows:
    print("| {model} | {figure} | {tokens} | {hillside_tokens_per_s:.1f} | {llama_cpp_tokens_per_s:.1f} | {ratio:.2f}x |".format(**r))
json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), cpu=cpu, cpu_id=cpu_id, flags=flags.split(),
               threads=int(threads), level=level, commit=commit, simd=dict(hillside=ours_simd, llama_cpp=theirs_simd.strip()),
               llama_cpp="llama-cpp-python 0.3.36 sdist", rows=rows), open(out, "w"), indent=2)
print(f"wrote {out}")
' "$level" "$threads" "$cpu" "$cpu_id" "$flags" "$ours_simd" "$theirs_simd" "$commit" "bench-vs-llama-$level.json"
