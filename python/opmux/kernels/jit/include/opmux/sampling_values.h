// The C++ counterpart of the sampling ops' values hooks (ops/sampling/op.py) for their serving
// lanes: a CPU row holding a NaN refuses the call, so the Python path raises the hook's error.
// CUDA tensors are not read (the Python hooks read none: a synchronisation).
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// No NaN in a [B, V] float32 / float16 / bfloat16 CPU tensor with a unit last stride.
inline bool rows_no_nan_on_cpu(int32_t device_type, const TensorView& x) {
  if (device_type != kDLCPU || x.ndim() != 2) return true;
  const int64_t b = x.size(0), v = x.size(1), s = b > 1 ? x.stride(0) : 0;
  const DLDataType d = x.dtype();
  for (int64_t r = 0; r < b; ++r) {
    if (d.bits == 32) {
      const uint32_t* p = data_ptr<const uint32_t>(x) + r * s;
      for (int64_t i = 0; i < v; ++i)
        if ((p[i] & 0x7FFFFFFFu) > 0x7F800000u) return false;
    } else {
      const uint16_t* p = data_ptr<const uint16_t>(x) + r * s;
      const uint16_t inf = d.code == kDLBfloat ? 0x7F80 : 0x7C00;
      for (int64_t i = 0; i < v; ++i)
        if ((p[i] & 0x7FFF) > inf) return false;
    }
  }
  return true;
}

}  // namespace lane
}  // namespace opmux
