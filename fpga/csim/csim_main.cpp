// C simulation of the scoring kernel against the Rust reference scorer's vectors
// (fpga/testdata/case-*.bin, written by tests/tests/fpga_vectors.rs). Every score block entry
// must match bit for bit, and `blocks_done` must count every block. Exit status 0 on success.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../kernel/score_kernel.h"

struct Reader {
    std::vector<uint8_t> bytes;
    size_t at = 0;
    uint32_t u32() {
        uint32_t v;
        std::memcpy(&v, take(4), 4);
        return v;
    }
    const uint8_t *take(size_t n) {
        if (at + n > bytes.size()) {
            std::fprintf(stderr, "vector file truncated\n");
            std::exit(2);
        }
        const uint8_t *p = bytes.data() + at;
        at += n;
        return p;
    }
};

static std::vector<word512> to_words(const uint8_t *bytes, size_t n) {
    std::vector<word512> words((n + 63) / 64);
    std::memset(words.data(), 0, words.size() * sizeof(word512));
    std::memcpy(words.data(), bytes, n);  // the host's byte order: little-endian lanes
    return words;
}

static bool run_case(const std::string &path) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    Reader r;
    for (int c; (c = std::fgetc(f)) != EOF;) r.bytes.push_back((uint8_t)c);
    std::fclose(f);
    if (std::memcmp(r.take(4), "HSKV", 4) != 0 || r.u32() != 1) {
        std::fprintf(stderr, "%s: not a version-1 vector file\n", path.c_str());
        std::exit(2);
    }
    const uint32_t bits = r.u32(), head_dim = r.u32(), n_heads = r.u32(), n_tokens = r.u32(), block_tokens = r.u32(),
                   first_position = r.u32();
    const uint32_t row_bytes = bits == 8 ? head_dim : head_dim / 2;
    const size_t region = (n_tokens * row_bytes + 63) / 64 * 64;
    std::vector<word512> keys = to_words(r.take(n_heads * region), n_heads * region);
    std::vector<float> scales(n_heads * n_tokens);
    std::memcpy(scales.data(), r.take(scales.size() * 4), scales.size() * 4);
    // The query, one word-padded row per head.
    const size_t query_row = (head_dim + 63) / 64 * 64;
    std::vector<uint8_t> query_bytes(n_heads * query_row, 0);
    const uint8_t *q = r.take(n_heads * head_dim);
    for (uint32_t h = 0; h < n_heads; h++) std::memcpy(&query_bytes[h * query_row], q + h * head_dim, head_dim);
    std::vector<word512> query = to_words(query_bytes.data(), query_bytes.size());
    const uint8_t *expected = r.take((size_t)n_heads * n_tokens * 8);

    std::vector<entry64> blocks(n_heads * n_tokens, 0);
    uint32_t blocks_done = 0;
    hillside_score(keys.data(), scales.data(), query.data(), blocks.data(), &blocks_done, n_heads, n_tokens, bits, head_dim,
                   block_tokens, first_position);

    size_t mismatches = 0;
    for (size_t i = 0; i < blocks.size(); i++) {
        uint64_t want;
        std::memcpy(&want, expected + i * 8, 8);
        if ((uint64_t)blocks[i] != want && mismatches++ < 5) {
            std::fprintf(stderr, "%s: entry %zu is %016llx, want %016llx\n", path.c_str(), i, (unsigned long long)(uint64_t)blocks[i],
                         (unsigned long long)want);
        }
    }
    const uint32_t want_blocks = n_heads * ((n_tokens + block_tokens - 1) / block_tokens);
    if (blocks_done != want_blocks) {
        std::fprintf(stderr, "%s: %u blocks published, want %u\n", path.c_str(), blocks_done, want_blocks);
        mismatches++;
    }
    std::printf("%s: INT%u, head_dim %u, %u heads, %u tokens, blocks of %u: %s\n", path.c_str(), bits, head_dim, n_heads, n_tokens,
                block_tokens, mismatches ? "MISMATCH" : "bit-exact");
    return mismatches == 0;
}

int main(int argc, char **argv) {
    const std::string dir = argc > 1 ? argv[1] : "testdata";
    int cases = 0, failed = 0;
    for (int i = 0;; i++) {
        const std::string path = dir + "/case-" + std::to_string(i) + ".bin";
        FILE *probe = std::fopen(path.c_str(), "rb");
        if (!probe) break;
        std::fclose(probe);
        cases++;
        failed += !run_case(path);
    }
    if (cases == 0) {
        std::fprintf(stderr, "no vectors in %s (cargo test -p hillside-tests --test fpga_vectors writes them)\n", dir.c_str());
        return 2;
    }
    std::printf("%d of %d cases bit-exact\n", cases - failed, cases);
    return failed ? 1 : 0;
}
