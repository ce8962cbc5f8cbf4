// Argument validation for the opmux ops, shared by the CPU and CUDA units so both devices
// reject exactly the same inputs with exactly the same messages. These checks guard memory
// safety for direct callers of the native ABI (ndim, dtype, shapes, device, strides); the
// semantic rules (scalar ranges, aliasing) are the Python argument contract's, checked once.
#pragma once

#include "opmux/common.h"

namespace opmux {

struct RowsArgs {
  DType dtype;
  int64_t rows;
  int64_t hidden;     // normalized size (rmsnorm) or output width d (silu_and_mul)
  int32_t device_id;
};

// rmsnorm(out, x, weight, eps) and fused_add_rmsnorm(x, residual, weight, eps) share one shape:
// `a` and `b` are [rows, hidden] (out/x or x/residual), `weight` is [hidden].
inline RowsArgs check_norm_args(const char* op, int32_t device_type, const char* a_name,
                                const TensorView& a, const char* b_name, const TensorView& b,
                                const TensorView& weight, double eps) {
  check_ndim(op, a_name, a, 2);
  check_ndim(op, b_name, b, 2);
  check_ndim(op, "weight", weight, 1);
  RowsArgs r;
  r.device_id = check_device(op, device_type, {{a_name, &a}, {b_name, &b}, {"weight", &weight}});
  r.dtype = check_same_dtype(op, {{a_name, &a}, {b_name, &b}, {"weight", &weight}});
  // x is the second argument of rmsnorm and the first of fused_add_rmsnorm; `b` names the
  // shape source for messages either way.
  r.rows = b.size(0);
  r.hidden = b.size(1);
  check_size(op, a_name, a, 0, r.rows, b_name);
  check_size(op, a_name, a, 1, r.hidden, b_name);
  check_size(op, "weight", weight, 0, r.hidden, "the hidden size");
  check_last_dim_contiguous(op, a_name, a);
  check_last_dim_contiguous(op, b_name, b);
  check_last_dim_contiguous(op, "weight", weight);
  row_stride(op, a_name, a);
  row_stride(op, b_name, b);
  (void)eps;  // its range is the Python contract's (eps > 0): no value of it reaches out of bounds
  return r;
}

// silu_and_mul(out, x): x is [rows, 2 * d], out is [rows, d].
inline RowsArgs check_silu_and_mul_args(const char* op, int32_t device_type,
                                        const TensorView& out, const TensorView& x) {
  check_ndim(op, "out", out, 2);
  check_ndim(op, "x", x, 2);
  RowsArgs r;
  r.device_id = check_device(op, device_type, {{"out", &out}, {"x", &x}});
  r.dtype = check_same_dtype(op, {{"out", &out}, {"x", &x}});
  r.rows = x.size(0);
  if (x.size(1) % 2 != 0) {
    TVM_FFI_THROW(ValueError) << op << ": x.shape[1] must be even (x = [gate, up] halves), got "
                              << x.size(1);
  }
  r.hidden = x.size(1) / 2;
  check_size(op, "out", out, 0, r.rows, "rows of x");
  check_size(op, "out", out, 1, r.hidden, "half of x.shape[1]");
  check_last_dim_contiguous(op, "out", out);
  check_last_dim_contiguous(op, "x", x);
  row_stride(op, "out", out);
  row_stride(op, "x", x);
  return r;
}

// Element-wise activations: out and x both [rows, n] (hidden = n), dense last dim.
inline RowsArgs check_elementwise_args(const char* op, int32_t device_type, const TensorView& out,
                                       const TensorView& x) {
  check_ndim(op, "out", out, 2);
  check_ndim(op, "x", x, 2);
  RowsArgs r;
  r.device_id = check_device(op, device_type, {{"out", &out}, {"x", &x}});
  r.dtype = check_same_dtype(op, {{"out", &out}, {"x", &x}});
  r.rows = x.size(0);
  r.hidden = x.size(1);
  check_size(op, "out", out, 0, r.rows, "rows of x");
  check_size(op, "out", out, 1, r.hidden, "x.shape[1]");
  check_last_dim_contiguous(op, "out", out);
  check_last_dim_contiguous(op, "x", x);
  row_stride(op, "out", out);
  row_stride(op, "x", x);
  return r;
}

}  // namespace opmux
