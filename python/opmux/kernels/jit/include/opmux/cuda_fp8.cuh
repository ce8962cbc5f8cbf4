// CUDA helpers for fp8 (e4m3fn) and int8 output: saturating round-to-nearest-even packing of VEC
// floats into VEC bytes (one 1/2/4/8-byte store; int8 truncated), UE8M0 rounding, max reductions.
#pragma once

#include <cuda_fp8.h>

#include "opmux/cuda_utils.cuh"

namespace opmux {
namespace cuda {

__device__ __forceinline__ uint16_t fp8x2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

template <int N> struct ByteVec;  // N fp8 bytes as one store
template <> struct ByteVec<1> { using type = uint8_t; };
template <> struct ByteVec<2> { using type = uint16_t; };
template <> struct ByteVec<4> { using type = uint32_t; };
template <> struct ByteVec<8> { using type = uint2; };

// q[0..VEC) = e4m3(v[k] * inv), saturated to +-448.
template <typename T, int VEC>
__device__ __forceinline__ void store_fp8(uint8_t* q, const Vec<T, VEC>& v, float inv) {
  if constexpr (VEC == 1) {
    *q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(to_float(v.v[0]) * inv, __NV_SATFINITE, __NV_E4M3));
  } else {
    uint16_t pairs[VEC / 2];
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k)
      pairs[k] = fp8x2(to_float(v.v[2 * k]) * inv, to_float(v.v[2 * k + 1]) * inv);
    using B = typename ByteVec<VEC>::type;
    B out;
    static_assert(sizeof(B) == sizeof(pairs), "fp8 vector size");
    memcpy(&out, pairs, sizeof(B));
    *reinterpret_cast<B*>(q) = out;
  }
}

// q[0..VEC) = e4m3(v[k] / scale): an IEEE division per element (vLLM's per-token and group
// convention), saturated to +-448.
template <typename T, int VEC>
__device__ __forceinline__ void store_fp8_div(uint8_t* q, const Vec<T, VEC>& v, float scale) {
  if constexpr (VEC == 1) {
    *q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(to_float(v.v[0]), scale), __NV_SATFINITE, __NV_E4M3));
  } else {
    uint16_t pairs[VEC / 2];
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k)
      pairs[k] = fp8x2(__fdiv_rn(to_float(v.v[2 * k]), scale), __fdiv_rn(to_float(v.v[2 * k + 1]), scale));
    using B = typename ByteVec<VEC>::type;
    B out;
    memcpy(&out, pairs, sizeof(B));
    *reinterpret_cast<B*>(q) = out;
  }
}

// int8(trunc(clamp(f, -128, 127))), NaN -> 0: sgl-kernel's int8_t(float) conversion.
__device__ __forceinline__ int8_t to_int8_trunc(float f) {
  f = (__float_as_uint(f) & 0x7FFFFFFFu) > 0x7F800000u ? 0.f : fminf(fmaxf(f, -128.f), 127.f);
  return static_cast<int8_t>(__float2int_rz(f));
}

// q[0..VEC) = int8(v[k] * inv), truncated (one 1/2/4/8-byte store).
template <typename T, int VEC>
__device__ __forceinline__ void store_int8(int8_t* q, const Vec<T, VEC>& v, float inv) {
  int8_t b[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) b[k] = to_int8_trunc(to_float(v.v[k]) * inv);
  using B = typename ByteVec<VEC>::type;
  B out;
  memcpy(&out, b, sizeof(B));
  *reinterpret_cast<B*>(q) = out;
}

// A positive float rounded up to a power of two, exactly (UE8M0 scales); NaN / inf unchanged.
__device__ __forceinline__ float ue8m0_round(float s) {
  const uint32_t u = __float_as_uint(s);
  const uint32_t e = (u >> 23) & 0xFFu;
  return e == 0xFFu ? s : __uint_as_float((e + ((u & 0x7FFFFFu) != 0u ? 1u : 0u)) << 23);
}

// max(a, b) that propagates NaN (fmaxf drops it): a NaN row gets a NaN scale and NaN outputs,
// like the reference. Tested on the bits, so fast-math flags cannot fold it away.
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) > 0x7F800000u; }

// One instruction on sm_80+ (max.NaN.f32); the bit tests cost ~6 per element, which made the
// quantization kernels ALU-bound (H200: per-token fp8 at T = 32768, 128 us vs 93 with fmaxf).
__device__ __forceinline__ float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return is_nan(a) || is_nan(b) ? __uint_as_float(0x7FC00000u) : fmaxf(a, b);
#endif
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max of v over the block (1-D, blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  v = warp_max(v);
  if (blockDim.x > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.f;
    v = warp_max(v);
  }
  return v;
}

}  // namespace cuda
}  // namespace opmux
