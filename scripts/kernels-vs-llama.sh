#!/usr/bin/env bash
# Each weight format's product kernel, Hillside's beside llama.cpp's, on one core in one run.
#
#   scripts/kernels-vs-llama.sh [--level avx2|native] [--formats q4_1,q5_0,q8_0,q4_K,q6_K,iq4_nl,iq4_xs,mxfp4]
#                               [--values 65536,655360,65536000] [--cols 896,4864] [--ms 300]
#
# Both sides take one token's activations, quantized beforehand, against the same shape of
# random weights, a row at a time, and keep the mean of the fastest fifth of their calls:
# `hillside bench kernels --threads 1` and `llama-kernels` (tools/bench/llama-kernels.c, which
# calls ggml's CPU vec_dot for each row, built by `llama-cpp-build.sh` against llama.cpp's ggml).
#   native  both at the CPU's best level;
#   avx2    HILLSIDE_SIMD=avx2 against ggml built without AVX-512.
# A row width a format cannot take (K-quants and IQ4_XS need multiples of 256 values) is skipped. Prints
# ns per 32 weights and llama.cpp ÷ Hillside (above 1: Hillside is faster) and writes it as JSON
# (kernels-vs-llama-<level>.json).
set -euo pipefail

level=native
formats=q4_1,q5_0,q8_0,q4_K,q6_K
values=65536,655360,65536000
cols_list=896,4864
ms=300
while [ $# -gt 0 ]; do
  case "$1" in
    --level) level=$2; shift 2 ;;
    --formats) formats=$2; shift 2 ;;
    --values) values=$2; shift 2 ;;
    --cols) cols_list=$2; shift 2 ;;
    --ms) ms=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/beside-llama.sh"
beside_llama "$level" llama-kernels

rows=()
IFS=, read -ra format_list <<< "$formats"
IFS=, read -ra value_list <<< "$values"
IFS=, read -ra col_list <<< "$cols_list"
for cols in "${col_list[@]}"; do
  for format in "${format_list[@]}"; do
    case "$format" in
      *_K|iq4_xs) [ $((cols % 256)) -eq 0 ] || { echo "$format: rows of $cols values are not whole blocks; skipped" >&2; continue; } ;;
    esac
    for v in "${value_list[@]}"; do
      echo "$format: $v weights in rows of $cols ..." >&2
      HILLSIDE_SIMD=$hillside_simd "$hillside" bench kernels --threads 1 --formats "$format" --values "$v" \
        --cols "$cols" --ms "$ms" --json "$work/h.json" >/dev/null 2>&1
      ours=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"][0]["ns_per_32_values"])' "$work/h.json")
      read -r _ total n_rows _ bytes ns < <("$llama_tool" "$format" "$v" "$cols" "$ms")
      rows+=("$format $total $n_rows $cols $bytes $ours $ns")
    done
  done
done

ours_simd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simd"])' "$work/h.json")
theirs_simd=$(llama_simd "$level")
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys, datetime
level, cpu, cpu_id, flags, ours_simd, theirs_simd, commit, out = sys.argv[1:9]
rows = []
for line in sys.stdin:
    fmt, values, n_rows, cols, ggml_bytes, ours, theirs = line.split()
    rows.append(dict(format=fmt, values=int(values), rows=int(n_rows), cols=int(cols),
                     ggml_weight_bytes=int(ggml_bytes), hillside_ns_per_32=float(ours),
                     llama_cpp_ns_per_32=float(theirs), ratio=float(theirs) / float(ours)))
print(f"# {cpu} ({cpu_id}; {flags.strip()}), 1 thread, level {level}")
print(f"# SIMD: Hillside {ours_simd} (commit {commit}), llama.cpp {theirs_simd.strip()}")
print("| format | matrix | MB | Hillside ns / 32 | llama.cpp ns / 32 | llama.cpp ÷ Hillside |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print("| {format} | {rows} × {cols} | {mb:.2f} | {hillside_ns_per_32:.3f} | {llama_cpp_ns_per_32:.3f} | {ratio:.2f}x |"
          .format(mb=r["ggml_weight_bytes"] / 1e6, **r))
json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), cpu=cpu,
               cpu_id=cpu_id, flags=flags.split(), threads=1, level=level, commit=commit,
               simd=dict(hillside=ours_simd, llama_cpp=theirs_simd.strip()),
               llama_cpp="llama-cpp-python 0.3.36 sdist, ggml vec_dot", rows=rows), open(out, "w"), indent=2)
print(f"wrote {out}")
' "$level" "$cpu" "$cpu_id" "$flags" "$ours_simd" "$theirs_simd" "$commit" "kernels-vs-llama-$level.json"
