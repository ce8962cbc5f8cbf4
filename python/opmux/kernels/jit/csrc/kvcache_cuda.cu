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
// The block ops follow (ops/kvcache/_blocks.py): copy_blocks (blocks copied as bytes within one
// cache), concat_and_cache_mla (MLA's [kv_c | k_pe] rows at their slots, fp8 with a scale) and
// gather_cache (sequences read through their block tables into consecutive rows).
#include <tvm/ffi/function.h>

#include <algorithm>
#include <type_traits>

#include "opmux/block_checks.h"
#include "opmux/contracts/kvcache.h"
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

// A token's slot as (block, offset in block); false: skip the token (slot < 0 or >= num_slots).
__device__ __forceinline__ bool slot_place(int64_t slot, int64_t num_slots, int64_t block_size, int64_t& blk,
                                           int64_t& off) {
  if (slot < 0 || slot >= num_slots) return false;
  blk = slot / block_size;
  off = slot - blk * block_size;
  return true;
}

// T: key / value element; FP8: the caches hold e4m3fn bytes (else T).
template <typename T, int VEC, bool FP8>
__global__ void __launch_bounds__(256) reshape_and_cache_kernel(CacheParams p) {
  using C = typename std::conditional<FP8, uint8_t, T>::type;
  const int64_t t = blockIdx.x;
  cuda::pdl_enter();
  int64_t blk, off;
  if (!slot_place(p.slots[t], p.num_slots, p.block_size, blk, off)) return;
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

// -- the block ops ----------------------------------------------------------------------------
// A copy unit of W bytes: the widest of 16 / 8 / 4 / 2 / 1 that divides every byte count and
// offset given and aligns every pointer.
template <int W> struct Unit;
template <> struct Unit<16> { using type = uint4; };
template <> struct Unit<8> { using type = uint2; };
template <> struct Unit<4> { using type = uint32_t; };
template <> struct Unit<2> { using type = uint16_t; };
template <> struct Unit<1> { using type = uint8_t; };

inline int unit_bytes(std::initializer_list<int64_t> sizes, std::initializer_list<const void*> ptrs) {
  int w = 16;
  for (; w > 1; w /= 2) {
    bool ok = true;
    for (int64_t s : sizes) ok = ok && s % w == 0;
    for (const void* q : ptrs) ok = ok && cuda::aligned(q, w);
    if (ok) break;
  }
  return w;
}

// Calls f.template operator()<W>() for the runtime unit width w.
template <typename F>
void with_unit(int w, F&& f) {
  switch (w) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

// copy_blocks: program (pair, chunk) copies its share of block src onto block dst, V units at a
// time. A pair with an index outside [0, num_blocks) is skipped (no host check: no sync), as is
// a block copied onto itself.
template <typename V>
__global__ void __launch_bounds__(256) copy_blocks_kernel(char* base, const int64_t* pairs, int64_t num_blocks,
                                                         int64_t stride_bytes, int64_t block_units) {
  const int64_t p = blockIdx.x;
  cuda::pdl_enter();
  const int64_t s = pairs[2 * p], d = pairs[2 * p + 1];
  if (s < 0 || s >= num_blocks || d < 0 || d >= num_blocks || s == d) return;
  const V* __restrict__ src = reinterpret_cast<const V*>(base + s * stride_bytes);
  V* __restrict__ dst = reinterpret_cast<V*>(base + d * stride_bytes);
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < block_units; i += step) {
    dst[i] = src[i];
  }
}

void copy_blocks_cuda(TensorView cache, TensorView block_mapping, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.copy_blocks";
  const int32_t device_id = check_device(op, kDLCUDA, {{"cache", &cache}, {"block_mapping", &block_mapping}});
  const BlockCache c = check_block_cache(op, "cache", cache);
  const int64_t n = check_block_mapping(op, block_mapping);
  if (n == 0 || c.block_bytes == 0) return;
  if (n > INT32_MAX) TVM_FFI_THROW(ValueError) << op << ": more than 2^31 - 1 pairs";
  char* base = data_ptr<char>(cache);
  const int w = unit_bytes({c.block_bytes, c.stride_bytes}, {base});
  const int64_t units = c.block_bytes / w;
  constexpr int kThreads = 256;
  const int64_t chunks = std::min<int64_t>(65535, std::max<int64_t>(1, (units + 4 * kThreads - 1) / (4 * kThreads)));
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(chunks)), block(kThreads);
  const int64_t* pairs = data_ptr<const int64_t>(block_mapping);
  with_unit(w, [&](auto W) {
    using V = typename Unit<decltype(W)::value>::type;
    cuda::launch(op, device_id, props, copy_blocks_kernel<V>, grid, block, 0, stream, base, pairs, c.num_blocks,
                 c.stride_bytes, units);
  });
}

// concat_and_cache_mla: one block per token writes [kv_c | k_pe] (rank + pe elements) at its
// slot, VEC elements at a time (scalar when a size, pointer or stride does not allow 16-byte
// vectors); fp8: e4m3(x / scale), saturated. A slot < 0 or >= num_slots skips the token.
struct MlaParams {
  const void* kv_c;
  const void* k_pe;
  void* cache;
  const int64_t* slots;
  const float* scale;  // fp8 caches only
  int64_t c_tok, pe_tok, cache_block, cache_page, num_slots, block_size;
  int rank, pe;
};

template <typename T, typename C, int VEC, bool FP8>
__device__ __forceinline__ void mla_segment(C* __restrict__ dst, const T* __restrict__ src, int n, float scale) {
  for (int i = threadIdx.x; i < n / VEC; i += blockDim.x) {
    const Vec<T, VEC> a = load_vec<T, VEC>(src + i * VEC);
    if constexpr (FP8) {
      cuda::store_fp8_div<T, VEC>(dst + i * VEC, a, scale);
    } else {
      store_vec(dst + i * VEC, a);
    }
  }
}

template <typename T, int VEC, bool FP8>
__global__ void __launch_bounds__(256) concat_and_cache_mla_kernel(MlaParams p) {
  using C = typename std::conditional<FP8, uint8_t, T>::type;
  const int64_t t = blockIdx.x;
  cuda::pdl_enter();
  int64_t blk, off;
  if (!slot_place(p.slots[t], p.num_slots, p.block_size, blk, off)) return;
  C* dst = static_cast<C*>(p.cache) + blk * p.cache_block + off * p.cache_page;
  const float scale = FP8 ? *p.scale : 1.f;
  mla_segment<T, C, VEC, FP8>(dst, static_cast<const T*>(p.kv_c) + t * p.c_tok, p.rank, scale);
  mla_segment<T, C, VEC, FP8>(dst + p.rank, static_cast<const T*>(p.k_pe) + t * p.pe_tok, p.pe, scale);
}

template <typename T, bool FP8>
void launch_mla(const char* op, const MlaParams& p, int64_t tokens, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  constexpr int64_t B = sizeof(T);
  constexpr int64_t CV = FP8 ? VEC : 16;  // bytes of one cache store
  constexpr int64_t CB = FP8 ? 1 : B;     // bytes of one cache element
  const bool vec_ok = p.rank % VEC == 0 && p.pe % VEC == 0 && cuda::aligned(p.kv_c, 16) &&
                      cuda::aligned(p.k_pe, 16) && cuda::aligned(p.cache, CV) && (p.c_tok * B) % 16 == 0 &&
                      (p.pe_tok * B) % 16 == 0 && (p.cache_block * CB) % CV == 0 &&
                      (p.cache_page * CB) % CV == 0 && (p.rank * CB) % CV == 0;
  const int units = std::max(p.rank, p.pe) / (vec_ok ? VEC : 1);
  const int threads = std::min(256, std::max(32, (units + 31) / 32 * 32));
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>(tokens)), block(threads);
  if (vec_ok) {
    cuda::launch(op, device_id, props, concat_and_cache_mla_kernel<T, VEC, FP8>, grid, block, 0, stream, p);
  } else {
    cuda::launch(op, device_id, props, concat_and_cache_mla_kernel<T, 1, FP8>, grid, block, 0, stream, p);
  }
}

void concat_and_cache_mla_cuda(TensorView kv_c, TensorView k_pe, TensorView kv_cache, TensorView slot_mapping,
                               TensorView scale, bool fp8, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.concat_and_cache_mla";
  const MlaArgs m = check_mla_args(op, kDLCUDA, kv_c, k_pe, kv_cache, slot_mapping, scale, fp8);
  if (m.tokens == 0 || m.rank + m.pe == 0) return;
  if (m.tokens > INT32_MAX || m.rank + m.pe > INT32_MAX) {
    TVM_FFI_THROW(ValueError) << op << ": sizes exceed the kernel's 32-bit indexing";
  }
  MlaParams p;
  p.kv_c = data_ptr<const void>(kv_c);
  p.k_pe = data_ptr<const void>(k_pe);
  p.cache = data_ptr<void>(kv_cache);
  p.slots = data_ptr<const int64_t>(slot_mapping);
  p.scale = fp8 ? data_ptr<const float>(scale) : nullptr;
  p.c_tok = m.c_tok;
  p.pe_tok = m.pe_tok;
  p.cache_block = m.cache_block;
  p.cache_page = m.cache_page;
  p.num_slots = m.num_blocks * m.block_size;
  p.block_size = m.block_size;
  p.rank = static_cast<int>(m.rank);
  p.pe = static_cast<int>(m.pe);
  OPMUX_DISPATCH_DTYPE(m.dtype, float, __half, __nv_bfloat16, [&] {
    if (fp8) launch_mla<scalar_t, true>(op, p, m.tokens, m.device_id);
    else launch_mla<scalar_t, false>(op, p, m.tokens, m.device_id);
  });
}

// gather_cache: program (sequence b, split) copies its share of b's tokens, a warp per token,
// V units per lane. Bad values (cu_seq_lens not increasing or past dst, negative seq_starts, a
// block_table column past its width, a block id out of range) skip the sequence or token: the
// kernel never reads or writes out of bounds.
struct GatherParams {
  const char* src;
  char* dst;
  const int32_t* table;
  const int32_t* cu;
  const int32_t* starts;  // nullptr: none
  int64_t num_blocks, block_size, rows, width, table_row;
  int64_t cache_block, cache_page, dst_row, entry_units;  // bytes (entry: units)
};

template <typename V>
__global__ void __launch_bounds__(256) gather_cache_kernel(GatherParams p) {
  const int64_t b = blockIdx.x;
  cuda::pdl_enter();
  const int64_t lo = p.cu[b], hi = p.cu[b + 1];
  if (lo < 0 || hi < lo || hi > p.rows) return;
  const int64_t first = p.starts != nullptr ? p.starts[b] : 0;
  if (first < 0) return;
  const int64_t col0 = first / p.block_size, n = hi - lo;
  const int64_t per = (n + gridDim.y - 1) / gridDim.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * per, t1 = min(n, t0 + per);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int32_t* row = p.table + b * p.table_row;
  for (int64_t i = t0 + warp; i < t1; i += warps) {
    const int64_t col = col0 + i / p.block_size;
    if (col >= p.width) break;  // columns only grow with i
    const int64_t blk = row[col];
    if (blk < 0 || blk >= p.num_blocks) continue;
    const V* __restrict__ src = reinterpret_cast<const V*>(p.src + blk * p.cache_block + (i % p.block_size) * p.cache_page);
    V* __restrict__ dst = reinterpret_cast<V*>(p.dst + (lo + i) * p.dst_row);
    for (int64_t e = lane; e < p.entry_units; e += 32) dst[e] = src[e];
  }
}

void gather_cache_cuda(TensorView src_cache, TensorView dst, TensorView block_table, TensorView cu_seq_lens,
                       TensorView seq_starts, bool has_starts, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.gather_cache";
  const GatherArgs g = check_gather_args(op, kDLCUDA, src_cache, dst, block_table, cu_seq_lens, seq_starts, has_starts);
  if (g.batch == 0 || g.entry_bytes == 0) return;
  if (g.batch > INT32_MAX) TVM_FFI_THROW(ValueError) << op << ": more than 2^31 - 1 sequences";
  GatherParams p;
  p.src = data_ptr<const char>(src_cache);
  p.dst = data_ptr<char>(dst);
  p.table = data_ptr<const int32_t>(block_table);
  p.cu = data_ptr<const int32_t>(cu_seq_lens);
  p.starts = has_starts ? data_ptr<const int32_t>(seq_starts) : nullptr;
  p.num_blocks = g.num_blocks;
  p.block_size = g.block_size;
  p.rows = g.rows;
  p.width = g.width;
  p.table_row = g.table_row;
  p.cache_block = g.cache_block;
  p.cache_page = g.cache_page;
  p.dst_row = g.dst_row;
  const int w = unit_bytes({g.entry_bytes, g.cache_block, g.cache_page, g.dst_row}, {p.src, p.dst});
  p.entry_units = g.entry_bytes / w;
  cuda::DeviceScope scope(op, g.device_id);
  const cuda::DeviceProps props = cuda::device_props(op, g.device_id);
  const cudaStream_t stream = cuda::current_stream(g.device_id);
  // splits per sequence: about two blocks per SM in all, at most 64 per sequence
  const int64_t splits = std::min<int64_t>(64, std::max<int64_t>(1, 2 * props.sm_count / g.batch));
  const dim3 grid(static_cast<unsigned>(g.batch), static_cast<unsigned>(splits)), block(256);
  with_unit(w, [&](auto W) {
    using V = typename Unit<decltype(W)::value>::type;
    cuda::launch(op, g.device_id, props, gather_cache_kernel<V>, grid, block, 0, stream, p);
  });
}

}  // namespace kvcache_cuda
}  // namespace opmux

// The serving lanes, generated from the contracts (ops/kvcache; opmux/lane.h)
#include "opmux/contracts/kvcache_cuda_lanes.inc"

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cuda, opmux::kvcache_cuda::reshape_and_cache_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(copy_blocks_cuda, opmux::kvcache_cuda::copy_blocks_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(concat_and_cache_mla_cuda, opmux::kvcache_cuda::concat_and_cache_mla_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gather_cache_cuda, opmux::kvcache_cuda::gather_cache_cuda);
