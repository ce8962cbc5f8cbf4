// Activations for CPU tensors, computed in float. Gated: out = act(x[:, :d]) * x[:, d:] for act =
// silu, gelu (exact, erf) and gelu_tanh (tanh approximation); mul_and_silu (the halves swapped);
// fatrelu (threshold), swiglustep (silu clamped, up clamped); swigluoai (interleaved gate / up
// pairs, clamps, alpha). Element-wise: gelu_new / gelu_fast (the tanh form), gelu_quick.
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry points.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"

namespace opmux {
namespace activation_cpu {

using cpu::from_float;
using cpu::to_float;

// Measured cut-over (benchmarks/bench_cpu.py, docs/benchmarks/cpu.md): below this many bytes
// moved (x read, out written) one thread is faster than a parallel region.
constexpr int64_t kParallelMinBytes = 64 << 10;
// Rows are shared out in pieces of this many elements, so one long row (T = 1) can use threads.
constexpr int64_t kPiece = 4096;

// The scalar parameters of an activation: fatrelu's threshold (a), swiglu's alpha (a), limit (b).
struct ActParams {
  float a = 0.0f, b = 0.0f;
};

// exp_f / normal_cdf_f (opmux/cpu_math.h) are branch-free, so the row loops below vectorize. Each
// activation has apply(g) (its value) and gated(g, u, p), the output of a gated pair; clamps are
// written as selects that keep a NaN input (as torch.clamp does).
OPMUX_CPU_INLINE float clamp_abs(float u, float l) { return u > l ? l : (u < -l ? -l : u); }

struct Silu {
  static OPMUX_CPU_INLINE float apply(float g) { return g / (1.0f + cpu::exp_f(-g)); }
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams&) { return apply(g) * u; }
};
// x * sigmoid(1.702 x) (element-wise only)
struct GeluQuick {
  static OPMUX_CPU_INLINE float apply(float g) { return g / (1.0f + cpu::exp_f(-1.702f * g)); }
};
// gelu(g) = g if g > threshold else 0 (F.threshold's test: NaN passes through)
struct Fatrelu {
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams& p) {
    return (g <= p.a ? 0.0f : g) * u;
  }
};
// min(silu(g), limit) * clamp(u, -limit, limit)
struct SwigluStep {
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams& p) {
    const float s = Silu::apply(g);
    return (s > p.b ? p.b : s) * clamp_abs(u, p.b);
  }
};
// gpt-oss: g = min(gate, limit), (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)
struct SwigluOai {
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams& p) {
    const float c = g > p.b ? p.b : g;
    return (clamp_abs(u, p.b) + 1.0f) * (c / (1.0f + cpu::exp_f(-p.a * c)));
  }
};
// 1 + erf(g / sqrt 2) and 1 + tanh(z) cancel for negative g; Phi by erfc (normal_cdf_f) and the
// sigmoid form 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z)) keep the tail's relative accuracy.
struct Gelu {
  static OPMUX_CPU_INLINE float apply(float g) {
    return g * cpu::normal_cdf_f(g);
  }
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams&) { return apply(g) * u; }
};
struct GeluTanh {
  static OPMUX_CPU_INLINE float apply(float g) {
    const float z = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return g / (1.0f + cpu::exp_f(-2.0f * z));
  }
  static OPMUX_CPU_INLINE float gated(float g, float u, const ActParams&) { return apply(g) * u; }
};

// vLLM's rounding (the kernel mode its compat entries select): the activation by the IEEE libm
// functions and division, rounded to T, then the product rounded to T (two roundings; bit-equal
// to vLLM's CUDA kernel where libm's expf and CUDA's agree, and for float32 nothing to round).
struct SiluIeee {
  static float apply(float g) { return g / (1.0f + std::exp(-g)); }
};
struct GeluIeee {  // vLLM's gelu_kernel: f * 0.5 * (1 + erf(f / sqrt 2))
  static float apply(float g) { return g * 0.5f * (1.0f + std::erf(g * 0.70710678118654752f)); }
};
struct GeluTanhIeee {  // vLLM's gelu_tanh_kernel
  static float apply(float g) {
    constexpr float kBeta = 0.79788456080286536f, kKappa = 0.044715f;
    const float cube = g * g * g;
    return 0.5f * g * (1.0f + std::tanh(kBeta * (g + kKappa * cube)));
  }
};
// gelu_new / gelu_fast in vLLM's rounding (csrc/activation_kernels.cu): each step rounded to T
// (rt), tanh by libm; float32 rounds nothing. Scalar (kScalarAct): libm calls do not vectorize.
template <typename T>
OPMUX_CPU_INLINE float rt(float v) {
  return to_float(from_float<T>(v));
}
template <typename T>
struct GeluNewVllm {
  static float apply(float x) {
    const float x3 = rt<T>(rt<T>(x * x) * x);
    const float t = rt<T>(std::tanh(rt<T>(0.79788456f * rt<T>(x + rt<T>(0.044715f * x3)))));
    return rt<T>(0.5f * x) * rt<T>(1.0f + t);
  }
};
template <typename T>
struct GeluFastVllm {
  static float apply(float x) {
    const float s = rt<T>(1.0f + rt<T>(rt<T>(0.044715f * x) * x));
    const float t = rt<T>(std::tanh(rt<T>(rt<T>(x * 0.79788456f) * s)));
    return rt<T>(0.5f * x) * rt<T>(1.0f + t);
  }
};
template <typename Act>
constexpr bool kScalarAct = false;
template <typename T>
constexpr bool kScalarAct<GeluNewVllm<T>> = true;
template <typename T>
constexpr bool kScalarAct<GeluFastVllm<T>> = true;

template <typename T, typename Ieee = SiluIeee>
void gated_vllm_row(T* o, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    o[i] = from_float<T>(to_float(from_float<T>(Ieee::apply(to_float(a[i])))) * to_float(b[i]));
}

// One row, in chunks through a float buffer: convert, activate, multiply, convert back. Each
// loop is a plain element-wise loop the compiler vectorizes (per ISA, see OPMUX_CPU_CLONES).
// float16 chunks go through float buffers (cpu::half_chunk_to_float: F16C where the CPU has it).
template <typename T, typename Act>
OPMUX_CPU_CLONES void gated_row(T* o, const T* a, const T* b, int64_t d, ActParams p) {
  float buf[cpu::kChunk];
  for (int64_t i0 = 0; i0 < d; i0 += cpu::kChunk) {
    const int n = static_cast<int>(d - i0 < cpu::kChunk ? d - i0 : cpu::kChunk);
    const T* ac = a + i0;
    const T* bc = b + i0;
    T* oc = o + i0;
    if constexpr (std::is_same<T, cpu::half_t>::value) {
      float fa[cpu::kChunk], fb[cpu::kChunk];
      cpu::half_chunk_to_float(fa, ac, n);
      cpu::half_chunk_to_float(fb, bc, n);
      for (int i = 0; i < n; ++i) buf[i] = Act::gated(fa[i], fb[i], p);
      cpu::half_chunk_from_float(oc, buf, n);
    } else {
      for (int i = 0; i < n; ++i) buf[i] = Act::gated(to_float(ac[i]), to_float(bc[i]), p);
      for (int i = 0; i < n; ++i) oc[i] = from_float<T>(buf[i]);
    }
  }
}

// One row of an element-wise activation, as gated_row.
template <typename T, typename Act>
OPMUX_CPU_CLONES void act_row(T* o, const T* a, int64_t d) {
  float buf[cpu::kChunk];
  for (int64_t i0 = 0; i0 < d; i0 += cpu::kChunk) {
    const int n = static_cast<int>(d - i0 < cpu::kChunk ? d - i0 : cpu::kChunk);
    if constexpr (std::is_same<T, cpu::half_t>::value) {
      float fa[cpu::kChunk];
      cpu::half_chunk_to_float(fa, a + i0, n);
      for (int i = 0; i < n; ++i) buf[i] = Act::apply(fa[i]);
      cpu::half_chunk_from_float(o + i0, buf, n);
    } else {
      for (int i = 0; i < n; ++i) buf[i] = Act::apply(to_float(a[i0 + i]));
      for (int i = 0; i < n; ++i) o[i0 + i] = from_float<T>(buf[i]);
    }
  }
}

// One row of swigluoai: pairs (gate, up) interleaved, x[2i] and x[2i + 1].
template <typename T>
OPMUX_CPU_CLONES void oai_row(T* o, const T* x, int64_t d, ActParams p) {
  float buf[cpu::kChunk];
  for (int64_t i0 = 0; i0 < d; i0 += cpu::kChunk) {
    const int n = static_cast<int>(d - i0 < cpu::kChunk ? d - i0 : cpu::kChunk);
    const T* xc = x + 2 * i0;
    if constexpr (std::is_same<T, cpu::half_t>::value) {
      float fx[2 * cpu::kChunk];
      cpu::half_chunk_to_float(fx, xc, 2 * n);
      for (int i = 0; i < n; ++i) buf[i] = SwigluOai::gated(fx[2 * i], fx[2 * i + 1], p);
      cpu::half_chunk_from_float(o + i0, buf, n);
    } else {
      for (int i = 0; i < n; ++i) buf[i] = SwigluOai::gated(to_float(xc[2 * i]), to_float(xc[2 * i + 1]), p);
      for (int i = 0; i < n; ++i) o[i0 + i] = from_float<T>(buf[i]);
    }
  }
}

#if OPMUX_CPU_VEC512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace v512 {
using namespace cpu::v512;

// The activations of Silu / Gelu / GeluTanh on 16 lanes (same formulas; 1 / d by recip_ge1). The
// exponentials are 2^y (exp2_16) with log2(e) folded into the argument's constants: the kernels
// are compute-bound on a core with one 512-bit FMA unit, and this is 4-8 of their 25-40 vector
// operations per 16 lanes. Infinite and NaN inputs give what the references give (inf, -inf and
// NaN in; tests/native/aarch64/kernel_check.cpp checks them at every vector level).
template <typename Act> struct Vec;
// The gated output of an activation that multiplies its value by up.
template <typename Act> struct VecMul {
  static OPMUX_V512_INLINE __m512 gated(__m512 g, __m512 u, const ActParams&) {
    return _mm512_mul_ps(Vec<Act>::apply(g), u);
  }
};
template <> struct Vec<Silu> : VecMul<Silu> {
  static OPMUX_V512_INLINE __m512 apply(__m512 g) {
    // e^-g = 2^(-g log2 e); g = +inf gives y = -inf, clamped (e = 0, silu = inf); a NaN y becomes
    // -200 there, and g's NaN makes the product NaN.
    const __m512 y = _mm512_max_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.44269504088896341f)),
                                   _mm512_set1_ps(-200.0f));
    return _mm512_mul_ps(g, recip_ge1(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_16(y))));
  }
};
template <> struct Vec<GeluTanh> : VecMul<GeluTanh> {
  static OPMUX_V512_INLINE __m512 apply(__m512 g) {
    // e^(-2z), z = sqrt(2/pi) (g + 0.044715 g^3): 2^y with y = g (c + 0.044715 c g^2), c =
    // -2 sqrt(2/pi) log2(e); clamped both ways (g^3 overflows for |g| > 2e12, y is then +-inf).
    constexpr float c = -2.0f * 0.79788456080286536f * 1.44269504088896341f;
    const __m512 g2 = _mm512_mul_ps(g, g);
    __m512 y = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_set1_ps(0.044715f * c), g2, _mm512_set1_ps(c)));
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-200.0f)), _mm512_set1_ps(200.0f));
    return _mm512_mul_ps(g, recip_ge1(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_16(y))));
  }
};
template <> struct Vec<Gelu> : VecMul<Gelu> {
  // g Phi(g) = g h for g <= 0 and g (1 - h) above, h = erfc(x) / 2, x = |g| / sqrt 2: no
  // cancellation in the negative tail, whose relative accuracy the reference keeps (erfc). h by a
  // fit of the Numerical Recipes erfcc form, t = 1 / (1 + x / 2), h = t 2^(P(t) - x^2 log2 e),
  // P of degree 8 fitted in log2 units over x in [0, 10.5] (t in [0.16, 1]; error 4e-7 in log2
  // units, 2.8e-7 relative): x is clamped to 10.5, where erfc is 0 in float, so t needs no
  // infinity check and 2^y no clamp. The result's relative error against the exact gelu is that
  // of its input's rounding in the far tail (~2e-5 at g = -13, where gelu is 1e-37) and below
  // 1e-6 wherever the result is above 1e-30 (the old Chebyshev fit of the same form, degree 9,
  // with exp16: the same figures, 7 more vector operations).
  static OPMUX_V512_INLINE __m512 apply(__m512 g) {
    const __m512 a = _mm512_mul_ps(g, _mm512_set1_ps(-0.70710678118654752f));
    const __m512 x = _mm512_min_ps(_mm512_abs_ps(a), _mm512_set1_ps(10.5f));  // NaN -> 10.5
    const __m512 d = _mm512_fmadd_ps(x, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_rcp14_ps(d);  // d in [1, 6.25]: one Newton step, ~2^-27
    const __m512 t = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
    __m512 p = _mm512_set1_ps(1.079749912e-01f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-7.742881775e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(2.072937250e+00f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-2.507691383e+00f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.186442614e+00f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-3.223462105e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(6.290956736e-01f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.433197498e+00f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-2.825322628e+00f));  // log2(erfc(x) / (2t)) + x^2 log2 e
    const __m512 y = _mm512_fnmadd_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), x, p);
    __m512 h = _mm512_mul_ps(t, exp2_16(y));
    const __mmask16 pos = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ);  // g > 0
    h = _mm512_mask_sub_ps(h, pos, _mm512_set1_ps(1.0f), h);
    return _mm512_mul_ps(g, h);
  }
};
// Silu's form with the argument scaled by 1.702 (element-wise only).
template <> struct Vec<GeluQuick> {
  static OPMUX_V512_INLINE __m512 apply(__m512 g) {
    const __m512 y = _mm512_max_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.702f * 1.44269504088896341f)),
                                   _mm512_set1_ps(-200.0f));
    return _mm512_mul_ps(g, recip_ge1(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_16(y))));
  }
};
// g <= threshold -> 0 (a NaN g compares false and stays), times up.
template <> struct Vec<Fatrelu> {
  static OPMUX_V512_INLINE __m512 gated(__m512 g, __m512 u, const ActParams& p) {
    const __mmask16 off = _mm512_cmp_ps_mask(g, _mm512_set1_ps(p.a), _CMP_LE_OQ);
    return _mm512_mul_ps(_mm512_mask_mov_ps(g, off, _mm512_setzero_ps()), u);
  }
};
// v > l -> l, v < -l -> -l, else v (NaN stays): the scalar selects, lane-wise.
OPMUX_V512_INLINE __m512 clamp_hi(__m512 v, __m512 l) {
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, l, _CMP_GT_OQ), l);
}
OPMUX_V512_INLINE __m512 clamp_abs16(__m512 v, __m512 l) {
  const __m512 nl = _mm512_sub_ps(_mm512_setzero_ps(), l);
  return _mm512_mask_mov_ps(clamp_hi(v, l), _mm512_cmp_ps_mask(v, nl, _CMP_LT_OQ), nl);
}
template <> struct Vec<SwigluStep> {
  static OPMUX_V512_INLINE __m512 gated(__m512 g, __m512 u, const ActParams& p) {
    const __m512 l = _mm512_set1_ps(p.b);
    return _mm512_mul_ps(clamp_hi(Vec<Silu>::apply(g), l), clamp_abs16(u, l));
  }
};

// gpt-oss: c = min(g, limit), (clamp(u, -limit, limit) + 1) * c * sigmoid(alpha c); the
// sigmoid as Silu's (2^y, y = -alpha c log2 e clamped to [-200, 200]: alpha may be negative).
template <> struct Vec<SwigluOai> {
  static OPMUX_V512_INLINE __m512 gated(__m512 g, __m512 u, const ActParams& p) {
    const __m512 l = _mm512_set1_ps(p.b);
    const __m512 c = clamp_hi(g, l);
    __m512 y = _mm512_mul_ps(c, _mm512_set1_ps(-p.a * 1.44269504088896341f));
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-200.0f)), _mm512_set1_ps(200.0f));
    const __m512 sig = _mm512_mul_ps(c, recip_ge1(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_16(y))));
    return _mm512_mul_ps(_mm512_add_ps(clamp_abs16(u, l), _mm512_set1_ps(1.0f)), sig);
  }
};

// o[0, n) = swigluoai of the n (gate, up) pairs at x (x[2i], x[2i + 1]): 32 elements a step,
// split into their even (gate) and odd (up) lanes; the tail masked.
template <bool NB, typename T>
void oai_piece(T* o, const T* x, int64_t n, const ActParams& p) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m512 a = load(x + 2 * i), b = load(x + 2 * i + kW);
    const __m512 g = _mm512_permutex2var_ps(a, even, b), u = _mm512_permutex2var_ps(a, odd, b);
    store<NB>(o + i, Vec<SwigluOai>::gated(g, u, p));
  }
  if (i < n) {
    const int64_t e = 2 * (n - i);  // elements left, < 2 kW
    const __m512 a = load(x + 2 * i, tail_mask(e)), b = load(x + 2 * i + kW, tail_mask(e > kW ? e - kW : 0));
    const __m512 g = _mm512_permutex2var_ps(a, even, b), u = _mm512_permutex2var_ps(a, odd, b);
    store<NB>(o + i, Vec<SwigluOai>::gated(g, u, p), tail_mask(n - i));
  }
}

// o[0, n) = act(a), 16 lanes at a time, the tail masked.
template <bool NB, typename T, typename Act>
void act_piece(T* o, const T* a, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) store<NB>(o + i, Vec<Act>::apply(load(a + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    store<NB>(o + i, Vec<Act>::apply(load(a + i, m)), m);
  }
}

// o[0, n) = act(a) * b, 16 lanes at a time, the tail masked. NB: bfloat16 by vcvtneps2bf16.
template <bool NB, typename T, typename Act>
void gated_piece(T* o, const T* a, const T* b, int64_t n, const ActParams& p) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) store<NB>(o + i, Vec<Act>::gated(load(a + i), load(b + i), p));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    store<NB>(o + i, Vec<Act>::gated(load(a + i, m), load(b + i, m), p), m);
  }
}

}  // namespace v512
#pragma GCC pop_options
#endif  // OPMUX_CPU_VEC512

#if OPMUX_CPU_F16C
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace v256 {
using namespace cpu::v256;

// Phi(g) on 8 lanes: cpu::normal_cdf_f (the same fit, the same Estrin order).
OPMUX_V256_INLINE __m256 normal_cdf8(__m256 g) {
  const __m256 a = _mm256_mul_ps(g, _mm256_set1_ps(-0.70710678118654752f));
  const __m256 x = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a), _mm256_set1_ps(10.5f));
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(x, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
  const __m256 t2 = _mm256_mul_ps(t, t), t4 = _mm256_mul_ps(t2, t2);
  const __m256 p01 = _mm256_fmadd_ps(_mm256_set1_ps(1.433197498e+00f), t, _mm256_set1_ps(-2.825322628e+00f));
  const __m256 p23 = _mm256_fmadd_ps(_mm256_set1_ps(-3.223462105e-01f), t, _mm256_set1_ps(6.290956736e-01f));
  const __m256 p45 = _mm256_fmadd_ps(_mm256_set1_ps(-2.507691383e+00f), t, _mm256_set1_ps(1.186442614e+00f));
  const __m256 p67 = _mm256_fmadd_ps(_mm256_set1_ps(-7.742881775e-01f), t, _mm256_set1_ps(2.072937250e+00f));
  const __m256 p03 = _mm256_fmadd_ps(p23, t2, p01), p47 = _mm256_fmadd_ps(p67, t2, p45);
  const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(1.079749912e-01f), t4, p47), t4, p03);
  const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), x, p);
  const __m256 h = _mm256_mul_ps(t, exp2_8(y));
  const __m256 pos = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ);  // g > 0: 1 - h
  return _mm256_blendv_ps(h, _mm256_sub_ps(_mm256_set1_ps(1.0f), h), pos);
}

// o[0, n) = gelu(a) * b, four vectors of 8 a step: one gelu is a chain of ~70 cycles of latency,
// longer than the out-of-order window covers, so independent vectors side by side are what keep
// the units busy (on a Zen 2 EPYC, 1 thread, T = 256: the portable loop 8.0 ms in every dtype;
// two vectors a step 5.9 ms fp32, 7.7 bf16; four 5.6, 6.5, fp16 5.8). Returns how many elements
// it did (a multiple of 8); the caller finishes the row.
template <typename T>
int64_t gelu_gated(T* o, const T* a, const T* b, int64_t n) {
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    const __m256 g0 = load(a + i), g1 = load(a + i + kW), g2 = load(a + i + 2 * kW), g3 = load(a + i + 3 * kW);
    const __m256 h0 = normal_cdf8(g0), h1 = normal_cdf8(g1), h2 = normal_cdf8(g2), h3 = normal_cdf8(g3);
    store(o + i, _mm256_mul_ps(_mm256_mul_ps(g0, h0), load(b + i)));
    store(o + i + kW, _mm256_mul_ps(_mm256_mul_ps(g1, h1), load(b + i + kW)));
    store(o + i + 2 * kW, _mm256_mul_ps(_mm256_mul_ps(g2, h2), load(b + i + 2 * kW)));
    store(o + i + 3 * kW, _mm256_mul_ps(_mm256_mul_ps(g3, h3), load(b + i + 3 * kW)));
  }
  for (; i + kW <= n; i += kW) {
    const __m256 g = load(a + i);
    store(o + i, _mm256_mul_ps(_mm256_mul_ps(g, normal_cdf8(g)), load(b + i)));
  }
  return i;
}

}  // namespace v256
#pragma GCC pop_options
#endif  // OPMUX_CPU_F16C

// One piece of a row on the vector level of this CPU (cpu::vec_level()).
template <typename T, typename Act>
OPMUX_CPU_INLINE void gated_piece(int level, T* o, const T* a, const T* b, int64_t n,
                                  const ActParams& p) {
#if OPMUX_CPU_VEC512
  if (level == 2) return v512::gated_piece<true, T, Act>(o, a, b, n, p);
  if (level == 1) return v512::gated_piece<false, T, Act>(o, a, b, n, p);
#endif
#if OPMUX_CPU_F16C
  if constexpr (std::is_same<Act, Gelu>::value) {
    if (cpu::has_v256()) {
      const int64_t done = v256::gelu_gated(o, a, b, n);
      if (done == n) return;
      o += done, a += done, b += done, n -= done;
    }
  }
#endif
  (void)level;
  gated_row<T, Act>(o, a, b, n, p);
}

template <typename T>
OPMUX_CPU_INLINE void oai_piece(int level, T* o, const T* x, int64_t n, const ActParams& p) {
#if OPMUX_CPU_VEC512
  if (level == 2) return v512::oai_piece<true, T>(o, x, n, p);
  if (level == 1) return v512::oai_piece<false, T>(o, x, n, p);
#endif
  (void)level;
  oai_row<T>(o, x, n, p);
}

template <typename T, typename Act>
OPMUX_CPU_INLINE void act_piece(int level, T* o, const T* a, int64_t n) {
  if constexpr (kScalarAct<Act>) {
    for (int64_t i = 0; i < n; ++i) o[i] = from_float<T>(Act::apply(to_float(a[i])));
    return;
  }
#if OPMUX_CPU_VEC512
  if constexpr (!kScalarAct<Act>) {
    if (level == 2) return v512::act_piece<true, T, Act>(o, a, n);
    if (level == 1) return v512::act_piece<false, T, Act>(o, a, n);
  }
#endif
  (void)level;
  if constexpr (!kScalarAct<Act>) act_row<T, Act>(o, a, n);
}

// Layout of a gated row: kHalves (gate = x[:d], up = x[d:]), kSwapped (mul_and_silu: gate =
// x[d:], up = x[:d]), kPairs (swigluoai: gate x[2i], up x[2i + 1]), kVllm (kSwapped or kHalves in
// vLLM's rounding, scalar libm: see gated_vllm_row).
enum Layout { kHalves, kSwapped, kPairs, kVllmHalves, kVllmSwapped };

// The libm form of an activation, for vLLM's rounding (Silu's for mul_and_silu).
template <typename Act> struct IeeeOf { using type = SiluIeee; };
template <> struct IeeeOf<Gelu> { using type = GeluIeee; };
template <> struct IeeeOf<GeluTanh> { using type = GeluTanhIeee; };

template <typename T, typename Act, Layout L = kHalves>
void gated_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows,
                int64_t d, ActParams p = {}) {
  const int64_t pieces = (d + kPiece - 1) / kPiece, items = rows * pieces;
  const int nt = cpu::threads_for(rows * d * 3 * static_cast<int64_t>(sizeof(T)), kParallelMinBytes, items);
  const int level = cpu::vec_level();
  (void)nt;
  if (out_stride == d) cpu::advise_huge_pages(out, rows * d * static_cast<int64_t>(sizeof(T)));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t it = 0; it < items; ++it) {
    const int64_t r = it / pieces, i0 = (it % pieces) * kPiece;
    const int64_t n = d - i0 < kPiece ? d - i0 : kPiece;
    T* o = out + r * out_stride + i0;
    const T* a = x + r * x_stride + i0;  // the first half
    if constexpr (L == kHalves) gated_piece<T, Act>(level, o, a, a + d, n, p);
    if constexpr (L == kSwapped) gated_piece<T, Act>(level, o, a + d, a, n, p);
    if constexpr (L == kPairs) oai_piece<T>(level, o, x + r * x_stride + 2 * i0, n, p);
    if constexpr (L == kVllmHalves) gated_vllm_row<T, typename IeeeOf<Act>::type>(o, a, a + d, n);
    if constexpr (L == kVllmSwapped) gated_vllm_row<T, typename IeeeOf<Act>::type>(o, a + d, a, n);
  }
}

template <typename T, typename Act>
void act_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows, int64_t d) {
  const int64_t pieces = (d + kPiece - 1) / kPiece, items = rows * pieces;
  const int nt = cpu::threads_for(rows * d * 2 * static_cast<int64_t>(sizeof(T)), kParallelMinBytes, items);
  const int level = cpu::vec_level();
  (void)nt;
  if (out_stride == d) cpu::advise_huge_pages(out, rows * d * static_cast<int64_t>(sizeof(T)));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t it = 0; it < items; ++it) {
    const int64_t r = it / pieces, i0 = (it % pieces) * kPiece;
    const int64_t n = d - i0 < kPiece ? d - i0 : kPiece;
    act_piece<T, Act>(level, out + r * out_stride + i0, x + r * x_stride + i0, n);
  }
}


}  // namespace activation_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/checks.h"
#include "opmux/contracts/activation.h"

namespace opmux {
namespace activation_cpu {

template <typename Act, Layout L = kHalves>
void run(const char* op, TensorView out, TensorView x, ActParams p = {}) {
  RowsArgs a = check_silu_and_mul_args(op, kDLCPU, out, x);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    gated_impl<scalar_t, Act, L>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                                 x_stride, a.rows, a.hidden, p);
  });
}

// Act, or VllmAct<T> with vllm_rounding.
template <typename Act, template <typename> class VllmAct = GeluNewVllm>
void run_act(const char* op, TensorView out, TensorView x, bool vllm_rounding = false) {
  RowsArgs a = check_elementwise_args(op, kDLCPU, out, x);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    if (vllm_rounding) {
      act_impl<scalar_t, VllmAct<scalar_t>>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                                            x_stride, a.rows, a.hidden);
    } else {
      act_impl<scalar_t, Act>(data_ptr<scalar_t>(out), out_stride, data_ptr<const scalar_t>(x),
                              x_stride, a.rows, a.hidden);
    }
  });
}

// vllm_rounding: vLLM's roundings (see gated_vllm_row); else opmux's (fp32, one rounding).
void mul_and_silu_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  if (vllm_rounding) return run<Silu, kVllmSwapped>("opmux.mul_and_silu", out, x);
  run<Silu, kSwapped>("opmux.mul_and_silu", out, x);
}
void fatrelu_and_mul_cpu(TensorView out, TensorView x, double threshold) {
  run<Fatrelu>("opmux.fatrelu_and_mul", out, x, {static_cast<float>(threshold), 0.0f});
}
void swiglustep_and_mul_cpu(TensorView out, TensorView x, double limit) {
  run<SwigluStep>("opmux.swiglustep_and_mul", out, x, {0.0f, static_cast<float>(limit)});
}
void swigluoai_and_mul_cpu(TensorView out, TensorView x, double alpha, double limit) {
  run<SwigluOai, kPairs>("opmux.swigluoai_and_mul", out, x,
                         {static_cast<float>(alpha), static_cast<float>(limit)});
}
void gelu_new_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  run_act<GeluTanh, GeluNewVllm>("opmux.gelu_new", out, x, vllm_rounding);
}
void gelu_fast_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  run_act<GeluTanh, GeluFastVllm>("opmux.gelu_fast", out, x, vllm_rounding);
}
void gelu_quick_cpu(TensorView out, TensorView x) { run_act<GeluQuick>("opmux.gelu_quick", out, x); }

// vllm_rounding: vLLM's roundings (gated_vllm_row, libm); else opmux's (fp32, one rounding).
void silu_and_mul_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  if (vllm_rounding) return run<Silu, kVllmHalves>("opmux.silu_and_mul", out, x);
  run<Silu>("opmux.silu_and_mul", out, x);
}
void gelu_and_mul_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  if (vllm_rounding) return run<Gelu, kVllmHalves>("opmux.gelu_and_mul", out, x);
  run<Gelu>("opmux.gelu_and_mul", out, x);
}
void gelu_tanh_and_mul_cpu(TensorView out, TensorView x, bool vllm_rounding) {
  if (vllm_rounding) return run<GeluTanh, kVllmHalves>("opmux.gelu_tanh_and_mul", out, x);
  run<GeluTanh>("opmux.gelu_tanh_and_mul", out, x);
}

}  // namespace activation_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_cpu, opmux::activation_cpu::silu_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul_cpu, opmux::activation_cpu::gelu_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul_cpu, opmux::activation_cpu::gelu_tanh_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul_and_silu_cpu, opmux::activation_cpu::mul_and_silu_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fatrelu_and_mul_cpu, opmux::activation_cpu::fatrelu_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(swiglustep_and_mul_cpu, opmux::activation_cpu::swiglustep_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(swigluoai_and_mul_cpu, opmux::activation_cpu::swigluoai_and_mul_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_new_cpu, opmux::activation_cpu::gelu_new_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_fast_cpu, opmux::activation_cpu::gelu_fast_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_quick_cpu, opmux::activation_cpu::gelu_quick_cpu);
// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/activation_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
