// See score_kernel.h. A DATAFLOW pipeline of four stages joined by FIFOs, all running at once on
// the FPGA: key words stream in from DDR (each read once, in long bursts), scales alongside;
// the scorer keeps each head's query in registers (fully partitioned) and turns one key row a
// cycle into a score with a fully unrolled multiply and adder tree; the writer puts entries out
// and bumps `blocks_done` after each block of `block_tokens`, so the host can read a block while
// the next is scored.

#include "score_kernel.h"

// The signed value of dimension d held in key byte b (INT8: the byte; INT4: two signed nibbles
// per byte, the even dimension low).
static inline int key_value(uint8_t b, uint32_t d, uint32_t bits) {
    if (bits == 8) return (int8_t)b;
    const int8_t nibble = (int8_t)((d % 2 == 0) ? (uint8_t)(b << 4) : (uint8_t)(b & 0xf0));
    return nibble >> 4;
}

static inline uint32_t row_bytes_of(uint32_t bits, uint32_t head_dim) { return bits == 8 ? head_dim : head_dim / 2; }

// Words in one head's key region: rows tile words exactly (a row is a divisor or a multiple of a
// word), so a region is whole words with no padding between rows.
static inline uint32_t region_words_of(uint32_t n_tokens, uint32_t bits, uint32_t head_dim) {
    return (n_tokens * row_bytes_of(bits, head_dim) + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;
}

static void read_keys(const word512 *keys, hls::stream<word512> &words, uint32_t n_heads, uint32_t n_tokens, uint32_t bits,
                      uint32_t head_dim) {
    const uint32_t n_words = n_heads * region_words_of(n_tokens, bits, head_dim);
read:
    for (uint32_t i = 0; i < n_words; i++) {
#pragma HLS PIPELINE II = 1
        words.write(keys[i]);
    }
}

static void read_scales(const float *scales, hls::stream<float> &out, uint32_t n_heads, uint32_t n_tokens) {
read:
    for (uint32_t i = 0; i < n_heads * n_tokens; i++) {
#pragma HLS PIPELINE II = 1
        out.write(scales[i]);
    }
}

static void score_rows(hls::stream<word512> &words, hls::stream<float> &scales, const word512 *query, hls::stream<entry64> &entries,
                       uint32_t n_heads, uint32_t n_tokens, uint32_t bits, uint32_t head_dim, uint32_t first_position) {
    const uint32_t row_bytes = row_bytes_of(bits, head_dim);
    const uint32_t words_per_row = (row_bytes + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;
    const uint32_t rows_per_word = row_bytes < HILLSIDE_WORD_BYTES ? HILLSIDE_WORD_BYTES / row_bytes : 1;
    const uint32_t query_words = (head_dim + HILLSIDE_WORD_BYTES - 1) / HILLSIDE_WORD_BYTES;

heads:
    for (uint32_t h = 0; h < n_heads; h++) {
        int8_t q[HILLSIDE_MAX_HEAD_DIM];
#pragma HLS ARRAY_PARTITION variable = q complete
    load_query:
        for (uint32_t d = 0; d < HILLSIDE_MAX_HEAD_DIM; d++) {
#pragma HLS UNROLL
            q[d] = d < head_dim ? (int8_t)word_byte(query[h * query_words + d / HILLSIDE_WORD_BYTES], d % HILLSIDE_WORD_BYTES) : 0;
        }
        // The row's words: a new word every `rows_per_word` tokens for short rows (INT4 and
        // INT8 rows of 64 dimensions share words), `words_per_row` words a token for long ones.
        word512 row_words[HILLSIDE_MAX_HEAD_DIM / HILLSIDE_WORD_BYTES];
#pragma HLS ARRAY_PARTITION variable = row_words complete
    tokens:
        for (uint32_t t = 0; t < n_tokens; t++) {
#pragma HLS PIPELINE II = 1
            int offset = 0;
            if (words_per_row > 1) {
            fetch:
                for (uint32_t i = 0; i < HILLSIDE_MAX_HEAD_DIM / HILLSIDE_WORD_BYTES; i++) {
#pragma HLS UNROLL
                    if (i < words_per_row) row_words[i] = words.read();
                }
            } else {
                if (t % rows_per_word == 0) row_words[0] = words.read();
                offset = (int)((t % rows_per_word) * row_bytes);
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
            entries.write(make_entry(first_position + t, (float)products[0] * scales.read()));
        }
    }
}

static void write_blocks(hls::stream<entry64> &entries, entry64 *blocks, uint32_t *blocks_done, uint32_t n_heads, uint32_t n_tokens,
                         uint32_t block_tokens) {
    uint32_t published = 0;
heads:
    for (uint32_t h = 0; h < n_heads; h++) {
    tokens:
        for (uint32_t t = 0; t < n_tokens; t++) {
#pragma HLS PIPELINE II = 1
            blocks[(uint64_t)h * n_tokens + t] = entries.read();
            if ((t + 1) % block_tokens == 0 || t + 1 == n_tokens) {
                published++;
                *blocks_done = published;
            }
        }
    }
}

extern "C" void hillside_score(const word512 *keys, const float *scales, const word512 *query, entry64 *blocks,
                               uint32_t *blocks_done, uint32_t n_heads, uint32_t n_tokens, uint32_t bits, uint32_t head_dim,
                               uint32_t block_tokens, uint32_t first_position) {
#pragma HLS INTERFACE m_axi port = keys bundle = gmem0 offset = slave max_read_burst_length = 64 num_read_outstanding = 16
#pragma HLS INTERFACE m_axi port = scales bundle = gmem1 offset = slave max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = query bundle = gmem3 offset = slave
#pragma HLS INTERFACE m_axi port = blocks bundle = gmem2 offset = slave max_write_burst_length = 64
#pragma HLS INTERFACE m_axi port = blocks_done bundle = gmem2 offset = slave
#pragma HLS INTERFACE s_axilite port = n_heads
#pragma HLS INTERFACE s_axilite port = n_tokens
#pragma HLS INTERFACE s_axilite port = bits
#pragma HLS INTERFACE s_axilite port = head_dim
#pragma HLS INTERFACE s_axilite port = block_tokens
#pragma HLS INTERFACE s_axilite port = first_position
#pragma HLS INTERFACE s_axilite port = return
#pragma HLS DATAFLOW

    hls::stream<word512> words("words");
    hls::stream<float> key_scales("key_scales");
    hls::stream<entry64> entries("entries");
#pragma HLS STREAM variable = words depth = 64
#pragma HLS STREAM variable = key_scales depth = 64
#pragma HLS STREAM variable = entries depth = 64

    read_keys(keys, words, n_heads, n_tokens, bits, head_dim);
    read_scales(scales, key_scales, n_heads, n_tokens);
    score_rows(words, key_scales, query, entries, n_heads, n_tokens, bits, head_dim, first_position);
    write_blocks(entries, blocks, blocks_done, n_heads, n_tokens, block_tokens);
}
