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
// exp_f / erfc_f ~15% faster on an AVX2 EPYC (the AVX2 copy stays for an AVX2 CPU without FMA).
//
// exp_f / sigmoid_f / tanh_f / erfc_f are branch-free (selects only, no libm calls), so a loop
// that calls them vectorizes. exp_f: Cephes range reduction + degree-6 polynomial, ~1-2 ulp,
// overflow -> inf, underflow -> 0 (through subnormals), NaN -> NaN. erfc_f: Cephes erfcf,
// relative accuracy ~1e-6 over the whole range, including the tail where 1 - erf cancels.
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

// erfc(a) (Cephes erfcf): 1 - a T(a^2) for |a| < 1; e^-a^2 / |a| * P(1/a^2) above (two
// ranges), reflected as 2 - erfc(|a|) for a < 0.
OPMUX_CPU_INLINE float erfc_f(float a) {
  float x = __builtin_fabsf(a);
  const float z = a * a;
  float t = 7.853861353153693e-5f;
  t = t * z - 8.010193625184903e-4f;
  t = t * z + 5.188327685732524e-3f;
  t = t * z - 2.685381193529856e-2f;
  t = t * z + 1.128358514861418e-1f;
  t = t * z - 3.761262582423300e-1f;
  t = t * z + 1.128379165726710e+0f;
  const float near = 1.0f - a * t;
  x = x > 10.5f ? 10.5f : x;  // erfc(10.5) underflows to 0; NaN passes
  const float q = 1.0f / x;
  const float y = q * q;
  float p = 2.326819970068386e-2f;  // 1 <= x < 2
  p = p * y - 1.387039388740657e-1f;
  p = p * y + 3.687424674597105e-1f;
  p = p * y - 5.824733027278666e-1f;
  p = p * y + 6.210004621745983e-1f;
  p = p * y - 4.944515323274145e-1f;
  p = p * y + 3.404879937665872e-1f;
  p = p * y - 2.741127028184656e-1f;
  p = p * y + 5.638259427386472e-1f;
  float r = -1.047766399936249e+1f;  // x >= 2
  r = r * y + 1.297719955372516e+1f;
  r = r * y - 7.495518717768503e+0f;
  r = r * y + 2.921019019210786e+0f;
  r = r * y - 1.015265279202700e+0f;
  r = r * y + 4.218463358204948e-1f;
  r = r * y - 2.820767439740514e-1f;
  r = r * y + 5.641895067754075e-1f;
  float far = exp_f(-(x * x)) * q * (x < 2.0f ? p : r);
  far = a < 0.0f ? 2.0f - far : far;
  return __builtin_fabsf(a) < 1.0f ? near : far;
}

// Rows are processed in chunks of this many elements through a float buffer on the stack.
constexpr int kChunk = 256;

}  // namespace cpu
}  // namespace opmux
