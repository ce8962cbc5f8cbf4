// The serving lane's checks of kvcache.reshape_and_cache (lane.h), mirroring kvcache/op.py's
// serving fast path: k_scale and v_scale None (a cache of key's dtype; fp8 caches and their
// scales are the contract's); key / value [T, H, D] (H, D >= 1) of one float dtype with a unit
// last stride (D > 1); key_cache / value_cache [num_blocks, block_size, H, D] of key's dtype
// (NHD, or HND as its permuted view) with a unit head_dim stride (D > 1) and no negative
// stride; slot_mapping int64 [T], dense when T > 1; all on key's device. The caches (written)
// each hold their elements apart and overlap nothing as the generic guard has it
// (lane::may_share). The values hook (CPU slots in [-1, num_blocks * block_size)) is the CPU
// lane's; CUDA slots are not read (nor by the contract). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

inline bool cache_args(int32_t device_type, const TensorView& key, const TensorView& value,
                       const TensorView& kc, const TensorView& vc, const TensorView& slots,
                       const AnyView& k_scale, const AnyView& v_scale) {
  if (k_scale.type_index() != TypeIndex::kTVMFFINone || v_scale.type_index() != TypeIndex::kTVMFFINone)
    return false;
  if (key.device().device_type != device_type || !is_float(key.dtype()) || key.ndim() != 3 ||
      value.ndim() != 3 || kc.ndim() != 4 || vc.ndim() != 4 || slots.ndim() != 1)
    return false;
  const int64_t t = key.size(0), h = key.size(1), d = key.size(2);
  if (h < 1 || d < 1 || kc.size(2) != h || kc.size(3) != d || slots.size(0) != t) return false;
  for (int i = 0; i < 3; ++i)
    if (value.size(i) != key.size(i)) return false;
  for (int i = 0; i < 4; ++i)
    if (vc.size(i) != kc.size(i)) return false;
  for (const TensorView* x : {&value, &kc, &vc})
    if (!same_dtype(x->dtype(), key.dtype()) || !same_device(*x, key)) return false;
  if (!is_dtype(slots, kDLInt, 64) || !same_device(slots, key) || !vector(slots, t)) return false;
  if (d > 1 && (key.stride(2) != 1 || value.stride(2) != 1 || kc.stride(3) != 1 || vc.stride(3) != 1))
    return false;
  for (int i = 0; i < 2; ++i)  // the kernels' non-negative strides (torch views: always)
    if (key.stride(i) < 0 || value.stride(i) < 0) return false;
  for (int i = 0; i < 4; ++i)
    if (kc.stride(i) < 0 || vc.stride(i) < 0) return false;
  // the generic guard: key_cache, value_cache written; key, value, slot_mapping read
  return distinct(kc) && distinct(vc) && may_share(kc, key, false) && may_share(kc, value, false) &&
         may_share(kc, vc, true) && may_share(kc, slots, false) && may_share(vc, key, false) &&
         may_share(vc, value, false) && may_share(vc, slots, false);
}

}  // namespace lane
}  // namespace opmux
