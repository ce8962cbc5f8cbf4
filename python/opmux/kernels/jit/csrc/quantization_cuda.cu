// fp8 (e4m3fn) and int8 quantization for CUDA tensors (float32 / float16 / bfloat16 input).
//
// per_token_quant_fp8_cuda(q, scales, x, scale_ub, divide): one block per row. When the row fits in
// registers (16-byte aligned, up to 8 vectors per thread x 512 threads: H <= 32768 for 16-bit
// inputs, 16384 for fp32; 512 keeps PER = 8 within 128 registers, no spills) x is read ONCE: load, block max, scale, convert from registers.
// Otherwise a two-pass loop whose second pass re-reads the row from L1/L2.
//
// per_tensor_quant_fp8_cuda(q, scale, x, static_scale): static, one pass; dynamic, two: the scale
// is zeroed, a first kernel max-reduces the bits of |x| / 448 per tile into it (atomicMax on the
// bits: non-negative floats order as unsigned integers, a NaN above every number), the second
// reads it and converts. Tiles of 256 threads x up to 1024 vectors of a row, rows grid-strided.
//
// per_token_group_quant_fp8_cuda(q, scales, x, group_size, eps, ue8m0, divide) and
// per_token_group_quant_int8_cuda(q, scales, x, group_size, eps): L lanes (a power of two <= 32
// dividing the group's vector count) per group, a shuffle max over those lanes; the first
// vector of each lane stays in registers (for group_size 128 that is the whole group). Each
// thread serves kGroupsPerThread groups (256 / L apart, so every load stays coalesced) and
// issues all their first loads before any use: 2 x 16 bytes in flight per thread. Group index
// math is 32-bit whenever rows * groups fits (a 64-bit division costs ~70 instructions).
//
// silu_and_mul_per_token_group_quant_fp8_cuda(q, scales, x, group_size, eps, ue8m0): x [rows, 2d];
// y = silu(x[:, :d]) * x[:, d:] in float (the activation group's silu: __expf, __fdividef), never
// rounded to x's dtype, then the group quantization of y. One pass: `lanes` threads per group,
// each thread's first gate / up vector pair in registers (group 128 of 16-bit inputs: the whole
// group, one pair per thread; the same launch shape as silu_and_mul's flat kernel).
//
// Group scales go to float32 [rows, groups] with any strides, or (ue8m0 with int32 scales) to
// sgl-kernel's packed layout: the UE8M0 exponent byte g % 4 of int32 element [row, g / 4].
//
// Arithmetic matches the reference: amax, scale = IEEE fp32 division (group scales with `divide`:
// the float32 reciprocal product, vllm_form below; ue8m0: rounded up to a power of two on its bits), q = e4m3(x * (1/scale)) (x / scale with `divide`) with
// __NV_SATFINITE round-to-nearest-even; int8 q = trunc(clamp(x * (1/scale), -128, 127)), NaN -> 0.
// Build without --use_fast_math.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <type_traits>

#include "opmux/checks.h"
#include "opmux/cuda_fp8.cuh"
#include "opmux/cuda_utils.cuh"
#include "opmux/dtype_checks.h"
#include "opmux/quant_checks.h"
#include "opmux/contracts/quantization.h"

namespace opmux {
namespace quantization_cuda {

using cuda::load_vec;
using cuda::store_fp8;
using cuda::store_fp8_div;
using cuda::store_int8;
using cuda::to_float;
using cuda::Vec;

constexpr float kFp8Max = 448.0f;

struct TokenParams {
  uint8_t* q;
  float* s;
  const void* x;
  const float* ub;    // nullptr: no upper bound
  int64_t x_stride;   // elements
  int64_t q_stride;   // bytes
  int hidden;
  float min_scale;
  bool divide;        // q = x / scale (vLLM) instead of x * (1 / scale)
};

// max |v[k]| with m, NaN if any is NaN. 16-bit inputs on sm_80+: packed abs / max.NaN on pairs
// (exact: the max of bf16 / fp16 values is one of them), one instruction per element less.
// max(m, |v[k]|), NaN if any is NaN. 16-bit inputs on sm_80+: packed abs and max.NaN on pairs
// (exact: the max of bf16 / fp16 values is one of them), half the instructions per element.
template <typename T, int VEC>
__device__ __forceinline__ float vec_abs_max(const Vec<T, VEC>& v, float m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool kPacked =
      (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) && VEC % 2 == 0;
#else
  constexpr bool kPacked = false;
#endif
  if constexpr (kPacked) {
    using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
    const T2* p = reinterpret_cast<const T2*>(v.v);
    T2 acc = __habs2(p[0]);
#pragma unroll
    for (int k = 1; k < VEC / 2; ++k) acc = __hmax2_nan(acc, __habs2(p[k]));
    m = cuda::nan_max(m, cuda::nan_max(to_float(acc.x), to_float(acc.y)));
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) m = cuda::nan_max(m, fabsf(to_float(v.v[k])));
  }
  return m;
}

__device__ __forceinline__ float token_scale(float amax, const TokenParams& p) {
  if (p.ub != nullptr) amax = cuda::is_nan(amax) ? amax : fminf(amax, __ldg(p.ub));
  return cuda::nan_max(amax / kFp8Max, p.min_scale);  // NaN stays NaN, like the reference
}

// One pass: thread t holds vectors t, t + T, ..., t + (PER-1) T of the row (coalesced).
template <typename T, int VEC, int PER>
__global__ void __launch_bounds__(512) per_token_reg_kernel(TokenParams p) {
  const int64_t row = blockIdx.x;
  const T* __restrict__ x = static_cast<const T*>(p.x) + row * p.x_stride;
  uint8_t* __restrict__ q = p.q + row * p.q_stride;
  const int nvec = p.hidden / VEC;
  const int tid = threadIdx.x;
  cuda::pdl_enter();
  Vec<T, VEC> v[PER];
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    if (j < nvec) v[i] = load_vec<T, VEC>(x + j * VEC);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i)
    if (i * blockDim.x + tid < nvec) m = vec_abs_max(v[i], m);
  const float scale = token_scale(cuda::block_max(m), p);
  if (tid == 0) p.s[row] = scale;
  const float inv = 1.0f / scale;
  if (p.divide) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int j = i * blockDim.x + tid;
      if (j < nvec) store_fp8_div<T, VEC>(q + j * VEC, v[i], scale);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    if (j < nvec) store_fp8<T, VEC>(q + j * VEC, v[i], inv);
  }
}

// Any size / alignment (VEC == 1 is the scalar path): two strided passes over the row.
template <typename T, int VEC>
__global__ void __launch_bounds__(1024) per_token_loop_kernel(TokenParams p) {
  const int64_t row = blockIdx.x;
  const T* __restrict__ x = static_cast<const T*>(p.x) + row * p.x_stride;
  uint8_t* __restrict__ q = p.q + row * p.q_stride;
  const int nvec = p.hidden / VEC;
  cuda::pdl_enter();
  float m = 0.f;
  for (int j = threadIdx.x; j < nvec; j += blockDim.x) m = vec_abs_max(load_vec<T, VEC>(x + j * VEC), m);
  const float scale = token_scale(cuda::block_max(m), p);
  if (threadIdx.x == 0) p.s[row] = scale;
  const float inv = 1.0f / scale;
  if (p.divide) {
    for (int j = threadIdx.x; j < nvec; j += blockDim.x)
      store_fp8_div<T, VEC>(q + j * VEC, load_vec<T, VEC>(x + j * VEC), scale);
    return;
  }
  for (int j = threadIdx.x; j < nvec; j += blockDim.x)
    store_fp8<T, VEC>(q + j * VEC, load_vec<T, VEC>(x + j * VEC), inv);
}

template <typename T>
void launch_per_token(const char* op, const TokenParams& p, int64_t rows, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const bool vec_ok = p.hidden % VEC == 0 && cuda::aligned(p.x, 16) &&
                      (p.x_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                      cuda::aligned(p.q, VEC) && p.q_stride % VEC == 0;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>(rows));
  const int nvec = vec_ok ? p.hidden / VEC : p.hidden;
  auto round32 = [](int n) { return std::max(32, (n + 31) / 32 * 32); };
  if (vec_ok && nvec <= 8 * 512) {
    // ~256 threads with PER vectors each (more threads only when PER would exceed 8).
    int per = 1;
    while (per < 8 && per * 256 < nvec) per *= 2;
    const dim3 block(round32((nvec + per - 1) / per));
    switch (per) {
      case 1: cuda::launch(op, device_id, props, per_token_reg_kernel<T, VEC, 1>, grid, block, 0, stream, p); break;
      case 2: cuda::launch(op, device_id, props, per_token_reg_kernel<T, VEC, 2>, grid, block, 0, stream, p); break;
      case 4: cuda::launch(op, device_id, props, per_token_reg_kernel<T, VEC, 4>, grid, block, 0, stream, p); break;
      default: cuda::launch(op, device_id, props, per_token_reg_kernel<T, VEC, 8>, grid, block, 0, stream, p); break;
    }
    return;
  }
  const dim3 block(std::min(1024, round32((nvec + 3) / 4)));
  if (vec_ok) {
    cuda::launch(op, device_id, props, per_token_loop_kernel<T, VEC>, grid, block, 0, stream, p);
  } else {
    cuda::launch(op, device_id, props, per_token_loop_kernel<T, 1>, grid, block, 0, stream, p);
  }
}

struct TensorParams {
  uint8_t* q;
  float* s;           // the scale written (dynamic: max-reduced into, zeroed before)
  const float* st;    // the static scale, or nullptr (dynamic)
  const void* x;
  int64_t x_stride;   // elements
  int64_t q_stride;   // bytes
  int64_t rows;
  int nvec;           // vectors per row
  int chunk;          // vectors per tile (blockIdx.y picks the tile of a row)
};

// Dynamic phase 1: max |x| / 448 over the block's tiles, max-reduced into *s on its bits.
template <typename T, int VEC>
__global__ void __launch_bounds__(256) tensor_amax_kernel(TensorParams p) {
  const int c0 = blockIdx.y * p.chunk;
  const int c1 = min(p.nvec, c0 + p.chunk);
  cuda::pdl_enter();
  float m = 0.f;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* __restrict__ x = static_cast<const T*>(p.x) + r * p.x_stride;
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) m = vec_abs_max(load_vec<T, VEC>(x + j * VEC), m);
  }
  m = cuda::block_max(m);
  // x / 448 is monotonic, so the max of the quotients is the quotient of the max (the reference's)
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(p.s), __float_as_uint(m / kFp8Max));
}

// q = e4m3(x * (1 / scale)) with the static scale or phase 1's; block (0, 0) stores a static
// scale into *s (the same value when s is the static scale itself).
template <typename T, int VEC>
__global__ void __launch_bounds__(256) tensor_scaled_kernel(TensorParams p) {
  const int c0 = blockIdx.y * p.chunk;
  const int c1 = min(p.nvec, c0 + p.chunk);
  cuda::pdl_enter();
  const float scale = p.st != nullptr ? *p.st : *p.s;
  const float inv = 1.0f / scale;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* __restrict__ x = static_cast<const T*>(p.x) + r * p.x_stride;
    uint8_t* __restrict__ q = p.q + r * p.q_stride;
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x)
      store_fp8<T, VEC>(q + j * VEC, load_vec<T, VEC>(x + j * VEC), inv);
  }
  if (p.st != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.s = scale;
}

template <typename T>
void launch_per_tensor(const char* op, TensorParams p, int hidden, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const bool vec_ok = hidden % VEC == 0 && cuda::aligned(p.x, 16) &&
                      (p.x_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                      cuda::aligned(p.q, VEC) && p.q_stride % VEC == 0;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  if (p.st == nullptr) cuda::check_cuda(cudaMemsetAsync(p.s, 0, sizeof(float), stream), op, "cudaMemsetAsync");
  if (p.rows == 0) {
    if (p.st != nullptr && p.st != p.s) {
      cuda::check_cuda(cudaMemcpyAsync(p.s, p.st, sizeof(float), cudaMemcpyDeviceToDevice, stream), op,
                       "cudaMemcpyAsync");
    }
    return;
  }
  p.nvec = vec_ok ? hidden / VEC : hidden;
  const int64_t tiles = std::min<int64_t>(65535, (p.nvec + 1023) / 1024);
  p.chunk = static_cast<int>((p.nvec + tiles - 1) / tiles);
  const int64_t want = 4LL * std::max(1, props.sm_count);  // blocks to fill the GPU
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(p.rows, (want + tiles - 1) / tiles));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(tiles));
  const dim3 block(std::min(256, std::max(32, (p.chunk + 31) / 32 * 32)));
  if (vec_ok) {
    if (p.st == nullptr) cuda::launch(op, device_id, props, tensor_amax_kernel<T, VEC>, grid, block, 0, stream, p);
    cuda::launch(op, device_id, props, tensor_scaled_kernel<T, VEC>, grid, block, 0, stream, p);
  } else {
    if (p.st == nullptr) cuda::launch(op, device_id, props, tensor_amax_kernel<T, 1>, grid, block, 0, stream, p);
    cuda::launch(op, device_id, props, tensor_scaled_kernel<T, 1>, grid, block, 0, stream, p);
  }
}

// static_quant_fp8_cuda(q, x, scale, group_m, group_n): static block scales; element [r, h] uses
// scale[(r / group_m) * s_i + (h / group_n) * s_j], q = e4m3(x * (1 / s)) (vLLM's static quant with
// a group shape). One block per row, grid-strided over 16-byte vectors; one reciprocal per vector
// (VEC divides group_n on the vector path, so a vector never spans two groups).
struct StaticParams {
  uint8_t* q;
  const void* x;
  const float* s;
  int64_t x_stride;   // elements
  int64_t q_stride;   // bytes
  int64_t s_i, s_j;   // scale strides (elements), 0 for a size-1 dim
  int64_t gm;         // rows per scale row
  int gn;             // columns per scale column
  int nvec;           // vectors per row
};

template <typename T, int VEC>
__global__ void __launch_bounds__(256) static_kernel(StaticParams p) {
  const int64_t row = blockIdx.x;
  const T* __restrict__ x = static_cast<const T*>(p.x) + row * p.x_stride;
  uint8_t* __restrict__ q = p.q + row * p.q_stride;
  const float* __restrict__ srow = p.s + (row / p.gm) * p.s_i;
  cuda::pdl_enter();
  int cached_g = -1;
  float inv = 0.f;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < p.nvec; j += gridDim.y * blockDim.x) {
    const int g = j * VEC / p.gn;
    if (g != cached_g) {
      inv = 1.0f / __ldg(srow + static_cast<int64_t>(g) * p.s_j);
      cached_g = g;
    }
    store_fp8<T, VEC>(q + j * VEC, load_vec<T, VEC>(x + j * VEC), inv);
  }
}

template <typename T>
void launch_static(const char* op, StaticParams p, int64_t rows, int hidden, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const bool vec_ok = p.gn % VEC == 0 && hidden % VEC == 0 && cuda::aligned(p.x, 16) &&
                      (p.x_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                      cuda::aligned(p.q, VEC) && p.q_stride % VEC == 0;
  p.nvec = vec_ok ? hidden / VEC : hidden;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  const int block = std::min(256, std::max(32, (p.nvec + 31) / 32 * 32));
  const int64_t ytiles = std::min<int64_t>(65535, (p.nvec + 4LL * block - 1) / (4LL * block));  // <= 4 vectors a thread
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(ytiles));
  if (vec_ok) {
    cuda::launch(op, device_id, props, static_kernel<T, VEC>, grid, dim3(block), 0, stream, p);
  } else {
    cuda::launch(op, device_id, props, static_kernel<T, 1>, grid, dim3(block), 0, stream, p);
  }
}

struct GroupParams {
  void* q;            // uint8_t (fp8 bytes) or int8_t
  void* s;            // float32 scales, or (packed) int32 words of four UE8M0 bytes
  const void* x;
  int64_t x_stride;   // elements
  int64_t q_stride;   // bytes
  int64_t s_row;      // scale strides (elements): column-major scales have s_row == 1
  int64_t s_col;
  int64_t total;      // rows * groups
  int groups;         // per row
  int group_size;
  int lanes;          // threads per group: power of two <= 32, divides group_size / VEC
  float eps;
  float qmax;         // 448 (fp8) or 127 (int8)
  bool packed;        // scales: packed UE8M0 bytes (int32 words) instead of float32
  bool ue8m0;         // scales rounded up to powers of two
  bool divide;        // fp8 q = x / scale (vLLM) instead of x * (1 / scale)
};

// max(amax, eps) / qmax; with `divide` vLLM's CUDA form max(amax, eps) * (1 / qmax), the
// reciprocal rounded to float first (__fmul_rn: never an FMA): what vLLM's Triton kernel and its
// test's reference compute on a GPU (see group_scale_of in ops/quantization/op.py; the CPU kernel
// divides, as vLLM's CPU path does).
__device__ __forceinline__ float vllm_form(float m, const GroupParams& p) {
  return p.divide ? __fmul_rn(m, __fdiv_rn(1.0f, p.qmax)) : __fdiv_rn(m, p.qmax);
}

// 2 groups per thread: 48 registers for 16-bit inputs on sm_90a (5 resident blocks, 1280 threads
// x 32 bytes in flight per SM, vs 2048 x 16 with one vector per thread). A register cap of 32
// (8 blocks) spills; no cap is set so the fp32 variants do not spill on sm_80 either.
constexpr int kGroupThreads = 256;
constexpr int kGroupsPerThread = 2;

template <typename T, int VEC, typename IndexT, typename Q>
__global__ void __launch_bounds__(kGroupThreads) per_group_kernel(GroupParams p) {
  constexpr int G = kGroupsPerThread;
  const int lanes = p.lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const IndexT per_pass = kGroupThreads / lanes;  // groups one pass of the block covers
  const IndexT gid0 = static_cast<IndexT>(blockIdx.x) * (G * per_pass) + threadIdx.x / lanes;
  const IndexT total = static_cast<IndexT>(p.total);
  const int nvec = p.group_size / VEC;

  const T* x[G];
  Q* q[G];
  uint8_t* s[G];  // the scale's address: a float, or one byte of a packed int32 word
  bool valid[G];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const IndexT gid = gid0 + u * per_pass;
    valid[u] = gid < total;
    const IndexT row = valid[u] ? gid / static_cast<IndexT>(p.groups) : 0;
    const IndexT g = valid[u] ? gid - row * static_cast<IndexT>(p.groups) : 0;
    const int64_t goff = static_cast<int64_t>(g) * p.group_size;
    x[u] = static_cast<const T*>(p.x) + static_cast<int64_t>(row) * p.x_stride + goff;
    q[u] = static_cast<Q*>(p.q) + static_cast<int64_t>(row) * p.q_stride + goff;
    s[u] = p.packed ? static_cast<uint8_t*>(p.s) +
                          4 * (static_cast<int64_t>(row) * p.s_row + static_cast<int64_t>(g >> 2) * p.s_col) +
                          static_cast<int>(g & 3)
                    : reinterpret_cast<uint8_t*>(static_cast<float*>(p.s) + static_cast<int64_t>(row) * p.s_row +
                                                 static_cast<int64_t>(g) * p.s_col);
  }

  cuda::pdl_enter();
  Vec<T, VEC> first[G];
  float m[G];
#pragma unroll
  for (int u = 0; u < G; ++u)  // lanes <= nvec: every lane has a first vector
    if (valid[u]) first[u] = load_vec<T, VEC>(x[u] + lane * VEC);
#pragma unroll
  for (int u = 0; u < G; ++u) {
    m[u] = 0.f;
    if (valid[u]) {
      m[u] = vec_abs_max(first[u], m[u]);
      for (int j = lane + lanes; j < nvec; j += lanes) m[u] = vec_abs_max(load_vec<T, VEC>(x[u] + j * VEC), m[u]);
    }
  }
  // max over the group's lanes: an aligned power-of-two subset of the warp (all lanes shuffle)
  for (int o = lanes >> 1; o > 0; o >>= 1) {
#pragma unroll
    for (int u = 0; u < G; ++u) m[u] = cuda::nan_max(m[u], __shfl_xor_sync(0xffffffffu, m[u], o));
  }
#pragma unroll
  for (int u = 0; u < G; ++u) {
    if (!valid[u]) continue;
    float scale = vllm_form(cuda::nan_max(m[u], p.eps), p);
    if (p.ue8m0) scale = cuda::ue8m0_round(scale);
    if (lane == 0) {
      if (p.packed) {
        *s[u] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
      } else {
        *reinterpret_cast<float*>(s[u]) = scale;
      }
    }
    const float inv = 1.0f / scale;
    if constexpr (std::is_same<Q, int8_t>::value) {
      store_int8<T, VEC>(q[u] + lane * VEC, first[u], inv);
      for (int j = lane + lanes; j < nvec; j += lanes)
        store_int8<T, VEC>(q[u] + j * VEC, load_vec<T, VEC>(x[u] + j * VEC), inv);
    } else if (p.divide) {
      store_fp8_div<T, VEC>(q[u] + lane * VEC, first[u], scale);
      for (int j = lane + lanes; j < nvec; j += lanes)
        store_fp8_div<T, VEC>(q[u] + j * VEC, load_vec<T, VEC>(x[u] + j * VEC), scale);
    } else {
      store_fp8<T, VEC>(q[u] + lane * VEC, first[u], inv);
      for (int j = lane + lanes; j < nvec; j += lanes)
        store_fp8<T, VEC>(q[u] + j * VEC, load_vec<T, VEC>(x[u] + j * VEC), inv);
    }
  }
}

// Large T: one row per block, as the per-token kernel. Thread t holds vectors t, t + blockDim, ...
// of the row, a group being `lanes` consecutive vectors, i.e. `lanes` consecutive threads
// (launch: lanes == group_size / VEC, blockDim a multiple of 32, PER * blockDim * gridDim.y ==
// the row's vectors). Same arithmetic as per_group_kernel, bit for bit; no division per group, and the
// PER loads of a thread are independent (H200 sweep, H 4096, group 128, bf16: 20.2 us vs 22.4
// at T = 4096, 71.7 vs 84.0 at T = 16384, 128 threads x 4). A row may be split over gridDim.y
// blocks, block y holding the row's vectors from y * PER * blockDim.x on (a multiple of the
// warp, so groups never straddle blocks): few wide rows spread over several SMs.
template <typename T, int VEC, int PER, typename Q>
__global__ void __launch_bounds__(512) per_group_row_kernel(GroupParams p) {
  const int64_t row = blockIdx.x;
  const T* __restrict__ x = static_cast<const T*>(p.x) + row * p.x_stride;
  Q* __restrict__ q = static_cast<Q*>(p.q) + row * p.q_stride;
  const int lanes = p.lanes;
  const int tid = static_cast<int>(blockIdx.y * PER * blockDim.x + threadIdx.x);
  cuda::pdl_enter();
  Vec<T, VEC> v[PER];
  float m[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) v[i] = load_vec<T, VEC>(x + (i * blockDim.x + tid) * VEC);
#pragma unroll
  for (int i = 0; i < PER; ++i) m[i] = vec_abs_max(v[i], 0.f);
  for (int o = lanes >> 1; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < PER; ++i) m[i] = cuda::nan_max(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    float scale = vllm_form(cuda::nan_max(m[i], p.eps), p);
    if (p.ue8m0) scale = cuda::ue8m0_round(scale);
    if ((j & (lanes - 1)) == 0) {
      const int64_t g = j / lanes;
      if (p.packed) {
        static_cast<uint8_t*>(p.s)[4 * (row * p.s_row + (g >> 2) * p.s_col) + (g & 3)] =
            static_cast<uint8_t>(__float_as_uint(scale) >> 23);
      } else {
        static_cast<float*>(p.s)[row * p.s_row + g * p.s_col] = scale;
      }
    }
    if constexpr (std::is_same<Q, int8_t>::value) {
      store_int8<T, VEC>(q + j * VEC, v[i], 1.0f / scale);
    } else if (p.divide) {
      store_fp8_div<T, VEC>(q + j * VEC, v[i], scale);
    } else {
      store_fp8<T, VEC>(q + j * VEC, v[i], 1.0f / scale);
    }
  }
}

// The row kernel's layout for `rows` rows of `row_vecs` vectors: PER vectors a thread, the row
// split over `splits` blocks (0 PER: the row kernel does not apply). Up to 512 threads with one
// vector each below 16384 rows, 128 threads x PER from there (H200 sweep, H 4096, group 128,
// bf16, against the group-strided kernel: 1.35 vs 1.47 us at T = 1, 1.68 vs 1.88 at T = 128,
// 6.83 vs 7.19 at T = 1024, 21.4 vs 23.3 at T = 4096; 78.5 vs 87.0 at T = 16384, 153.3 vs 171.8
// at T = 32768). Up to 128 rows of 512 vectors or more (decode and small prefill steps: the
// MLP-down or MoE input) split each row over blocks of 256 (224, 128) threads with one vector
// each, so that a row streams through several SMs (H100 sweep, group 128, bf16, whole rows ->
// split: H 14336 2.43 -> 1.28 us at T = 1, 2.58 -> 1.42 at T = 16, 3.53 -> 2.59 at T = 64,
// 4.35 -> 3.65 at T = 128; H 7168 1.59 -> 1.16 at T = 1, 2.80 -> 2.57 at T = 128; H 4096
// 1.24 -> 1.18 at T = 1, 1.65 -> 1.62 at T = 128; benchmarks/tune/sweep_cuda.cu, quant family).
struct RowLayout {
  int per = 0;
  int splits = 1;
  int threads = 0;
};

inline RowLayout row_layout(int64_t rows, int64_t row_vecs) {
  RowLayout l;
  if (rows < 16384) {
    if (row_vecs >= 512 && rows <= 128) {
      for (int t : {256, 224, 128}) {
        if (row_vecs % t == 0 && row_vecs / t <= 65535) {  // gridDim.y's limit
          l.per = 1;
          l.splits = static_cast<int>(row_vecs / t);
          l.threads = t;
          return l;
        }
      }
    }
    for (int c : {1, 2, 4, 8}) {
      if (row_vecs % c == 0 && row_vecs / c <= 512 && (row_vecs / c) % 32 == 0) {  // whole warps
        l.per = c;
        l.threads = static_cast<int>(row_vecs / c);
        return l;
      }
    }
  } else if (row_vecs % 128 == 0 && row_vecs / 128 <= 8) {
    l.per = static_cast<int>(row_vecs / 128);
    l.threads = 128;
  }
  return l;
}

template <typename T, typename Q>
void launch_per_group(const char* op, GroupParams p, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const bool vec_ok = p.group_size % VEC == 0 && cuda::aligned(p.x, 16) &&
                      (p.x_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                      cuda::aligned(p.q, VEC) && p.q_stride % VEC == 0;
  const int nvec = vec_ok ? p.group_size / VEC : p.group_size;
  int lanes = 1;
  while (lanes < 32 && nvec % (lanes * 2) == 0) lanes *= 2;
  p.lanes = lanes;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  // Groups of exactly `lanes` vectors: the row kernel (row_layout's shapes)
  const int64_t rows = p.groups > 0 ? p.total / p.groups : 0;
  const RowLayout l = vec_ok && lanes == nvec && rows <= INT32_MAX
                          ? row_layout(rows, static_cast<int64_t>(p.groups) * nvec)
                          : RowLayout{};
  if (l.per > 0) {
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(l.splits)), block(static_cast<unsigned>(l.threads));
    switch (l.per) {
      case 1: cuda::launch(op, device_id, props, per_group_row_kernel<T, VEC, 1, Q>, grid, block, 0, stream, p); return;
      case 2: cuda::launch(op, device_id, props, per_group_row_kernel<T, VEC, 2, Q>, grid, block, 0, stream, p); return;
      case 4: cuda::launch(op, device_id, props, per_group_row_kernel<T, VEC, 4, Q>, grid, block, 0, stream, p); return;
      case 8: cuda::launch(op, device_id, props, per_group_row_kernel<T, VEC, 8, Q>, grid, block, 0, stream, p); return;
      default: break;  // other row sizes: the group-strided kernel below
    }
  }
  const int64_t per_block = static_cast<int64_t>(kGroupsPerThread) * (kGroupThreads / lanes);
  const int64_t blocks = (p.total + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kGroupThreads);
  // 32-bit group ids when the largest one formed (< blocks * per_block) fits
  const bool small = blocks * per_block <= static_cast<int64_t>(UINT32_MAX);
  auto kernel = vec_ok ? (small ? per_group_kernel<T, VEC, uint32_t, Q> : per_group_kernel<T, VEC, int64_t, Q>)
                       : (small ? per_group_kernel<T, 1, uint32_t, Q> : per_group_kernel<T, 1, int64_t, Q>);
  cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p);
}

// y[k] = silu(gate[k]) * up[k] for one vector pair, in float.
template <typename T, int VEC>
__device__ __forceinline__ Vec<float, VEC> silu_mul(const Vec<T, VEC>& g, const Vec<T, VEC>& u) {
  Vec<float, VEC> y;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float gf = to_float(g.v[k]);
    y.v[k] = __fdividef(gf, 1.0f + __expf(-gf)) * to_float(u.v[k]);
  }
  return y;
}

template <int VEC>
__device__ __forceinline__ float float_abs_max(const Vec<float, VEC>& y, float m) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) m = cuda::nan_max(m, fabsf(y.v[k]));
  return m;
}

// Thread i serves group i / lanes of the flattened [rows, groups] index space as lane i % lanes
// (lanes: a power of two <= 32 dividing the group's vector count, so a group's lanes are
// consecutive threads of one warp); p.x_stride / p.q_stride as GroupParams, `d` the half width.
template <typename T, int VEC, typename IndexT>
__global__ void __launch_bounds__(256) silu_group_kernel(GroupParams p, int64_t d) {
  const int lanes = p.lanes;
  const IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x;
  const IndexT gid = i >> (__ffs(lanes) - 1);  // lanes: a power of two
  const int lane = static_cast<int>(i & static_cast<IndexT>(lanes - 1));
  const bool valid = gid < static_cast<IndexT>(p.total);
  const IndexT row = valid ? gid / static_cast<IndexT>(p.groups) : 0;
  const IndexT g = valid ? gid - row * static_cast<IndexT>(p.groups) : 0;
  const int64_t goff = static_cast<int64_t>(g) * p.group_size;
  const T* gate = static_cast<const T*>(p.x) + static_cast<int64_t>(row) * p.x_stride + goff;
  const T* up = gate + d;
  uint8_t* q = static_cast<uint8_t*>(p.q) + static_cast<int64_t>(row) * p.q_stride + goff;
  const int nvec = p.group_size / VEC;

  cuda::pdl_enter();
  Vec<float, VEC> first;
  float m = 0.f;
  if (valid) {  // lanes <= nvec: every lane has a first vector
    first = silu_mul<T, VEC>(load_vec<T, VEC>(gate + lane * VEC), load_vec<T, VEC>(up + lane * VEC));
    m = float_abs_max<VEC>(first, m);
    for (int j = lane + lanes; j < nvec; j += lanes)
      m = float_abs_max<VEC>(silu_mul<T, VEC>(load_vec<T, VEC>(gate + j * VEC), load_vec<T, VEC>(up + j * VEC)), m);
  }
  // max over the group's lanes (every thread of the warp shuffles, the invalid ones with 0)
  for (int o = lanes >> 1; o > 0; o >>= 1) m = cuda::nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (!valid) return;
  float scale = __fdiv_rn(cuda::nan_max(m, p.eps), kFp8Max);
  if (p.ue8m0) scale = cuda::ue8m0_round(scale);
  if (lane == 0) {
    if (p.packed) {
      static_cast<uint8_t*>(p.s)[4 * (static_cast<int64_t>(row) * p.s_row + static_cast<int64_t>(g >> 2) * p.s_col) +
                                 static_cast<int>(g & 3)] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
    } else {
      static_cast<float*>(p.s)[static_cast<int64_t>(row) * p.s_row + static_cast<int64_t>(g) * p.s_col] = scale;
    }
  }
  const float inv = 1.0f / scale;
  store_fp8<float, VEC>(q + lane * VEC, first, inv);
  for (int j = lane + lanes; j < nvec; j += lanes)
    store_fp8<float, VEC>(q + j * VEC, silu_mul<T, VEC>(load_vec<T, VEC>(gate + j * VEC), load_vec<T, VEC>(up + j * VEC)), inv);
}

template <typename T>
void launch_silu_group(const char* op, GroupParams p, int64_t d, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  // 16-byte gate and up loads need d (the up half's offset) and the group in whole vectors
  const bool vec_ok = p.group_size % VEC == 0 && d % VEC == 0 && cuda::aligned(p.x, 16) &&
                      (p.x_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 && cuda::aligned(p.q, VEC) &&
                      p.q_stride % VEC == 0;
  const int nvec = vec_ok ? p.group_size / VEC : p.group_size;
  int lanes = 1;
  while (lanes < 32 && nvec % (lanes * 2) == 0) lanes *= 2;
  p.lanes = lanes;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  constexpr int kThreads = 256;
  const int64_t threads = p.total * lanes;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) TVM_FFI_THROW(ValueError) << op << ": " << p.total << " groups are too many for one launch";
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  const bool small = blocks * kThreads <= static_cast<int64_t>(UINT32_MAX);  // every thread index formed fits
  auto kernel = vec_ok ? (small ? silu_group_kernel<T, VEC, uint32_t> : silu_group_kernel<T, VEC, int64_t>)
                       : (small ? silu_group_kernel<T, 1, uint32_t> : silu_group_kernel<T, 1, int64_t>);
  cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p, d);
}

// The shared checks, plus the 32-bit index limits of these kernels (the contract's CUDA rules).
inline QuantArgs check_cuda_quant_args(const char* op, const TensorView& q, const TensorView& x,
                                       bool int8_q = false) {
  QuantArgs a = check_quant_args(op, q, x, int8_q);
  lane::contract::rule_cuda_rows(op, a.rows);
  lane::contract::rule_cuda_hidden(op, a.hidden);
  return a;
}

void per_token_quant_fp8_cuda(TensorView q, TensorView scales, TensorView x, TensorView scale_ub, bool divide,
                              bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.per_token_quant_fp8";
  const int32_t dev = check_device(op, kDLCUDA, {{"q", &q}, {"scales", &scales}, {"x", &x}, {"scale_ub", &scale_ub}});
  QuantArgs a = check_cuda_quant_args(op, q, x);
  if (a.hidden == 0) TVM_FFI_THROW(ValueError) << op << ": x has hidden size 0";
  check_float32(op, "scales", scales);
  check_vector(op, "scales", scales, a.rows, "rows of x");
  check_float32(op, "scale_ub", scale_ub);
  check_ndim(op, "scale_ub", scale_ub, 1);
  if (scale_ub.size(0) > 1) {
    TVM_FFI_THROW(ValueError) << op << ": scale_ub must have 0 (none) or 1 element, got " << scale_ub.size(0);
  }
  if (a.rows == 0) return;
  TokenParams p;
  p.q = data_ptr<uint8_t>(q);
  p.s = data_ptr<float>(scales);
  p.x = data_ptr<const void>(x);
  p.ub = scale_ub.size(0) == 1 ? data_ptr<const float>(scale_ub) : nullptr;
  p.x_stride = a.x_stride;
  p.q_stride = a.q_stride;
  p.hidden = static_cast<int>(a.hidden);
  p.min_scale = static_cast<float>(1.0 / (448.0 * 512.0));  // as the Python reference rounds it
  p.divide = divide;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_per_token<scalar_t>(op, p, a.rows, dev); });
}

void per_tensor_quant_fp8_cuda(TensorView q, TensorView scale, TensorView x, TensorView static_scale,
                               bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.per_tensor_quant_fp8";
  const int32_t dev = check_device(op, kDLCUDA, {{"q", &q}, {"scale", &scale}, {"x", &x}, {"static_scale", &static_scale}});
  QuantArgs a = check_cuda_quant_args(op, q, x);
  if (a.hidden == 0) TVM_FFI_THROW(ValueError) << op << ": x has hidden size 0";
  check_float32(op, "scale", scale);
  check_vector(op, "scale", scale, 1, "one scale");
  check_float32(op, "static_scale", static_scale);
  check_ndim(op, "static_scale", static_scale, 1);
  if (static_scale.size(0) > 1) {
    TVM_FFI_THROW(ValueError) << op << ": static_scale must have 0 (dynamic) or 1 element, got " << static_scale.size(0);
  }
  TensorParams p;
  p.q = data_ptr<uint8_t>(q);
  p.s = data_ptr<float>(scale);
  p.st = static_scale.size(0) == 1 ? data_ptr<const float>(static_scale) : nullptr;
  p.x = data_ptr<const void>(x);
  p.x_stride = a.x_stride;
  p.q_stride = a.q_stride;
  p.rows = a.rows;
  p.nvec = p.chunk = 0;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_per_tensor<scalar_t>(op, p, static_cast<int>(a.hidden), dev); });
}

void static_quant_fp8_cuda(TensorView q, TensorView x, TensorView scale, int64_t group_m, int64_t group_n,
                           bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.static_quant_fp8";
  const int32_t dev = check_device(op, kDLCUDA, {{"q", &q}, {"x", &x}, {"scale", &scale}});
  QuantArgs a = check_cuda_quant_args(op, q, x);
  const StaticScales ss = check_static_scales(op, scale, a.rows, a.hidden, group_m, group_n);
  StaticParams p;
  p.s_i = ss.s_i;
  p.s_j = ss.s_j;
  if (a.rows == 0 || a.hidden == 0) return;  // nothing to write (a zero-width grid would not launch)
  p.q = data_ptr<uint8_t>(q);
  p.x = data_ptr<const void>(x);
  p.s = data_ptr<const float>(scale);
  p.x_stride = a.x_stride;
  p.q_stride = a.q_stride;
  p.gm = group_m;
  p.gn = static_cast<int>(group_n);
  p.nvec = 0;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_static<scalar_t>(op, p, a.rows, static_cast<int>(a.hidden), dev); });
}

// The kernels' parameters of a checked group call (a.hidden: the width quantized).
inline GroupParams group_params(const TensorView& q, const TensorView& scales, const TensorView& x, const QuantArgs& a,
                                const GroupScales& gsc, int64_t group_size, double eps, float qmax, bool ue8m0,
                                bool divide) {
  GroupParams p;
  p.q = data_ptr<void>(q);
  p.s = data_ptr<void>(scales);
  p.x = data_ptr<const void>(x);
  p.x_stride = a.x_stride;
  p.q_stride = a.q_stride;
  p.s_row = gsc.s_row;
  p.s_col = gsc.s_col;
  p.groups = static_cast<int>(a.hidden / group_size);
  p.group_size = static_cast<int>(group_size);
  p.total = a.rows * p.groups;
  p.lanes = 1;
  p.eps = static_cast<float>(eps);
  p.qmax = qmax;
  p.packed = gsc.packed;
  p.ue8m0 = ue8m0;
  p.divide = divide;
  return p;
}

template <typename Q>
void group_entry(const char* op, TensorView q, TensorView scales, TensorView x, int64_t group_size, double eps,
                 bool ue8m0, bool divide) {
  constexpr bool kInt8 = std::is_same<Q, int8_t>::value;
  const int32_t dev = check_device(op, kDLCUDA, {{"q", &q}, {"scales", &scales}, {"x", &x}});
  QuantArgs a = check_cuda_quant_args(op, q, x, kInt8);
  check_positive_int(op, "group_size", group_size);
  lane::contract::rule_group_multiple(op, a.hidden, group_size);  // the contract's words
  check_eps(op, eps);
  const GroupScales gsc = check_group_scales(op, scales, a.rows, a.hidden / group_size, ue8m0);
  if (a.rows == 0) return;
  const GroupParams p =
      group_params(q, scales, x, a, gsc, group_size, eps, kInt8 ? 127.0f : kFp8Max, ue8m0, divide);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_per_group<scalar_t, Q>(op, p, dev); });
}

void per_token_group_quant_fp8_cuda(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                    double eps, bool ue8m0, bool divide, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  group_entry<uint8_t>("opmux.per_token_group_quant_fp8", q, scales, x, group_size, eps, ue8m0, divide);
}

void per_token_group_quant_int8_cuda(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                     double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  group_entry<int8_t>("opmux.per_token_group_quant_int8", q, scales, x, group_size, eps, false, false);
}

void silu_and_mul_per_token_group_quant_fp8_cuda(TensorView q, TensorView scales, TensorView x, int64_t group_size,
                                                 double eps, bool ue8m0, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.silu_and_mul_per_token_group_quant_fp8";
  const int32_t dev = check_device(op, kDLCUDA, {{"q", &q}, {"scales", &scales}, {"x", &x}});
  QuantArgs a = check_quant_args(op, q, x, false, true);
  lane::contract::rule_cuda_rows(op, a.rows);
  lane::contract::rule_cuda_pairs(op, 2 * a.hidden);
  check_positive_int(op, "group_size", group_size);
  lane::contract::rule_half_group_multiple(op, 2 * a.hidden, group_size);  // the contract's words
  check_eps(op, eps);
  const GroupScales gsc = check_group_scales(op, scales, a.rows, a.hidden / group_size, ue8m0);
  if (a.rows == 0) return;
  const GroupParams p = group_params(q, scales, x, a, gsc, group_size, eps, kFp8Max, ue8m0, false);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_silu_group<scalar_t>(op, p, a.hidden, dev); });
}

}  // namespace quantization_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_per_token_group_quant_fp8_cuda,
                              opmux::quantization_cuda::silu_and_mul_per_token_group_quant_fp8_cuda);

TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_quant_fp8_cuda, opmux::quantization_cuda::per_token_quant_fp8_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_tensor_quant_fp8_cuda, opmux::quantization_cuda::per_tensor_quant_fp8_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_group_quant_fp8_cuda,
                              opmux::quantization_cuda::per_token_group_quant_fp8_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(static_quant_fp8_cuda, opmux::quantization_cuda::static_quant_fp8_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(per_token_group_quant_int8_cuda,
                              opmux::quantization_cuda::per_token_group_quant_int8_cuda);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/quantization_cuda_lanes.inc"
