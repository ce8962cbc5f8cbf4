// Gated activations for CPU tensors: out = act(x[:, :d]) * x[:, d:], computed in float, for
// act = silu, gelu (exact, erf) and gelu_tanh (tanh approximation).
#include <tvm/ffi/function.h>

#include <cmath>

#include "opmux/checks.h"
#include "opmux/cpu_types.h"

namespace opmux {
namespace activation_cpu {

using cpu::from_float;
using cpu::to_float;

constexpr int64_t kParallelMinElems = 1 << 15;

struct Silu {
  static float apply(float g) { return g / (1.0f + std::exp(-g)); }
};
// 1 + erf(g / sqrt 2) and 1 + tanh(z) cancel for negative g; erfc and the sigmoid form
// 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z)) keep the tail's relative accuracy.
struct Gelu {
  static float apply(float g) { return 0.5f * g * std::erfc(g * -0.70710678118654752f); }
};
struct GeluTanh {
  static float apply(float g) {
    const float z = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return g / (1.0f + std::exp(-2.0f * z));
  }
};

template <typename T, typename Act>
void gated_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows,
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
      o[i] = from_float<T>(Act::apply(to_float(a[i])) * to_float(b[i]));
    }
  }
}

template <typename Act>
void run(const char* op, TensorView out, TensorView x) {
  RowsArgs a = check_silu_and_mul_args(op, kDLCPU, out, x);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    gated_impl<scalar_t, Act>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                              x_stride, a.rows, a.hidden);
  });
}

void silu_and_mul_cpu(TensorView out, TensorView x) { run<Silu>("opmux.silu_and_mul", out, x); }
void gelu_and_mul_cpu(TensorView out, TensorView x) { run<Gelu>("opmux.gelu_and_mul", out, x); }
void gelu_tanh_and_mul_cpu(TensorView out, TensorView x) {
  run<GeluTanh>("opmux.gelu_tanh_and_mul", out, x);
}

}  // namespace activation_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_cpu, opmux::activation_cpu::silu_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul_cpu, opmux::activation_cpu::gelu_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul_cpu, opmux::activation_cpu::gelu_tanh_and_mul_cpu);
