// Hillside's storage-side scoring kernel: raw q·k of quantized keys against each KV head's
// quantized query, streamed out in score blocks. The contract (layouts, exact scores) is
// engine/src/score/contract.rs; fpga/README.md has the build.
#pragma once

#include "hls_compat.h"

#define HILLSIDE_WORD_BYTES 64
#define HILLSIDE_MAX_HEAD_DIM 128

extern "C" void hillside_score(const word512 *keys,    // [head] regions of n_tokens packed rows, word-padded
                               const float *scales,    // [head][token]
                               const word512 *query,   // [head] INT8 rows, word-padded
                               entry64 *blocks,        // [head][token] (position, score) entries
                               uint32_t *blocks_done,  // blocks written so far, updated after each
                               uint32_t n_heads, uint32_t n_tokens, uint32_t bits, uint32_t head_dim,
                               uint32_t block_tokens, uint32_t first_position);
