// The few HLS types and helpers the kernel uses. Under Vitis HLS (__SYNTHESIS__, or
// HILLSIDE_VITIS for its C simulation) they come from ap_int.h; with a plain C++ compiler a
// minimal stand-in keeps the same kernel source compiling and running bit-exactly, and the
// HLS pragmas are ignored.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SYNTHESIS__) || defined(HILLSIDE_VITIS)
#include <ap_int.h>
#include <hls_stream.h>

typedef ap_uint<512> word512;
typedef ap_uint<64> entry64;

// Byte i (0 = least significant) of a 512-bit word.
static inline uint8_t word_byte(const word512 &w, int i) { return w.range(8 * i + 7, 8 * i).to_uint(); }

#else

// A 512-bit bus word: eight little-endian 64-bit lanes.
struct word512 {
    uint64_t lane[8];
};
typedef uint64_t entry64;

static inline uint8_t word_byte(const word512 &w, int i) { return (uint8_t)(w.lane[i / 8] >> (8 * (i % 8))); }

#include <deque>

namespace hls {
// A FIFO between dataflow stages. Without HLS the stages run one after another, so it is
// unbounded here; on the FPGA they run concurrently through a FIFO of the declared depth.
template <typename T> class stream {
   public:
    explicit stream(const char * = nullptr) {}
    void write(const T &v) { items_.push_back(v); }
    T read() {
        T v = items_.front();
        items_.pop_front();
        return v;
    }

   private:
    std::deque<T> items_;
};
}  // namespace hls

#endif

// A score-block entry: the token's position in the low 32 bits, the score's IEEE bits above.
static inline entry64 make_entry(uint32_t position, float score) {
    uint32_t bits;
    std::memcpy(&bits, &score, sizeof bits);
    return ((entry64)bits << 32) | (entry64)position;
}
