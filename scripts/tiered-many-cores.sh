#!/usr/bin/env bash
# The tiered store against the full cache and offload on a machine with many cores (issue 47),
# side by side in one run, for a lent GPU machine's host (16 cores, no network, ~60 MiB of files):
#
#   scripts/tiered-many-cores.sh pack [DIR]   here: a release build (hillside and the lab it hands
#                                             `bench` to, hillside-bench), stripped, and the default
#                                             model cut to its first 9 blocks (real weights, so a
#                                             layer costs what it does), xz'd into DIR
#                                             (default target/devpack, ~55 MB), with this script
#   OUT=... DIR/tiered-many-cores.sh run      there: decode at 8K, full / tiered / offload,
#                                             16 and 2 threads, alternated, with the step traced;
#                                             a memory-capped run; 32K where time is left
#
# Everything `run` prints goes to $OUT (summary.log, bench.log, a JSON per run). BUDGET_S bounds
# the whole run (default 390 s); CAP_MB is the cap of the capped run (160 suits the 9-block model);
# CONTEXT and LONG_CONTEXT (8192, 32768) the contexts.
set -uo pipefail

pack() {
  local dir=${1:-target/devpack} model=$HOME/.local/share/hillside/models/SmolLM2-135M-Instruct.Q4_1.gguf
  local venv=$HOME/.cache/hillside-gguf-venv cut=../shared/gpu/make_small_gguf.py
  cd "$(dirname "$0")/.." || exit 1
  set -e
  mkdir -p "$dir"
  [ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q gguf numpy; }
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/hillside-target}
  cargo build --release -p hillside -p hillside-bench
  strip -o "$dir/hillside" "$CARGO_TARGET_DIR/release/hillside"
  strip -o "$dir/hillside-bench" "$CARGO_TARGET_DIR/release/hillside-bench"
  "$venv/bin/python" "$cut" "$model" "$dir/model.gguf" 9
  xz -T2 -9 -f "$dir/hillside" "$dir/hillside-bench" "$dir/model.gguf"
  cp ../shared/data/pride-and-prejudice.txt "$dir/"
  install -m 755 scripts/tiered-many-cores.sh "$dir/"
  git rev-parse --short HEAD >"$dir/commit"
  du -sh "$dir"
}

run() {
  : "${OUT:?set OUT to the output folder}"
  local here start=$SECONDS budget=${BUDGET_S:-390}
  here=$(cd "$(dirname "$0")" && pwd)
  work=$(mktemp -d /tmp/hillside-many-cores.XXXXXX) # global: the exit trap removes it
  trap 'rm -rf "$work"' EXIT
  local log=$OUT/bench.log summary=$OUT/summary.log
  : >"$log"
  : >"$summary"
  say() { echo "$*" | tee -a "$summary"; }
  step() { # NAME LIMIT_S COMMAND...: runs it within what is left of the budget
    local name=$1 limit=$2 left s rc
    shift 2
    left=$((budget - (SECONDS - start) - 5))
    [ "$left" -lt "$limit" ] && limit=$left
    [ "$limit" -lt 10 ] && { say "$name: skipped, no time left"; return; }
    echo "=== $name: $*" >>"$log"
    s=$SECONDS
    timeout -k 3 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    say "$name: exit $rc, $((SECONDS - s)) s"
  }
  xz -dc "$here/hillside.xz" >"$work/hillside" && chmod +x "$work/hillside"
  xz -dc "$here/hillside-bench.xz" >"$work/hillside-bench" && chmod +x "$work/hillside-bench"
  xz -dc "$here/model.gguf.xz" >"$work/model.gguf"
  local bin=$work/hillside model=$work/model.gguf text=$here/pride-and-prejudice.txt
  local ctx=${CONTEXT:-8192} long=${LONG_CONTEXT:-32768}
  say "$(date -u) · $(nproc) CPUs · $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) · commit $(cat "$here/commit")"
  decode() { # NAME THREADS STORE CONTEXT TOKENS [FLAGS...]
    local name=$1 threads=$2 store=$3 context=$4 tokens=$5
    shift 5
    step "$name" 120 "$bin" --threads "$threads" bench decode -m "$model" --text "$text" --kv "$store" \
      --spare-copy false --cold-dir "$work/cold" --contexts "$context" --decode-tokens "$tokens" \
      --prefill-tokens 16 --prompt-cache "$work/prompts" --json "$OUT/$name.json" "$@"
  }
  decode full-16-a 16 full "$ctx" 256
  decode tiered-16-a 16 tiered "$ctx" 256 --trace
  decode full-16-b 16 full "$ctx" 256
  decode tiered-16-b 16 tiered "$ctx" 256 --trace
  decode offload-16 16 offload "$ctx" 128
  decode full-2 2 full "$ctx" 128
  decode tiered-2 2 tiered "$ctx" 128 --trace
  decode offload-2 2 offload "$ctx" 64
  step capped-16 90 "$bin" --threads 16 bench kv -m "$model" --text "$text" --stores offload,tiered \
    --spare-copy false --cold-dir "$work/cold" --contexts "$ctx" --decode-tokens 64 \
    --prompt-cache "$work/prompts" --memory-cap-mb "${CAP_MB:-160}" --json "$OUT/capped-16.json" \
    --plot "$OUT/capped-16.svg"
  decode full-16-long 16 full "$long" 128
  decode tiered-16-long 16 tiered "$long" 128 --trace
  say "done in $((SECONDS - start)) s"
}

case "${1:-}" in
  pack) pack "${2:-}" ;;
  run) run ;;
  *) echo "usage: $0 pack [DIR] | run" >&2; exit 2 ;;
esac
