// The serving lanes' checks of the activations (lane.h), mirroring activation/op.py's contract:
// x [T, 2d] (gated) or [T, n] (element-wise) float rows with a unit last stride; out None (the
// lane allocates a dense one) or [T, d] / [T, n] like x, holding its elements apart, and apart
// from x or (element-wise) the very same view. Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

template <bool GATED>
inline bool act_args(int32_t device_type, const TensorView& x, const std::optional<TensorView>& out) {
  if (x.ndim() != 2 || x.device().device_type != device_type || !is_float(x.dtype()) ||
      (GATED && x.size(1) % 2 != 0) || !rows_view(x, x.size(0), x.size(1)))
    return false;
  if (!out) return true;
  const TensorView& o = *out;
  return rows_view(o, x.size(0), GATED ? x.size(1) / 2 : x.size(1)) && same_dtype(o.dtype(), x.dtype()) &&
         same_device(o, x) && distinct(o) && may_share(o, x, false);
}

// Checks, then `kernel(out)` on the caller's out or a fresh one (returned).
template <bool GATED, typename Kernel>
inline Any act_lane(int32_t device_type, const TensorView& x, const AnyView& out_arg, Kernel&& kernel) {
  std::optional<TensorView> out;
  if (!opt_tensor(out_arg, &out) || !act_args<GATED>(device_type, x, out)) return refused();
  if (out) {
    kernel(*out);
    return ran();
  }
  Tensor y = empty({x.size(0), GATED ? x.size(1) / 2 : x.size(1)}, x.dtype(), x.device());
  kernel(TensorView(y));
  return y;
}

// One lane per scalar kind: `fn` is the op's kernel entry (out, x, scalars...[, enable_pdl]).
template <bool GATED, typename F, typename... Pdl>
inline Any act_lane_plain(int32_t dev, F fn, const TensorView& x, const AnyView& out, Pdl... pdl) {
  return act_lane<GATED>(dev, x, out, [&](TensorView o) { fn(o, x, pdl...); });
}
template <bool GATED, typename F, typename... Pdl>
inline Any act_lane_bool(int32_t dev, F fn, const TensorView& x, const AnyView& flag, const AnyView& out,
                         Pdl... pdl) {  // vllm_rounding
  bool v;
  if (!bool_arg(flag, &v)) return refused();
  return act_lane<GATED>(dev, x, out, [&](TensorView o) { fn(o, x, v, pdl...); });
}
template <bool GATED, typename F, typename... Pdl>
inline Any act_lane_finite(int32_t dev, F fn, const TensorView& x, const AnyView& a, const AnyView& out,
                           Pdl... pdl) {  // fatrelu's threshold
  double v;
  if (!finite_float(a, &v)) return refused();
  return act_lane<GATED>(dev, x, out, [&](TensorView o) { fn(o, x, v, pdl...); });
}
template <bool GATED, typename F, typename... Pdl>
inline Any act_lane_positive(int32_t dev, F fn, const TensorView& x, const AnyView& a, const AnyView& out,
                             Pdl... pdl) {  // swiglustep's limit
  double v;
  if (!positive_float(a, &v)) return refused();
  return act_lane<GATED>(dev, x, out, [&](TensorView o) { fn(o, x, v, pdl...); });
}
template <bool GATED, typename F, typename... Pdl>
inline Any act_lane_oai(int32_t dev, F fn, const TensorView& x, const AnyView& alpha, const AnyView& limit,
                        const AnyView& out, Pdl... pdl) {  // swigluoai's alpha and limit
  double a, l;
  if (!finite_float(alpha, &a) || !positive_float(limit, &l)) return refused();
  return act_lane<GATED>(dev, x, out, [&](TensorView o) { fn(o, x, a, l, pdl...); });
}

}  // namespace lane
}  // namespace opmux
