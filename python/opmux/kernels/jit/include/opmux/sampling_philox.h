// The sampling ops' uniform numbers and ordered keys, shared by the CPU and CUDA units (and equal
// to the Triton backend's): Philox-4x32-10 keyed by the 64-bit seed (lo, hi words), counter
// (offset lo, offset hi, row, 0), word 0 turned into a float in [0, 1) as triton.language.random's
// uint_to_uniform_float does. So for one seed / offset every backend that uses it draws a row with
// the same u (docs: ops/sampling/op.py, "Randomness"); the torch backend has its own stream.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OPMUX_HD __host__ __device__ __forceinline__
#else
#define OPMUX_HD inline
#endif

namespace opmux {
namespace sampling {

OPMUX_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

// Word 0 of Philox-4x32 with 10 rounds (Salmon et al. 2011; the constants of Random123 / Triton).
OPMUX_HD uint32_t philox_word0(uint64_t seed, uint64_t offset, uint32_t row) {
  uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32), c2 = row, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int i = 0; i < 10; ++i) {
    const uint32_t a0 = c0, a2 = c2;
    c0 = mulhi32(0xCD9E8D57u, a2) ^ c1 ^ k0;
    c2 = mulhi32(0xD2511F53u, a0) ^ c3 ^ k1;
    c1 = 0xCD9E8D57u * a2;
    c3 = 0xD2511F53u * a0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// A uniform float in [0, 1): the word as int32, negatives complemented, times (2^23 - 1) / 2^54.
OPMUX_HD float uniform(uint64_t seed, uint64_t offset, int64_t row) {
  int32_t x = static_cast<int32_t>(philox_word0(seed, offset, static_cast<uint32_t>(row)));
  x = x < 0 ? ~x : x;
  return static_cast<float>(x) * 4.6566127342e-10f;
}

// An int32 key that orders as the float32 value (NaNs at the ends), so a selection over keys is
// well defined for any bits a caller passes. -0 and +0 share the key 0: they are one value, so a
// signed zero tied with a zero threshold is kept, as the definition's `x >= t` keeps it.
OPMUX_HD int32_t ordered_key(float v) {
  int32_t b;
#if defined(__CUDA_ARCH__)
  b = __float_as_int(v);
#else
  std::memcpy(&b, &v, 4);
#endif
  if ((b & 0x7FFFFFFF) == 0) b = 0;
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

}  // namespace sampling
}  // namespace opmux
