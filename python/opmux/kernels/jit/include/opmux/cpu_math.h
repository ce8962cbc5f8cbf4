// Vectorizable float math and function multiversioning for the CPU units.
//
// OPMUX_CPU_CLONES marks a hot per-row / per-chunk kernel for GCC function multiversioning: the
// compiler emits an AVX-512F, an x86-64-v3 (AVX2 + FMA + F16C + BMI), an AVX2 and a baseline
// x86-64 copy and an ifunc resolver picks one at load time, so the library stays portable (no
// -march flag) yet runs wide vectors where the CPU has them. Empty on other compilers / targets.
// Feature names and ISA levels, not "arch=haswell" / "arch=skylake-avx512": a CPU-name clone is
// chosen by CPU *model*, so an AMD EPYC with AVX-512 would fall back to the baseline copy; the
// x86-64-v3 level is tested by its features (GCC 12: __builtin_cpu_supports("x86-64-v3")), which
// every AVX2 CPU of the last decade has, Intel and AMD alike. Its FMA makes the polynomials of
// exp_f / normal_cdf_f ~15% faster on an AVX2 EPYC (the AVX2 copy stays for an AVX2 CPU without FMA).
//
// exp_f / exp2_f / sigmoid_f / tanh_f / normal_cdf_f are branch-free (selects only, no libm
// calls), so a loop that calls them vectorizes. exp_f: Cephes range reduction + degree-6
// polynomial, ~1-2 ulp, overflow -> inf, underflow -> 0 (through subnormals), NaN -> NaN.
// normal_cdf_f: relative error of g Phi(g) below 1e-6 for g >= -2.4, growing to ~2e-5 in the far
// negative tail (g ~ -11, the conditioning of erfc at the input's rounding: Cephes erfcf's was the
// same), with no cancellation where 1 + erf would cancel.
// The vector clones may contract a * b + c into FMA, so their last bit can differ from the
// baseline copy (well inside fp32 tolerances).
#pragma once

#include <cstdint>

#include "opmux/cpu_types.h"  // OPMUX_CPU_INLINE

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && \
    defined(__linux__) && !defined(OPMUX_CPU_NO_CLONES)
#define OPMUX_CPU_CLONES \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8 && defined(__x86_64__) && \
    defined(__linux__) && !defined(OPMUX_CPU_NO_CLONES)
#define OPMUX_CPU_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OPMUX_CPU_CLONES
#endif

namespace opmux {
namespace cpu {

OPMUX_CPU_INLINE float sel(bool c, float a, float b) { return c ? a : b; }

// e^x.
OPMUX_CPU_INLINE float exp_f(float x) {
  // Clamp (NaN passes: both comparisons are false). e^-150 = 0 and e^150 = inf in float.
  x = x < -150.0f ? -150.0f : x;
  x = x > 150.0f ? 150.0f : x;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  const int32_t ni = static_cast<int32_t>(f32_to_bits(t) - f32_to_bits(kMagic));
  float r = x - n * 0.693359375f;  // ln 2 split in two, the first part exact times n
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as two factors so that |n| up to 217 neither wraps the exponent nor loses subnormals.
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = bits_to_f32(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_f32(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

// 1 / (1 + e^-x).
OPMUX_CPU_INLINE float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

// tanh: Cephes tanhf (odd polynomial for |x| < 0.625, 1 - 2 / (e^2|x| + 1) above).
OPMUX_CPU_INLINE float tanh_f(float x) {
  const float ax = __builtin_fabsf(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  float big = 1.0f - 2.0f / (exp_f(ax + ax) + 1.0f);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}

// 2^y for finite y >= -200 or NaN (callers clamp): y = n + f, n = round(y), f in [-0.5, 0.5]
// exact, 2^f by Cephes' exp2f polynomial (relative error ~1.5e-7), 2^n as two factors (as exp_f).
// The scalar twin of v512::exp2_16, for kernels whose exponent is already in log2 units.
OPMUX_CPU_INLINE float exp2_f(float y) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = y + kMagic;
  const float n = t - kMagic;
  const int32_t ni = static_cast<int32_t>(f32_to_bits(t) - f32_to_bits(kMagic));
  const float f = y - n;
  // Estrin's scheme: 3 dependent multiply-adds instead of Horner's 6 (the kernels that call this
  // are bound by the latency of their chains, not by the number of operations)
  const float f2 = f * f;
  const float e01 = 6.931472028550421e-1f * f + 1.0f;
  const float e23 = 5.550332471162809e-2f * f + 2.402264791363012e-1f;
  const float e45 = 1.339887440266574e-3f * f + 9.618437357674640e-3f;
  const float e46 = 1.535336188319500e-4f * f2 + e45;
  const float q = (e46 * f2 + e23) * f2 + e01;
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = bits_to_f32(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_f32(static_cast<uint32_t>(n2 + 127) << 23);
  return q * s1 * s2;
}

// Phi(g), the standard normal CDF, as the factor of g Phi(g) (gelu): h = erfc(x) / 2 for
// x = |g| / sqrt 2 by the Numerical Recipes erfcc form t 2^(P(t) - x^2 log2 e), t = 1 / (1 + x / 2),
// P of degree 8 fitted in log2 units over x in [0, 10.5] (v512's Gelu: the same fit), then
// Phi = h for g <= 0 and 1 - h above, so the negative tail keeps its relative accuracy. One
// division, 9 + 7 multiply-adds and no selects beyond the clamp and the sign: half the work of the
// Cephes erfcf it replaces (three polynomials, an exponential and a division) in the
// compute-bound gelu rows.
OPMUX_CPU_INLINE float normal_cdf_f(float g) {
  const float a = g * -0.70710678118654752f;
  float x = __builtin_fabsf(a);
  x = x > 10.5f ? 10.5f : x;  // erfc(10.5) underflows to 0; NaN passes
  const float t = 1.0f / (x * 0.5f + 1.0f);
  // P by Estrin's scheme (depth 4 instead of Horner's 8: see exp2_f)
  const float t2 = t * t, t4 = t2 * t2;
  const float p01 = 1.433197498e+00f * t - 2.825322628e+00f;
  const float p23 = -3.223462105e-01f * t + 6.290956736e-01f;
  const float p45 = -2.507691383e+00f * t + 1.186442614e+00f;
  const float p67 = -7.742881775e-01f * t + 2.072937250e+00f;
  const float p03 = p23 * t2 + p01, p47 = p67 * t2 + p45;
  const float p = (1.079749912e-01f * t4 + p47) * t4 + p03;  // log2(erfc(x) / (2t)) + x^2 log2 e
  const float h = t * exp2_f(p - x * 1.44269504088896341f * x);
  return a < 0.0f ? 1.0f - h : h;
}

// Rows are processed in chunks of this many elements through a float buffer on the stack.
constexpr int kChunk = 256;

}  // namespace cpu
}  // namespace opmux
