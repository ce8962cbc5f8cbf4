// Portable float16 / bfloat16 storage types and float conversions for the CPU units.
// No torch, no _Float16 and no -march: branch-free bit manipulation that the compiler can
// vectorize with baseline SSE2. Rounding is round-to-nearest-even, like torch's .to(dtype).
#pragma once

#include <cstdint>
#include <cstring>

// Helpers called from multiversioned kernels (OPMUX_CPU_CLONES in cpu_math.h) must be forced
// inline: GCC does not inline a plain function into a clone built for another target.
#if defined(__GNUC__)
#define OPMUX_CPU_INLINE inline __attribute__((always_inline))
#else
#define OPMUX_CPU_INLINE inline
#endif

namespace opmux {
namespace cpu {

struct half_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

OPMUX_CPU_INLINE float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
OPMUX_CPU_INLINE uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// IEEE half -> float (after M. Dukhan's FP16 library, MIT): normals are rebased by an
// exponent offset and a power-of-two scale; subnormals go through a magic-number subtract.
// The select is a mask on a signed compare (two_w >> 1 fits in int32): x86 has no unsigned
// vector compare before AVX-512, and with one GCC left the loops around this scalar (~6x
// slower on an AVX2 CPU, where the fp16 kernels run this portable path).
OPMUX_CPU_INLINE float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // drops the sign bit
  const float normalized = bits_to_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_to_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t sub = 0u - static_cast<uint32_t>(static_cast<int32_t>(two_w >> 1) < (1 << 26));
  const uint32_t mag = (f32_to_bits(denormalized) & sub) | (f32_to_bits(normalized) & ~sub);
  return bits_to_f32(sign | mag);
}

// float -> IEEE half, round to nearest even; overflow -> inf, NaN -> quiet NaN. The compares
// are signed, on |f|'s bits (see half_to_float: they keep the loops vectorized).
OPMUX_CPU_INLINE uint16_t float_to_half(float f) {
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;  // rounds, saturates to inf
  const uint32_t w = f32_to_bits(f);
  const uint32_t sign = w & 0x80000000u;
  const int32_t mag = static_cast<int32_t>(w & 0x7FFFFFFFu);
  int32_t bias = mag & 0x7F800000;
  bias = bias < 0x38800000 ? 0x38800000 : bias;
  base = bits_to_f32(static_cast<uint32_t>(bias) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  const uint32_t nan = 0u - static_cast<uint32_t>(mag > 0x7F800000);
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & nan) | (nonsign & ~nan));
}

OPMUX_CPU_INLINE float bf16_to_float(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }

// float -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
OPMUX_CPU_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

OPMUX_CPU_INLINE float to_float(float v) { return v; }
OPMUX_CPU_INLINE float to_float(half_t v) { return half_to_float(v.bits); }
OPMUX_CPU_INLINE float to_float(bf16_t v) { return bf16_to_float(v.bits); }

template <typename T> OPMUX_CPU_INLINE T from_float(float v);
template <> OPMUX_CPU_INLINE float from_float<float>(float v) { return v; }
template <> OPMUX_CPU_INLINE half_t from_float<half_t>(float v) { return half_t{float_to_half(v)}; }
template <> OPMUX_CPU_INLINE bf16_t from_float<bf16_t>(float v) { return bf16_t{float_to_bf16(v)}; }

// *p = v rounded to T; returns the value stored, as a load of it would give. Through the bits,
// not a struct copy: GCC's vectorizer does not take an aggregate assignment ("more than one data
// ref"), so a loop that stores a named half_t / bf16_t stays scalar.
OPMUX_CPU_INLINE float store_rounded(float* p, float v) { *p = v; return v; }
OPMUX_CPU_INLINE float store_rounded(half_t* p, float v) {
  const uint16_t b = float_to_half(v);
  p->bits = b;
  return half_to_float(b);
}
OPMUX_CPU_INLINE float store_rounded(bf16_t* p, float v) {
  const uint16_t b = float_to_bf16(v);
  p->bits = b;
  return bf16_to_float(b);
}

// A [tokens, heads, dim] tensor (dim dense) as the per-head CPU kernels (qk_norm, rope) address
// it: base + t * token_stride + h * head_stride, in elements. The tvm-ffi side fills it from the
// checked opmux::Heads (opmux/head_checks.h); the kernels themselves need no tvm-ffi.
struct HeadLayout {
  int64_t tokens;
  int64_t heads;
  int64_t token_stride;
  int64_t head_stride;
};

}  // namespace cpu
}  // namespace opmux
