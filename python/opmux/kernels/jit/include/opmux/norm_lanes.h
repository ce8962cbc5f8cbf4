// The hand-written serving lanes' checks of the norms whose contracts no generated lane states yet
// (lane.h): the static fp8 forms. rmsnorm, the fused add, their Gemma variants and qk_norm have
// lanes generated from their contracts (opmux/contracts/layernorm.h). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// x [T, H] float rows, weight a dense [H] of x's dtype on x's device, eps a float in (0, inf): the
// static fp8 norms' inputs (rmsnorm and the fused add have lanes generated from their contracts:
// opmux/contracts/layernorm.h).
inline bool norm_inputs(int32_t device_type, const TensorView& x, const TensorView& weight,
                        const AnyView& eps_arg, double* eps) {
  if (!positive_float(eps_arg, eps) || x.ndim() != 2 || x.device().device_type != device_type ||
      !is_float(x.dtype()) || !same_dtype(weight.dtype(), x.dtype()) || !same_device(x, weight))
    return false;
  const int64_t h = x.size(1);
  return rows_view(x, x.size(0), h) && vector(weight, h);
}

// rmsnorm_static_quant_fp8 / fused_add_rmsnorm_static_quant_fp8 (layernorm/_quant.py): scale a
// float32 [1] on x's device (the serving form; 0-d or [1, 1] scales are the contract's); out None
// (allocated by the lane) or fp8 [T, H] rows on x's device, each element at its own address and
// overlapping no other argument as the generic guard has it (lane::may_share).
inline bool norm_quant_scale(const TensorView& x, const TensorView& scale) {
  return is_dtype(scale, kDLFloat, 32) && scale.ndim() == 1 && scale.size(0) == 1 && same_device(scale, x);
}
inline bool norm_quant_out(const TensorView& x, const std::optional<TensorView>& out) {
  if (!out) return true;
  const TensorView& q = *out;
  return is_dtype(q, kDLFloat8_e4m3fn, 8) && rows_view(q, x.size(0), x.size(1)) && same_device(q, x) &&
         distinct(q);
}
inline bool norm_quant_args(int32_t device_type, const TensorView& x, const TensorView& weight,
                            const TensorView& scale, const AnyView& eps_arg, const std::optional<TensorView>& out,
                            double* eps) {
  if (!norm_inputs(device_type, x, weight, eps_arg, eps) || !norm_quant_scale(x, scale) || !norm_quant_out(x, out))
    return false;
  return !out || (may_share(*out, x, false) && may_share(*out, weight, false) && may_share(*out, scale, false));
}
// The fused add: residual [T, H] like x (written), holding its elements apart, another tensor
// than x (the contract refuses one data pointer; the guard any other overlap), apart from weight,
// scale and out.
inline bool fused_add_quant_args(int32_t device_type, const TensorView& x, const TensorView& residual,
                                 const TensorView& weight, const TensorView& scale, const AnyView& eps_arg,
                                 const std::optional<TensorView>& out, double* eps) {
  if (!norm_inputs(device_type, x, weight, eps_arg, eps) || !norm_quant_scale(x, scale) || !norm_quant_out(x, out))
    return false;
  if (!rows_view(residual, x.size(0), x.size(1)) || !same_dtype(residual.dtype(), x.dtype()) ||
      !same_device(residual, x) || !distinct(residual) || !may_share(residual, x, true) ||
      !may_share(residual, weight, false) || !may_share(residual, scale, false))
    return false;
  return !out || (may_share(*out, residual, true) && may_share(*out, x, false) && may_share(*out, weight, false) &&
                  may_share(*out, scale, false));
}

}  // namespace lane
}  // namespace opmux
