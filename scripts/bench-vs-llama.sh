#!/usr/bin/env bash
# Hillside against llama.cpp on the same GGUF, threads and contexts, in one run.
#
#   scripts/bench-vs-llama.sh [--level avx2|native] [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
#                             [--contexts 512,4096,8192] [--prefill 512,8192] [--threads 2] [--decode-tokens 32]
#                             [--runs 1] [--json bench-vs-llama-LEVEL.json]
#
# --models takes names from models/registry.json or paths to GGUF files (such as the files of
# real shapes and random weights that tests/tools/tiny-gguf.sh --real-shape writes).
#
# llama.cpp's `llama-bench` is built once by `llama-cpp-build.sh` (from the PyPI sdist):
#   native  against Hillside at the CPU's best level;
#   avx2    against HILLSIDE_SIMD=avx2, so an AVX-512 machine can time the AVX2-only path of both.
# Prints one table of tokens/s and Hillside/llama.cpp ratios and writes it as JSON
# (bench-vs-llama-<level>.json). Both sides run back to back, --runs times in turn, and each
# keeps its fastest: on a machine whose speed drifts between minutes (a shared VM) one run
# each can land on either side of 1.0x.
set -euo pipefail

level=native
models=smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct
contexts=512,4096,8192
prefills=512,8192
threads=2
decode_tokens=32
runs=1
json=
while [ $# -gt 0 ]; do
  case "$1" in
    --level) level=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --prefill) prefills=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --decode-tokens) decode_tokens=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/beside-llama.sh"
beside_llama "$level" llama-bench
bench_bin=$llama_tool
models_dir=${HILLSIDE_MODELS_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/hillside/models}

# Runs a command and writes its peak RSS in MB to $work/rss.
measured() {
  python3 -c 'import resource, subprocess, sys
done = subprocess.run(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 // 1_000_000))
sys.exit(done.returncode)' "$work/rss" "$@"
}

# One llama-bench figure: tokens/s of a prompt (-p N) or of decoding at a depth (-n N -d D).
llama_tps() {
  measured "$bench_bin" -m "$1" -t "$threads" -r 2 -o json "${@:2}" 2>/dev/null >"$work/l.json"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["avg_ts"])' "$work/l.json"
}

# One Hillside figure from `bench decode`'s JSON: $1 is a Python expression on it, `r`. Its peak
# RSS is the one `bench decode` reads before its memory-bandwidth probe (a 512 MiB buffer).
hillside_tps() {
  local figure=$1; shift
  HILLSIDE_SIMD=$hillside_simd "$hillside" bench decode --model "$path" --threads "$threads" \
    --json "$work/h.json" "$@" >/dev/null 2>&1
  python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); print(round(r["peak_rss_mb"]), file=open(sys.argv[3], "w")); print(eval(sys.argv[2]))' \
    "$work/h.json" "$figure" "$work/rss"
}

# One figure on both sides, --runs times in turn: sets $pair to "ours theirs ours_rss theirs_rss",
# the fastest run of each with its peak RSS. $1 is the figure in `bench decode`'s JSON, $2 its
# flags, $3 llama-bench's.
figure_pair() {
  local best_ours=0 best_theirs=0 ours_rss=0 theirs_rss=0 t v
  for ((t = 0; t < runs; t++)); do
    # shellcheck disable=SC2086 # the flags are words
    v=$(hillside_tps "$1" $2)
    if python3 -c 'import sys; sys.exit(float(sys.argv[1]) <= float(sys.argv[2]))' "$v" "$best_ours"; then
      best_ours=$v; ours_rss=$(cat "$work/rss")
    fi
    # shellcheck disable=SC2086
    v=$(llama_tps "$path" $3)
    if python3 -c 'import sys; sys.exit(float(sys.argv[1]) <= float(sys.argv[2]))' "$v" "$best_theirs"; then
      best_theirs=$v; theirs_rss=$(cat "$work/rss")
    fi
  done
  pair="$best_ours $best_theirs $ours_rss $theirs_rss"
}

rows=()
IFS=, read -ra model_list <<< "$models"
IFS=, read -ra prefill_list <<< "$prefills"
IFS=, read -ra context_list <<< "$contexts"
for model in "${model_list[@]}"; do
  if [[ $model == *.gguf ]]; then
    path=$(realpath "$model")
    model=$(basename "$model" .gguf)
  else
    file=$(python3 -c 'import json,sys; print(next(m["file"] for m in json.load(open(sys.argv[1]))["models"] if m["name"] == sys.argv[2]))' "$root/models/registry.json" "$model")
    path=$models_dir/$file
    [ -f "$path" ] || python3 "$root/models/fetch.py" "$model" >&2
  fi
  for p in "${prefill_list[@]}"; do
    echo "$model: prefill $p ..." >&2
    figure_pair 'r["prefill"]["tokens_per_s"]' "--prefill-tokens $p --contexts 2 --decode-tokens 1" "-p $p -n 0"
    rows+=("$model prefill $p $pair")
  done
  for c in "${context_list[@]}"; do
    echo "$model: decode at $c ..." >&2
    figure_pair 'r["decode"][0]["tokens_per_s"]' "--prefill-tokens 1 --contexts $c --decode-tokens $decode_tokens" \
      "-p 0 -n $decode_tokens -d $((c - decode_tokens))"
    rows+=("$model decode $c $pair")
  done
done

# The level each side ran at: Hillside says which kernels it chose; llama.cpp's is what its
# build enabled.
ours_simd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$work/h.json")
theirs_simd=$(llama_simd "$level")
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys, datetime
level, threads, cpu, cpu_id, flags, ours_simd, theirs_simd, commit, out, runs = sys.argv[1:11]
rows = []
for line in sys.stdin:
    model, kind, tokens, ours, theirs, ours_rss, theirs_rss = line.split()
    rows.append(dict(model=model, figure=kind, tokens=int(tokens), hillside_tokens_per_s=float(ours),
                     llama_cpp_tokens_per_s=float(theirs), ratio=float(ours) / float(theirs),
                     hillside_peak_rss_mb=int(ours_rss), llama_cpp_peak_rss_mb=int(theirs_rss)))
print(f"# {cpu} ({cpu_id}; {flags.strip()}), {threads} threads, level {level}, best of {runs} run(s) a side")
print(f"# SIMD: Hillside {ours_simd} (commit {commit}), llama.cpp {theirs_simd.strip()}")
print(f"| model | figure | tokens | Hillside tok/s | llama.cpp tok/s | ratio | peak RSS MB (Hillside / llama.cpp) |")
print(f"| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print("| {model} | {figure} | {tokens} | {hillside_tokens_per_s:.1f} | {llama_cpp_tokens_per_s:.1f} | {ratio:.2f}x "
          "| {hillside_peak_rss_mb} / {llama_cpp_peak_rss_mb} |".format(**r))
json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), cpu=cpu, cpu_id=cpu_id, flags=flags.split(),
               threads=int(threads), level=level, runs=int(runs), commit=commit, simd=dict(hillside=ours_simd, llama_cpp=theirs_simd.strip()),
               llama_cpp="llama-cpp-python 0.3.36 sdist", rows=rows), open(out, "w"), indent=2)
print(f"wrote {out}")
' "$level" "$threads" "$cpu" "$cpu_id" "$flags" "$ours_simd" "$theirs_simd" "$commit" "${json:-bench-vs-llama-$level.json}" "$runs"
