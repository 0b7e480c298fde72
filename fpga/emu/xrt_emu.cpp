// An XRT emulator: the subset of XRT's C API (xrt_device.h, xrt_kernel.h, xrt_bo.h, 2.13) that
// Hillside's XrtEvaluator loads with dlopen, running the scoring kernel's own source natively,
// so the host → FFI → kernel path is tested without a card. Built as libxrt_coreutil.so.
//
// What it emulates, and how:
// - Devices: `HILLSIDE_XRT_EMU_DEVICES` cards (default 1); opening a higher index fails with
//   ENODEV and a null handle, as XRT does.
// - xclbins: a file starting with XRT's "xclbin2\0" magic whose text names its kernels on a
//   `kernels:` line. Its UUID is a hash of the file. A `fail-after-runs: N` line makes every run
//   after the N-th end in ERT_CMD_STATE_ERROR (the tests' way to break the card mid-decode).
// - Buffers: page-aligned host memory. A P2P buffer is mappable like on a SmartSSD, so the host's
//   O_DIRECT pread into the mapping is what moves cold-pool blocks "peer to peer".
// - Runs: xrtRunStart scores on a thread of its own and xrtRunWait joins it, so the host sees
//   the same asynchrony a card gives.
// Errors follow XRT's C API: a null handle or a negative errno, and errno set.

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../kernel/score_kernel.h"

namespace {

enum ert_cmd_state { ERT_CMD_STATE_COMPLETED = 4, ERT_CMD_STATE_ERROR = 5, ERT_CMD_STATE_NEW = 1, ERT_CMD_STATE_RUNNING = 3 };

constexpr uint64_t P2P_FLAG = 1u << 30;
constexpr int N_BUFFER_ARGS = 5;  // keys, scales, query, blocks, blocks_done
constexpr int N_ARGS = 11;        // then n_heads, n_tokens, bits, head_dim, block_tokens, first_position
constexpr size_t PAGE = 4096;

struct Device {
    unsigned index;
    std::string xclbin;        // the loaded file's contents
    unsigned char uuid[16] = {};
    bool loaded = false;
    long fail_after_runs = -1;  // from the xclbin; -1: never
    long runs = 0;
    std::mutex lock;
};

struct Buffer {
    Device *device;
    void *data;
    size_t size;
    bool p2p;
};

struct Kernel {
    Device *device;
    std::string name;
};

struct Run {
    Kernel *kernel;
    Buffer *buffers[N_BUFFER_ARGS] = {};
    uint32_t scalars[N_ARGS - N_BUFFER_ARGS] = {};
    std::thread worker;
    std::atomic<int> state{ERT_CMD_STATE_NEW};
};

int fail(int err) {
    errno = err;
    return -err;
}

template <typename T> T *fail_null(int err) {
    errno = err;
    return nullptr;
}

unsigned device_count() {
    const char *env = std::getenv("HILLSIDE_XRT_EMU_DEVICES");
    return env ? (unsigned)std::strtoul(env, nullptr, 10) : 1;
}

// FNV-1a over the file, spread over 16 bytes: a stable stand-in for the xclbin's UUID.
void hash_uuid(const std::string &bytes, unsigned char out[16]) {
    uint64_t a = 1469598103934665603ull, b = 1099511628211ull;
    for (unsigned char c : bytes) {
        a = (a ^ c) * 1099511628211ull;
        b = (b + c) * 6364136223846793005ull + 1;
    }
    std::memcpy(out, &a, 8);
    std::memcpy(out + 8, &b, 8);
}

// The value after `key` on a line of the xclbin's text, or "".
std::string xclbin_field(const std::string &xclbin, const std::string &key) {
    std::istringstream lines(xclbin.substr(8));
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind(key, 0) == 0) return line.substr(key.size());
    }
    return "";
}

// "hillside_score" or XRT's "kernel:{cu}" form.
std::string kernel_base_name(const char *name) {
    std::string s(name);
    return s.substr(0, s.find(':'));
}

bool run_kernel(Run &run) {
    Buffer **b = run.buffers;
    for (int i = 0; i < N_BUFFER_ARGS; i++)
        if (!b[i]) return false;
    const uint32_t n_heads = run.scalars[0], n_tokens = run.scalars[1], bits = run.scalars[2], head_dim = run.scalars[3];
    const uint32_t row_bytes = bits == 8 ? head_dim : head_dim / 2;
    const size_t region = ((size_t)n_tokens * row_bytes + 63) / 64 * 64;
    // The card would fault on an out-of-range AXI read; the emulator refuses the run instead.
    if ((bits != 4 && bits != 8) || head_dim == 0 || head_dim > HILLSIDE_MAX_HEAD_DIM || run.scalars[4] == 0 ||
        b[0]->size < n_heads * region || b[1]->size < (size_t)n_heads * n_tokens * 4 ||
        b[2]->size < n_heads * ((head_dim + 63) / 64 * 64) || b[3]->size < (size_t)n_heads * n_tokens * 8 || b[4]->size < 4)
        return false;
    hillside_score((const word512 *)b[0]->data, (const float *)b[1]->data, (const word512 *)b[2]->data, (entry64 *)b[3]->data,
                   (uint32_t *)b[4]->data, n_heads, n_tokens, bits, head_dim, run.scalars[4], run.scalars[5]);
    return true;
}

// Buffers travel as handles; scalars as unsigned int (C's promotion of uint32_t).
int set_arg(Run *run, int index, va_list *args) {
    if (!run || index < 0 || index >= N_ARGS) return fail(EINVAL);
    if (index < N_BUFFER_ARGS)
        run->buffers[index] = static_cast<Buffer *>(va_arg(*args, void *));
    else
        run->scalars[index - N_BUFFER_ARGS] = va_arg(*args, unsigned int);
    return 0;
}

}  // namespace

extern "C" {

// Tells Hillside it is talking to this emulator, not to XRT.
const char *hillsideXrtEmulator() { return "hillside XRT emulator 1 (XRT 2.13 C API subset)"; }

void *xrtDeviceOpen(unsigned int index) {
    if (index >= device_count()) {
        std::fprintf(stderr, "[XRT emulator] ERROR: Could not open device with index '%u'\n", index);
        return fail_null<void>(ENODEV);
    }
    auto *d = new Device();
    d->index = index;
    return d;
}

int xrtDeviceClose(void *dhdl) {
    if (!dhdl) return fail(EINVAL);
    delete static_cast<Device *>(dhdl);
    return 0;
}

int xrtDeviceLoadXclbinFile(void *dhdl, const char *path) {
    auto *d = static_cast<Device *>(dhdl);
    if (!d || !path) return fail(EINVAL);
    std::ifstream file(path, std::ios::binary);
    if (!file) return fail(ENOENT);
    std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (bytes.size() < 8 || std::memcmp(bytes.data(), "xclbin2\0", 8) != 0) return fail(EINVAL);
    std::lock_guard<std::mutex> guard(d->lock);
    d->xclbin = bytes;
    hash_uuid(bytes, d->uuid);
    const std::string fail_after = xclbin_field(bytes, "fail-after-runs:");
    d->fail_after_runs = fail_after.empty() ? -1 : std::strtol(fail_after.c_str(), nullptr, 10);
    d->runs = 0;
    d->loaded = true;
    return 0;
}

int xrtDeviceGetXclbinUUID(void *dhdl, unsigned char out[16]) {
    auto *d = static_cast<Device *>(dhdl);
    if (!d || !d->loaded) return fail(EINVAL);
    std::memcpy(out, d->uuid, 16);
    return 0;
}

void *xrtPLKernelOpen(void *dhdl, const unsigned char uuid[16], const char *name) {
    auto *d = static_cast<Device *>(dhdl);
    if (!d || !name || !d->loaded || std::memcmp(uuid, d->uuid, 16) != 0) return fail_null<void>(EINVAL);
    const std::string base = kernel_base_name(name);
    std::istringstream kernels(xclbin_field(d->xclbin, "kernels:"));
    bool listed = false;
    for (std::string k; kernels >> k;) listed |= k == base;
    if (!listed || base != "hillside_score") {
        std::fprintf(stderr, "[XRT emulator] ERROR: No such kernel '%s'\n", name);
        return fail_null<void>(ENOENT);
    }
    return new Kernel{d, base};
}

int xrtKernelClose(void *khdl) {
    if (!khdl) return fail(EINVAL);
    delete static_cast<Kernel *>(khdl);
    return 0;
}

// Every buffer argument of the kernel sits in DDR bank 0 (kernel/link.cfg does the same).
int xrtKernelArgGroupId(void *khdl, int argno) {
    if (!khdl || argno < 0 || argno >= N_BUFFER_ARGS) return fail(EINVAL);
    return 0;
}

void *xrtBOAlloc(void *dhdl, size_t size, uint64_t flags, uint32_t group) {
    auto *d = static_cast<Device *>(dhdl);
    if (!d || size == 0 || group != 0) return fail_null<void>(EINVAL);
    const bool p2p = (flags & P2P_FLAG) != 0;
    if (p2p && std::getenv("HILLSIDE_XRT_EMU_NO_P2P")) return fail_null<void>(EOPNOTSUPP);
    void *data = std::aligned_alloc(PAGE, (size + PAGE - 1) / PAGE * PAGE);
    if (!data) return fail_null<void>(ENOMEM);
    std::memset(data, 0, size);
    return new Buffer{d, data, size, p2p};
}

int xrtBOFree(void *bhdl) {
    auto *b = static_cast<Buffer *>(bhdl);
    if (!b) return fail(EINVAL);
    std::free(b->data);
    delete b;
    return 0;
}

size_t xrtBOSize(void *bhdl) { return bhdl ? static_cast<Buffer *>(bhdl)->size : 0; }

void *xrtBOMap(void *bhdl) {
    auto *b = static_cast<Buffer *>(bhdl);
    return b ? b->data : fail_null<void>(EINVAL);
}

// Host memory is device memory here, so a sync only checks its range.
int xrtBOSync(void *bhdl, int direction, size_t size, size_t offset) {
    auto *b = static_cast<Buffer *>(bhdl);
    if (!b || (direction != 0 && direction != 1) || offset > b->size || size > b->size - offset) return fail(EINVAL);
    return 0;
}

int xrtBOWrite(void *bhdl, const void *src, size_t size, size_t seek) {
    auto *b = static_cast<Buffer *>(bhdl);
    if (!b || seek > b->size || size > b->size - seek) return fail(EINVAL);
    std::memcpy((char *)b->data + seek, src, size);
    return 0;
}

int xrtBORead(void *bhdl, void *dst, size_t size, size_t skip) {
    auto *b = static_cast<Buffer *>(bhdl);
    if (!b || skip > b->size || size > b->size - skip) return fail(EINVAL);
    std::memcpy(dst, (const char *)b->data + skip, size);
    return 0;
}

void *xrtRunOpen(void *khdl) {
    if (!khdl) return fail_null<void>(EINVAL);
    auto *r = new Run();
    r->kernel = static_cast<Kernel *>(khdl);
    return r;
}

int xrtRunSetArg(void *rhdl, int index, ...) {
    va_list args;
    va_start(args, index);
    const int rc = set_arg(static_cast<Run *>(rhdl), index, &args);
    va_end(args);
    return rc;
}

int xrtRunStart(void *rhdl) {
    auto *r = static_cast<Run *>(rhdl);
    if (!r || r->worker.joinable()) return fail(EINVAL);
    Device *d = r->kernel->device;
    bool broken;
    {
        std::lock_guard<std::mutex> guard(d->lock);
        broken = d->fail_after_runs >= 0 && d->runs >= d->fail_after_runs;
        d->runs++;
    }
    r->state = ERT_CMD_STATE_RUNNING;
    r->worker = std::thread([r, broken] { r->state = !broken && run_kernel(*r) ? ERT_CMD_STATE_COMPLETED : ERT_CMD_STATE_ERROR; });
    return 0;
}

#ifndef HILLSIDE_EMU_OMIT_RUN_WAIT  // a build without it tests a library missing a symbol
int xrtRunWait(void *rhdl) {
    auto *r = static_cast<Run *>(rhdl);
    if (!r) return fail(EINVAL);
    if (r->worker.joinable()) r->worker.join();
    return r->state.load();
}
#endif

int xrtRunState(void *rhdl) { return rhdl ? static_cast<Run *>(rhdl)->state.load() : fail(EINVAL); }

int xrtRunClose(void *rhdl) {
    auto *r = static_cast<Run *>(rhdl);
    if (!r) return fail(EINVAL);
    if (r->worker.joinable()) r->worker.join();
    delete r;
    return 0;
}

void *xrtKernelRun(void *khdl, ...) {
    auto *r = static_cast<Run *>(xrtRunOpen(khdl));
    if (!r) return nullptr;
    va_list args;
    va_start(args, khdl);
    for (int i = 0; i < N_ARGS; i++) set_arg(r, i, &args);
    va_end(args);
    if (xrtRunStart(r) != 0) {
        xrtRunClose(r);
        return nullptr;
    }
    return r;
}

}  // extern "C"
