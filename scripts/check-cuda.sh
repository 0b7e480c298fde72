#!/usr/bin/env bash
# Checks that the `cuda` build compiles, on a machine without a CUDA toolkit: NVIDIA's nvcc,
# runtime headers and libNVVM from PyPI (CUDA 13.0) in a venv under ~/.cache, then
# `cargo check --features cuda` for the engine and the CLI (candle's CUDA kernels are compiled
# with that nvcc). Linking a runnable binary needs the CUDA libraries of a real install.
# About 15 minutes on 2 cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$HOME/.cache/hillside-cuda-venv"
if [ ! -x "$venv/bin/pip" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-runtime==13.0.*" \
  "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*"
cuda="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
export PATH="$cuda/bin:$PATH" CUDA_ROOT="$cuda" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hillside-cuda-target}"
nvcc --version | tail -1
cargo check -p hillside-engine -p hillside --features hillside/cuda
