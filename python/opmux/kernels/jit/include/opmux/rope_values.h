// The C++ counterpart of rope.rotary_embedding's values hook (ops/rope/op.py `values`: CPU
// positions in [0, max_position), which the Python hook states and raises on). A serving lane
// runs it after the contract's checks (positions are then a dense int64 [T]): false refuses the
// call, and the Python path raises the hook's error. CUDA positions are not read, as the Python
// hook reads none: the kernel clamps them and poisons the token instead.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

inline bool positions_ok(int32_t device_type, const TensorView& positions, int64_t max_pos) {
  if (device_type != kDLCPU) return true;
  const int64_t* p = data_ptr<const int64_t>(positions);
  for (int64_t t = 0; t < positions.size(0); ++t)
    if (p[t] < 0 || p[t] >= max_pos) return false;
  return true;
}

}  // namespace lane
}  // namespace opmux
