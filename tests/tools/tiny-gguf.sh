#!/usr/bin/env bash
# Writes a small random-weight GGUF of one model family (tiny_gguf.py beside this script), with
# the `gguf` package from PyPI installed into the tests' venv under ~/.cache the first time.
#
#   tests/tools/tiny-gguf.sh FAMILY OUT.gguf --vocab-from REAL.gguf
set -euo pipefail
venv="${HILLSIDE_TEST_VENV:-$HOME/.cache/hillside-test-venv}"
if ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  # Tests run side by side and may all find the venv missing on a fresh machine: one installs it
  # while the others wait on the lock, then find it there.
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    echo "installing the gguf Python package into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q "gguf==0.19.0" >&2
  fi
  exec 9>&-
fi
exec "$venv/bin/python" "$(dirname "$0")/tiny_gguf.py" "$@"
