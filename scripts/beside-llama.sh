# Sourced by the scripts that set Hillside beside llama.cpp (bench-vs-llama.sh,
# kernels-vs-llama.sh), after they read their flags.
#
#   beside_llama LEVEL TOOL   checks LEVEL (native or avx2) and sets:
#     hillside_simd  the HILLSIDE_SIMD that level means ("" for native)
#     root           the checkout
#     llama_tool     llama.cpp's TOOL built at LEVEL by llama-cpp-build.sh
#     hillside       a release build of this checkout's hillside
#     work           a scratch folder, removed on exit
#     commit         the checkout's commit (with -dirty when it has changes)
#   cpu, cpu_id, flags   the CPU's model name; vendor, family, model and stepping; the SIMD
#                        extensions the kernels choose between
#   llama_simd LEVEL     prints what llama.cpp's build at LEVEL enables

beside_llama() {
  case "$1" in
    native) hillside_simd="" ;;
    avx2) hillside_simd=avx2 ;;
    *) echo "--level is native or avx2" >&2; exit 2 ;;
  esac
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  export PATH="$HOME/.cargo/bin:$PATH"
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/hillside-target}
  llama_tool=$("$root/scripts/llama-cpp-build.sh" "$1" "$2")
  # `hillside bench` hands over to the lab, `hillside-bench`, built beside it.
  cargo build --release -q -p hillside -p hillside-bench --manifest-path "$root/Cargo.toml"
  hillside=$CARGO_TARGET_DIR/release/hillside
  commit=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}

cpuinfo() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
cpu=$(cpuinfo 'model name')
cpu_id="$(cpuinfo vendor_id) family $(cpuinfo 'cpu family') model $(cpuinfo model) stepping $(cpuinfo stepping)"
flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_vnni|avx_vnni' | sort -u | tr '\n' ' ')

# For native, what the compiler's -march=native turns on here.
llama_simd() {
  case "$1" in
    native) cc -march=native -dM -E - </dev/null | grep -o -E '__(AVX2|AVX512F|AVX512VNNI|AVXVNNI)__' | tr -d _ | sort -u | tr '\n' ' ' ;;
    avx2) echo "AVX2 FMA F16C (GGML_AVX512=OFF)" ;;
  esac
}
