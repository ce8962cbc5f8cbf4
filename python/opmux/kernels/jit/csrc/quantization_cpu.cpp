// fp8 (e4m3fn) and int8 quantization for CPU tensors (float32 / float16 / bfloat16 input).
//   per_token_quant_fp8_cpu(q, scales, x, scale_ub, divide):    scale per row
//   per_tensor_quant_fp8_cpu(q, scale, x, static_scale):         one scale (dynamic: two passes)
//   per_token_group_quant_fp8_cpu(q, scales, x, group_size, eps, ue8m0, divide): scale per group
//     (float32 scales with any strides, or sgl-kernel's packed int32 UE8M0 exponents)
//   per_token_group_quant_int8_cpu(q, scales, x, group_size, eps): int8, truncated
//   static_quant_fp8_cpu(q, x, scale, group_m, group_n): static scales of [group_m, group_n] blocks
//   silu_and_mul_per_token_group_quant_fp8_cpu(q, scales, x, group_size, eps, ue8m0): x [rows, 2d],
//     y = silu(x[:, :d]) * x[:, d:] in float (never rounded to x's dtype), then group quant of y
// Same fp32 arithmetic as the torch reference (amax, IEEE division, q = x * (1 / scale), or
// x / scale with `divide`), so scales match bit for bit and q matches up to the fp8 rounding,
// which is exact here.
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry points.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"
#include "opmux/fp8_cpu.h"

namespace opmux {
namespace quantization_cpu {

using cpu::float_to_e4m3fn_branchless;
using cpu::to_float;

constexpr float kFp8Max = 448.0f;
constexpr float kInt8Max = 127.0f;
// vLLM's MIN_SCALING_FACTOR, rounded from double exactly as the Python reference rounds it.
const float kMinScale = static_cast<float>(1.0 / (448.0 * 512.0));
// Measured cut-over (benchmarks/bench_cpu.py, docs/benchmarks/cpu.md): calls that move fewer
// bytes than this run on one thread.
constexpr int64_t kParallelMinBytes = 64 << 10;

// max |v[i]|, NaN when any entry is NaN (like the reference's amax: a NaN row gets a NaN scale
// and NaN outputs on every backend). Taken on the bit patterns: for non-negative floats the
// unsigned integer order is the float order, NaNs (above +inf) included, and an unsigned max
// reduction vectorizes where a float one (NaN / signed-zero rules) does not.
template <typename T>
OPMUX_CPU_INLINE float abs_max(const T* v, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = cpu::f32_to_bits(to_float(v[i])) & 0x7FFFFFFFu;
    m = m < u ? u : m;
  }
  return cpu::bits_to_f32(m);
}

template <typename T>
OPMUX_CPU_INLINE void quantize(uint8_t* q, const T* x, int64_t n, float inv) {
  for (int64_t i = 0; i < n; ++i) q[i] = float_to_e4m3fn_branchless(to_float(x[i]) * inv);
}

// q = e4m3(x / scale): an IEEE division per element (vLLM's convention).
template <typename T>
OPMUX_CPU_INLINE void quantize_div(uint8_t* q, const T* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) q[i] = float_to_e4m3fn_branchless(to_float(x[i]) / scale);
}

// q = int8(trunc(clamp(x * inv, -128, 127))), NaN -> 0 (sgl-kernel's int8_t(float) conversion).
template <typename T>
OPMUX_CPU_INLINE void quantize(int8_t* q, const T* x, int64_t n, float inv) {
  for (int64_t i = 0; i < n; ++i) {
    float y = to_float(x[i]) * inv;
    y = y == y ? y : 0.0f;
    y = y < -128.0f ? -128.0f : y;
    y = y > 127.0f ? 127.0f : y;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(y));
  }
}
template <typename T>
OPMUX_CPU_INLINE void quantize_div(int8_t* q, const T* x, int64_t n, float scale) {
  quantize(q, x, n, 1.0f / scale);  // not used: int8 has no division mode
}

// float16 rows through float chunks (cpu::half_chunk_to_float: F16C where the CPU has it); the
// same values as the templates above (the conversion is exact, each element's math unchanged).
OPMUX_CPU_INLINE int64_t chunk_at(int64_t i0, int64_t n) { return n - i0 < cpu::kChunk ? n - i0 : cpu::kChunk; }
OPMUX_CPU_INLINE float abs_max(const cpu::half_t* v, int64_t n) {
  float buf[cpu::kChunk];
  uint32_t m = 0;
  for (int64_t i0 = 0; i0 < n; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, n);
    cpu::half_chunk_to_float(buf, v + i0, c);
    const uint32_t u = cpu::f32_to_bits(abs_max(buf, c));
    m = m < u ? u : m;
  }
  return cpu::bits_to_f32(m);
}
// quantize (DIV: quantize_div) of a float16 row, chunk by chunk through a float buffer.
template <bool DIV, typename Q>
OPMUX_CPU_INLINE void quantize_half(Q* q, const cpu::half_t* x, int64_t n, float s) {
  float buf[cpu::kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, n);
    cpu::half_chunk_to_float(buf, x + i0, c);
    if constexpr (DIV) {
      quantize_div(q + i0, buf, c, s);
    } else {
      quantize(q + i0, buf, c, s);
    }
  }
}
OPMUX_CPU_INLINE void quantize(uint8_t* q, const cpu::half_t* x, int64_t n, float inv) {
  quantize_half<false>(q, x, n, inv);
}
OPMUX_CPU_INLINE void quantize_div(uint8_t* q, const cpu::half_t* x, int64_t n, float scale) {
  quantize_half<true>(q, x, n, scale);
}
OPMUX_CPU_INLINE void quantize(int8_t* q, const cpu::half_t* x, int64_t n, float inv) {
  quantize_half<false>(q, x, n, inv);
}
OPMUX_CPU_INLINE void quantize_div(int8_t* q, const cpu::half_t* x, int64_t n, float scale) {
  quantize(q, x, n, 1.0f / scale);  // not used: int8 has no division mode
}

OPMUX_CPU_INLINE float token_scale(float amax, const float* ub) {
  if (ub != nullptr) amax = std::min(amax, *ub);  // NaN amax stays NaN
  return std::max(amax / kFp8Max, kMinScale);
}

// The scale of one group: max(amax, eps) / qmax, rounded up to a power of two with ue8m0.
OPMUX_CPU_INLINE float group_scale(float amax, float eps, float qmax, bool ue8m0) {
  const float scale = std::max(amax, eps) / qmax;  // NaN amax stays NaN
  return ue8m0 ? cpu::bits_to_f32(cpu::ue8m0_bits(cpu::f32_to_bits(scale))) : scale;
}

// Where group scales go: float32 at s[r * s_row + g * s_col], or (packed) the UE8M0 exponent
// byte g % 4 of int32 element [r, g / 4] (byte offset 4 * (r * s_row + (g / 4) * s_col)).
struct ScaleOut {
  void* s;
  int64_t s_row, s_col;
  bool packed;
  OPMUX_CPU_INLINE void store(int64_t r, int64_t g, float scale) const {
    if (packed) {
      uint8_t* b = static_cast<uint8_t*>(s) + 4 * (r * s_row + (g >> 2) * s_col) + (g & 3);
      *b = static_cast<uint8_t>(cpu::f32_to_bits(scale) >> 23);
    } else {
      static_cast<float*>(s)[r * s_row + g * s_col] = scale;
    }
  }
};

// One row (per token): returns the scale. Multiversioned (OPMUX_CPU_CLONES); the amax and the
// scale + convert loops are branch-free and vectorize.
template <typename T>
OPMUX_CPU_CLONES float per_token_row(uint8_t* q, const T* x, int64_t n, const float* ub, bool divide) {
  const float scale = token_scale(abs_max(x, n), ub);
  if (divide) {
    quantize_div(q, x, n, scale);
  } else {
    quantize(q, x, n, 1.0f / scale);
  }
  return scale;
}

// One row with a given multiplier (per tensor).
template <typename T>
OPMUX_CPU_CLONES void scaled_row(uint8_t* q, const T* x, int64_t n, float inv) {
  quantize(q, x, n, inv);
}

template <typename T>
OPMUX_CPU_CLONES float row_abs_max(const T* x, int64_t n) {
  return abs_max(x, n);
}

// One row, group by group.
template <typename T, typename Q>
OPMUX_CPU_CLONES void per_group_row(Q* q, const ScaleOut& so, int64_t r, const T* x, int64_t groups,
                                    int64_t gs, float eps, float qmax, bool ue8m0, bool divide) {
  for (int64_t g = 0; g < groups; ++g) {
    const T* xg = x + g * gs;
    const float scale = group_scale(abs_max(xg, gs), eps, qmax, ue8m0);
    so.store(r, g, scale);
    if (divide) {
      quantize_div(q + g * gs, xg, gs, scale);
    } else {
      quantize(q + g * gs, xg, gs, 1.0f / scale);
    }
  }
}

#if OPMUX_CPU_VEC512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace v512 {
using namespace cpu::v512;

// abs_max on 16 lanes: the same unsigned max over the bit patterns (a NaN lane wins: NaN scale).
template <typename T>
OPMUX_V512_INLINE float abs_max(const T* v, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const __m512i u0 = _mm512_and_si512(_mm512_castps_si512(load(v + i)), abs_mask);
    const __m512i u1 = _mm512_and_si512(_mm512_castps_si512(load(v + i + kW)), abs_mask);
    m0 = _mm512_max_epu32(m0, u0);
    m1 = _mm512_max_epu32(m1, u1);
  }
  for (; i < n; i += kW) {
    const __m512i u = _mm512_and_si512(_mm512_castps_si512(load(v + i, tail_mask(n - i))), abs_mask);
    m0 = _mm512_max_epu32(m0, u);
  }
  return cpu::bits_to_f32(_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)));
}

// to_e4m3fn (16 lanes -> e4m3fn codes): opmux/cpu_vec.h.

// q[i] = conv(x[i]) for i < n, 16 lanes at a time, the tail masked; conv: 16 floats -> 16 bytes.
template <typename T, typename Q, typename Conv>
OPMUX_V512_INLINE void map_bytes(Q* q, const T* x, int64_t n, Conv conv) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), conv(load(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm_mask_storeu_epi8(q + i, m, conv(load(x + i, m)));
  }
}

template <typename T>
OPMUX_V512_INLINE void quantize(uint8_t* q, const T* x, int64_t n, float inv) {
  const __m512 s = _mm512_set1_ps(inv);
  map_bytes(q, x, n, [s](__m512 v) { return to_e4m3fn(_mm512_mul_ps(v, s)); });
}

template <typename T>
OPMUX_V512_INLINE void quantize_div(uint8_t* q, const T* x, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  map_bytes(q, x, n, [s](__m512 v) { return to_e4m3fn(_mm512_div_ps(v, s)); });
}

// q = int8(trunc(clamp(x * inv, -128, 127))), NaN -> 0: the portable loop's bits on 16 lanes.
OPMUX_V512_INLINE __m128i to_int8(__m512 y) {
  y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), y);  // NaN -> 0
  y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(y));  // truncation toward zero, then narrow
}

template <typename T>
OPMUX_V512_INLINE void quantize(int8_t* q, const T* x, int64_t n, float inv) {
  const __m512 s = _mm512_set1_ps(inv);
  map_bytes(q, x, n, [s](__m512 v) { return to_int8(_mm512_mul_ps(v, s)); });
}

template <typename T>
OPMUX_V512_INLINE void quantize_div(int8_t* q, const T* x, int64_t n, float scale) {
  quantize(q, x, n, 1.0f / scale);  // not used: int8 has no division mode
}

template <typename T>
float per_token_row(uint8_t* q, const T* x, int64_t n, const float* ub, bool divide) {
  const float scale = token_scale(abs_max(x, n), ub);
  if (divide) {
    quantize_div(q, x, n, scale);
  } else {
    quantize(q, x, n, 1.0f / scale);
  }
  return scale;
}

template <typename T>
void scaled_row(uint8_t* q, const T* x, int64_t n, float inv) {
  quantize(q, x, n, inv);
}

template <typename T>
float row_abs_max(const T* x, int64_t n) {
  return abs_max(x, n);
}

template <typename T, typename Q>
void per_group_row(Q* q, const ScaleOut& so, int64_t r, const T* x, int64_t groups, int64_t gs,
                   float eps, float qmax, bool ue8m0, bool divide) {
  for (int64_t g = 0; g < groups; ++g) {
    const T* xg = x + g * gs;
    const float scale = group_scale(abs_max(xg, gs), eps, qmax, ue8m0);
    so.store(r, g, scale);
    if (divide) {
      quantize_div(q + g * gs, xg, gs, scale);
    } else {
      quantize(q + g * gs, xg, gs, 1.0f / scale);
    }
  }
}

}  // namespace v512
#pragma GCC pop_options
#endif  // OPMUX_CPU_VEC512

// y[i] = silu(g[i]) * u[i] in float: the activation group's CPU silu (cpu::exp_f, branch-free: the
// loop vectorizes), chunk by chunk for float16 (F16C, as the quantize loops).
template <typename T>
OPMUX_CPU_CLONES void silu_mul_row(float* y, const T* g, const T* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gf = to_float(g[i]);
    y[i] = gf / (1.0f + cpu::exp_f(-gf)) * to_float(u[i]);
  }
}
OPMUX_CPU_CLONES void silu_mul_row(float* y, const cpu::half_t* g, const cpu::half_t* u, int64_t n) {
  float gb[cpu::kChunk], ub[cpu::kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, n);
    cpu::half_chunk_to_float(gb, g + i0, c);
    cpu::half_chunk_to_float(ub, u + i0, c);
    silu_mul_row(y + i0, gb, ub, c);
  }
}

// q [rows, hidden] fp8 bytes (row stride q_stride), x [rows, hidden] (row stride x_stride).
struct QuantRows {
  int64_t rows, hidden, x_stride, q_stride;
};

template <typename T>
int threads_of(const QuantRows& a) {
  return cpu::threads_for(a.rows * a.hidden * static_cast<int64_t>(sizeof(T) + 1), kParallelMinBytes, a.rows);
}

// s[r]: the scale of row r; ub: the scale upper bound, or nullptr.
template <typename T>
void per_token_impl(uint8_t* q, float* s, const T* x, const QuantRows& a, const float* ub, bool divide) {
  const int nt = threads_of<T>(a), level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
#if OPMUX_CPU_VEC512
    if (level >= 1) {
      s[r] = v512::per_token_row(q + r * a.q_stride, x + r * a.x_stride, a.hidden, ub, divide);
      continue;
    }
#endif
    s[r] = per_token_row(q + r * a.q_stride, x + r * a.x_stride, a.hidden, ub, divide);
  }
}

// One scale for the whole tensor: `static_scale`, or (nullptr) max |x| / 448 from a first pass
// (a NaN anywhere gives a NaN scale). s[0] is written once both passes have read what they need.
template <typename T>
void per_tensor_impl(uint8_t* q, float* s, const T* x, const QuantRows& a, const float* static_scale) {
  const int nt = threads_of<T>(a), level = cpu::vec_level();
  (void)nt, (void)level;
  float scale;
  if (static_scale != nullptr) {
    scale = *static_scale;
  } else {
    uint32_t m = 0;  // max over the bit patterns of |row max| (NaN wins, as in abs_max)
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1) reduction(max : m)
#endif
    for (int64_t r = 0; r < a.rows; ++r) {
      float rm;
#if OPMUX_CPU_VEC512
      if (level >= 1) {
        rm = v512::row_abs_max(x + r * a.x_stride, a.hidden);
      } else {
        rm = row_abs_max(x + r * a.x_stride, a.hidden);
      }
#else
      rm = row_abs_max(x + r * a.x_stride, a.hidden);
#endif
      const uint32_t u = cpu::f32_to_bits(rm);
      m = m < u ? u : m;
    }
    scale = cpu::bits_to_f32(m) / kFp8Max;
  }
  const float inv = 1.0f / scale;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
#if OPMUX_CPU_VEC512
    if (level >= 1) {
      v512::scaled_row(q + r * a.q_stride, x + r * a.x_stride, a.hidden, inv);
      continue;
    }
#endif
    scaled_row(q + r * a.q_stride, x + r * a.x_stride, a.hidden, inv);
  }
  *s = scale;
}

// Static block scales: element [r, h] uses scale[(r / gm) * s_i + (h / gn) * s_j]; q = x * (1 / s).
template <typename T>
void static_impl(uint8_t* q, const T* x, const QuantRows& a, const float* s, int64_t s_i, int64_t s_j,
                 int64_t gm, int64_t gn) {
  const int64_t groups = a.hidden / gn;
  const int nt = threads_of<T>(a), level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* srow = s + (r / gm) * s_i;
    for (int64_t g = 0; g < groups; ++g) {
      const float inv = 1.0f / srow[g * s_j];
      uint8_t* qg = q + r * a.q_stride + g * gn;
      const T* xg = x + r * a.x_stride + g * gn;
#if OPMUX_CPU_VEC512
      if (level >= 1) {
        v512::scaled_row(qg, xg, gn, inv);
        continue;
      }
#endif
      scaled_row(qg, xg, gn, inv);
    }
  }
}

// Group scales through `so` (float32 any strides, or packed UE8M0); gs divides hidden. Q is
// uint8_t (fp8 bytes, qmax 448) or int8_t (qmax 127).
template <typename T, typename Q>
void per_group_impl(Q* q, const ScaleOut& so, const T* x, const QuantRows& a, int64_t gs, float eps,
                    bool ue8m0, bool divide) {
  constexpr bool kFp8 = std::is_same<Q, uint8_t>::value;
  const float qmax = kFp8 ? kFp8Max : kInt8Max;
  const int64_t groups = a.hidden / gs;
  const int nt = threads_of<T>(a), level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
#if OPMUX_CPU_VEC512
    if (level >= 1) {  // fp8 and int8 (16 lanes: the same bits as the portable loops)
      v512::per_group_row(q + r * a.q_stride, so, r, x + r * a.x_stride, groups, gs, eps, qmax, ue8m0,
                          divide);
      continue;
    }
#endif
    per_group_row(q + r * a.q_stride, so, r, x + r * a.x_stride, groups, gs, eps, qmax, ue8m0, divide);
  }
}

// The fused form: a.hidden is d (x's rows hold 2d); each row's product goes through a float
// buffer of d (one per thread, allocated once) into the float32 group quantization above.
template <typename T>
void silu_group_impl(uint8_t* q, const ScaleOut& so, const T* x, const QuantRows& a, int64_t gs, float eps,
                     bool ue8m0) {
  const int64_t d = a.hidden, groups = d / gs;
  const int nt = cpu::threads_for(a.rows * d * static_cast<int64_t>(2 * sizeof(T) + 1), kParallelMinBytes, a.rows);
  const int level = cpu::vec_level();
  (void)level;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
  {
    std::vector<float> y(static_cast<size_t>(d));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < a.rows; ++r) {
      const T* xr = x + r * a.x_stride;
      silu_mul_row(y.data(), xr, xr + d, d);
#if OPMUX_CPU_VEC512
      if (level >= 1) {
        v512::per_group_row(q + r * a.q_stride, so, r, y.data(), groups, gs, eps, kFp8Max, ue8m0, false);
        continue;
      }
#endif
      per_group_row(q + r * a.q_stride, so, r, y.data(), groups, gs, eps, kFp8Max, ue8m0, false);
    }
  }
}

}  // namespace quantization_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"
#include "opmux/quant_checks.h"
#include "opmux/contracts/quantization.h"

namespace opmux {
namespace quantization_cpu {

inline QuantRows rows_of(const QuantArgs& a) { return {a.rows, a.hidden, a.x_stride, a.q_stride}; }

void per_token_quant_fp8_cpu(TensorView q, TensorView scales, TensorView x, TensorView scale_ub,
                             bool divide) {
  const char* op = "opmux.per_token_quant_fp8";
  check_device(op, kDLCPU, {{"q", &q}, {"scales", &scales}, {"x", &x}, {"scale_ub", &scale_ub}});
  QuantArgs a = check_quant_args(op, q, x);
  if (a.hidden == 0) TVM_FFI_THROW(ValueError) << op << ": x has hidden size 0";
  check_float32(op, "scales", scales);
  check_vector(op, "scales", scales, a.rows, "rows of x");
  check_float32(op, "scale_ub", scale_ub);
  check_ndim(op, "scale_ub", scale_ub, 1);
  if (scale_ub.size(0) > 1) {
    TVM_FFI_THROW(ValueError) << op << ": scale_ub must have 0 (none) or 1 element, got "
                              << scale_ub.size(0);
  }
  if (a.rows == 0) return;
  const float* ub = scale_ub.size(0) == 1 ? data_ptr<const float>(scale_ub) : nullptr;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    per_token_impl<scalar_t>(data_ptr<uint8_t>(q), data_ptr<float>(scales),
                             data_ptr<const scalar_t>(x), rows_of(a), ub, divide);
  });
}

void per_tensor_quant_fp8_cpu(TensorView q, TensorView scale, TensorView x, TensorView static_scale) {
  const char* op = "opmux.per_tensor_quant_fp8";
  check_device(op, kDLCPU, {{"q", &q}, {"scale", &scale}, {"x", &x}, {"static_scale", &static_scale}});
  QuantArgs a = check_quant_args(op, q, x);
  if (a.hidden == 0) TVM_FFI_THROW(ValueError) << op << ": x has hidden size 0";
  check_float32(op, "scale", scale);
  check_vector(op, "scale", scale, 1, "one scale");
  check_float32(op, "static_scale", static_scale);
  check_ndim(op, "static_scale", static_scale, 1);
  if (static_scale.size(0) > 1) {
    TVM_FFI_THROW(ValueError) << op << ": static_scale must have 0 (dynamic) or 1 element, got "
                              << static_scale.size(0);
  }
  const float* st = static_scale.size(0) == 1 ? data_ptr<const float>(static_scale) : nullptr;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    per_tensor_impl<scalar_t>(data_ptr<uint8_t>(q), data_ptr<float>(scale), data_ptr<const scalar_t>(x),
                              rows_of(a), st);
  });
}

void static_quant_fp8_cpu(TensorView q, TensorView x, TensorView scale, int64_t group_m, int64_t group_n) {
  const char* op = "opmux.static_quant_fp8";
  check_device(op, kDLCPU, {{"q", &q}, {"x", &x}, {"scale", &scale}});
  QuantArgs a = check_quant_args(op, q, x);
  const StaticScales ss = check_static_scales(op, scale, a.rows, a.hidden, group_m, group_n);
  if (a.rows == 0) return;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    static_impl<scalar_t>(data_ptr<uint8_t>(q), data_ptr<const scalar_t>(x), rows_of(a),
                          data_ptr<const float>(scale), ss.s_i, ss.s_j, group_m, group_n);
  });
}

template <typename Q>
void group_entry(const char* op, TensorView q, TensorView scales, TensorView x, int64_t group_size,
                 double eps, bool ue8m0, bool divide) {
  constexpr bool kInt8 = std::is_same<Q, int8_t>::value;
  check_device(op, kDLCPU, {{"q", &q}, {"scales", &scales}, {"x", &x}});
  QuantArgs a = check_quant_args(op, q, x, kInt8);
  check_positive_int(op, "group_size", group_size);
  lane::contract::rule_group_multiple(op, a.hidden, group_size);  // the contract's words
  check_eps(op, eps);
  const GroupScales gsc = check_group_scales(op, scales, a.rows, a.hidden / group_size, ue8m0);
  if (a.rows == 0) return;
  const ScaleOut so{data_ptr<void>(scales), gsc.s_row, gsc.s_col, gsc.packed};
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    per_group_impl<scalar_t, Q>(data_ptr<Q>(q), so, data_ptr<const scalar_t>(x), rows_of(a), group_size,
                                static_cast<float>(eps), ue8m0, divide);
  });
}

void per_token_group_quant_fp8_cpu(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                   double eps, bool ue8m0, bool divide) {
  group_entry<uint8_t>("opmux.per_token_group_quant_fp8", q, scales, x, group_size, eps, ue8m0, divide);
}

void per_token_group_quant_int8_cpu(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                    double eps) {
  group_entry<int8_t>("opmux.per_token_group_quant_int8", q, scales, x, group_size, eps, false, false);
}

void silu_and_mul_per_token_group_quant_fp8_cpu(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                                double eps, bool ue8m0) {
  const char* op = "opmux.silu_and_mul_per_token_group_quant_fp8";
  check_device(op, kDLCPU, {{"q", &q}, {"scales", &scales}, {"x", &x}});
  QuantArgs a = check_quant_args(op, q, x, false, true);
  check_positive_int(op, "group_size", group_size);
  lane::contract::rule_half_group_multiple(op, 2 * a.hidden, group_size);  // the contract's words
  check_eps(op, eps);
  const GroupScales gsc = check_group_scales(op, scales, a.rows, a.hidden / group_size, ue8m0);
  if (a.rows == 0) return;
  const ScaleOut so{data_ptr<void>(scales), gsc.s_row, gsc.s_col, gsc.packed};
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    silu_group_impl<scalar_t>(data_ptr<uint8_t>(q), so, data_ptr<const scalar_t>(x), rows_of(a), group_size,
                              static_cast<float>(eps), ue8m0);
  });
}

}  // namespace quantization_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_per_token_group_quant_fp8_cpu,
                              opmux::quantization_cpu::silu_and_mul_per_token_group_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_quant_fp8_cpu, opmux::quantization_cpu::per_token_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_tensor_quant_fp8_cpu, opmux::quantization_cpu::per_tensor_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_group_quant_fp8_cpu,
                              opmux::quantization_cpu::per_token_group_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(static_quant_fp8_cpu, opmux::quantization_cpu::static_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_group_quant_int8_cpu,
                              opmux::quantization_cpu::per_token_group_quant_int8_cpu);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/quantization_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
