// Rotary position embedding (vLLM style) for CUDA tensors, in place, float math.
//
// One block per token rotates every q and k head of that token: the token's cos | sin row is
// converted to float into shared memory once, then the block's threads walk (head, chunk)
// items. A chunk is N elements: NeoX style, N of the first half and the N partners
// rotary_dim / 2 further; GPT-J style, N / 2 adjacent (even, odd) pairs. With 16-byte aligned
// rows N = 16 / sizeof(T) and every access is one 16-byte load/store; otherwise a scalar
// path (N = 1 NeoX, one pair GPT-J) handles any size and alignment.
//
// Out-of-range positions: never read out of bounds. The host does not look at positions (that
// would cost a device sync per call and break CUDA graphs); the kernel clamps the index and
// fills that token's cos / sin with NaN, so its rotated q / k elements become NaN: a loud,
// sync-free flag. (The CPU kernel and the CPU-side Python wrappers raise ValueError instead.)
#include <tvm/ffi/function.h>

#include <algorithm>

#include "opmux/cuda_utils.cuh"
#include "opmux/head_checks.h"
#include "opmux/contracts/rope.h"

namespace opmux {
namespace rope_cuda {

using cuda::from_float;
using cuda::load_vec;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;

struct RopeParams {
  const int64_t* pos;
  void* q;
  void* k;
  const void* cache;
  int64_t q_token_stride;  // elements
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t cache_stride;
  int64_t max_pos;
  int q_heads;
  int k_heads;
  int half;  // rotary_dim / 2
  bool vllm;  // vLLM's rounding (rot_lo / rot_hi)
};

// x1 * cos - x2 * sin and x2 * cos + x1 * sin. vllm: as vLLM's kernel computes them in T, cos /
// sin rounded to T, then each product and the sum or difference rounded to T (float32: nothing
// to round); else in float, one rounding by the caller's store.
template <typename T>
__device__ __forceinline__ float rt(float v) {
  return to_float(from_float<T>(v));
}
template <typename T>
__device__ __forceinline__ float rot_lo(float a, float b, float co, float si, bool vllm) {
  if (vllm) return rt<T>(a * rt<T>(co)) - rt<T>(b * rt<T>(si));
  return a * co - b * si;
}
template <typename T>
__device__ __forceinline__ float rot_hi(float a, float b, float co, float si, bool vllm) {
  if (vllm) return rt<T>(b * rt<T>(co)) + rt<T>(a * rt<T>(si));
  return b * co + a * si;
}

template <typename T, int N, bool VECTOR>
__device__ __forceinline__ Vec<T, N> load_chunk(const T* p) {
  if constexpr (VECTOR) {
    return load_vec<T, N>(p);
  } else {
    Vec<T, N> v;
#pragma unroll
    for (int i = 0; i < N; ++i) v.v[i] = p[i];
    return v;
  }
}

template <typename T, int N, bool VECTOR>
__device__ __forceinline__ void store_chunk(T* p, const Vec<T, N>& v) {
  if constexpr (VECTOR) {
    store_vec(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = v.v[i];
  }
}

template <typename T, typename C, bool NEOX, int N, bool VECTOR>
__global__ void __launch_bounds__(128) rope_kernel(RopeParams p) {
  extern __shared__ float cs[];  // [2 * half]: cos, then sin
  const int64_t t = blockIdx.x;
  cuda::pdl_enter();
  const int64_t pos = p.pos[t];
  const bool ok = pos >= 0 && pos < p.max_pos;
  const C* row = static_cast<const C*>(p.cache) + (ok ? pos : 0) * p.cache_stride;
  for (int i = threadIdx.x; i < 2 * p.half; i += blockDim.x)
    cs[i] = ok ? to_float(row[i]) : __int_as_float(0x7fc00000);  // quiet NaN
  __syncthreads();

  const int chunks = (NEOX ? p.half : 2 * p.half) / N;  // per head
  const int items = (p.q_heads + p.k_heads) * chunks;
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    const int head = i / chunks, c = i - head * chunks;
    const bool is_q = head < p.q_heads;
    T* x = static_cast<T*>(is_q ? p.q : p.k) + t * (is_q ? p.q_token_stride : p.k_token_stride) +
           static_cast<int64_t>(is_q ? head : head - p.q_heads) *
               (is_q ? p.q_head_stride : p.k_head_stride);
    if constexpr (NEOX) {
      T* x1 = x + c * N;
      T* x2 = x1 + p.half;
      const Vec<T, N> a = load_chunk<T, N, VECTOR>(x1), b = load_chunk<T, N, VECTOR>(x2);
      Vec<T, N> oa, ob;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float co = cs[c * N + e], si = cs[p.half + c * N + e];
        const float fa = to_float(a.v[e]), fb = to_float(b.v[e]);
        oa.v[e] = from_float<T>(rot_lo<T>(fa, fb, co, si, p.vllm));
        ob.v[e] = from_float<T>(rot_hi<T>(fa, fb, co, si, p.vllm));
      }
      store_chunk<T, N, VECTOR>(x1, oa);
      store_chunk<T, N, VECTOR>(x2, ob);
    } else {
      T* x1 = x + c * N;
      const Vec<T, N> a = load_chunk<T, N, VECTOR>(x1);
      Vec<T, N> o;
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        const int j = c * (N / 2) + e;
        const float co = cs[j], si = cs[p.half + j];
        const float f0 = to_float(a.v[2 * e]), f1 = to_float(a.v[2 * e + 1]);
        o.v[2 * e] = from_float<T>(rot_lo<T>(f0, f1, co, si, p.vllm));
        o.v[2 * e + 1] = from_float<T>(rot_hi<T>(f0, f1, co, si, p.vllm));
      }
      store_chunk<T, N, VECTOR>(x1, o);
    }
  }
}

// Few tokens: one block per token leaves most SMs idle (T = 1: one block walking all heads).
// Instead grid (tokens, item blocks): each thread rotates exactly one (head, chunk) item and
// reads its cos / sin straight from the (L2-resident) cache row, no shared-memory staging and
// no barrier. Same arithmetic and NaN flag as rope_kernel.
template <typename T, typename C, bool NEOX, int N, bool VECTOR>
__global__ void __launch_bounds__(128) rope_direct_kernel(RopeParams p) {
  const int64_t t = blockIdx.x;
  const int chunks = (NEOX ? p.half : 2 * p.half) / N;  // per head
  const int items = (p.q_heads + p.k_heads) * chunks;
  const int i = blockIdx.y * blockDim.x + threadIdx.x;
  cuda::pdl_enter();
  if (i < items) {
    const int64_t pos = p.pos[t];
    const bool ok = pos >= 0 && pos < p.max_pos;
    const C* row = static_cast<const C*>(p.cache) + (ok ? pos : 0) * p.cache_stride;
    const float nan = __int_as_float(0x7fc00000);  // quiet NaN
    const int head = i / chunks, c = i - head * chunks;
    const bool is_q = head < p.q_heads;
    T* x = static_cast<T*>(is_q ? p.q : p.k) + t * (is_q ? p.q_token_stride : p.k_token_stride) +
           static_cast<int64_t>(is_q ? head : head - p.q_heads) *
               (is_q ? p.q_head_stride : p.k_head_stride);
    if constexpr (NEOX) {
      T* x1 = x + c * N;
      T* x2 = x1 + p.half;
      const Vec<T, N> a = load_chunk<T, N, VECTOR>(x1), b = load_chunk<T, N, VECTOR>(x2);
      float co[N], si[N];
#pragma unroll
      for (int e = 0; e < N; ++e) {
        co[e] = ok ? to_float(__ldg(row + c * N + e)) : nan;
        si[e] = ok ? to_float(__ldg(row + p.half + c * N + e)) : nan;
      }
      Vec<T, N> oa, ob;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float fa = to_float(a.v[e]), fb = to_float(b.v[e]);
        oa.v[e] = from_float<T>(rot_lo<T>(fa, fb, co[e], si[e], p.vllm));
        ob.v[e] = from_float<T>(rot_hi<T>(fa, fb, co[e], si[e], p.vllm));
      }
      store_chunk<T, N, VECTOR>(x1, oa);
      store_chunk<T, N, VECTOR>(x2, ob);
    } else {
      T* x1 = x + c * N;
      const Vec<T, N> a = load_chunk<T, N, VECTOR>(x1);
      float co[N / 2], si[N / 2];
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        const int j = c * (N / 2) + e;
        co[e] = ok ? to_float(__ldg(row + j)) : nan;
        si[e] = ok ? to_float(__ldg(row + p.half + j)) : nan;
      }
      Vec<T, N> o;
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        const float f0 = to_float(a.v[2 * e]), f1 = to_float(a.v[2 * e + 1]);
        o.v[2 * e] = from_float<T>(rot_lo<T>(f0, f1, co[e], si[e], p.vllm));
        o.v[2 * e + 1] = from_float<T>(rot_hi<T>(f0, f1, co[e], si[e], p.vllm));
      }
      store_chunk<T, N, VECTOR>(x1, o);
    }
  }
}

constexpr int kMaxThreads = 128;

template <typename T, typename C, bool NEOX>
void launch_rope(const char* op, const RopeParams& p, int64_t tokens, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  // 16-byte chunks when every chunk start is 16-byte aligned: bases and strides in whole
  // vectors, and the chunk grid (half for NeoX, rotary_dim for GPT-J) in whole vectors.
  const bool vec_ok = (NEOX ? p.half : 2 * p.half) % VEC == 0 &&
                      cuda::aligned(p.q, 16) && cuda::aligned(p.k, 16) &&
                      (p.q_token_stride * sizeof(T)) % 16 == 0 &&
                      (p.q_head_stride * sizeof(T)) % 16 == 0 &&
                      (p.k_token_stride * sizeof(T)) % 16 == 0 &&
                      (p.k_head_stride * sizeof(T)) % 16 == 0;
  constexpr int kScalar = NEOX ? 1 : 2;
  const int n = vec_ok ? VEC : kScalar;
  const int64_t items = static_cast<int64_t>(p.q_heads + p.k_heads) * ((NEOX ? p.half : 2 * p.half) / n);
  const int threads =
      static_cast<int>(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (items + 31) / 32 * 32)));
  const size_t smem = static_cast<size_t>(2 * p.half) * sizeof(float);
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  // Direct path while every item gets its own thread within about half a resident wave
  // (1024 threads per SM; neox 40 heads x 128 bf16: up to ~420 tokens on H200). Larger T
  // keeps the staged one-block-per-token kernel (measured ahead of the peers there).
  const int64_t sms = props.sm_count;
  if (tokens * items <= sms * 1024) {
    // 32-thread blocks for the smallest launches (more SMs share T = 1), else 64.
    const int dthreads = tokens * items <= sms * 256 ? 32 : 64;
    const int64_t yblocks = (items + dthreads - 1) / dthreads;
    if (yblocks <= 65535) {
      auto dkernel = vec_ok ? rope_direct_kernel<T, C, NEOX, VEC, true>
                            : rope_direct_kernel<T, C, NEOX, kScalar, false>;
      cuda::launch(op, device_id, props, dkernel,
                   dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(yblocks)),
                   dim3(dthreads), 0, cuda::current_stream(device_id), p);
      return;
    }
  }
  auto kernel = vec_ok ? rope_kernel<T, C, NEOX, VEC, true> : rope_kernel<T, C, NEOX, kScalar, false>;
  cuda::launch(op, device_id, props, kernel, dim3(static_cast<unsigned>(tokens)), dim3(threads),
               smem, cuda::current_stream(device_id), p);
}

void rotary_embedding_cuda(TensorView positions, TensorView query, TensorView key,
                           TensorView cos_sin_cache, bool is_neox, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.rotary_embedding";
  RopeArgs a = check_rope_args(op, kDLCUDA, positions, query, key, cos_sin_cache);
  if (a.q.tokens == 0 || a.q.heads + a.k.heads == 0) return;
  lane::contract::rule_rope_sizes(op, a.k.heads, a.q.heads, a.q.tokens);  // the contract's CUDA limits
  lane::contract::rule_rope_smem(op, a.rot_dim);
  RopeParams p;
  p.pos = data_ptr<const int64_t>(positions);
  p.q = data_ptr<void>(query);
  p.k = data_ptr<void>(key);
  p.cache = data_ptr<const void>(cos_sin_cache);
  p.q_token_stride = a.q.token_stride;
  p.q_head_stride = a.q.head_stride;
  p.k_token_stride = a.k.token_stride;
  p.k_head_stride = a.k.head_stride;
  p.cache_stride = a.cache_stride;
  p.max_pos = a.max_pos;
  p.q_heads = static_cast<int>(a.q.heads);
  p.k_heads = static_cast<int>(a.k.heads);
  p.half = static_cast<int>(a.rot_dim / 2);
  p.vllm = vllm_rounding;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16, [&] {
    const bool f32_cache = a.cache_dtype == DType::kFloat32;
    if (is_neox) {
      f32_cache ? launch_rope<scalar_t, float, true>(op, p, a.q.tokens, a.device_id)
                : launch_rope<scalar_t, scalar_t, true>(op, p, a.q.tokens, a.device_id);
    } else {
      f32_cache ? launch_rope<scalar_t, float, false>(op, p, a.q.tokens, a.device_id)
                : launch_rope<scalar_t, scalar_t, false>(op, p, a.q.tokens, a.device_id);
    }
  });
}

}  // namespace rope_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rotary_embedding_cuda, opmux::rope_cuda::rotary_embedding_cuda);

#include "opmux/contracts/rope_cuda_lanes.inc"
