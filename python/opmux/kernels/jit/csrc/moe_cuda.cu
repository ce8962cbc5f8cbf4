// MoE routing for CUDA tensors.
//
// topk_softmax_cuda(topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
// correction_bias, has_bias, renormalize, moe_softcapping, bias_on_logits, enable_pdl): one warp
// per token. Each logit is first made the CPU kernel's way: an optional softcap
// (cap * tanh(x / cap), the same Cephes tanh), plus the bias when it goes on the logits. For
// E <= 1024 the row lives in registers (lane l holds experts l, l + 32, ...). Each ranking key
// (the logit; in DeepSeek's mode softmax + bias) gets an order-preserving uint32 key, so
// selection j is two single-instruction warp reductions (redux.sync: max key, then min expert
// index among the lanes holding it) instead of a 5-step shuffle chain of (value, index) pairs; a
// per-lane bitmask marks taken experts. The token is latency-bound (one warp, k dependent
// rounds), so this chain is its cost. Ranking by logit, the max for the softmax is selection 0's
// logit; in DeepSeek's mode max and sum come first (the keys need them). Lane j keeps weight j
// in a register and the k weights are written once, renormalized, by lanes 0..k-1 (k <= 32;
// larger k writes lane 0's way). Larger E re-reads the row from L1/L2 on each selection, taking
// the best (key, -index) strictly after selection j - 1 in that order. Either way ties go to the
// lower expert index. Weights: expf(x - max) / sum in fp32, renormalized by their sum in
// selection order. ids are int32 or int64; token_expert_indices[i, j] = j * T + i.
//
// topk_sigmoid_cuda(topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
// correction_bias, has_bias, renormalize, enable_pdl): the same kernels in their kSigmoid mode:
// the key is sigmoid(x) (+ bias), the weight sigmoid(x) of the chosen expert, ties -> lower id.
//
// batched_moe_align_block_size_cuda(sorted_ids, expert_ids, num_tokens_post_padded,
// expert_num_tokens, max_tokens_per_batch, block_size, enable_pdl): one block per expert.
//
// moe_align_block_size_cuda(sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum, has_cumsum,
// topk_ids, expert_map, has_map, block_size, num_experts, pad, unused_expert_id, enable_pdl): one block. Warp w owns a contiguous slice of topk_ids; pass 1
// counts per (warp, expert) in shared memory (__match_any_sync groups equal ids, the group's
// leader adds its popcount: no atomics), then an exclusive scan over warps and a scan over
// experts give every (warp, expert) its first output slot; pass 2 replays the slice in order
// and writes rank-in-group offsets. The result is the stable (token-order) layout of the CPU
// reference. Ids are int32 or int64; with an expert map each id is mapped first (-1: left out).
// Ids (and mapped ids) outside [0, E) are skipped: never an out-of-bounds write. With `pad`
// every slot of sorted_token_ids gets numel first; blocks past the total get unused_expert_id;
// cumsum (when given) gets each expert's first slot and the total.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "opmux/cuda_utils.cuh"
#include "opmux/moe_checks.h"
#include "opmux/contracts/moe.h"

namespace opmux {
namespace moe_cuda {

using cuda::to_float;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;

// Scoring modes of the top-k kernels (a template argument): topk_softmax ranking by logit, by
// softmax + bias (DeepSeek's correction bias), and topk_sigmoid (weights sigmoid(x), ranked by
// sigmoid(x), + bias when given).
constexpr int kByLogit = 0, kDeepseek = 1, kSigmoid = 2;

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

struct TopkParams {
  float* w;
  void* ids;        // int32 or int64 (the kernel's template argument)
  int32_t* tei;     // null: not written
  const void* g;
  const float* bias;  // null: none
  int64_t g_stride, w_stride, ids_stride, tei_stride;
  int64_t tokens;
  int experts;
  int k;
  float softcap;  // 0: off
  bool renormalize;
  bool bias_on_logits;
};

// Order-preserving map of a float to uint32 (a > b  <=>  key(a) > key(b)); -0 is folded into +0
// so that equal logits compare equal and tie on the index, as in the reference.
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;  // any NaN ranks first, as torch.sort does
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float order_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// (v, i) ranks before (bv, bi): higher key (NaN above all), or equal key and lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  const uint32_t a = order_key(v), b = order_key(bv);
  return bi == INT_MAX || a > b || (a == b && i < bi);
}
// (v, i) comes strictly after the previous selection (pv, pi) in that order.
__device__ __forceinline__ bool after(float v, int i, float pv, int pi) {
  const uint32_t a = order_key(v), b = order_key(pv);
  return pi < 0 || a < b || (a == b && i > pi);
}

__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (oi != INT_MAX && better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// The CPU kernel's tanh (Cephes tanhf: odd polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above).
__device__ __forceinline__ float tanh_cephes(float x) {
  const float ax = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  float big = 1.0f - 2.0f / (expf(ax + ax) + 1.0f);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}

// Expert e's logit as every backend makes it: softcapped, plus the bias when it goes on the logits.
template <typename T>
__device__ __forceinline__ float logit(const TopkParams& p, const T* g, int e) {
  float v = to_float(g[e]);
  if (p.softcap > 0.f) v = tanh_cephes(v / p.softcap) * p.softcap;
  if (p.bias != nullptr && p.bias_on_logits) v += p.bias[e];
  return v;
}

template <typename I>
__device__ __forceinline__ void write_out(const TopkParams& p, int64_t row, int j, float w, int id) {
  p.w[row * p.w_stride + j] = w;
  static_cast<I*>(p.ids)[row * p.ids_stride + j] = static_cast<I>(id);
  if (p.tei != nullptr) p.tei[row * p.tei_stride + j] = static_cast<int32_t>(j * p.tokens + row);
}

// Row in registers: lane l holds experts l + 32 i, i < VPT (E <= 32 * VPT). MODE: ranked by logit,
// by softmax + bias (kDeepseek) or by sigmoid (+ bias) (kSigmoid).
template <typename T, typename I, int VPT, int MODE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) topk_softmax_reg_kernel(TopkParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  cuda::pdl_enter();
  if (row >= p.tokens) return;  // whole warp
  const T* __restrict__ g = static_cast<const T*>(p.g) + row * p.g_stride;
  const int E = p.experts;
  float x[VPT];
  uint32_t key[VPT];  // 0 (below every real key, even -inf's) marks padding
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * 32 + lane;
    x[i] = e < E ? logit(p, g, e) : -INFINITY;
    key[i] = e < E ? order_key(x[i]) : 0u;
  }
  float m = 0.f, s = 1.f, total = 0.f, my_w = 0.f;
  if (MODE == kSigmoid) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int e = i * 32 + lane;
      if (e < E) {
        const float sc = sigmoid_f(x[i]);
        key[i] = order_key(p.bias != nullptr ? sc + p.bias[e] : sc);
      }
    }
  }
  if (MODE == kDeepseek) {  // the keys need the softmax first
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i) mx = fmaxf(mx, x[i]);
    m = warp_max(mx);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (i * 32 + lane < E) acc += expf(x[i] - m);
    s = cuda::warp_sum(acc);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int e = i * 32 + lane;
      key[i] = e < E ? order_key(expf(x[i] - m) / s + p.bias[e]) : 0u;
    }
  }
  uint32_t taken = 0;  // bit i: expert i * 32 + lane already selected
  int my_id = 0;
  for (int j = 0; j < p.k; ++j) {
    // this lane's best untaken expert; ascending i with a strict > keeps the lower index on ties
    uint32_t bk = 0u, bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!((taken >> i) & 1u) && key[i] > bk) { bk = key[i]; bi = static_cast<uint32_t>(i * 32 + lane); }
    }
    const uint32_t wk = __reduce_max_sync(kFull, bk);
    const int wi = static_cast<int>(__reduce_min_sync(kFull, bk == wk ? bi : static_cast<uint32_t>(INT_MAX)));
    if ((wi & 31) == lane) taken |= 1u << (wi >> 5);
    float bv;
    if (MODE != kByLogit) {  // the chosen expert's logit, from the lane holding it
      float mine = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        if (i == (wi >> 5)) mine = x[i];
      bv = __shfl_sync(kFull, mine, wi & 31);
    } else {
      bv = order_value(wk);
      if (j == 0) {  // the first selection is the row max
        m = bv;
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < VPT; ++i)
          if (i * 32 + lane < E) acc += expf(x[i] - m);
        s = cuda::warp_sum(acc);
      }
    }
    const float w = MODE == kSigmoid ? sigmoid_f(bv) : expf(bv - m) / s;
    total += w;
    if (j < 32) {
      if (lane == j) { my_w = w; my_id = wi; }
    } else if (lane == 0) {
      write_out<I>(p, row, j, w, wi);
    }
  }
  if (lane < p.k) write_out<I>(p, row, lane, p.renormalize ? my_w / total : my_w, my_id);
  if (p.renormalize && lane == 0)  // k > 32 only: re-reads this thread's own stores
    for (int j = 32; j < p.k; ++j) p.w[row * p.w_stride + j] /= total;
}

// Any E: the row is re-read from global memory (L1/L2) for the max, the sum and each selection.
template <typename T, typename I, int MODE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) topk_softmax_loop_kernel(TopkParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  cuda::pdl_enter();
  if (row >= p.tokens) return;  // whole warp
  const T* __restrict__ g = static_cast<const T*>(p.g) + row * p.g_stride;
  const int E = p.experts;
  float m = 0.f, s = 1.f;
  if (MODE != kSigmoid) {
    m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, logit(p, g, e));
    m = warp_max(m);
    s = 0.f;
    for (int e = lane; e < E; e += 32) s += expf(logit(p, g, e) - m);
    s = cuda::warp_sum(s);
  }
  float pv = 0.f, total = 0.f;
  int pi = -1;
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lane; e < E; e += 32) {
      const float x = logit(p, g, e);
      float v = x;
      if (MODE == kDeepseek) v = expf(x - m) / s + p.bias[e];
      if (MODE == kSigmoid) v = p.bias != nullptr ? sigmoid_f(x) + p.bias[e] : sigmoid_f(x);
      if (after(v, e, pv, pi) && better(v, e, bv, bi)) { bv = v; bi = e; }
    }
    warp_best(bv, bi);
    pv = bv;
    pi = bi;
    const float w = MODE == kSigmoid    ? sigmoid_f(logit(p, g, bi))
                    : MODE == kDeepseek ? expf(logit(p, g, bi) - m) / s
                                        : expf(bv - m) / s;
    total += w;
    if (lane == 0) write_out<I>(p, row, j, w, bi);
  }
  if (p.renormalize && lane == 0)  // re-reads this thread's own stores
    for (int j = 0; j < p.k; ++j) p.w[row * p.w_stride + j] /= total;
}

template <typename T, typename I, int MODE>
void launch_topk(const char* op, const TopkParams& p, int32_t device_id) {
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>((p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(32 * kWarpsPerBlock);
  const int vpt = (p.experts + 31) / 32;
  if (vpt <= 1) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 1, MODE>, grid, block, 0, stream, p);
  else if (vpt <= 2) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 2, MODE>, grid, block, 0, stream, p);
  else if (vpt <= 4) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 4, MODE>, grid, block, 0, stream, p);
  else if (vpt <= 8) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 8, MODE>, grid, block, 0, stream, p);
  else if (vpt <= 16) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 16, MODE>, grid, block, 0, stream, p);
  else if (vpt <= 32) cuda::launch(op, device_id, props, topk_softmax_reg_kernel<T, I, 32, MODE>, grid, block, 0, stream, p);
  else cuda::launch(op, device_id, props, topk_softmax_loop_kernel<T, I, MODE>, grid, block, 0, stream, p);
}

// The kernels' parameters from the checked arguments (topk_softmax and topk_sigmoid).
TopkParams topk_params(const char* op, const TopkArgs& a, TensorView topk_weights, TensorView topk_ids,
                       TensorView token_expert_indices, bool has_tei, TensorView gating_output,
                       TensorView correction_bias, bool has_bias, bool renormalize, float softcap,
                       bool bias_on_logits) {
  if (a.experts > INT_MAX / 2) TVM_FFI_THROW(ValueError) << op << ": too many experts (" << a.experts << ")";
  TopkParams p;
  p.w = data_ptr<float>(topk_weights);
  p.ids = data_ptr<void>(topk_ids);
  p.tei = has_tei ? data_ptr<int32_t>(token_expert_indices) : nullptr;
  p.g = data_ptr<const void>(gating_output);
  p.bias = has_bias ? data_ptr<const float>(correction_bias) : nullptr;
  p.g_stride = a.g_stride;
  p.w_stride = a.w_stride;
  p.ids_stride = a.ids_stride;
  p.tei_stride = a.tei_stride;
  p.tokens = a.tokens;
  p.experts = static_cast<int>(a.experts);
  p.k = static_cast<int>(a.k);
  p.softcap = softcap;
  p.renormalize = renormalize;
  p.bias_on_logits = bias_on_logits;
  return p;
}

void topk_softmax_cuda(TensorView topk_weights, TensorView topk_ids, TensorView token_expert_indices, bool has_tei,
                       TensorView gating_output, TensorView correction_bias, bool has_bias, bool renormalize,
                       double moe_softcapping, bool bias_on_logits, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.topk_softmax";
  TopkArgs a = check_topk_args(op, kDLCUDA, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                               correction_bias, has_bias, moe_softcapping);
  if (a.tokens == 0) return;
  const TopkParams p = topk_params(op, a, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                                   correction_bias, has_bias, renormalize, static_cast<float>(moe_softcapping),
                                   bias_on_logits);
  const bool deepseek = has_bias && !bias_on_logits;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16, [&] {
    if (a.ids64) {
      if (deepseek) launch_topk<scalar_t, int64_t, kDeepseek>(op, p, a.device_id);
      else launch_topk<scalar_t, int64_t, kByLogit>(op, p, a.device_id);
    } else {
      if (deepseek) launch_topk<scalar_t, int32_t, kDeepseek>(op, p, a.device_id);
      else launch_topk<scalar_t, int32_t, kByLogit>(op, p, a.device_id);
    }
  });
}

void topk_sigmoid_cuda(TensorView topk_weights, TensorView topk_ids, TensorView token_expert_indices, bool has_tei,
                       TensorView gating_output, TensorView correction_bias, bool has_bias, bool renormalize,
                       bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.topk_sigmoid";
  TopkArgs a = check_topk_args(op, kDLCUDA, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                               correction_bias, has_bias, 0.0);
  if (a.tokens == 0) return;
  // softcap 0: logit() returns the plain logit; the bias goes on the sigmoid scores
  const TopkParams p = topk_params(op, a, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                                   correction_bias, has_bias, renormalize, 0.f, false);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, __half, __nv_bfloat16, [&] {
    if (a.ids64) launch_topk<scalar_t, int64_t, kSigmoid>(op, p, a.device_id);
    else launch_topk<scalar_t, int32_t, kSigmoid>(op, p, a.device_id);
  });
}

struct AlignParams {
  int32_t* sorted;
  int32_t* experts;
  int32_t* post;
  int32_t* cumsum;     // null: not written
  const void* ids;     // int32 or int64 (the kernel's template argument)
  const int32_t* map;  // null: no expert map
  int numel, num_experts, block_size, n_sorted, n_blocks, fill;
  bool pad;
};

// Entry i's bin: its expert id (through the expert map), or -1 when it is not placed (mapped to
// -1, or out of range: skipped, never written out of bounds).
template <typename I>
__device__ __forceinline__ int align_bin(const AlignParams& p, int i, int hi) {
  if (i >= hi) return -1;
  const I v = __ldg(static_cast<const I*>(p.ids) + i);
  if (v < 0 || v >= p.num_experts) return -1;
  int e = static_cast<int>(v);
  if (p.map != nullptr) {
    e = __ldg(p.map + e);
    if (e < 0 || e >= p.num_experts) return -1;
  }
  return e;
}

template <typename I>
__global__ void __launch_bounds__(1024) moe_align_kernel(AlignParams p) {
  extern __shared__ int smem[];
  const int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int E = p.num_experts, bs = p.block_size;
  int* cnt = smem;            // [W][E]: counts, then each (warp, expert)'s offset in its expert
  int* base = smem + W * E;   // [E]: padded count, then the expert's first slot
  int* total = base + E;      // [1]
  const unsigned lt_mask = (1u << lane) - 1u;
  cuda::pdl_enter();
  for (int i = threadIdx.x; i < W * E; i += blockDim.x) cnt[i] = 0;
  if (p.pad)
    for (int i = threadIdx.x; i < p.n_sorted; i += blockDim.x) p.sorted[i] = p.numel;
  __syncthreads();
  const int per = (p.numel + W - 1) / W;
  const int lo = min(p.numel, warp * per), hi = min(p.numel, lo + per);
  for (int s = lo; s < hi; s += 32) {  // pass 1: counts
    const int e = align_bin<I>(p, s + lane, hi);
    const bool ok = e >= 0;
    const unsigned peers = __match_any_sync(kFull, e);
    if (ok && (peers & lt_mask) == 0) cnt[warp * E + e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {  // exclusive scan over warps
    int run = 0;
    for (int w = 0; w < W; ++w) {
      const int c = cnt[w * E + e];
      cnt[w * E + e] = run;
      run += c;
    }
    base[e] = (run + bs - 1) / bs * bs;
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scan of padded counts over experts
    const int chunk = (E + 31) / 32, b = min(E, lane * chunk), end = min(E, b + chunk);
    int local = 0;
    for (int e = b; e < end; ++e) local += base[e];
    int incl = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += v;
    }
    int run = incl - local;
    for (int e = b; e < end; ++e) {
      const int padded = base[e];
      base[e] = run;
      if (p.cumsum != nullptr) p.cumsum[e] = run;
      run += padded;
    }
    if (lane == 31) {
      *total = incl;
      *p.post = incl;
      if (p.cumsum != nullptr) p.cumsum[E] = incl;
    }
  }
  __syncthreads();
  const int tot = *total;
  for (int b = threadIdx.x; b < p.n_blocks; b += blockDim.x) {  // block -> expert
    const int pos = b * bs;
    int owner = p.fill;
    if (pos < tot) {  // last expert whose first slot is <= pos (it is non-empty)
      int l = 0, h = E - 1;
      while (l < h) {
        const int mid = (l + h + 1) >> 1;
        if (base[mid] <= pos) l = mid; else h = mid - 1;
      }
      owner = l;
    }
    p.experts[b] = owner;
  }
  for (int s = lo; s < hi; s += 32) {  // pass 2: stable scatter
    const int i = s + lane;
    const int e = align_bin<I>(p, i, hi);
    const bool ok = e >= 0;
    const unsigned peers = __match_any_sync(kFull, e);
    if (ok) p.sorted[base[e] + cnt[warp * E + e] + __popc(peers & lt_mask)] = i;
    __syncwarp();
    if (ok && (peers & lt_mask) == 0) cnt[warp * E + e] += __popc(peers);
    __syncwarp();
  }
}

void moe_align_block_size_cuda(TensorView sorted_token_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                               TensorView cumsum_buffer, bool has_cumsum, TensorView topk_ids, TensorView expert_map,
                               bool has_map, int64_t block_size, int64_t num_experts, bool pad_sorted_token_ids,
                               int64_t unused_expert_id, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.moe_align_block_size";
  AlignArgs a = check_align_args(op, kDLCUDA, sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum_buffer,
                                 has_cumsum, topk_ids, expert_map, has_map, block_size, num_experts);
  // shared memory: W * E counters + E slots + 1, within the default 48 KiB (W >= 1: the contract's rule)
  lane::contract::rule_align_smem(op, num_experts);
  constexpr int64_t kSmem = 48 * 1024;
  const int64_t fixed = (num_experts + 1) * 4;
  const int64_t warps = std::min<int64_t>(32, (kSmem - fixed) / (4 * num_experts));
  AlignParams p;
  p.sorted = data_ptr<int32_t>(sorted_token_ids);
  p.experts = data_ptr<int32_t>(expert_ids);
  p.post = data_ptr<int32_t>(num_tokens_post_padded);
  p.cumsum = has_cumsum ? data_ptr<int32_t>(cumsum_buffer) : nullptr;
  p.ids = data_ptr<const void>(topk_ids);
  p.map = has_map ? data_ptr<const int32_t>(expert_map) : nullptr;
  p.numel = static_cast<int>(a.numel);
  p.num_experts = static_cast<int>(num_experts);
  p.block_size = static_cast<int>(block_size);
  p.n_sorted = static_cast<int>(a.n_sorted);
  p.n_blocks = static_cast<int>(a.n_blocks);
  p.fill = static_cast<int>(unused_expert_id);
  p.pad = pad_sorted_token_ids;
  cuda::DeviceScope scope(op, a.device_id);
  const cuda::DeviceProps props = cuda::device_props(op, a.device_id);
  const size_t smem = static_cast<size_t>(warps * num_experts * 4 + fixed);
  const dim3 grid(1), block(static_cast<unsigned>(warps * 32));
  const cudaStream_t stream = cuda::current_stream(a.device_id);
  if (a.ids64) {
    cuda::launch(op, a.device_id, props, moe_align_kernel<int64_t>, grid, block, smem, stream, p);
  } else {
    cuda::launch(op, a.device_id, props, moe_align_kernel<int32_t>, grid, block, smem, stream, p);
  }
}

struct BatchedParams {
  int32_t* sorted;
  int32_t* experts;
  int32_t* post;
  const int32_t* counts;
  int64_t num_experts, m, block_size, n_sorted, n_blocks;
};

// batched_moe_align_block_size: block x lays out expert x (its first slot: the padded counts of
// the experts before it, summed by the block); the slots and blocks past the total are shared
// by all blocks (grid-stride); block 0 writes the total. Counts are clamped to [0, m] (the
// Python contract rejects others on the CPU; here a check would cost a synchronisation), so
// every write stays inside [0, E * round_up(m, block_size)), within the checked buffers.
__global__ void __launch_bounds__(256) batched_align_kernel(BatchedParams p) {
  __shared__ long long sums[2];  // [0]: padded counts of experts < x, [1]: of all experts
  const int64_t x = blockIdx.x;
  const int64_t bs = p.block_size, m = p.m;
  cuda::pdl_enter();
  if (threadIdx.x < 2) sums[threadIdx.x] = 0;
  __syncthreads();
  long long before = 0, all = 0;
  for (int64_t e = threadIdx.x; e < p.num_experts; e += blockDim.x) {
    const int64_t c = min(max(static_cast<int64_t>(__ldg(p.counts + e)), int64_t(0)), m);
    const int64_t padded = (c + bs - 1) / bs * bs;
    all += padded;
    if (e < x) before += padded;
  }
  if (before) atomicAdd(reinterpret_cast<unsigned long long*>(&sums[0]), static_cast<unsigned long long>(before));
  if (all) atomicAdd(reinterpret_cast<unsigned long long*>(&sums[1]), static_cast<unsigned long long>(all));
  __syncthreads();
  const int64_t start = sums[0], total = sums[1];
  const int64_t c = min(max(static_cast<int64_t>(__ldg(p.counts + x)), int64_t(0)), m);
  const int64_t padded = (c + bs - 1) / bs * bs;
  const int32_t sentinel = static_cast<int32_t>(p.num_experts * m);
  for (int64_t j = threadIdx.x; j < padded; j += blockDim.x)
    p.sorted[start + j] = j < c ? static_cast<int32_t>(x * m + j) : sentinel;
  for (int64_t b = threadIdx.x; b < padded / bs; b += blockDim.x) p.experts[start / bs + b] = static_cast<int32_t>(x);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = total + x * blockDim.x + threadIdx.x; i < p.n_sorted; i += step) p.sorted[i] = sentinel;
  for (int64_t b = total / bs + x * blockDim.x + threadIdx.x; b < p.n_blocks; b += step) p.experts[b] = -1;
  if (x == 0 && threadIdx.x == 0) *p.post = static_cast<int32_t>(total);
}

void batched_moe_align_block_size_cuda(TensorView sorted_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                                       TensorView expert_num_tokens, int64_t max_tokens_per_batch, int64_t block_size,
                                       bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.batched_moe_align_block_size";
  BatchedArgs a = check_batched_args(op, kDLCUDA, sorted_ids, expert_ids, num_tokens_post_padded, expert_num_tokens,
                                     max_tokens_per_batch, block_size);
  BatchedParams p;
  p.sorted = data_ptr<int32_t>(sorted_ids);
  p.experts = data_ptr<int32_t>(expert_ids);
  p.post = data_ptr<int32_t>(num_tokens_post_padded);
  p.counts = data_ptr<const int32_t>(expert_num_tokens);
  p.num_experts = a.num_experts;
  p.m = max_tokens_per_batch;
  p.block_size = block_size;
  p.n_sorted = a.n_sorted;
  p.n_blocks = a.n_blocks;
  if (a.num_experts > INT_MAX) TVM_FFI_THROW(ValueError) << op << ": too many experts (" << a.num_experts << ")";
  cuda::DeviceScope scope(op, a.device_id);
  const cuda::DeviceProps props = cuda::device_props(op, a.device_id);
  const cudaStream_t stream = cuda::current_stream(a.device_id);
  const dim3 grid(static_cast<unsigned>(a.num_experts)), block(256);
  cuda::launch(op, a.device_id, props, batched_align_kernel, grid, block, 0, stream, p);
}

}  // namespace moe_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_softmax_cuda, opmux::moe_cuda::topk_softmax_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_sigmoid_cuda, opmux::moe_cuda::topk_sigmoid_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batched_moe_align_block_size_cuda, opmux::moe_cuda::batched_moe_align_block_size_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_align_block_size_cuda, opmux::moe_cuda::moe_align_block_size_cuda);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/moe_cuda_lanes.inc"
