#!/usr/bin/env bash
# The official openai Python client (from PyPI, in a venv kept under ~/.cache) against
# `hillside serve`. Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
venv="${HILLSIDE_TEST_VENV:-$HOME/.cache/hillside-test-venv}"
# The program under test: HILLSIDE_BIN (`make test` passes the one its workspace build made), else
# built here.
bin="${HILLSIDE_BIN:-}"
if [ -z "$bin" ]; then
  cargo build -q -p hillside
  bin="$target/debug/hillside"
fi
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "installing the openai Python client into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "openai>=1.40,<3"
fi
"$venv/bin/python" tests/python/test_openai_client.py "$bin"
