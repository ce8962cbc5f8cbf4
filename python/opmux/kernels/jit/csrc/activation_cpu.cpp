// silu_and_mul for CPU tensors: out = silu(x[:, :d]) * x[:, d:], computed in float.
#include <tvm/ffi/function.h>

#include <cmath>

#include "opmux/checks.h"
#include "opmux/cpu_types.h"

namespace opmux {
namespace activation_cpu {

using cpu::from_float;
using cpu::to_float;

constexpr int64_t kParallelMinElems = 1 << 15;

template <typename T>
void silu_and_mul_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows,
                       int64_t d) {
  const bool parallel = rows > 1 && rows * d >= kParallelMinElems;
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* a = x + r * x_stride;  // gate half
    const T* b = a + d;             // up half
    T* o = out + r * out_stride;
    for (int64_t i = 0; i < d; ++i) {
      const float g = to_float(a[i]);
      o[i] = from_float<T>(g / (1.0f + std::exp(-g)) * to_float(b[i]));
    }
  }
}

void silu_and_mul_cpu(TensorView out, TensorView x) {
  const char* op = "opmux.silu_and_mul";
  RowsArgs a = check_silu_and_mul_args(op, kDLCPU, out, x);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    silu_and_mul_impl<scalar_t>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                                x_stride, a.rows, a.hidden);
  });
}

}  // namespace activation_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_cpu, opmux::activation_cpu::silu_and_mul_cpu);
