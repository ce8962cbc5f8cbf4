// RMSNorm and fused add + RMSNorm for CPU tensors (float32 / float16 / bfloat16).
// One OpenMP task per row range; float accumulation; no temporaries beyond registers.
#include <tvm/ffi/function.h>

#include <cmath>

#include "opmux/checks.h"
#include "opmux/cpu_types.h"

namespace opmux {
namespace layernorm_cpu {

using cpu::from_float;
using cpu::to_float;

// Rows below this many elements in total run on one thread (a parallel region costs ~us).
constexpr int64_t kParallelMinElems = 1 << 15;
// Independent partial sums: lets the compiler vectorize the reduction without -ffast-math.
constexpr int kLanes = 16;

template <typename T>
inline float sum_squares(const T* v, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float f = to_float(v[i + l]);
      acc[l] += f * f;
    }
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (; i < n; ++i) {
    const float f = to_float(v[i]);
    sum += f * f;
  }
  return sum;
}

// out[i] = (x[i] * rstd) * w[i], same operation order as the torch reference.
template <typename T>
inline void scale_row(T* out, const T* x, const T* w, int64_t n, float rstd) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>((to_float(x[i]) * rstd) * to_float(w[i]));
}

inline float inv_rms(float sum, int64_t n, float eps) {
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
}

template <typename T>
void rmsnorm_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                  int64_t rows, int64_t hidden, float eps) {
  const bool parallel = rows > 1 && rows * hidden >= kParallelMinElems;
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    const float rstd = inv_rms(sum_squares(xr, hidden), hidden, eps);
    scale_row(out + r * out_stride, xr, w, hidden, rstd);
  }
}

template <typename T>
void fused_add_rmsnorm_impl(T* x, int64_t x_stride, T* res, int64_t res_stride, const T* w,
                            int64_t rows, int64_t hidden, float eps) {
  const bool parallel = rows > 1 && rows * hidden >= kParallelMinElems;
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * x_stride;
    T* rr = res + r * res_stride;
    // Pass 1: residual = round(x + residual); the sum of squares uses the rounded value, so
    // x below is exactly rmsnorm(residual as stored).
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= hidden; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const T s = from_float<T>(to_float(xr[i + l]) + to_float(rr[i + l]));
        rr[i + l] = s;
        const float f = to_float(s);
        acc[l] += f * f;
      }
    }
    float sum = 0.f;
    for (int l = 0; l < kLanes; ++l) sum += acc[l];
    for (; i < hidden; ++i) {
      const T s = from_float<T>(to_float(xr[i]) + to_float(rr[i]));
      rr[i] = s;
      const float f = to_float(s);
      sum += f * f;
    }
    // Pass 2: the row is hot in L1/L2.
    scale_row(xr, rr, w, hidden, inv_rms(sum, hidden, eps));
  }
}

void rmsnorm_cpu(TensorView out, TensorView x, TensorView weight, double eps) {
  const char* op = "opmux.rmsnorm";
  RowsArgs a = check_norm_args(op, kDLCPU, "out", out, "x", x, weight, eps);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    rmsnorm_impl<scalar_t>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                           x_stride, data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                           static_cast<float>(eps));
  });
}

void fused_add_rmsnorm_cpu(TensorView x, TensorView residual, TensorView weight, double eps) {
  const char* op = "opmux.fused_add_rmsnorm";
  RowsArgs a = check_norm_args(op, kDLCPU, "x", x, "residual", residual, weight, eps);
  if (a.rows == 0 || a.hidden == 0) return;
  if (data_ptr<char>(x) == data_ptr<char>(residual)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (both are "
                              << "updated in place)";
  }
  const int64_t x_stride = row_stride(op, "x", x), r_stride = row_stride(op, "residual", residual);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    fused_add_rmsnorm_impl<scalar_t>(data_ptr<scalar_t>(x), x_stride, data_ptr<scalar_t>(residual),
                                     r_stride, data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                                     static_cast<float>(eps));
  });
}

}  // namespace layernorm_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_cpu, opmux::layernorm_cpu::rmsnorm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm_cpu, opmux::layernorm_cpu::fused_add_rmsnorm_cpu);
