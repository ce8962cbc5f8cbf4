// reshape_and_cache for CUDA tensors (vLLM's reshape_and_cache_flash, and reshape_and_cache's
// paged layout). Caches are [num_blocks, block_size, H, D] views with a dense head_dim and any
// block / page / head strides (NHD, or HND passed as its permuted view), or vLLM's paged key
// [num_blocks, H, D/x, block_size, x] with value [num_blocks, H, D, block_size] (its value rows
// are strided: the scalar path). One block per token; its threads copy the token's H*D key and
// value elements as 16-byte vectors (scalar path when D, a pointer or a stride is not a multiple
// of the vector); head h of the slot lands at block * block_stride + offset * page_stride +
// h * head_stride. An fp8 cache (e4m3fn bytes) gets e4m3(x / scale) (IEEE division, saturated,
// vLLM's convention), VEC bytes per store. A slot < 0 (padding) or >= num_blocks * block_size
// skips the token: the kernel never writes out of bounds and the host never synchronises.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <type_traits>

#include "opmux/cuda_fp8.cuh"
#include "opmux/cuda_utils.cuh"
#include "opmux/kvcache_checks.h"

namespace opmux {
namespace kvcache_cuda {

using cuda::load_vec;
using cuda::store_vec;
using cuda::Vec;

struct CacheParams {
  const void* k;
  const void* v;
  void* kc;
  void* vc;
  const int64_t* slots;
  const float* k_scale;  // fp8 caches only
  const float* v_scale;
  int64_t k_tok, k_head, v_tok, v_head;  // elements of key / value
  // cache strides (cache elements) of block, offset in block, head, d / x, d % x: element d of a
  // head row at (d / x) * [3] + (d % x) * [4] (x = D, [4] = 1 but for vLLM's paged layout)
  int64_t kcs[5], vcs[5];
  int kx, vx;
  int64_t num_slots;
  int block_size, heads, head_dim;
};

// Vectors per thread per step: both loads of U vectors are issued before the stores.
constexpr int kU = 2;

// T: key / value element; FP8: the caches hold e4m3fn bytes (else T).
template <typename T, int VEC, bool FP8>
__global__ void __launch_bounds__(256) reshape_and_cache_kernel(CacheParams p) {
  using C = typename std::conditional<FP8, uint8_t, T>::type;
  const int64_t t = blockIdx.x;
  cuda::pdl_enter();
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;
  const int64_t blk = slot / p.block_size, off = slot - blk * p.block_size;
  const int per_head = p.head_dim / VEC, nvec = p.heads * per_head;
  const float ks = FP8 ? *p.k_scale : 1.f, vs = FP8 ? *p.v_scale : 1.f;
  const T* __restrict__ k = static_cast<const T*>(p.k) + t * p.k_tok;
  const T* __restrict__ v = static_cast<const T*>(p.v) + t * p.v_tok;
  C* __restrict__ kc = static_cast<C*>(p.kc) + blk * p.kcs[0] + off * p.kcs[1];
  C* __restrict__ vc = static_cast<C*>(p.vc) + blk * p.vcs[0] + off * p.vcs[1];
  for (int base = threadIdx.x; base < nvec; base += kU * blockDim.x) {
    Vec<T, VEC> a[kU], b[kU];
    int h[kU], c[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * blockDim.x;
      h[u] = j / per_head;
      c[u] = (j - h[u] * per_head) * VEC;
      if (j < nvec) {
        a[u] = load_vec<T, VEC>(k + h[u] * p.k_head + c[u]);
        b[u] = load_vec<T, VEC>(v + h[u] * p.v_head + c[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * blockDim.x;
      if (j < nvec) {
        // VEC > 1 only where the VEC elements are adjacent in the cache (x a multiple of VEC)
        C* kd = kc + h[u] * p.kcs[2] + (c[u] / p.kx) * p.kcs[3] + (c[u] % p.kx) * p.kcs[4];
        C* vd = vc + h[u] * p.vcs[2] + (c[u] / p.vx) * p.vcs[3] + (c[u] % p.vx) * p.vcs[4];
        if constexpr (FP8) {
          cuda::store_fp8_div<T, VEC>(kd, a[u], ks);
          cuda::store_fp8_div<T, VEC>(vd, b[u], vs);
        } else {
          store_vec(kd, a[u]);
          store_vec(vd, b[u]);
        }
      }
    }
  }
}

template <typename T, bool FP8>
void launch_cache(const char* op, const CacheParams& p, int64_t tokens, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  constexpr int64_t B = sizeof(T);
  constexpr int64_t CV = FP8 ? VEC : 16;  // bytes of one cache store
  constexpr int64_t CB = FP8 ? 1 : B;     // bytes of one cache element
  bool vec_ok = p.head_dim % VEC == 0 && cuda::aligned(p.k, 16) && cuda::aligned(p.v, 16) &&
                cuda::aligned(p.kc, CV) && cuda::aligned(p.vc, CV) && (p.k_tok * B) % 16 == 0 &&
                (p.k_head * B) % 16 == 0 && (p.v_tok * B) % 16 == 0 && (p.v_head * B) % 16 == 0;
  vec_ok = vec_ok && p.kcs[4] == 1 && p.vcs[4] == 1 && p.kx % VEC == 0 && p.vx % VEC == 0;
  for (int d = 0; d < 4; ++d) vec_ok = vec_ok && (p.kcs[d] * CB) % CV == 0 && (p.vcs[d] * CB) % CV == 0;
  const int nvec = p.heads * p.head_dim / (vec_ok ? VEC : 1);
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  // threads: enough for kU vectors each, a multiple of 32, at most 256
  const int threads = std::min(256, std::max(32, ((nvec + kU - 1) / kU + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(tokens)), block(threads);
  const cudaStream_t stream = cuda::current_stream(device_id);
  if (vec_ok) {
    cuda::launch(op, device_id, props, reshape_and_cache_kernel<T, VEC, FP8>, grid, block, 0, stream, p);
  } else {
    cuda::launch(op, device_id, props, reshape_and_cache_kernel<T, 1, FP8>, grid, block, 0, stream, p);
  }
}

void reshape_and_cache_cuda(TensorView key, TensorView value, TensorView key_cache, TensorView value_cache,
                            TensorView slot_mapping, TensorView k_scale, TensorView v_scale, bool fp8,
                            bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.reshape_and_cache";
  CacheArgs a = check_cache_args(op, kDLCUDA, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, fp8);
  if (a.tokens == 0 || a.heads * a.head_dim == 0) return;
  if (a.heads * a.head_dim > INT32_MAX || a.block_size > INT32_MAX || a.tokens > INT32_MAX) {
    TVM_FFI_THROW(ValueError) << op << ": sizes exceed the kernel's 32-bit indexing";
  }
  CacheParams p;
  p.k = data_ptr<const void>(key);
  p.v = data_ptr<const void>(value);
  p.kc = data_ptr<void>(key_cache);
  p.vc = data_ptr<void>(value_cache);
  p.slots = data_ptr<const int64_t>(slot_mapping);
  p.k_scale = fp8 ? data_ptr<const float>(k_scale) : nullptr;
  p.v_scale = fp8 ? data_ptr<const float>(v_scale) : nullptr;
  p.k_tok = a.k_tok;
  p.k_head = a.k_head;
  p.v_tok = a.v_tok;
  p.v_head = a.v_head;
  for (int d = 0; d < 5; ++d) {
    p.kcs[d] = a.kc[d];
    p.vcs[d] = a.vc[d];
  }
  p.kx = static_cast<int>(a.kx);
  p.vx = static_cast<int>(a.vx);
  p.num_slots = a.num_blocks * a.block_size;
  p.block_size = static_cast<int>(a.block_size);
  p.heads = static_cast<int>(a.heads);
  p.head_dim = static_cast<int>(a.head_dim);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16, [&] {
    if (fp8) launch_cache<scalar_t, true>(op, p, a.tokens, a.device_id);
    else launch_cache<scalar_t, false>(op, p, a.tokens, a.device_id);
  });
}

}  // namespace kvcache_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cuda, opmux::kvcache_cuda::reshape_and_cache_cuda);
