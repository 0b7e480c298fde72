// llama.cpp's product kernels timed as `hillside bench kernels` times Hillside's: one token's
// activations, quantized beforehand to the kernel's activation type, against a matrix of
// random weights, a row at a time through ggml's CPU `vec_dot` (what ggml's mul_mat calls for a
// weight type without a repacked layout), on one thread, keeping the mean of the fastest fifth.
// Built against the static ggml of `scripts/llama-cpp-build.sh` by `scripts/kernels-vs-llama.sh`.
//
//   llama-kernels TYPE VALUES COLS MS   ->   TYPE VALUES ROWS COLS WEIGHT_BYTES NS_PER_32_VALUES

#include "ggml-cpu.h"
#include "ggml.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_time(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE VALUES COLS MS\n", argv[0]);
        return 2;
    }
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *name = ggml_type_name((enum ggml_type)t);
        if (name && strcmp(name, argv[1]) == 0) {
            type = (enum ggml_type)t;
        }
    }
    const int64_t values = atoll(argv[2]), cols = atoll(argv[3]);
    const double budget_s = atof(argv[4]) / 1e3;
    if (type == GGML_TYPE_COUNT || cols <= 0 || cols % ggml_blck_size(type) != 0) {
        fprintf(stderr, "%s: unknown type, or rows of %s values are not whole blocks of it\n", argv[0], argv[3]);
        return 2;
    }
    ggml_cpu_init();
    const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu(type);
    const struct ggml_type_traits_cpu *activation = ggml_get_type_traits_cpu(traits->vec_dot_type);
    const int64_t rows = values / cols > 0 ? values / cols : 1;
    const size_t row_bytes = ggml_row_size(type, cols);

    float *source = malloc(sizeof(float) * rows * cols);
    uint64_t state = 0x5eed ^ (uint64_t)values;
    for (int64_t i = 0; i < rows * cols; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        source[i] = (float)((state >> 33) % 2000) / 1000.0f - 1.0f;
    }
    char *weights = malloc(row_bytes * rows);
    ggml_quantize_chunk(type, source, weights, 0, rows, cols, NULL);
    for (int64_t c = 0; c < cols; c++) {
        source[c] = (float)((c * 7919) % 2000) / 1000.0f - 1.0f;
    }
    char *x = malloc(ggml_row_size(traits->vec_dot_type, cols));
    activation->from_float(source, x, cols);
    float *out = malloc(sizeof(float) * rows);

    size_t kept_max = 1 << 20, n = 0;
    double *times = malloc(sizeof(double) * kept_max);
    const double started = now_s();
    for (int call = -1; n < kept_max && (n < 5 || now_s() - started < budget_s); call++) {
        const double t0 = now_s();
        for (int64_t r = 0; r < rows; r++) {
            traits->vec_dot((int)cols, &out[r], 0, weights + r * row_bytes, 0, x, 0, 1);
        }
        const double elapsed = now_s() - t0;
        if (call >= 0) {  // the first call warms up
            times[n++] = elapsed;
        }
    }
    qsort(times, n, sizeof(double), by_time);
    size_t fifth = (n + 4) / 5;
    double sum = 0;
    for (size_t i = 0; i < fifth; i++) {
        sum += times[i];
    }
    volatile float sink = out[rows - 1];
    (void)sink;
    printf("%s %lld %lld %lld %zu %.6f\n", argv[1], (long long)(rows * cols), (long long)rows, (long long)cols,
           row_bytes * rows, sum / fifth * 1e9 * 32 / (double)(rows * cols));
    return 0;
}
