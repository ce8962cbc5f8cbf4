// Argument validation for the fp8 / int8 quantization ops, shared by the CPU and CUDA units.
#pragma once

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct QuantArgs {
  DType dtype;
  int64_t rows, hidden, x_stride, q_stride;
};

// q [rows, hidden] fp8 bytes (int8 with `int8_q`), x [rows, hidden]; last dims dense, row
// strides >= 0. `pairs` (the fused silu_and_mul forms): x [rows, 2 * hidden] gate / up halves,
// q [rows, hidden]; QuantArgs.hidden is the half width.
inline QuantArgs check_quant_args(const char* op, const TensorView& q, const TensorView& x,
                                  bool int8_q = false, bool pairs = false) {
  check_ndim(op, "x", x, 2);
  check_ndim(op, "q", q, 2);
  QuantArgs a;
  a.dtype = get_dtype(op, "x", x);
  if (int8_q) {
    check_dtype(op, "q", q, kDLInt, 8, "int8");
  } else {
    check_fp8_bytes(op, "q", q);
  }
  a.rows = x.size(0);
  a.hidden = x.size(1);
  if (pairs) {
    if (a.hidden < 2 || a.hidden % 2 != 0) {
      TVM_FFI_THROW(ValueError) << op << ": x has last dim " << a.hidden
                                << "; it must be even ([..., 2*d]) and at least 2";
    }
    a.hidden /= 2;
  }
  check_size(op, "q", q, 0, a.rows, "rows of x");
  check_size(op, "q", q, 1, a.hidden, pairs ? "half width of x" : "hidden size of x");
  check_last_dim_contiguous(op, "x", x);
  check_last_dim_contiguous(op, "q", q);
  a.x_stride = row_stride(op, "x", x);
  a.q_stride = row_stride(op, "q", q);
  return a;
}

// Static block scales: float32 [Gm, Gn] covering x [rows, hidden] in blocks of group_m x
// group_n (group_n divides hidden). -> the element strides (stride 0 along a size-1 dim).
struct StaticScales {
  int64_t s_i, s_j;
};

inline StaticScales check_static_scales(const char* op, const TensorView& scale, int64_t rows, int64_t hidden,
                                        int64_t group_m, int64_t group_n) {
  check_float32(op, "scale", scale);
  check_ndim(op, "scale", scale, 2);
  if (group_m <= 0 || group_n <= 0 || hidden % group_n != 0 || scale.size(1) != hidden / group_n ||
      scale.size(0) * group_m < rows) {
    TVM_FFI_THROW(ValueError) << op << ": scale [" << scale.size(0) << ", " << scale.size(1)
                              << "] with groups " << group_m << " x " << group_n << " does not cover x ["
                              << rows << ", " << hidden << "]";
  }
  StaticScales s;
  s.s_i = scale.size(0) > 1 ? scale.stride(0) : 0;
  s.s_j = scale.size(1) > 1 ? scale.stride(1) : 0;
  if (s.s_i < 0 || s.s_j < 0) TVM_FFI_THROW(ValueError) << op << ": scale must have non-negative strides";
  return s;
}

// Group scales: float32 [rows, groups], or with `packed_ok` int32 [rows, ceil(groups / 4)]
// holding four UE8M0 exponent bytes each (sgl-kernel's layout). Any non-negative strides (in
// elements; a size-1 dim gets stride 0): every address the kernel forms is inside the view.
struct GroupScales {
  bool packed;
  int64_t s_row, s_col;  // elements (float32 or int32)
};

inline GroupScales check_group_scales(const char* op, const TensorView& scales, int64_t rows,
                                      int64_t groups, bool packed_ok) {
  GroupScales g;
  g.packed = packed_ok && is_dtype(scales, kDLInt, 32);
  if (!g.packed) check_float32(op, "scales", scales);
  check_ndim(op, "scales", scales, 2);
  const int64_t cols = g.packed ? (groups + 3) / 4 : groups;
  check_size(op, "scales", scales, 0, rows, "rows of x");
  check_size(op, "scales", scales, 1, cols, g.packed ? "ceil(groups / 4) (packed UE8M0)" : "hidden / group_size");
  g.s_row = rows > 1 ? scales.stride(0) : 0;
  g.s_col = cols > 1 ? scales.stride(1) : 0;
  if (g.s_row < 0 || g.s_col < 0) {
    TVM_FFI_THROW(ValueError) << op << ": scales must have non-negative strides";
  }
  return g;  // (each element at its own address: the contract's rule, lane::distinct on its lane)
}

// A positive int scalar (the contract's words: _checks.positive_int).
inline void check_positive_int(const char* op, const char* name, int64_t v) {
  if (v <= 0) TVM_FFI_THROW(ValueError) << op << ": " << name << " must be a positive int, got " << v;
}

}  // namespace opmux
