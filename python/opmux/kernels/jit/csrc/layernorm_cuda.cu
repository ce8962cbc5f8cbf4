// RMSNorm, fused add + RMSNorm, their Gemma variants, qk_norm, and RMSNorm / fused add + RMSNorm
// with static fp8 quantization for CUDA tensors (float32 / float16 / bfloat16).
//
// All ops are one kernel family over two row tensors `a` (written) and `b` (read):
//   rmsnorm:            b = x,        a = out
//   fused_add_rmsnorm:  b = residual, a = x;  b <- round(a + b) first, then a <- norm(b)
//   qk_norm:            a = b = one (token, head) row of q or k, normalized in place; q's and
//                       k's rows share one launch (QkParams). Every element is read before the
//                       thread that owns it writes it, so a == b is safe.
// GEMMA applies the weight as (1 + w) in float; the kernels' parameter type (NormParams or
// QkParams) says where row `row` lives (row_ptrs).
// Static fp8 quantization (NormQuantParams, kQuant): the same kernels, launched exactly as the
// unquantized op would be (same threads, same reduction order, so the same rstd), write
// e4m3(round_T(norm) * (1 / scale)) into q (store_fp8: static_quant_fp8's conversion) instead
// of the normalized row into `a`: rmsnorm: b = x (a unused); fused: b = residual (updated as
// above), a = x, only read (another tensor: checked). So q is bit-equal to rmsnorm / fused_add_rmsnorm followed by
// static_quant_fp8.
// Layout: blockDim.x threads share a row: a multiple of 32, or a power of two below 32 (a
// sub-warp group, e.g. 16 lanes x 8 bf16 for head_dim 128, so no lane idles); blockDim.y > 1
// only when blockDim.x <= 32 (several rows per block, each warp holding whole rows), so
// __syncthreads() is only used in blocks that hold exactly one row and never diverges.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <type_traits>

#include "opmux/checks.h"
#include "opmux/cuda_fp8.cuh"
#include "opmux/cuda_utils.cuh"
#include "opmux/head_checks.h"
#include "opmux/contracts/layernorm.h"
#include "opmux/quant_checks.h"

namespace opmux {
namespace layernorm_cuda {

using cuda::from_float;
using cuda::load_vec;
using cuda::load_vec_ro;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;

struct NormParams {
  void* a;            // out (rmsnorm) or x (fused)
  void* b;            // x (rmsnorm) or residual (fused)
  const void* w;      // [hidden]
  int64_t a_stride;   // row strides in elements
  int64_t b_stride;
  int64_t rows;
  int hidden;
  float eps;
};

// qk_norm: one of q / k, its rows being (token, head) pairs in token-major order.
struct HeadRows {
  void* x;
  const void* w;          // [hidden]
  int64_t token_stride;   // elements
  int64_t head_stride;
  int64_t heads;
  int64_t rows;           // tokens * heads
};

// qk_norm in one launch: rows [0, q.rows) are q's, [q.rows, rows) k's.
struct QkParams {
  HeadRows q, k;
  int64_t rows;
  int hidden;
  float eps;
};

// The quantized ops: the norm's rows, plus the fp8 output and its one float32 scale.
struct NormQuantParams : NormParams {
  uint8_t* q;          // [rows, hidden] fp8 bytes
  int64_t q_stride;    // bytes
  const float* scale;  // one element, read after pdl_enter (an earlier kernel may write it)
};

template <typename P>
constexpr bool kQuant = std::is_same_v<P, NormQuantParams>;

template <typename T>
struct RowPtrs {
  T* a;
  T* b;
  const T* w;
};

template <typename T>
__device__ __forceinline__ RowPtrs<T> row_ptrs(const NormParams& p, int64_t row) {
  return {static_cast<T*>(p.a) + row * p.a_stride, static_cast<T*>(p.b) + row * p.b_stride,
          static_cast<const T*>(p.w)};
}

// Field-wise selects rather than a reference to p.q or p.k: keeps the parameters in the
// constant bank instead of copying the struct to local memory.
template <typename T>
__device__ __forceinline__ RowPtrs<T> row_ptrs(const QkParams& p, int64_t row) {
  const bool is_q = row < p.q.rows;
  const int64_t r = is_q ? row : row - p.q.rows;
  const int64_t heads = is_q ? p.q.heads : p.k.heads;
  const int64_t ts = is_q ? p.q.token_stride : p.k.token_stride;
  const int64_t hs = is_q ? p.q.head_stride : p.k.head_stride;
  T* x = static_cast<T*>(is_q ? p.q.x : p.k.x);
  if (ts == heads * hs) {
    // each token's heads packed (contiguous q / k): row r = t * heads + h starts at r * head_stride,
    // no division (qk_norm at prefill sizes was SM-bound on it, at 16 lanes a row)
    x += r * hs;
  } else {
    // 32-bit division whenever it fits (a 64-bit one is a long instruction sequence per row)
    const int64_t t = r <= 0xffffffffLL && heads <= 0xffffffffLL
                          ? static_cast<int64_t>(static_cast<uint32_t>(r) / static_cast<uint32_t>(heads))
                          : r / heads;
    x += t * ts + (r - t * heads) * hs;
  }
  return {x, x, static_cast<const T*>(is_q ? p.q.w : p.k.w)};
}

template <bool GEMMA>
__device__ __forceinline__ float weight_factor(float w) {
  return GEMMA ? 1.0f + w : w;
}

// Sum of `v` over the threads of this row (all of blockDim.x); every thread gets the total.
// SUBWARP (compile-time, so the other kernels keep their register counts): blockDim.x < 32.
template <bool SUBWARP = false>
__device__ __forceinline__ float row_sum(float v) {
  if constexpr (SUBWARP) {  // power-of-two group of lanes within one warp
    // The group's own lanes only (its rows exit as a whole, the other groups of the warp may
    // have exited); xor offsets < width never leave the group.
    const unsigned width = blockDim.x;
    const unsigned lane = (threadIdx.y * width + threadIdx.x) & 31u;
    const unsigned mask = ((1u << width) - 1u) << (lane & ~(width - 1u));
    for (unsigned o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    return v;
  }
  v = cuda::warp_sum(v);
  if (blockDim.x > 32) {  // uniform per block: blockDim.y == 1 here
    __shared__ float partial[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.f;
    v = cuda::warp_sum(v);  // each warp reduces all partials itself: no second barrier
  }
  return v;
}

__device__ __forceinline__ float inv_rms(float sum, int hidden, float eps) {
  return rsqrtf(sum / static_cast<float>(hidden) + eps);
}

// Row held in registers: thread t owns vectors t, t + T, ..., t + (PER-1) T of the row
// (T = blockDim.x), so every load/store instruction of a warp is one contiguous 512-byte run.
// Launch guarantees hidden / VEC <= PER * blockDim.x.
// PER == 1 may run 1024 threads per row (H = 8192 bf16 with one vector per thread: the fused
// op at PER = 2 x 512 needed 50 registers, i.e. 2 blocks = half occupancy per SM).
// SUBWARP: blockDim.x < 32 (PER == 1 only).
template <typename T, int VEC, int PER, bool FUSED, bool GEMMA, typename P, bool SUBWARP = false>
__global__ void __launch_bounds__(PER == 1 ? 1024 : 512) norm_reg_kernel(P p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;  // whole warp (blockDim.x == 32 whenever blockDim.y > 1)
  const RowPtrs<T> rp = row_ptrs<T>(p, row);
  T* __restrict__ a = rp.a;
  T* __restrict__ b = rp.b;
  const T* __restrict__ w = rp.w;
  const int nvec = p.hidden / VEC;
  const int tid = threadIdx.x;

  // Weights are prefetched with the row only while registers allow (no spills at PER >= 4).
  constexpr bool kPreloadW = PER <= 2;
  cuda::pdl_enter();
  uint8_t* q = nullptr;
  float inv = 0.f;
  if constexpr (kQuant<P>) {
    q = p.q + row * p.q_stride;
    inv = 1.0f / __ldg(p.scale);
  }
  Vec<T, VEC> vb[PER], va[PER], vw[PER];
  // All loads first so PER independent requests are in flight per thread.
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    if (j < nvec) {
      vb[i] = load_vec<T, VEC>(b + j * VEC);
      if constexpr (FUSED) va[i] = load_vec<T, VEC>(a + j * VEC);
      if constexpr (kPreloadW) vw[i] = load_vec_ro<T, VEC>(w + j * VEC);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    if (j < nvec) {
      if constexpr (FUSED) {
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          vb[i].v[k] = from_float<T>(to_float(va[i].v[k]) + to_float(vb[i].v[k]));
        store_vec(b + j * VEC, vb[i]);  // residual as stored; normalized below as stored
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float f = to_float(vb[i].v[k]);
        sum += f * f;
      }
    }
  }
  const float rstd = inv_rms(row_sum<SUBWARP>(sum), p.hidden, p.eps);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = i * blockDim.x + tid;
    if (j < nvec) {
      if constexpr (!kPreloadW) vw[i] = load_vec_ro<T, VEC>(w + j * VEC);
      Vec<T, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        o.v[k] = from_float<T>((to_float(vb[i].v[k]) * rstd) *
                               weight_factor<GEMMA>(to_float(vw[i].v[k])));
      if constexpr (kQuant<P>) {
        cuda::store_fp8<T, VEC>(q + j * VEC, o, inv);
      } else {
        store_vec(a + j * VEC, o);
      }
    }
  }
}

// Any hidden size: two strided passes over the row, the second re-reads b (from L1/L2). For
// the fused op the re-read sees this thread's own pass-1 store (same thread, same index).
// VEC == 1 is the scalar path for odd sizes and misaligned rows.
template <typename T, int VEC, bool FUSED, bool GEMMA, typename P>
__global__ void __launch_bounds__(512) norm_loop_kernel(P p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;
  const RowPtrs<T> rp = row_ptrs<T>(p, row);
  T* __restrict__ a = rp.a;
  T* __restrict__ b = rp.b;
  const T* __restrict__ w = rp.w;
  const int nvec = p.hidden / VEC;

  cuda::pdl_enter();
  uint8_t* q = nullptr;
  float inv = 0.f;
  if constexpr (kQuant<P>) {
    q = p.q + row * p.q_stride;
    inv = 1.0f / __ldg(p.scale);
  }
  float sum = 0.f;
  for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
    Vec<T, VEC> vb = load_vec<T, VEC>(b + j * VEC);
    if constexpr (FUSED) {
      const Vec<T, VEC> va = load_vec<T, VEC>(a + j * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        vb.v[k] = from_float<T>(to_float(va.v[k]) + to_float(vb.v[k]));
      store_vec(b + j * VEC, vb);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float f = to_float(vb.v[k]);
      sum += f * f;
    }
  }
  const float rstd = inv_rms(row_sum(sum), p.hidden, p.eps);
  for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
    const Vec<T, VEC> vb = load_vec<T, VEC>(b + j * VEC);
    const Vec<T, VEC> vw = load_vec_ro<T, VEC>(w + j * VEC);
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o.v[k] = from_float<T>((to_float(vb.v[k]) * rstd) * weight_factor<GEMMA>(to_float(vw.v[k])));
    if constexpr (kQuant<P>) {
      cuda::store_fp8<T, VEC>(q + j * VEC, o, inv);
    } else {
      store_vec(a + j * VEC, o);
    }
  }
}

// Threads per row cap, measured on H200 (bf16, H=4096): rmsnorm is faster with 256 threads x 2
// vectors (more loads in flight per thread), the fused op with 512 x 1 (two row copies in regs).
template <bool FUSED>
constexpr int kMaxThreads = FUSED ? 512 : 256;
// Register path up to 4 x kMaxThreads vectors per row (fused: 16K bf16/fp16, 8K fp32 elements). PER = 8
// spills on sm_90 for the fused op (two row copies + addresses), so larger rows use the loop.
constexpr int kMaxPer = 4;

inline int round_up32(int64_t n) { return static_cast<int>((n + 31) / 32 * 32); }

// 16-byte path only if every row start of a, b and w is 16-byte aligned and rows are whole
// vectors: base % 16 == 0, stride * sizeof(T) % 16 == 0 and hidden % VEC == 0.
template <typename T>
bool vec_aligned(const NormParams& p) {
  return p.hidden % cuda::kVec16<T> == 0 && cuda::aligned(p.a, 16) && cuda::aligned(p.b, 16) &&
         cuda::aligned(p.w, 16) && (p.a_stride * sizeof(T)) % 16 == 0 &&
         (p.b_stride * sizeof(T)) % 16 == 0;
}

// and q's rows: VEC-byte stores
template <typename T>
bool vec_aligned(const NormQuantParams& p) {
  return vec_aligned<T>(static_cast<const NormParams&>(p)) && cuda::aligned(p.q, cuda::kVec16<T>) &&
         p.q_stride % cuda::kVec16<T> == 0;
}

template <typename T>
bool vec_aligned(const HeadRows& h) {
  return cuda::aligned(h.x, 16) && cuda::aligned(h.w, 16) &&
         (h.token_stride * sizeof(T)) % 16 == 0 && (h.head_stride * sizeof(T)) % 16 == 0;
}

template <typename T>
bool vec_aligned(const QkParams& p) {
  return p.hidden % cuda::kVec16<T> == 0 && vec_aligned<T>(p.q) && vec_aligned<T>(p.k);
}

// The fused op's choice of threads per row and vector width fixes its sum-of-squares order:
// comm_cuda.cu's norm_threads() mirrors it (the fused all-reduce + add + RMSNorm is bit-equal to
// all_reduce -> fused_add_rmsnorm only while both agree), so change both together.
template <typename T, bool FUSED, bool GEMMA, typename P>
void launch_norm(const char* op, const P& p, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const bool vec_ok = vec_aligned<T>(p);
  const int vec = vec_ok ? VEC : 1;
  const int64_t nvec = p.hidden / vec;

  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);

  int per = 1;
  while (per < kMaxPer && nvec > static_cast<int64_t>(per) * kMaxThreads<FUSED>) per *= 2;
  bool use_reg = vec_ok && nvec <= static_cast<int64_t>(per) * kMaxThreads<FUSED>;
  // One vector per thread with up to 1024 threads per row, when rows of up to 1024 vectors
  // would otherwise take PER >= 2:
  //  - fused op (always): PER = 2 x 512 threads used 50 registers -> 2 blocks / SM (half
  //    occupancy); 1 x 1024 uses 32 -> 2 blocks of 1024, full occupancy.
  //  - rmsnorm with few rows (fewer than two per SM): the per-row latency (PER serial vectors
  //    per thread and a longer reduction) dominates when each SM has one or two rows.
  //    (Large T keeps 256 x PER: measured at copy bandwidth.)
  //  - rmsnorm rows of 513-1024 vectors (H = 8192 bf16) with few rows: 2 x 512 rather than
  //    1 x 1024 (H200 sweep: 1.55 vs 1.75 us at T = 1, 1.68 vs 1.80 at T = 16).
  if (vec_ok && per >= 2 && nvec <= 1024) {
    if (FUSED) {
      per = 1;
      use_reg = true;
    } else if (p.rows < 2 * static_cast<int64_t>(props.sm_count)) {
      per = nvec <= 512 ? 1 : 2;
      use_reg = true;
    }
  }
  // Prefill (H200 sweep, bf16): rmsnorm from 16384 rows with 4 vectors per thread (H = 4096:
  // 128 x 4, 131.6 us vs 136.8 for 256 x 2 at T = 32768; H = 8192 already runs 256 x 4); the
  // fused op from 4096 rows of 257-1024 vectors in the two-pass loop of 256 threads (the re-read
  // hits L1; H = 4096: 260.0 vs 266.2 us at T = 32768; H = 8192: 67.9 vs 72.6 at T = 4096,
  // 264.1 vs 286.9 at T = 16384).
  if (vec_ok && !FUSED && p.rows >= 16384 && nvec >= 4 * 32 && nvec <= 4 * kMaxThreads<FUSED>) {
    per = 4;
    use_reg = true;
  }
  if (vec_ok && FUSED && p.rows >= 4096 && nvec > kMaxThreads<FUSED> / 2 && nvec <= 2 * kMaxThreads<FUSED>) {
    use_reg = false;  // the loop kernel, 256 threads (below)
  }
  int threads_x;
  if (use_reg) {
    const int64_t need = (nvec + per - 1) / per;
    if (need < 32) {  // sub-warp row group: smallest power of two covering the row
      threads_x = 1;
      while (threads_x < need) threads_x *= 2;
    } else {
      threads_x = round_up32(need);
    }
  } else {
    threads_x = round_up32(std::min<int64_t>(nvec, FUSED && p.rows >= 4096 ? 256 : kMaxThreads<FUSED>));
  }
  // Small rows: one warp (or sub-warp group) per row, 256 threads per block.
  const int rows_per_block = threads_x <= 32 ? 256 / threads_x : 1;
  const int64_t blocks = (p.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) {
    TVM_FFI_THROW(ValueError) << op << ": too many rows (" << p.rows << ")";
  }
  const dim3 grid(static_cast<unsigned>(blocks)), block(threads_x, rows_per_block);

  void (*kernel)(P) = nullptr;
  // qk_norm with few rows (decode): a warp per row of 8-byte vectors, 8 rows per block, when
  // that covers a row exactly (head_dim 128 in 16-bit types). H200 sweep, 32 + 8 heads of 128
  // bf16: 1.09 us at T = 1 against 1.33 us for 16 lanes x 16 bytes; at T = 128 and above the
  // 16-lane layout stays faster.
  constexpr int VEC8 = 8 / static_cast<int>(sizeof(T));
  if constexpr (std::is_same_v<P, QkParams> && VEC8 >= 2) {
    if (vec_ok && p.hidden == 32 * VEC8 && p.rows <= 4 * static_cast<int64_t>(props.sm_count)) {
      const int64_t small_blocks = (p.rows + 7) / 8;
      cuda::launch(op, device_id, props, norm_reg_kernel<T, VEC8, 1, FUSED, GEMMA, P>,
                   dim3(static_cast<unsigned>(small_blocks)), dim3(32, 8), 0,
                   cuda::current_stream(device_id), p);
      return;
    }
  }
  if (use_reg) {
    switch (per) {
      case 1:
        kernel = threads_x < 32 ? norm_reg_kernel<T, VEC, 1, FUSED, GEMMA, P, true>
                                : norm_reg_kernel<T, VEC, 1, FUSED, GEMMA, P>;
        break;
      case 2: kernel = norm_reg_kernel<T, VEC, 2, FUSED, GEMMA, P>; break;
      default: kernel = norm_reg_kernel<T, VEC, 4, FUSED, GEMMA, P>; break;
    }
  } else {
    kernel = vec_ok ? norm_loop_kernel<T, VEC, FUSED, GEMMA, P>
                    : norm_loop_kernel<T, 1, FUSED, GEMMA, P>;
  }
  cuda::launch(op, device_id, props, kernel, grid, block, 0, cuda::current_stream(device_id), p);
}

template <bool FUSED, bool GEMMA>
void run(const char* op, const char* a_name, TensorView a, const char* b_name, TensorView b,
         TensorView weight, double eps) {
  RowsArgs r = check_norm_args(op, kDLCUDA, a_name, a, b_name, b, weight, eps);
  if (r.rows == 0 || r.hidden == 0) return;
  lane::contract::rule_norm_hidden(op, r.hidden);  // the contract's CUDA limit, its words
  if (FUSED && data_ptr<char>(a) == data_ptr<char>(b)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (both are "
                              << "updated in place)";
  }
  NormParams p;
  p.a = data_ptr<void>(a);
  p.b = data_ptr<void>(b);
  p.w = data_ptr<const void>(weight);
  p.a_stride = row_stride(op, a_name, a);
  p.b_stride = row_stride(op, b_name, b);
  p.rows = r.rows;
  p.hidden = static_cast<int>(r.hidden);
  p.eps = static_cast<float>(eps);
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_norm<scalar_t, FUSED, GEMMA>(op, p, r.device_id); });
}

void rmsnorm_cuda(TensorView out, TensorView x, TensorView weight, double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<false, false>("opmux.rmsnorm", "out", out, "x", x, weight, eps);
}

void fused_add_rmsnorm_cuda(TensorView x, TensorView residual, TensorView weight, double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<true, false>("opmux.fused_add_rmsnorm", "x", x, "residual", residual, weight, eps);
}

void gemma_rmsnorm_cuda(TensorView out, TensorView x, TensorView weight, double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<false, true>("opmux.gemma_rmsnorm", "out", out, "x", x, weight, eps);
}

void gemma_fused_add_rmsnorm_cuda(TensorView x, TensorView residual, TensorView weight,
                                  double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<true, true>("opmux.gemma_fused_add_rmsnorm", "x", x, "residual", residual, weight, eps);
}

HeadRows head_rows(TensorView t, const Heads& h, TensorView weight) {
  return {data_ptr<void>(t), data_ptr<const void>(weight), h.token_stride, h.head_stride,
          h.heads, h.tokens * h.heads};
}

void qk_norm_cuda(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight,
                  double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.qk_norm";
  QkNormArgs a = check_qk_norm_args(op, kDLCUDA, q, k, q_weight, k_weight, eps);
  QkParams p;
  p.q = head_rows(q, a.q, q_weight);
  p.k = head_rows(k, a.k, k_weight);
  p.rows = p.q.rows + p.k.rows;
  if (p.rows == 0 || a.head_dim == 0) return;
  lane::contract::rule_qk_head_dim(op, a.head_dim);  // the contract's CUDA limit, its words
  p.hidden = static_cast<int>(a.head_dim);
  p.eps = static_cast<float>(eps);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_norm<scalar_t, false, false>(op, p, a.device_id); });
}

// q [rows, hidden] fp8 bytes, x [rows, hidden] (residual like x), weight [hidden], scale one
// float32 element (read on the device).
template <bool FUSED>
void run_quant(const char* op, TensorView q, TensorView x, TensorView residual, TensorView weight,
               TensorView scale, double eps) {
  RowsArgs r = FUSED ? check_norm_args(op, kDLCUDA, "residual", residual, "x", x, weight, eps)
                     : check_norm_args(op, kDLCUDA, "x", x, "x", x, weight, eps);
  check_quant_args(op, q, x);
  check_device(op, kDLCUDA, {{"x", &x}, {"q", &q}, {"scale", &scale}});
  check_float32(op, "scale", scale);
  check_ndim(op, "scale", scale, 1);
  check_size(op, "scale", scale, 0, 1, "one element (a per-tensor scale)");
  if (r.rows == 0 || r.hidden == 0) return;
  lane::contract::rule_norm_hidden(op, r.hidden);  // the contract's CUDA limit, its words
  if (FUSED && data_ptr<char>(x) == data_ptr<char>(residual)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (residual is "
                              << "updated in place, x is read)";
  }
  // the norm's rows as launch_norm takes them: a = x (fused; only read) or unused (= b), b = x
  // or residual
  NormQuantParams p;
  p.a = data_ptr<void>(x);
  p.b = FUSED ? data_ptr<void>(residual) : data_ptr<void>(x);
  p.w = data_ptr<const void>(weight);
  p.a_stride = row_stride(op, "x", x);
  p.b_stride = FUSED ? row_stride(op, "residual", residual) : p.a_stride;
  p.rows = r.rows;
  p.hidden = static_cast<int>(r.hidden);
  p.eps = static_cast<float>(eps);
  p.q = data_ptr<uint8_t>(q);
  p.q_stride = row_stride(op, "q", q);
  p.scale = data_ptr<const float>(scale);
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_norm<scalar_t, FUSED, false>(op, p, r.device_id); });
}

void rmsnorm_static_quant_fp8_cuda(TensorView q, TensorView x, TensorView weight, TensorView scale,
                                   double eps, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run_quant<false>("opmux.rmsnorm_static_quant_fp8", q, x, x, weight, scale, eps);
}

void fused_add_rmsnorm_static_quant_fp8_cuda(TensorView q, TensorView x, TensorView residual,
                                             TensorView weight, TensorView scale, double eps,
                                             bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run_quant<true>("opmux.fused_add_rmsnorm_static_quant_fp8", q, x, residual, weight, scale, eps);
}

}  // namespace layernorm_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_cuda, opmux::layernorm_cuda::rmsnorm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm_cuda, opmux::layernorm_cuda::fused_add_rmsnorm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_rmsnorm_cuda, opmux::layernorm_cuda::gemma_rmsnorm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_fused_add_rmsnorm_cuda,
                              opmux::layernorm_cuda::gemma_fused_add_rmsnorm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_norm_cuda, opmux::layernorm_cuda::qk_norm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_static_quant_fp8_cuda,
                              opmux::layernorm_cuda::rmsnorm_static_quant_fp8_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm_static_quant_fp8_cuda,
                              opmux::layernorm_cuda::fused_add_rmsnorm_static_quant_fp8_cuda);
// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/layernorm_cuda_lanes.inc"
