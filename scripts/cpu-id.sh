# Sourced by the scripts that set Hillside beside llama.cpp: names the CPU they ran on and the
# SIMD level llama.cpp was built for, so that every table and JSON says both.
#   cpu      the model name
#   cpu_id   vendor, family, model and stepping
#   flags    the SIMD extensions the kernels choose between
#   llama_simd LEVEL   prints what llama.cpp's build at LEVEL (native or avx2) enables

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
