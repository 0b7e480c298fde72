// See score_kernel.h. One pass per KV head: the query stays in registers (fully partitioned),
// keys stream from DDR one 512-bit word per cycle, each token's dot product is a fully unrolled
// multiply and adder tree, and every finished block of `block_tokens` entries is published by
// bumping `blocks_done`, so the host can read it while the next block is scored.

#include "score_kernel.h"

// The signed value of dimension d held in key byte b (INT8: the byte; INT4: two signed nibbles
// per byte, the even dimension low).
static inline int key_value(uint8_t b, uint32_t d, uint32_t bits) {
    if (bits == 8) return (int8_t)b;
    const int8_t nibble = (int8_t)((d % 2 == 0) ? (uint8_t)(b << 4) : (uint8_t)(b & 0xf0));
    return nibble >> 4;
}

extern "C" void hillside_score(const word512 *keys, const float *scales, const word512 *query, entry64 *blocks,
                               uint32_t *blocks_done, uint32_t n_heads, uint32_t n_tokens, uint32_t bits, uint32_t head_dim,
                               uint32_t block_tokens, uint32_t first_position) {
#pragma HLS INTERFACE m_axi port = keys bundle = gmem0 offset = slave max_read_burst_length = 64 num_read_outstanding = 16
#pragma HLS INTERFACE m_axi port = scales bundle = gmem1 offset = slave max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = query bundle = gmem1 offset = slave
#pragma HLS INTERFACE m_axi port = blocks bundle = gmem2 offset = slave max_write_burst_length = 64
#pragma HLS INTERFACE m_axi port = blocks_done bundle = gmem2 offset = slave
#pragma HLS INTERFACE s_axilite port = n_heads
#pragma HLS INTERFACE s_axilite port = n_tokens
#pragma HLS INTERFACE s_axilite port = bits
#pragma HLS INTERFACE s_axilite port = head_dim
#pragma HLS INTERFACE s_axilite port = block_tokens
#pragma HLS INTERFACE s_axilite port = first_position
#pragma HLS INTERFACE s_axilite port = return

    const uint32_t row_bytes = bits == 8 ? head_dim : head_dim / 2;
    const uint32_t words_per_row = (row_bytes + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;
    const uint32_t rows_per_word = row_bytes < HILLSIDE_WORD_BYTES ? HILLSIDE_WORD_BYTES / row_bytes : 1;
    const uint32_t region_words = (n_tokens * row_bytes + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;
    const uint32_t query_words = (head_dim + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;
    uint32_t published = 0;

heads:
    for (uint32_t h = 0; h < n_heads; h++) {
        int8_t q[HILLSIDE_MAX_HEAD_DIM];
#pragma HLS ARRAY_PARTITION variable = q complete
    load_query:
        for (uint32_t d = 0; d < HILLSIDE_MAX_HEAD_DIM; d++) {
#pragma HLS UNROLL
            q[d] = d < head_dim ? (int8_t)word_byte(query[h * query_words + d / HILLSIDE_WORD_BYTES], d % HILLSIDE_WORD_BYTES) : 0;
        }
        const word512 *region = keys + (uint64_t)h * region_words;
    tokens:
        for (uint32_t t = 0; t < n_tokens; t++) {
#pragma HLS PIPELINE II = 1
            // A row is a divisor or a multiple of a word: it sits in one word, or spans whole ones.
            const uint32_t first_word = words_per_row > 1 ? t * words_per_row : t / rows_per_word;
            const int offset = words_per_row > 1 ? 0 : (int)((t % rows_per_word) * row_bytes);
            // The row's words (INT8 rows of 128 dimensions span two; others sit in one).
            word512 row_words[HILLSIDE_MAX_HEAD_DIM / HILLSIDE_WORD_BYTES];
#pragma HLS ARRAY_PARTITION variable = row_words complete
        fetch:
            for (uint32_t i = 0; i < HILLSIDE_MAX_HEAD_DIM / HILLSIDE_WORD_BYTES; i++) {
#pragma HLS UNROLL
                row_words[i] = region[first_word + (i < words_per_row ? i : 0)];
            }
            int32_t products[HILLSIDE_MAX_HEAD_DIM];
#pragma HLS ARRAY_PARTITION variable = products complete
        multiply:
            for (uint32_t d = 0; d < HILLSIDE_MAX_HEAD_DIM; d++) {
#pragma HLS UNROLL
                // Dimensions past head_dim read byte 0 of the row and multiply a zero query.
                const uint32_t row_byte = d >= head_dim ? 0 : bits == 8 ? d : d / 2;
                const word512 &w = row_words[row_byte / HILLSIDE_WORD_BYTES];
                const uint8_t b = word_byte(w, offset + (int)(row_byte % HILLSIDE_WORD_BYTES));
                products[d] = d < head_dim ? key_value(b, d, bits) * q[d] : 0;
            }
            // Adder tree: log2(MAX_HEAD_DIM) levels of pairwise sums.
        reduce:
            for (uint32_t width = HILLSIDE_MAX_HEAD_DIM / 2; width > 0; width /= 2) {
#pragma HLS UNROLL
                for (uint32_t i = 0; i < width; i++) {
#pragma HLS UNROLL
                    products[i] += products[i + width];
                }
            }
            const float score = (float)products[0] * scales[h * n_tokens + t];
            blocks[(uint64_t)h * n_tokens + t] = make_entry(first_position + t, score);
            if ((t + 1) % block_tokens == 0 || t + 1 == n_tokens) {
                published++;
                *blocks_done = published;
            }
        }
    }
}
