// The comm op group's shared memory layout (issue #31): the peer-accessible buffer every rank
// registers, and the rank-local `counters` tensor, as csrc/comm_cuda.cu uses them.
//
// The Python side (which allocates the buffer with torch symmetric memory and the counters with
// torch.zeros) MIRRORS THESE NUMBERS: change one, change both (a test should read them from this
// file). Every line `constexpr <type> kName = <integer>;` below is such a number. Plain C++17, no
// CUDA headers.
//
// Buffer (bytes; identical size and layout on every rank, zeroed at registration):
//   [0, kFlagsBytes)                    flags: uint32 flags[kMaxBlocks][kMaxWorld]; flags[b][src]
//                                       is written by rank src's block b into the DESTINATION
//                                       rank's buffer (the barrier's arrival epoch, see below)
//   kFlagsBytes + h * 2 * cap           half h (h = 0, 1): in[cap bytes]     (each rank's input)
//   kFlagsBytes + h * 2 * cap + cap                         result[cap bytes] (two-shot: the
//                                                            rank's reduced share)
//   total kFlagsBytes + 4 * cap; cap (bytes of one data region, the largest message) is a
//   positive multiple of kCapAlign.
// Calls alternate halves: call n (counted per buffer, by the counters below) uses h = n & 1.
//
// Counters (int32 [kCounters], on the rank's own device, zeroed at registration, only its own
// kernels touch them; int32 storage, uint32 arithmetic that wraps):
//   [kCounterEpoch + b], b < kMaxBlocks  the barriers block b has completed (equal on every rank,
//                                        since every rank runs the same calls with the same
//                                        grids); block b's k-th barrier writes and waits for
//                                        epoch k
//   [kCounterCall]                       calls completed with this buffer (the half of the next)
//   [kCounterDone]                       blocks of the running call that finished (0 between
//                                        calls: the last block resets it and bumps kCounterCall)
//   the rest                             reserved (zero)
#pragma once

#include <cstdint>

namespace opmux {
namespace comm {

constexpr int kMaxBlocks = 64;       // blocks of one call (grid size limit)
constexpr int kMaxWorld = 8;         // ranks of one group
constexpr int64_t kFlagsBytes = 4096;  // the flags region, before the two halves
constexpr int64_t kCapAlign = 4096;  // cap is a multiple of this
constexpr int kCounters = 256;       // int32 elements of `counters` (at least)
constexpr int kCounterEpoch = 0;     // [kCounterEpoch, kCounterEpoch + kMaxBlocks): per-block epochs
constexpr int kCounterCall = 64;     // calls completed
constexpr int kCounterDone = 65;     // blocks of the running call that finished
constexpr int kAlgoOneShot = 1;
constexpr int kAlgoTwoShot = 2;

static_assert(kMaxBlocks * kMaxWorld * 4 <= kFlagsBytes, "flags fit their region");
static_assert(kCounterEpoch + kMaxBlocks <= kCounterCall && kCounterDone < kCounters, "counters");

#if defined(__CUDACC__)
#define OPMUX_COMM_HD __host__ __device__
#else
#define OPMUX_COMM_HD
#endif

// Byte offsets in a buffer whose data regions hold `cap` bytes.
OPMUX_COMM_HD constexpr int64_t in_offset(int half, int64_t cap) { return kFlagsBytes + half * 2 * cap; }
OPMUX_COMM_HD constexpr int64_t result_offset(int half, int64_t cap) { return in_offset(half, cap) + cap; }
OPMUX_COMM_HD constexpr int64_t buffer_bytes(int64_t cap) { return kFlagsBytes + 4 * cap; }

}  // namespace comm
}  // namespace opmux
