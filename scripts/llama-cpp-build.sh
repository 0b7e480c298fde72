#!/usr/bin/env bash
# Builds one llama.cpp tool once, from the llama-cpp-python 0.3.36 sdist on PyPI (the package
# registry is all this machine reaches), into ~/.cache/hillside/llama.cpp/<level>, and prints
# the binary's path. A native build's folder is named by the instruction sets -march=native
# turns on, so a cache that moves to another CPU builds afresh rather than running (or timing)
# code made for a different one.
#
#   scripts/llama-cpp-build.sh <native|avx2> <llama-bench|llama-server|llama-kernels|llama-logits>
#
#   native  GGML_NATIVE=ON: the CPU's best level;
#   avx2    GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF, so an AVX-512 machine can time the
#           AVX2-only path.
# Used by `bench-vs-llama.sh` (llama-bench), `kernels-vs-llama.sh` (llama-kernels: our harness
# in tools/bench/llama-kernels.c, linked against this build's ggml), by the model families'
# tests (llama-logits: tests/tools/llama-logits.c, linked against libllama: tokens, logits and
# greedy text of a GGUF) and by the remote-engine tests and `hillside bench docs --engine`
# (llama-server, an independent OpenAI-compatible engine).
set -euo pipefail

level=${1:?level: native or avx2}
target=${2:?target: llama-bench, llama-server, llama-kernels or llama-logits}
case "$level" in
  native) cmake_simd=(-DGGML_NATIVE=ON) ;;
  avx2) cmake_simd=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
  *) echo "level is native or avx2" >&2; exit 2 ;;
esac
case "$target" in
  llama-bench | llama-server | llama-kernels | llama-logits) ;;
  *) echo "target is llama-bench, llama-server, llama-kernels or llama-logits" >&2; exit 2 ;;
esac

cache=$HOME/.cache/hillside/llama.cpp
sdist_url=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
build=$cache/$level
if [ "$level" = native ]; then
  build=$cache/native-$(cc -march=native -dM -E - </dev/null | grep -o -E '__(AVX|SSE|FMA|F16C|BMI|AMX|GFNI|VAES|VPCLMULQDQ)[A-Z0-9_]*__' | sort -u | sha256sum | cut -c1-12)
fi
bin=$build/bin/$target
root=$(cd "$(dirname "$0")/.." && pwd)
case "$target" in
  llama-kernels) harness=$root/tools/bench/llama-kernels.c ;;
  llama-logits) harness=$root/tests/tools/llama-logits.c ;;
  *) harness= ;;
esac
# The harnesses are ours, so they are built again whenever they change.
[ -z "$harness" ] || [ ! "$harness" -nt "$bin" ] || rm -f "$bin"

if [ ! -x "$bin" ]; then
  command -v cmake >/dev/null || { echo "installing cmake ..." >&2; ${SUDO:-$( [ "$(id -u)" = 0 ] || echo sudo)} apt-get install -y cmake >&2; }
  mkdir -p "$cache"
  if [ ! -d "$cache/src" ]; then
    tarball=$cache/llama_cpp_python-0.3.36.tar.gz
    if [ ! -f "$tarball" ]; then
      curl -sSLf -o "$tarball.part" "$sdist_url"
      mv "$tarball.part" "$tarball"
    fi
    echo "$sdist_sha256  $tarball" | sha256sum -c --quiet - || { rm -f "$tarball"; echo "llama-cpp-python sdist: hash mismatch" >&2; exit 1; }
    rm -rf "$cache/src.part" && mkdir "$cache/src.part"
    tar xzf "$tarball" -C "$cache/src.part" --strip-components=3 llama_cpp_python-0.3.36/vendor/llama.cpp
    mv "$cache/src.part" "$cache/src"
  fi
  echo "building $target ($level) ..." >&2
  # One configuration serves every tool (the server's own web UI is prebuilt in the sdist).
  cmake -S "$cache/src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DGGML_OPENMP=ON "${cmake_simd[@]}" >&2
  if [ "$target" = llama-kernels ]; then
    cmake --build "$build" --target ggml -j "$(nproc)" >&2
    lib=$build/ggml/src
    mkdir -p "$(dirname "$bin")"
    cc -O2 -o "$bin" "$harness" -I "$cache/src/ggml/include" "$lib/libggml.a" "$lib/libggml-cpu.a" \
      "$lib/libggml-base.a" -fopenmp -lpthread -ldl -lm -lstdc++ >&2
  elif [ "$target" = llama-logits ]; then
    cmake --build "$build" --target llama -j "$(nproc)" >&2
    lib=$build/ggml/src
    mkdir -p "$(dirname "$bin")"
    cc -O2 -o "$bin" "$harness" -I "$cache/src/include" -I "$cache/src/ggml/include" "$build/src/libllama.a" \
      "$lib/libggml.a" "$lib/libggml-cpu.a" "$lib/libggml-base.a" -fopenmp -lpthread -ldl -lm -lstdc++ >&2
  else
    cmake --build "$build" --target "$target" -j "$(nproc)" >&2
  fi
fi
echo "$bin"
