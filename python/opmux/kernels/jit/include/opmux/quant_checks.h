// Argument validation for the fp8 quantization ops, shared by the CPU and CUDA units.
#pragma once

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct QuantArgs {
  DType dtype;
  int64_t rows, hidden, x_stride, q_stride;
};

// q [rows, hidden] fp8 bytes, x [rows, hidden]; last dims dense, row strides >= 0.
inline QuantArgs check_quant_args(const char* op, const TensorView& q, const TensorView& x) {
  check_ndim(op, "x", x, 2);
  check_ndim(op, "q", q, 2);
  QuantArgs a;
  a.dtype = get_dtype(op, "x", x);
  check_fp8_bytes(op, "q", q);
  a.rows = x.size(0);
  a.hidden = x.size(1);
  check_size(op, "q", q, 0, a.rows, "rows of x");
  check_size(op, "q", q, 1, a.hidden, "hidden size of x");
  check_last_dim_contiguous(op, "x", x);
  check_last_dim_contiguous(op, "q", q);
  a.x_stride = row_stride(op, "x", x);
  a.q_stride = row_stride(op, "q", q);
  return a;
}

}  // namespace opmux
