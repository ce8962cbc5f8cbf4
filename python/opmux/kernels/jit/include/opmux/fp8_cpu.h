// float -> fp8 e4m3fn (and UE8M0 scale rounding) for the CPU units, by bit manipulation (no torch, no -march).
// Round to nearest even; |x| >= 448 (and inf) saturate to +-448 ("satfinite", like CUDA's
// __NV_SATFINITE); NaN -> 0x7F with x's sign. Matches torch's .to(torch.float8_e4m3fn) for
// every |x| < 464 (torch maps larger values to NaN; callers clamp first).
#pragma once

#include <cstdint>

#include "opmux/cpu_types.h"  // OPMUX_CPU_INLINE

namespace opmux {
namespace cpu {

OPMUX_CPU_INLINE uint8_t float_to_e4m3fn(float f) {
  uint32_t u = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return sign | 0x7Fu;   // NaN
  if (u >= 0x43E00000u) return sign | 0x7Eu;  // >= 448.0: saturate to 448 (S.1111.110)
  if (u < (121u << 23)) {
    // Below 2^-6: subnormal grid of 2^-9. Adding 2^14 (whose fp32 ulp is 2^-9) rounds to
    // nearest even on that grid; the low bits are then the e4m3 code (8 carries to 2^-6).
    const float r = bits_to_f32(u) + bits_to_f32(141u << 23);
    return sign | static_cast<uint8_t>(f32_to_bits(r) - (141u << 23));
  }
  // Normal: rebias the exponent (127 -> 7) and round the 23-bit mantissa to 3 bits, ties to
  // even; a mantissa carry moves into the exponent, which is the right value.
  const uint32_t mant_odd = (u >> 20) & 1u;
  u += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd;
  return sign | static_cast<uint8_t>(u >> 20);
}

// The same conversion without branches (every path computed, then merged through all-ones /
// all-zeros masks), so a loop over it vectorizes; bit-identical to float_to_e4m3fn for every
// input. Masks, not ?: selects: GCC 12 leaves this loop scalar ("control flow in loop") when
// the selects are written as conditionals.
OPMUX_CPU_INLINE uint8_t float_to_e4m3fn_branchless(float f) {
  uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7FFFFFFFu;
  const float r = bits_to_f32(u) + bits_to_f32(141u << 23);
  const uint32_t sub = f32_to_bits(r) - (141u << 23);
  const uint32_t mant_odd = (u >> 20) & 1u;
  const uint32_t nrm = (u + (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd) >> 20;
  const uint32_t is_sub = 0u - static_cast<uint32_t>(u < (121u << 23));
  uint32_t v = (sub & is_sub) | (nrm & ~is_sub);
  const uint32_t is_sat = 0u - static_cast<uint32_t>(u >= 0x43E00000u);
  v = (0x7Eu & is_sat) | (v & ~is_sat);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(u > 0x7F800000u);
  v = (0x7Fu & is_nan) | (v & ~is_nan);
  return static_cast<uint8_t>(sign | (v & 0xFFu));
}

// A positive float's bits rounded up to a power of two, exactly (UE8M0 scales: DeepGEMM's
// ceil(log2)); NaN and inf unchanged. Branch-free.
OPMUX_CPU_INLINE uint32_t ue8m0_bits(uint32_t u) {
  const uint32_t e = (u >> 23) & 0xFFu;
  const uint32_t up = (e + static_cast<uint32_t>((u & 0x7FFFFFu) != 0u)) << 23;
  return e == 0xFFu ? u : up;
}

}  // namespace cpu
}  // namespace opmux
