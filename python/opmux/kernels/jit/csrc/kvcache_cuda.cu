// reshape_and_cache for CUDA tensors (NHD paged layout). One block per token; its threads
// copy the token's H*D key and value elements as 16-byte vectors (scalar path when D or a
// stride is not a multiple of 16 bytes). A slot < 0 (padding) or >= num_blocks * block_size
// skips the token: the kernel never writes out of bounds and the host never synchronises.
#include <tvm/ffi/function.h>

#include <algorithm>

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
  int64_t k_tok, k_head, v_tok, v_head, kc_block, vc_block;  // elements
  int64_t num_slots;
  int block_size, heads, head_dim;
};

// Vectors per thread per step: both loads of U vectors are issued before the stores.
constexpr int kU = 2;

template <typename T, int VEC>
__global__ void __launch_bounds__(256) reshape_and_cache_kernel(CacheParams p) {
  const int64_t t = blockIdx.x;
  cuda::pdl_wait();
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;
  const int64_t blk = slot / p.block_size, off = slot - blk * p.block_size;
  const int hd = p.heads * p.head_dim;
  const int per_head = p.head_dim / VEC, nvec = hd / VEC;
  const T* __restrict__ k = static_cast<const T*>(p.k) + t * p.k_tok;
  const T* __restrict__ v = static_cast<const T*>(p.v) + t * p.v_tok;
  T* __restrict__ kc = static_cast<T*>(p.kc) + blk * p.kc_block + off * hd;
  T* __restrict__ vc = static_cast<T*>(p.vc) + blk * p.vc_block + off * hd;
  for (int base = threadIdx.x; base < nvec; base += kU * blockDim.x) {
    Vec<T, VEC> a[kU], b[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * blockDim.x;
      if (j < nvec) {
        const int h = j / per_head, c = (j - h * per_head) * VEC;
        a[u] = load_vec<T, VEC>(k + h * p.k_head + c);
        b[u] = load_vec<T, VEC>(v + h * p.v_head + c);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * blockDim.x;
      if (j < nvec) {
        store_vec(kc + j * VEC, a[u]);
        store_vec(vc + j * VEC, b[u]);
      }
    }
  }
  cuda::pdl_launch_dependents();
}

template <typename T>
void launch_cache(const char* op, const CacheParams& p, int64_t tokens, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  constexpr int64_t B = sizeof(T);
  const bool vec_ok = p.head_dim % VEC == 0 && cuda::aligned(p.k, 16) && cuda::aligned(p.v, 16) &&
                      cuda::aligned(p.kc, 16) && cuda::aligned(p.vc, 16) && (p.k_tok * B) % 16 == 0 &&
                      (p.k_head * B) % 16 == 0 && (p.v_tok * B) % 16 == 0 && (p.v_head * B) % 16 == 0 &&
                      (p.kc_block * B) % 16 == 0 && (p.vc_block * B) % 16 == 0;
  const int nvec = p.heads * p.head_dim / (vec_ok ? VEC : 1);
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  // threads: enough for kU vectors each, a multiple of 32, at most 256
  const int threads = std::min(256, std::max(32, ((nvec + kU - 1) / kU + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(tokens)), block(threads);
  const cudaStream_t stream = cuda::current_stream(device_id);
  if (vec_ok) {
    cuda::launch(op, device_id, props, reshape_and_cache_kernel<T, VEC>, grid, block, 0, stream, p);
  } else {
    cuda::launch(op, device_id, props, reshape_and_cache_kernel<T, 1>, grid, block, 0, stream, p);
  }
}

void reshape_and_cache_cuda(TensorView key, TensorView value, TensorView key_cache, TensorView value_cache,
                            TensorView slot_mapping, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.reshape_and_cache";
  CacheArgs a = check_cache_args(op, kDLCUDA, key, value, key_cache, value_cache, slot_mapping);
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
  p.k_tok = a.k_tok;
  p.k_head = a.k_head;
  p.v_tok = a.v_tok;
  p.v_head = a.v_head;
  p.kc_block = a.kc_block;
  p.vc_block = a.vc_block;
  p.num_slots = a.num_blocks * a.block_size;
  p.block_size = static_cast<int>(a.block_size);
  p.heads = static_cast<int>(a.heads);
  p.head_dim = static_cast<int>(a.head_dim);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_cache<scalar_t>(op, p, a.tokens, a.device_id); });
}

}  // namespace kvcache_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cuda, opmux::kvcache_cuda::reshape_and_cache_cuda);
