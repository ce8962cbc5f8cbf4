// The C++ counterparts of the KV cache ops' values hooks (ops/kvcache: reshape_and_cache's and
// concat_and_cache_mla's slots, copy_blocks' pairs, gather_cache's sequences), which the Python
// hooks state and raise on. A serving lane runs its counterpart after the contract's checks (the
// index tensors are then dense and in bounds) and before anything is written: false refuses the
// call, and the Python path raises the hook's error. CUDA tensors are not read here, as the
// Python hooks read none: their kernels skip bad indices instead.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// Every slot in [0, num_slots) or -1 (skip): slots a dense int64 [T].
inline bool slots_ok(int32_t device_type, const TensorView& slots, int64_t num_slots) {
  return all_in_on_cpu<int64_t>(device_type, slots, -1, num_slots);
}

// Both columns of a contiguous int64 [n, 2] block_mapping in [0, num_blocks).
inline bool pairs_ok(int32_t device_type, const TensorView& m, int64_t num_blocks) {
  return all_in_on_cpu<int64_t>(device_type, m, 0, num_blocks);
}

// gather_values: cu_seq_lens non-decreasing from 0 and within dst's rows, seq_starts (or none)
// >= 0, each sequence's block-table entries within the table and in [0, num_blocks).
inline bool gather_values_ok(int32_t device_type, const TensorView& src, const TensorView& dst,
                             const TensorView& table, const TensorView& cu_t, const TensorView* starts_t) {
  const int64_t batch = cu_t.size(0) - 1;
  if (device_type != kDLCPU || batch < 1) return true;
  const int64_t nb = src.size(0), bs = src.size(1), rows = dst.size(0), width = table.size(1);
  const int64_t row = table.size(0) > 1 ? table.stride(0) : 0;
  const int32_t* cu = data_ptr<const int32_t>(cu_t);
  const int32_t* starts = starts_t != nullptr ? data_ptr<const int32_t>(*starts_t) : nullptr;
  const int32_t* tab = data_ptr<const int32_t>(table);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lo = cu[b], hi = cu[b + 1], first = starts != nullptr ? starts[b] : 0;
    if (lo < 0 || hi < lo || hi > rows || first < 0) return false;
    const int64_t col0 = first / bs, need = col0 + (hi - lo + bs - 1) / bs;
    if (need > width) return false;
    for (int64_t c = col0; c < need; ++c) {
      const int32_t blk = tab[b * row + c];
      if (blk < 0 || blk >= nb) return false;
    }
  }
  return true;
}

}  // namespace lane
}  // namespace opmux
