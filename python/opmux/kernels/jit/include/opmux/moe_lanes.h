// The serving lanes' checks of the moe routing ops (lane.h), mirroring moe/op.py's contract
// (check_topk / check_sigmoid, _check_route, _buffer and the generic guard): gating_output
// [T, E] float rows with a unit last stride; topk an int in [1, E]; renormalize a bool;
// correction_bias None or a dense float32 [E]; topk_softmax's moe_softcapping a float in
// [0, inf) and bias_on_logits a bool; topk_weights (float32), topk_ids (int32 / int64) and
// token_expert_indices (int32): None (weights and ids: allocated here as the contract does) or
// [T, k] rows on gating_output's device (unit last stride when k > 1, row stride >= k when
// T > 1), each element at its own address, and overlapping no other argument as the generic
// guard has it (guard_pair). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// The generic guard's overlap rule for a written `w` and another argument `o` (fused_op's
// OVERLAPS + _checks.alias), where it accepts and no more: either is empty; or both are dense
// (torch's overlap test then compares byte ranges) and share no byte; or (a read `o`) the very
// same view; or not the same view and provably no common element (lane::disjoint_views).
// lane::may_share also admits non-dense views sharing no byte, which the Python guard refuses
// when they are views of one storage with different strides (torch._C._overlaps answers "too
// hard", then _checks._disjoint is unsure): not used here.
inline bool dense_rows(const TensorView& t) {  // row-major contiguous (size-1 dims: any stride)
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}
inline bool guard_pair(const TensorView& w, const TensorView& o, bool o_written) {
  if (w.numel() == 0 || o.numel() == 0) return true;
  uintptr_t wl, wh, ol, oh;
  extent(w, &wl, &wh);
  extent(o, &ol, &oh);
  if ((wh <= ol || oh <= wl) && dense_rows(w) && dense_rows(o)) return true;
  if (same_view(w, o)) return !o_written;
  return disjoint_views(w, o);
}

// A routing output (moe/op.py's _buffer): [T, k] of an accepted dtype on g's device, rows with a
// unit last stride (k > 1) that do not overlap (T > 1: row stride >= k), elements apart.
inline bool route_out(const TensorView& o, const TensorView& g, int64_t k, bool dtype_ok) {
  return dtype_ok && o.ndim() == 2 && o.size(0) == g.size(0) && o.size(1) == k && same_device(o, g) &&
         (k <= 1 || o.stride(1) == 1) && (o.size(0) <= 1 || o.stride(0) >= k) && distinct(o);
}

// An optional tensor argument: None or a tensor. lane::opt_tensor's as<TensorView>() matches only
// an argument held as a tvm-ffi Tensor object, not the DLTensor* a torch tensor arrives as, so it
// refuses every torch tensor; try_cast converts both.
inline bool opt_tensor_arg(const AnyView& v, std::optional<TensorView>* out) {
  if (v.type_index() == TypeIndex::kTVMFFINone) {
    out->reset();
    return true;
  }
  *out = v.try_cast<TensorView>();
  return out->has_value();
}

struct RouteArgs {
  int64_t k;
  bool renormalize;
  std::optional<TensorView> bias, w, ids, tei;
  Tensor w_new, ids_new;  // allocated here when the caller passed none
};

// The arguments every routing op shares; on success the weights and ids are set (allocated
// float32 / int32 [T, k] where absent, as the contract allocates them).
inline bool route_args(int32_t device_type, const TensorView& g, const AnyView& topk_arg,
                       const AnyView& renormalize_arg, const AnyView& bias_arg, const AnyView& w_arg,
                       const AnyView& ids_arg, const AnyView& tei_arg, RouteArgs* a) {
  if (g.ndim() != 2 || g.device().device_type != device_type || !is_float(g.dtype())) return false;
  const int64_t t = g.size(0), e = g.size(1);
  if (e < 1 || !rows_view(g, t, e)) return false;
  if (!int_arg(topk_arg, &a->k) || a->k < 1 || a->k > e) return false;
  if (!bool_arg(renormalize_arg, &a->renormalize)) return false;
  if (!opt_tensor_arg(bias_arg, &a->bias) || !opt_tensor_arg(w_arg, &a->w) || !opt_tensor_arg(ids_arg, &a->ids) ||
      !opt_tensor_arg(tei_arg, &a->tei))
    return false;
  const int64_t k = a->k;
  if (a->bias) {
    const TensorView& b = *a->bias;
    if (!is_dtype(b, kDLFloat, 32) || !same_device(b, g) || !vector(b, e)) return false;
  }
  if (a->w && !route_out(*a->w, g, k, is_dtype(*a->w, kDLFloat, 32))) return false;
  if (a->ids &&
      !route_out(*a->ids, g, k, is_dtype(*a->ids, kDLInt, 32) || is_dtype(*a->ids, kDLInt, 64)))
    return false;
  if (a->tei && !route_out(*a->tei, g, k, is_dtype(*a->tei, kDLInt, 32))) return false;
  // written tensors: apart from each other and from the read ones
  const std::optional<TensorView>* outs[3] = {&a->w, &a->ids, &a->tei};
  for (int i = 0; i < 3; ++i) {
    if (!*outs[i]) continue;
    const TensorView& o = **outs[i];
    if (!guard_pair(o, g, false) || (a->bias && !guard_pair(o, *a->bias, false))) return false;
    for (int j = i + 1; j < 3; ++j)
      if (*outs[j] && !guard_pair(o, **outs[j], true)) return false;
  }
  if (!a->w) {
    a->w_new = empty({t, k}, DLDataType{kDLFloat, 32, 1}, g.device());
    a->w = TensorView(a->w_new);
  }
  if (!a->ids) {
    a->ids_new = empty({t, k}, DLDataType{kDLInt, 32, 1}, g.device());
    a->ids = TensorView(a->ids_new);
  }
  return true;
}

// topk_softmax's own scoring arguments: moe_softcapping a float in [0, inf), bias_on_logits a bool.
inline bool softmax_scoring(const AnyView& cap_arg, const AnyView& bol_arg, double* cap, bool* bol) {
  return float_arg(cap_arg, cap) && *cap >= 0.0 && *cap < HUGE_VAL && bool_arg(bol_arg, bol);
}

}  // namespace lane
}  // namespace opmux
