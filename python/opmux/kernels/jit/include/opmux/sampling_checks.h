// The sampling ops' native-ABI checks, shared by the CPU and CUDA units: what guards memory for a
// direct caller (ranks, dtypes, sizes, devices, strides). The rules (ranges, not both a tensor and
// a scalar) are the Python contract's (ops/sampling/op.py), checked before a kernel runs.
#pragma once

#include "opmux/common.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct SampleRows {
  DType dtype;
  int64_t rows;
  int64_t vocab;
  int64_t stride;  // elements between rows (>= 0)
  int32_t device_id;
};

// x [B, V] (float32 only when `probs`), unit last stride, on `device_type`.
inline SampleRows check_sample_rows(const char* op, int32_t device_type, const char* name, const TensorView& x,
                                    bool probs) {
  check_ndim(op, name, x, 2);
  SampleRows r;
  r.device_id = check_device(op, device_type, {{name, &x}});
  if (probs) check_float32(op, name, x);
  r.dtype = get_dtype(op, name, x);
  r.rows = x.size(0);
  r.vocab = x.size(1);
  if (r.vocab < 1 || r.vocab > 2147483647) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << ".shape[1] is " << r.vocab
                              << ", expected 1 .. 2^31 - 1 (int32 ids)";
  }
  check_last_dim_contiguous(op, name, x);
  r.stride = row_stride(op, name, x);
  return r;
}

// out [B, V] of x's dtype and device; returns its row stride.
inline int64_t check_sample_out_rows(const char* op, int32_t device_type, const TensorView& out,
                                     const TensorView& x, const SampleRows& r) {
  check_ndim(op, "out", out, 2);
  check_device(op, device_type, {{"x", &x}, {"out", &out}});
  check_same_dtype(op, {{"x", &x}, {"out", &out}});
  check_size(op, "out", out, 0, r.rows, "rows of the input");
  check_size(op, "out", out, 1, r.vocab, "columns of the input");
  check_last_dim_contiguous(op, "out", out);
  return row_stride(op, "out", out);
}

// ids out: a dense int32 [B] on the rows' device.
inline void check_sample_ids(const char* op, int32_t device_type, const TensorView& out, const TensorView& x,
                             const SampleRows& r) {
  check_device(op, device_type, {{"x", &x}, {"out", &out}});
  check_int32(op, "out", out);
  check_vector(op, "out", out, r.rows, "one id per row");
}

// A per-row parameter when given: dense [B] on the rows' device; top_k_arr int32 or int64 (returns
// whether int64), the float ones float32.
inline bool check_sample_k_arr(const char* op, int32_t device_type, const TensorView& k, bool has,
                               const TensorView& x, const SampleRows& r) {
  if (!has) return false;
  check_device(op, device_type, {{"x", &x}, {"top_k_arr", &k}});
  if (!is_dtype(k, kDLInt, 32) && !is_dtype(k, kDLInt, 64)) {
    TVM_FFI_THROW(ValueError) << op << ": top_k_arr has dtype " << dtype_name(k.dtype())
                              << ", expected int32 or int64";
  }
  check_vector(op, "top_k_arr", k, r.rows, "one k per row");
  return is_dtype(k, kDLInt, 64);
}

inline void check_sample_f32_arr(const char* op, int32_t device_type, const char* name, const TensorView& a,
                                 bool has, const TensorView& x, const SampleRows& r) {
  if (!has) return;
  check_device(op, device_type, {{"x", &x}, {name, &a}});
  check_float32(op, name, a);
  check_vector(op, name, a, r.rows, "one value per row");
}

// seed_tensor / offset_tensor when given: int64 with at least one element (the first is read).
inline void check_sample_word(const char* op, int32_t device_type, const char* name, const TensorView& t,
                              bool has, const TensorView& x) {
  if (!has) return;
  check_device(op, device_type, {{"x", &x}, {name, &t}});
  check_int64(op, name, t);
  if (t.numel() < 1) TVM_FFI_THROW(ValueError) << op << ": " << name << " is empty; expected one int64";
}

}  // namespace opmux
