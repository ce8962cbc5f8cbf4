// The C++ counterparts of the moe ops' values hooks (ops/moe/op.py values_align, values_batched),
// which the Python hooks state and raise on. A serving lane runs its counterpart after the
// contract's checks (the index tensors are then dense and of the declared shapes) and before
// anything is written: false refuses the call, and the Python path raises the hook's error. CUDA
// tensors are not read here, as the Python hooks read none: their kernels skip or clamp instead.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// moe_align_block_size: every id in [0, num_experts); expert_map's entries in [-1, num_experts).
inline bool align_values_ok(int32_t device_type, const TensorView& ids, int64_t num_experts,
                            const std::optional<TensorView>& expert_map) {
  if (device_type != kDLCPU) return true;
  const bool ids_ok = is_dtype(ids, kDLInt, 64) ? all_in<int64_t>(ids, 0, num_experts)
                                                : all_in<int32_t>(ids, 0, num_experts);
  return ids_ok && (!expert_map || all_in<int32_t>(*expert_map, -1, num_experts));
}

// batched_moe_align_block_size: every count in [0, max_tokens_per_batch].
inline bool counts_in_range(const TensorView& counts, int64_t m) { return all_in<int32_t>(counts, 0, m + 1); }

}  // namespace lane
}  // namespace opmux
