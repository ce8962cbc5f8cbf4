// The serving lanes' checks of the quantization ops (lane.h), mirroring quantization/op.py's
// contract for its serving form: x [T, H] float rows with a unit last stride (H >= 1, row
// stride >= 0), no scale_ub / dynamic scale (per tensor), row-major or any distinct
// non-negative-strided float32 group scales, default (False) column_major_scales /
// scale_tma_aligned. The ops with two results get their outputs from the Python side
// (quantization/op.py's `outputs` hooks) and check them here like caller-given ones; a call
// without them (the torch library op's C++ kernel) has them allocated here (Fresh). Shared by the
// CPU and CUDA units.
#pragma once

#include <array>

#include "opmux/lane.h"

namespace opmux {
namespace lane {

constexpr DLDataType kFp8E4m3 = {kDLFloat8_e4m3fn, 8, 1};
constexpr DLDataType kF32 = {kDLFloat, 32, 1};

inline bool is_fp8(const TensorView& t) { return is_dtype(t, kDLFloat8_e4m3fn, 8); }
inline bool is_f32(const TensorView& t) { return is_dtype(t, kDLFloat, 32); }
inline bool on(int32_t device_type, const TensorView& t, const TensorView& x) {
  return t.device().device_type == device_type && same_device(t, x);
}

// x: [T, H] float rows, unit last stride, H >= 1, a non-negative row stride.
inline bool quant_x(int32_t device_type, const TensorView& x) {
  return x.ndim() == 2 && x.device().device_type == device_type && is_float(x.dtype()) && x.size(1) >= 1 &&
         rows_view(x, x.size(0), x.size(1)) && (x.size(0) <= 1 || x.stride(0) >= 0);
}

// A written [rows, cols] tensor (cols >= 1): unit last stride, rows apart (row stride >= cols), so
// every element at its own address under _no_self_overlap's, the generic guard's and the
// kernels' rules.
inline bool written_rows(const TensorView& t, int64_t rows, int64_t cols) {
  return rows_view(t, rows, cols) && (rows <= 1 || t.stride(0) >= cols);
}

// Group scales [rows, cols] with any strides that quantization/op.py's _no_self_overlap accepts
// (the dims of size > 1 by increasing stride, each >= the span stride * size of the smaller
// ones; no negative or zero stride), which check_group_scales and the generic guard accept too.
inline bool group_scale_layout(const TensorView& s, int64_t rows, int64_t cols) {
  if (s.ndim() != 2 || s.size(0) != rows || s.size(1) != cols) return false;
  int64_t st[2], n[2];
  int k = 0;
  for (int i = 0; i < 2; ++i) {
    if (s.size(i) > 1) {
      st[k] = s.stride(i);
      n[k] = s.size(i);
      ++k;
    }
  }
  if (k == 2 && (st[1] < st[0] || (st[1] == st[0] && n[1] < n[0]))) std::swap(st[0], st[1]), std::swap(n[0], n[1]);
  int64_t span = 1;
  for (int i = 0; i < k; ++i) {
    if (st[i] < span) return false;
    span = st[i] * n[i];
  }
  return true;
}

// Written tensors: apart from every other argument (no shared byte at all; stricter than the
// generic guard's same-view exception).
inline bool apart(const TensorView& w, const TensorView& o) { return may_share(w, o, true); }

// A float32 DLTensor on the stack (the kernels' views of the contract): `t`'s data as a dense
// [n] vector (the per-token scales' [T] view of [T, 1]) or [1, 1] (a one-element static scale's
// view(1, 1)), or a 0-element vector on `dev` (no scale_ub / a dynamic scale: `_empty`).
struct F32View {
  DLTensor dl;
  int64_t shape[2];
  int64_t strides[2];
  F32View(void* data, uint64_t offset, DLDevice dev, int ndim, int64_t n) {
    shape[0] = n;
    shape[1] = 1;
    strides[0] = strides[1] = 1;
    dl.data = data;
    dl.device = dev;
    dl.ndim = ndim;
    dl.dtype = kF32;
    dl.shape = shape;
    dl.strides = strides;
    dl.byte_offset = offset;
  }
  static F32View vector_of(const TensorView& t, int64_t n) {
    return F32View(t.data_ptr(), t.byte_offset(), t.device(), 1, n);
  }
  static F32View one_by_one(const TensorView& t) { return F32View(t.data_ptr(), t.byte_offset(), t.device(), 2, 1); }
  static F32View none(DLDevice dev) { return F32View(nullptr, 0, dev, 1, 0); }
  F32View(const F32View&) = delete;
  TensorView view() {  // (shape / strides re-pointed: a view of this object's arrays)
    dl.shape = shape;
    dl.strides = strides;
    return TensorView(&dl);
  }
};

// The two results of a quantization: both given (the `outputs` hook's or the caller's), or both
// None (allocated here as the contract does: the quantized [T, H], float32 scales of `scale_shape`
// ({n, 0}: a vector of n); the lane returns them: ran_all). One of them alone: refused.
struct Fresh {
  Tensor q, s;
  bool outputs(const TensorView& x, DLDataType q_dtype, std::array<int64_t, 2> scale_shape,
               std::optional<TensorView>* out_q, std::optional<TensorView>* out_scale) {
    if (*out_q && *out_scale) return true;
    if (*out_q || *out_scale) return false;
    q = empty({x.size(0), x.size(1)}, q_dtype, x.device());
    s = scale_shape[1] == 0 ? empty({scale_shape[0]}, kF32, x.device())
                            : empty({scale_shape[0], scale_shape[1]}, kF32, x.device());
    *out_q = TensorView(q);
    *out_scale = TensorView(s);
    return true;
  }
};

// per_token_quant_fp8's serving form: scale_ub None, divide_by_scale a bool, out_q fp8 [T, H]
// and out_scale float32 [T] or [T, 1] (dense), both given (the `outputs` hook's or the caller's).
inline bool per_token_args(int32_t device_type, const TensorView& x, const AnyView& ub_arg, const AnyView& divide_arg,
                           const AnyView& out_q_arg, const AnyView& out_scale_arg, bool* divide,
                           std::optional<TensorView>* out_q, std::optional<TensorView>* out_scale, Fresh* fresh) {
  if (ub_arg.type_index() != TypeIndex::kTVMFFINone || !bool_arg(divide_arg, divide) || !quant_x(device_type, x) ||
      !opt_tensor(out_q_arg, out_q) || !opt_tensor(out_scale_arg, out_scale) ||
      !fresh->outputs(x, kFp8E4m3, {x.size(0), 1}, out_q, out_scale))
    return false;
  const TensorView &q = **out_q, &s = **out_scale;
  const int64_t t = x.size(0), h = x.size(1);
  const bool s_ok = s.ndim() == 1 ? vector(s, t) : (s.ndim() == 2 && s.size(0) == t && s.size(1) == 1 && (t <= 1 || s.stride(0) == 1));
  return is_fp8(q) && on(device_type, q, x) && written_rows(q, t, h) && is_f32(s) && on(device_type, s, x) && s_ok &&
         apart(q, x) && apart(q, s) && apart(s, x);
}

// per_tensor_quant_fp8's dynamic serving form: scale None, out_q fp8 [T, H], out_scale float32 [1].
inline bool per_tensor_args(int32_t device_type, const TensorView& x, const AnyView& scale_arg,
                            const AnyView& out_q_arg, const AnyView& out_scale_arg, std::optional<TensorView>* out_q,
                            std::optional<TensorView>* out_scale, Fresh* fresh) {
  if (scale_arg.type_index() != TypeIndex::kTVMFFINone || !quant_x(device_type, x) || !opt_tensor(out_q_arg, out_q) ||
      !opt_tensor(out_scale_arg, out_scale) || !fresh->outputs(x, kFp8E4m3, {1, 0}, out_q, out_scale))
    return false;
  const TensorView &q = **out_q, &s = **out_scale;
  return is_fp8(q) && on(device_type, q, x) && written_rows(q, x.size(0), x.size(1)) && is_f32(s) &&
         on(device_type, s, x) && vector(s, 1) && apart(q, x) && apart(q, s) && apart(s, x);
}

// The group ops' serving form: group_size an int dividing H, eps a float in (0, inf),
// column_major_scales / scale_tma_aligned False, out_q [T, H] (fp8, or int8 with INT8), out_scale
// float32 [T, H / group_size] with distinct non-negative strides.
template <bool INT8>
inline bool group_args(int32_t device_type, const TensorView& x, const AnyView& gs_arg, const AnyView& eps_arg,
                       const AnyView& cm_arg, const AnyView& tma_arg, const AnyView& out_q_arg,
                       const AnyView& out_scale_arg, int64_t* gs, double* eps, std::optional<TensorView>* out_q,
                       std::optional<TensorView>* out_scale, Fresh* fresh) {
  bool cm, tma;
  if (!int_arg(gs_arg, gs) || *gs <= 0 || !positive_float(eps_arg, eps) || !bool_arg(cm_arg, &cm) || cm ||
      !bool_arg(tma_arg, &tma) || tma || !quant_x(device_type, x) || x.size(1) % *gs != 0 ||
      !opt_tensor(out_q_arg, out_q) || !opt_tensor(out_scale_arg, out_scale) ||
      !fresh->outputs(x, INT8 ? DLDataType{kDLInt, 8, 1} : kFp8E4m3, {x.size(0), x.size(1) / *gs}, out_q, out_scale))
    return false;
  const TensorView &q = **out_q, &s = **out_scale;
  const int64_t t = x.size(0), h = x.size(1);
  const bool q_dtype = INT8 ? is_dtype(q, kDLInt, 8) : is_fp8(q);
  return q_dtype && on(device_type, q, x) && written_rows(q, t, h) && is_f32(s) && on(device_type, s, x) &&
         group_scale_layout(s, t, h / *gs) && apart(q, x) && apart(q, s) && apart(s, x);
}

// static_quant_fp8's serving form: scale float32, one element ([1] or 0-d) or [Gm, Gn] (Gm
// divides T, Gn divides H, non-negative strides) on x's device; out None or fp8 [T, H] apart
// from x and scale. -> the kernel's group_m, group_n.
inline bool static_args(int32_t device_type, const TensorView& x, const TensorView& scale, const AnyView& out_arg,
                        std::optional<TensorView>* out, bool* one, int64_t* gm, int64_t* gn) {
  if (!quant_x(device_type, x) || !is_f32(scale) || !on(device_type, scale, x) || !opt_tensor(out_arg, out))
    return false;
  const int64_t t = x.size(0), h = x.size(1);
  if (scale.ndim() == 2) {
    const int64_t sm = scale.size(0), sn = scale.size(1);
    if (sm <= 0 || sn <= 0 || t % sm != 0 || h % sn != 0 || scale.stride(0) < 0 || scale.stride(1) < 0) return false;
    *one = false;
    *gm = std::max<int64_t>(t / sm, 1);
    *gn = h / sn;
  } else if (scale.ndim() == 0 || (scale.ndim() == 1 && scale.size(0) == 1)) {
    *one = true;
    *gm = std::max<int64_t>(t, 1);
    *gn = h;
  } else {
    return false;
  }
  if (!*out) return true;
  const TensorView& q = **out;
  return is_fp8(q) && on(device_type, q, x) && written_rows(q, t, h) && apart(q, x) && apart(q, scale);
}

}  // namespace lane
}  // namespace opmux
