// Argument checks of gemm.w8a8_block_fp8_matmul for the native units (memory safety of direct
// callers of the ABI: ndim, dtypes, shapes, devices, strides). The Python contract checks the
// same rules first; these only guard the raw entry. Plain C++17 (no CUDA, no CUTLASS).
#pragma once

#include <cstdint>

#include "opmux/common.h"
#include "opmux/dtype_checks.h"

namespace opmux {
namespace gemm {

enum class OutType { kBFloat16, kFloat16, kFloat32 };

struct W8A8Args {
  int64_t m = 0, n = 0, k = 0;
  int64_t kb = 0, nb = 0;  // ceil(K / 128), ceil(N / 128)
  OutType out_type = OutType::kBFloat16;
  int64_t out_esize = 2;
  int32_t device_id = 0;
  // strides in elements; a row stride of a size-1 dim is reported as 0
  int64_t lda = 0, ldb = 0, ldo = 0;
  int64_t sa_m = 0, sa_k = 0;  // a_scale [M, Kb]
  int64_t sb_n = 0;            // b_scale [Nb, Kb] (unit last stride)
};

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline W8A8Args check_w8a8_block_args(const char* op, int32_t device_type, const TensorView& out,
                                      const TensorView& a, const TensorView& b,
                                      const TensorView& a_scale, const TensorView& b_scale) {
  check_ndim(op, "out", out, 2);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  check_ndim(op, "a_scale", a_scale, 2);
  check_ndim(op, "b_scale", b_scale, 2);
  W8A8Args r;
  r.device_id = check_device(op, device_type,
                             {{"out", &out}, {"a", &a}, {"b", &b}, {"a_scale", &a_scale},
                              {"b_scale", &b_scale}});
  check_dtype(op, "a", a, kDLFloat8_e4m3fn, 8, "float8_e4m3fn");
  check_dtype(op, "b", b, kDLFloat8_e4m3fn, 8, "float8_e4m3fn");
  check_float32(op, "a_scale", a_scale);
  check_float32(op, "b_scale", b_scale);
  switch (get_dtype(op, "out", out)) {
    case DType::kBFloat16: r.out_type = OutType::kBFloat16; r.out_esize = 2; break;
    case DType::kFloat16: r.out_type = OutType::kFloat16; r.out_esize = 2; break;
    default: r.out_type = OutType::kFloat32; r.out_esize = 4; break;
  }
  r.m = a.size(0);
  r.k = a.size(1);
  r.n = b.size(0);
  r.kb = cdiv(r.k, 128);
  r.nb = cdiv(r.n, 128);
  check_size(op, "b", b, 1, r.k, "K, a.shape[1]");
  check_size(op, "out", out, 0, r.m, "M, a.shape[0]");
  check_size(op, "out", out, 1, r.n, "N, b.shape[0]");
  check_size(op, "a_scale", a_scale, 0, r.m, "M, a.shape[0]");
  check_size(op, "a_scale", a_scale, 1, r.kb, "ceil(K / 128)");
  check_size(op, "b_scale", b_scale, 0, r.nb, "ceil(N / 128)");
  check_size(op, "b_scale", b_scale, 1, r.kb, "ceil(K / 128)");
  if (r.k < 1) TVM_FFI_THROW(ValueError) << op << ": K (a.shape[1]) must be at least 1, got " << r.k;
  constexpr int64_t kMax = (int64_t(1) << 31) - 1;  // CUTLASS problem shapes are int32
  if (r.m > kMax || r.n > kMax || r.k > kMax) {
    TVM_FFI_THROW(ValueError) << op << ": M, N, K must each be below 2^31, got " << r.m << ", "
                              << r.n << ", " << r.k;
  }
  check_last_dim_contiguous(op, "out", out);
  check_last_dim_contiguous(op, "a", a);
  check_last_dim_contiguous(op, "b", b);
  check_last_dim_contiguous(op, "b_scale", b_scale);
  r.lda = row_stride(op, "a", a);
  r.ldb = row_stride(op, "b", b);
  r.ldo = row_stride(op, "out", out);
  r.sb_n = row_stride(op, "b_scale", b_scale);
  // a_scale: one of its dims has unit stride (M-major "TMA-aligned" columns or K-major rows)
  const int64_t s0 = a_scale.size(0) <= 1 ? 0 : a_scale.stride(0);
  const int64_t s1 = a_scale.size(1) <= 1 ? 0 : a_scale.stride(1);
  if (s0 < 0 || s1 < 0) {
    TVM_FFI_THROW(ValueError) << op << ": a_scale has a negative stride (" << s0 << ", " << s1
                              << "); only non-negative strides are supported";
  }
  if (!(s0 <= 1 || s1 <= 1)) {
    TVM_FFI_THROW(ValueError) << op << ": a_scale must have a unit stride in one of its two dims "
                              << "(M-major or K-major), got strides (" << s0 << ", " << s1 << ")";
  }
  if (r.sb_n > kMax) {
    TVM_FFI_THROW(ValueError) << op << ": b_scale's row stride must be below 2^31, got " << r.sb_n;
  }
  r.sa_m = s0;
  r.sa_k = s1;
  return r;
}

}  // namespace gemm
}  // namespace opmux
