#!/usr/bin/env bash
# The published OpenAPI document against `hillside serve`: schemathesis (pinned, in a venv kept
# under ~/.cache) with every check, a bounded number of cases per route. Part of `make test`.
# Usage: scripts/api-conformance.sh [cases per route, default 25]
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
venv="$HOME/.cache/hillside/schemathesis-4.32.5"
# The server under test: HILLSIDE_BIN (`make test` passes the one its workspace build made, with the
# document reader beside it), else built here with the reader (together, so that they share their
# dependencies' build).
bin="${HILLSIDE_BIN:-}"
if [ -z "$bin" ]; then
  cargo build -q -p hillside -p hillside-documents --bin hillside --bin hillside-ingest
  bin="$target/debug/hillside"
fi
if [ ! -x "$venv/bin/st" ]; then
  echo "installing schemathesis 4.32.5 into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q schemathesis==4.32.5
fi
python3 tests/python/api_conformance.py "$bin" "$venv/bin/st" "${1:-25}"
