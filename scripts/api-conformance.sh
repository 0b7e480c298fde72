#!/usr/bin/env bash
# The published OpenAPI document against `hillside serve`: schemathesis (pinned, in a venv kept
# under ~/.cache) with every check, a bounded number of cases per route. Part of `make test`.
# Usage: scripts/api-conformance.sh [cases per route, default 25]
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
venv="$HOME/.cache/hillside/schemathesis-4.32.5"
# The server, and the document reader it runs beside it (built together, so that they share
# their dependencies' build).
cargo build -q -p hillside -p hillside-documents --bin hillside --bin hillside-ingest
if [ ! -x "$venv/bin/st" ]; then
  echo "installing schemathesis 4.32.5 into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q schemathesis==4.32.5
fi
python3 tests/python/api_conformance.py "$target/debug/hillside" "$venv/bin/st" "${1:-25}"
