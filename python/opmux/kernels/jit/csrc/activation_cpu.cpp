// Gated activations for CPU tensors: out = act(x[:, :d]) * x[:, d:], computed in float, for
// act = silu, gelu (exact, erf) and gelu_tanh (tanh approximation).
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry points.
#include <cmath>
#include <cstdint>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"

namespace opmux {
namespace activation_cpu {

using cpu::from_float;
using cpu::to_float;

constexpr int64_t kParallelMinElems = 1 << 15;

// exp_f / erfc_f (opmux/cpu_math.h) are branch-free, so the row loops below vectorize.
struct Silu {
  static OPMUX_CPU_INLINE float apply(float g) { return g / (1.0f + cpu::exp_f(-g)); }
};
// 1 + erf(g / sqrt 2) and 1 + tanh(z) cancel for negative g; erfc and the sigmoid form
// 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z)) keep the tail's relative accuracy.
struct Gelu {
  static OPMUX_CPU_INLINE float apply(float g) {
    return 0.5f * g * cpu::erfc_f(g * -0.70710678118654752f);
  }
};
struct GeluTanh {
  static OPMUX_CPU_INLINE float apply(float g) {
    const float z = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return g / (1.0f + cpu::exp_f(-2.0f * z));
  }
};

// One row, in chunks through a float buffer: convert, activate, multiply, convert back. Each
// loop is a plain element-wise loop the compiler vectorizes (per ISA, see OPMUX_CPU_CLONES).
template <typename T, typename Act>
OPMUX_CPU_CLONES void gated_row(T* o, const T* a, const T* b, int64_t d) {
  float buf[cpu::kChunk];
  for (int64_t i0 = 0; i0 < d; i0 += cpu::kChunk) {
    const int n = static_cast<int>(d - i0 < cpu::kChunk ? d - i0 : cpu::kChunk);
    const T* ac = a + i0;
    const T* bc = b + i0;
    T* oc = o + i0;
    for (int i = 0; i < n; ++i) buf[i] = Act::apply(to_float(ac[i]));
    for (int i = 0; i < n; ++i) oc[i] = from_float<T>(buf[i] * to_float(bc[i]));
  }
}

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
    gated_row<T, Act>(out + r * out_stride, a, a + d, d);
  }
}

}  // namespace activation_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/checks.h"

namespace opmux {
namespace activation_cpu {

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
#endif  // OPMUX_CPU_KERNELS_ONLY
