// The serving lane's checks of rope.rotary_embedding (lane.h), mirroring rope/op.py's serving
// fast path: positions int64 [T] (dense when T > 1); query / key (not None) of one float dtype,
// [T, H * D] or [T, H, D] with a unit last stride (D = head_size, an int > 1); cos_sin_cache
// [P, rot] float32 or query's dtype, unit last stride, rot even in (0, D]; is_neox and
// vllm_rounding bools; every tensor on query's device; query and key (written) each element at
// its own address and overlapping nothing as the generic guard has it (lane::may_share, on the
// tensors as passed). The values hook (CPU positions in [0, P)) is the CPU lane's; CUDA positions
// are not read (the contract does not read them either). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// t as the [T, H, D] view the contract makes (a 3-D t as it is), held in `v` (v.view() points
// into v: keep v alive while the view is used).
struct HeadsView {
  DLTensor dl;
  int64_t shape[3], strides[3];
  TensorView view() const { return TensorView(&dl); }
};
inline bool heads_view(const TensorView& t, int64_t tokens, int64_t d, HeadsView* v) {
  if (t.ndim() < 2 || t.size(0) != tokens || t.stride(t.ndim() - 1) != 1) return false;
  v->dl.data = t.data_ptr();
  v->dl.device = t.device();
  v->dl.dtype = t.dtype();
  v->dl.byte_offset = t.byte_offset();
  if (t.ndim() == 3 && t.size(2) == d) {
    for (int i = 0; i < 3; ++i) v->shape[i] = t.size(i), v->strides[i] = t.stride(i);
  } else if (t.ndim() == 2 && t.size(1) % d == 0) {
    v->shape[0] = tokens, v->shape[1] = t.size(1) / d, v->shape[2] = d;
    v->strides[0] = t.stride(0), v->strides[1] = d, v->strides[2] = 1;
  } else {
    return false;
  }
  v->dl.ndim = 3;
  v->dl.shape = v->shape;
  v->dl.strides = v->strides;
  return true;
}

struct RopeLaneArgs {
  std::optional<TensorView> key;
  int64_t head_size;
  bool neox, vllm;
  HeadsView q, k;
};

inline bool rope_args(int32_t device_type, const TensorView& positions, const TensorView& query,
                      const AnyView& key_arg, const AnyView& head_size_arg, const TensorView& cache,
                      const AnyView& neox_arg, const AnyView& vllm_arg, RopeLaneArgs* a) {
  if (!opt_tensor(key_arg, &a->key) || !a->key || !int_arg(head_size_arg, &a->head_size) ||
      a->head_size < 2 || !bool_arg(neox_arg, &a->neox) || !bool_arg(vllm_arg, &a->vllm))
    return false;
  const TensorView& key = *a->key;
  const int64_t d = a->head_size;
  if (query.device().device_type != device_type || !is_float(query.dtype()) ||
      !same_dtype(key.dtype(), query.dtype()) || !same_device(key, query) || !same_device(positions, query) ||
      !same_device(cache, query))
    return false;
  if (!is_dtype(positions, kDLInt, 64) || positions.ndim() != 1 || !vector(positions, positions.size(0)))
    return false;
  if (cache.ndim() != 2 || cache.size(1) <= 0 || cache.size(1) > d || cache.size(1) % 2 != 0 ||
      cache.stride(1) != 1 || (cache.size(0) > 1 && cache.stride(0) < 0) ||
      !(is_dtype(cache, kDLFloat, 32) || same_dtype(cache.dtype(), query.dtype())))
    return false;
  const int64_t t = positions.size(0);
  if (!heads_view(query, t, d, &a->q) || !heads_view(key, t, d, &a->k)) return false;
  for (const HeadsView* h : {&a->q, &a->k})  // the kernels' non-negative strides (torch: always)
    if ((h->shape[0] > 1 && h->strides[0] < 0) || (h->shape[1] > 1 && h->strides[1] < 0)) return false;
  // the generic guard: query, key written (each element at its own address); positions, cache read
  return distinct(query) && distinct(key) && may_share(query, key, true) && may_share(query, positions, false) &&
         may_share(query, cache, false) && may_share(key, positions, false) && may_share(key, cache, false);
}

}  // namespace lane
}  // namespace opmux
