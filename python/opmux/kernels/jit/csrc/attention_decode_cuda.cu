// attention.paged_decode's native CUDA backend `cuda` (ops/attention/paged_decode_cuda.py; the op's
// rules: ops/attention/op.py's docstring, its definition: ops/attention/_decode.py's reference).
// Split-KV flash decoding in two kernels, PDL between them:
//
//   stage 1 (split_kernel), one CTA per (sequence, KV head x head chunk, split): the CTA takes up
//     to HC query heads of the KV head's GQA group (HC = 1, 2, 4 or 8; a larger group is cut into
//     chunks of equal size, one per CTA, each reading the same keys), walks its split's share of
//     the sequence's positions in tiles of TILE tokens and keeps an fp32 online softmax (max, sum)
//     per head. A tile's K and V rows are copied into shared memory with 16-byte cp.async
//     (zero-filled for a masked row), double-buffered: tile i+1 is in flight while tile i is used.
//     Threads: BDX lanes cover a row's 16-byte chunks (D * sizeof(cache) / 16 of them, VPT per
//     lane), HC rows of lanes the heads, BDZ groups of those the tile's tokens (TPZ each). A lane
//     holds its slice of q and of the output in fp32 registers; a score is its lanes' partial dot
//     products summed by shuffles, so every lane of the head has it for the V step.
//     One split (num_splits == 1) finalizes in place (sinks, normalisation, out, lse); otherwise
//     the CTA writes its unnormalised output, max and sum to the float32 workspace;
//   stage 2 (merge_kernel), one CTA per (sequence, query head): rescales the splits to their
//     common max, adds the sink to the denominator, writes out (one rounding) and lse.
//
// The arithmetic is the definition's in fp32: q and k converted exactly (fp8 e4m3 -> fp32), s =
// (q . k) * scale * k_scale, softcap * tanh(s / softcap), exp of s - max, p * v in fp32 (no
// rounding of p to the value dtype), v_scale on the output, one cast at the end.
//
// Memory safety whatever the tables hold (no host check: it would synchronise): each seq_len is
// clamped to [0, max_blocks_per_seq * page_size], so the table is only read inside its width; a
// block id outside [0, num_blocks) masks its positions (their rows are never read: the copy is
// zero-filled and the score -inf), as the Triton kernel does. Offsets are int64. The host checks
// (ValueError naming the argument) guard direct callers: ndim, dtypes, shapes, devices, strides,
// 16-byte aligned cache rows, the workspace's size.
//
// CUDA-graph safe: the grid, the split count and the workspace come from shapes and host scalars
// (num_splits: attention_decode_num_splits below, mirrored by paged_decode_cuda.num_splits).
#include <cuda_fp8.h>
#include <tvm/ffi/function.h>

#include <cmath>
#include <cstdint>

#include "opmux/cuda_utils.cuh"
#include "opmux/dtype_checks.h"

namespace opmux {
namespace attention_decode_cuda {

//: the split rule's bounds (attention_decode_num_splits) and the most splits the kernels take
constexpr int64_t kMinSplitTokens = 128;
constexpr int64_t kRuleMaxSplits = 64;
constexpr int kMaxSplits = 256;
//: the running max starts here (finite: no -inf - -inf), as the Triton kernels
constexpr float kNegBig = -1.0e30f;

// ---- host: the split rule -------------------------------------------------------------------

// Query heads per CTA for a GQA group of g heads.
inline int64_t heads_per_cta(int64_t g) { return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8; }

// Splits per (sequence, KV head chunk): enough CTAs for two waves of the SMs, each split at least
// kMinSplitTokens positions of the bound, at most kRuleMaxSplits. From host values only: `bound`
// is the longest attended range the shapes allow (the table's capacity, or window_left + 1).
// Rounded up, yet never into a second round of resident CTAs (the tail the Triton launch's rule
// rounds down to avoid): a 128-thread split CTA takes 63-80 registers (128 with an fp8 cache at
// 8 heads a CTA) and 18-34 KB of shared memory (sm_90a, nvcc 13, cuobjdump), so an SM holds 4-6,
// and P programs x ceil(2 SMs / P) CTAs < 2 SMs + P stay under 4 CTAs an SM whenever a second
// split is asked for (P < 2 SMs); past that it is one split, P CTAs.
inline int64_t num_splits(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t bound, int64_t sm_count) {
  const int64_t g = kv_heads > 0 ? q_heads / kv_heads : 1;
  const int64_t hc = heads_per_cta(g);
  const int64_t chunks = (g + hc - 1) / hc;
  int64_t programs = batch * kv_heads * chunks;
  if (programs < 1) programs = 1;
  const int64_t want = (2 * sm_count + programs - 1) / programs;
  const int64_t by_len = ((bound > 1 ? bound : 1) + kMinSplitTokens - 1) / kMinSplitTokens;
  int64_t s = want < by_len ? want : by_len;
  s = s < kRuleMaxSplits ? s : kRuleMaxSplits;
  return s > 1 ? s : 1;
}

// ---- device helpers -------------------------------------------------------------------------

struct Params {
  const void* q;
  const void* kc;
  const void* vc;
  const int32_t* bt;
  const int32_t* lens;
  const float* sinks;    // nullptr: no sinks
  const float* k_scale;  // nullptr: not an fp8 cache
  const float* v_scale;
  void* out;
  float* lse;   // nullptr: no lse
  float* ws_o;  // [B * Hq * S, D]: split partials (S > 1)
  float* ws_ml; // [B * Hq * S, 2]: their max and sum
  int64_t sq_b, sq_h, sk_b, sk_p, sk_h, sv_b, sv_p, sv_h, sbt_b, sbt_m, so_b, so_h, sl_b, sl_h;
  int64_t num_blocks;
  int32_t hq, group, chunks, chunk_heads, d, nvec, page_size, capacity, splits, window_left;
  float scale, softcap;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 16 : 0)
               : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = pred ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// One 16-byte chunk of cache elements as floats (exact for every cache dtype).
template <typename TC>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int kVec = 4;
  __device__ static void to_float(const uint4& r, float* f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
};
template <>
struct Chunk<__half> {
  static constexpr int kVec = 8;
  __device__ static void to_float(const uint4& r, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};
template <>
struct Chunk<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ static void to_float(const uint4& r, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};
template <>
struct Chunk<uint8_t> {  // fp8 e4m3fn bytes
  static constexpr int kVec = 16;
  __device__ static void to_float(const uint4& r, float* f) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(&r);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(p[i]), __NV_E4M3);
      const float2 v = __half22float2(__half2(h));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};

// The launch shape of one form: BDX lanes x VPT chunks per row (padded to a power of two), HC
// heads per CTA; TILE tokens per stage (about 8 KB of K), BDZ token groups of TPZ tokens.
template <typename TC, int BDX_, int VPT_, int HC_>
struct Cfg {
  static constexpr int BDX = BDX_, VPT = VPT_, HC = HC_;
  static constexpr int VEC = Chunk<TC>::kVec;
  static constexpr int SPT = VPT * VEC;  // floats of q / out per lane
  static constexpr int ROW_CHUNKS = BDX * VPT;
  static constexpr int ROW_BYTES = ROW_CHUNKS * 16;
  static constexpr int NT = BDX * HC >= 128 ? BDX * HC : 128;
  static constexpr int BDZ = NT / (BDX * HC);
  static constexpr int TILE_RAW = 8192 / ROW_BYTES > 64 ? 64 : 8192 / ROW_BYTES;
  static constexpr int TILE = TILE_RAW < BDZ ? BDZ : TILE_RAW;
  static constexpr int TPZ = TILE / BDZ;
  static_assert(BDX >= 1 && BDX <= 32 && (BDX & (BDX - 1)) == 0, "BDX: a power of two <= 32");
  static_assert(TILE % BDZ == 0, "tile rows split evenly over the token groups");
  // the z-groups' partial outputs reuse the K / V buffers
  static_assert(BDZ * HC * ROW_CHUNKS * VEC * 4 <= 4 * TILE * ROW_BYTES, "combine buffer");
};

template <typename TQ, typename TC, typename C>
__global__ void __launch_bounds__(C::NT) split_kernel(Params p) {
  constexpr int BDX = C::BDX, VPT = C::VPT, HC = C::HC, VEC = C::VEC, SPT = C::SPT;
  constexpr int NT = C::NT, BDZ = C::BDZ, TILE = C::TILE, TPZ = C::TPZ, ROW_BYTES = C::ROW_BYTES;
  __shared__ __align__(16) uint8_t kv[2][2][TILE * ROW_BYTES];  // [stage][k, v][row][chunk]
  __shared__ bool valid[2][TILE];
  __shared__ float red_m[BDZ * HC], red_l[BDZ * HC];

  cuda::pdl_enter();
  const int tid = threadIdx.x;
  const int x = tid % BDX, y = (tid / BDX) % HC, z = tid / (BDX * HC);
  const int64_t b = blockIdx.x;
  const int hk = blockIdx.y / p.chunks, chunk = blockIdx.y % p.chunks;
  const int split = blockIdx.z;
  const int gi = chunk * p.chunk_heads + y;
  const bool active = y < p.chunk_heads && gi < p.group;
  const int h = hk * p.group + gi;

  // the split's positions [start, end): the attended range [lo, n) cut in S shares of whole tiles
  int64_t n = p.lens[b];
  n = n < 0 ? 0 : (n > p.capacity ? p.capacity : n);
  const int64_t lo = p.window_left >= 0 ? (n - 1 - p.window_left > 0 ? n - 1 - p.window_left : 0) : 0;
  int64_t per = (n - lo + p.splits - 1) / p.splits;
  per = (per + TILE - 1) / TILE * TILE;
  const int64_t start = lo + split * per;
  const int64_t end = start + per < n ? start + per : n;
  const int ntiles = end > start ? static_cast<int>((end - start + TILE - 1) / TILE) : 0;

  // this lane's slice of q (its head, chunks x + BDX * v), in fp32; zero past D or for an idle head
  float q[SPT];
  {
    const TQ* qrow = static_cast<const TQ*>(p.q) + b * p.sq_b + static_cast<int64_t>(active ? h : 0) * p.sq_h;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int ch = x + BDX * v;
#pragma unroll
      for (int e = 0; e < VEC; ++e) q[v * VEC + e] = active && ch < p.nvec ? cuda::to_float(qrow[ch * VEC + e]) : 0.0f;
    }
  }
  const float qk_scale = p.k_scale != nullptr ? p.scale * *p.k_scale : p.scale;

  const uint8_t* kbase = static_cast<const uint8_t*>(p.kc) + hk * p.sk_h * static_cast<int64_t>(sizeof(TC));
  const uint8_t* vbase = static_cast<const uint8_t*>(p.vc) + hk * p.sv_h * static_cast<int64_t>(sizeof(TC));
  const int32_t* bt_row = p.bt + b * p.sbt_b;
  // tile t's K / V rows into stage st: a masked row (past the split, or a bad block id) is zeros
  auto load_tile = [&](int t, int st) {
    const int64_t t0 = start + static_cast<int64_t>(t) * TILE;
    const int nvec = p.nvec;
    for (int c = tid; c < TILE * nvec; c += NT) {
      const int r = c / nvec, col = c - r * nvec;
      const int64_t pos = t0 + r;
      bool ok = pos < end;
      int64_t blk = -1;
      if (ok) blk = bt_row[(pos / p.page_size) * p.sbt_m];
      ok = ok && blk >= 0 && blk < p.num_blocks;
      const int64_t off = pos % p.page_size;
      const uint8_t* ks = ok ? kbase + (blk * p.sk_b + off * p.sk_p) * static_cast<int64_t>(sizeof(TC)) + col * 16
                             : static_cast<const uint8_t*>(p.kc);
      const uint8_t* vs = ok ? vbase + (blk * p.sv_b + off * p.sv_p) * static_cast<int64_t>(sizeof(TC)) + col * 16
                             : static_cast<const uint8_t*>(p.vc);
      cp_async16(&kv[st][0][r * ROW_BYTES + col * 16], ks, ok);
      cp_async16(&kv[st][1][r * ROW_BYTES + col * 16], vs, ok);
      if (col == 0) valid[st][r] = ok;
    }
  };

  float m = kNegBig, l = 0.0f, o[SPT];
#pragma unroll
  for (int i = 0; i < SPT; ++i) o[i] = 0.0f;
  const bool capped = p.softcap > 0.0f;

  if (ntiles > 0) load_tile(0, 0);
  cp_async_commit();
  for (int t = 0; t < ntiles; ++t) {
    if (t + 1 < ntiles) load_tile(t + 1, (t + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // tile t's copies (this thread's) are done
    __syncthreads();     // and every thread's
    const uint8_t* ks = kv[t & 1][0];
    const uint8_t* vs = kv[t & 1][1];
    float s[TPZ];
    float mt = m;
#pragma unroll
    for (int j = 0; j < TPZ; ++j) {
      const int r = z * TPZ + j;
      float acc = 0.0f;
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        const int ch = x + BDX * v;
        if (ch < p.nvec) {
          float kf[VEC];
          Chunk<TC>::to_float(*reinterpret_cast<const uint4*>(ks + r * ROW_BYTES + ch * 16), kf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc = fmaf(q[v * VEC + e], kf[e], acc);
        }
      }
#pragma unroll
      for (int off = BDX / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      float sc = acc * qk_scale;
      if (capped) sc = p.softcap * tanhf(sc / p.softcap);
      s[j] = valid[t & 1][r] ? sc : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    // online softmax: m, mt finite (kNegBig at worst), so alpha and p never see inf - inf
    const float alpha = expf(m - mt);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < SPT; ++i) o[i] *= alpha;
#pragma unroll
    for (int j = 0; j < TPZ; ++j) {
      const int r = z * TPZ + j;
      const float pj = expf(s[j] - mt);  // 0 for a masked row (whose V row is zeros)
      l += pj;
#pragma unroll
      for (int v = 0; v < VPT; ++v) {
        const int ch = x + BDX * v;
        if (ch < p.nvec) {
          float vf[VEC];
          Chunk<TC>::to_float(*reinterpret_cast<const uint4*>(vs + r * ROW_BYTES + ch * 16), vf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[v * VEC + e] = fmaf(pj, vf[e], o[v * VEC + e]);
        }
      }
    }
    m = mt;
    __syncthreads();  // stage t & 1 is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  if constexpr (BDZ > 1) {  // the token groups' partial results of each head, merged by group 0
    __syncthreads();
    float* red = reinterpret_cast<float*>(&kv[0][0][0]);
    constexpr int W = C::ROW_CHUNKS * VEC;
    float* mine = red + (z * HC + y) * W;
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
      for (int e = 0; e < VEC; ++e) mine[(x + BDX * v) * VEC + e] = o[v * VEC + e];
    if (x == 0) {
      red_m[z * HC + y] = m;
      red_l[z * HC + y] = l;
    }
    __syncthreads();
    if (z != 0) return;
    float mx = kNegBig;
#pragma unroll
    for (int zz = 0; zz < BDZ; ++zz) mx = fmaxf(mx, red_m[zz * HC + y]);
    l = 0.0f;
#pragma unroll
    for (int i = 0; i < SPT; ++i) o[i] = 0.0f;
#pragma unroll
    for (int zz = 0; zz < BDZ; ++zz) {
      const float w = expf(red_m[zz * HC + y] - mx);
      l = fmaf(w, red_l[zz * HC + y], l);
      const float* theirs = red + (zz * HC + y) * W;
#pragma unroll
      for (int v = 0; v < VPT; ++v)
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[v * VEC + e] = fmaf(w, theirs[(x + BDX * v) * VEC + e], o[v * VEC + e]);
    }
    m = mx;
  }
  if (!active) return;
  const float vsc = p.v_scale != nullptr ? *p.v_scale : 1.0f;
  const int64_t row = b * p.hq + h;
  if (p.splits == 1) {  // finalize here: the merge of one split
    float mx = m, total;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[h];
      mx = fmaxf(mx, sink);
      total = l * expf(m - mx) + expf(sink - mx);
    } else {
      total = l;
    }
    const bool has = total > 0.0f;
    const float safe = has ? total : 1.0f;
    const float w = expf(m - mx) * vsc;
    TQ* orow = static_cast<TQ*>(p.out) + b * p.so_b + static_cast<int64_t>(h) * p.so_h;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      const int ch = x + BDX * v;
      if (ch < p.nvec) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) orow[ch * VEC + e] = cuda::from_float<TQ>(o[v * VEC + e] * w / safe);
      }
    }
    if (p.lse != nullptr && x == 0) p.lse[b * p.sl_b + static_cast<int64_t>(h) * p.sl_h] = has ? logf(safe) + mx : -INFINITY;
    return;
  }
  const int64_t prow = row * p.splits + split;
  float* dst = p.ws_o + prow * p.d;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int ch = x + BDX * v;
    if (ch < p.nvec) {
#pragma unroll
      for (int e = 0; e < VEC; e += 4) {
        *reinterpret_cast<float4*>(dst + ch * VEC + e) = make_float4(
            o[v * VEC + e] * vsc, o[v * VEC + e + 1] * vsc, o[v * VEC + e + 2] * vsc, o[v * VEC + e + 3] * vsc);
      }
    }
  }
  if (x == 0) {
    p.ws_ml[2 * prow] = m;
    p.ws_ml[2 * prow + 1] = l;
  }
}

constexpr int kMergeThreads = 128;

template <typename TQ>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(Params p) {
  __shared__ float w[kMaxSplits];
  __shared__ float stat[2];
  cuda::pdl_enter();  // waits for the split kernel's writes
  const int64_t row = blockIdx.x;
  const int64_t b = row / p.hq;
  const int h = static_cast<int>(row - b * p.hq);
  const int S = p.splits;
  const float* ml = p.ws_ml + row * S * 2;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = kNegBig;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, ml[2 * s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sink = 0.0f;
    if (p.sinks != nullptr) {
      sink = p.sinks[h];
      mx = fmaxf(mx, sink);
    }
    float total = 0.0f;
    for (int s = lane; s < S; s += 32) {
      const float ws = expf(ml[2 * s] - mx);
      w[s] = ws;
      total = fmaf(ws, ml[2 * s + 1], total);
    }
    total = cuda::warp_sum(total);
    if (p.sinks != nullptr) total += expf(sink - mx);
    if (lane == 0) {
      stat[0] = mx;
      stat[1] = total;
    }
  }
  __syncthreads();
  const float total = stat[1];
  const bool has = total > 0.0f;
  const float safe = has ? total : 1.0f;
  const float* po = p.ws_o + row * S * p.d;
  TQ* orow = static_cast<TQ*>(p.out) + b * p.so_b + static_cast<int64_t>(h) * p.so_h;
  for (int d = threadIdx.x; d < p.d; d += kMergeThreads) {
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc = fmaf(w[s], po[static_cast<int64_t>(s) * p.d + d], acc);
    orow[d] = cuda::from_float<TQ>(acc / safe);
  }
  if (p.lse != nullptr && threadIdx.x == 0) {
    p.lse[b * p.sl_b + static_cast<int64_t>(h) * p.sl_h] = has ? logf(safe) + stat[0] : -INFINITY;
  }
}

// ---- host: checks, dispatch ----------------------------------------------------------------

constexpr const char* kOp = "opmux.attention.paged_decode (cuda)";

inline int64_t stride_of(const TensorView& t, int dim) { return t.size(dim) <= 1 ? 0 : t.stride(dim); }

inline void check_nonneg(const TensorView& t, const char* name) {
  for (int d = 0; d < t.ndim(); ++d) {
    if (stride_of(t, d) < 0) {
      TVM_FFI_THROW(ValueError) << kOp << ": " << name << " has a negative stride (" << t.stride(d) << " in dim "
                                << d << "); only non-negative strides are supported";
    }
  }
}

inline int64_t numel(const TensorView& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim(); ++d) n *= t.size(d);
  return n;
}

template <typename TQ, typename TC, int BDX, int VPT, int HC>
void launch_split(const Params& p, int64_t batch, int64_t hkv, int32_t device_id, const cuda::DeviceProps& props,
                  cudaStream_t stream) {
  using C = Cfg<TC, BDX, VPT, HC>;
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(hkv * p.chunks),
                  static_cast<unsigned>(p.splits));
  cuda::launch(kOp, device_id, props, split_kernel<TQ, TC, C>, grid, dim3(C::NT), 0, stream, p);
}

template <typename TQ, typename TC, int BDX, int VPT>
void by_heads(const Params& p, int64_t hc, int64_t batch, int64_t hkv, int32_t device_id,
              const cuda::DeviceProps& props, cudaStream_t stream) {
  switch (hc) {
    case 1: return launch_split<TQ, TC, BDX, VPT, 1>(p, batch, hkv, device_id, props, stream);
    case 2: return launch_split<TQ, TC, BDX, VPT, 2>(p, batch, hkv, device_id, props, stream);
    case 4: return launch_split<TQ, TC, BDX, VPT, 4>(p, batch, hkv, device_id, props, stream);
    default: return launch_split<TQ, TC, BDX, VPT, 8>(p, batch, hkv, device_id, props, stream);
  }
}

// The row's chunk count picks the lanes: next power of two <= 32, the rest as chunks per lane.
template <typename TQ, typename TC>
void by_row(const Params& p, int64_t hc, int64_t batch, int64_t hkv, int32_t device_id,
            const cuda::DeviceProps& props, cudaStream_t stream) {
  const int nvec = p.nvec;
  if constexpr (sizeof(TC) == 1) {  // fp8: D 64 -> 4 chunks, 80 / 96 / 128 -> 5..8, 256 -> 16
    if (nvec <= 4) return by_heads<TQ, TC, 4, 1>(p, hc, batch, hkv, device_id, props, stream);
    if (nvec <= 8) return by_heads<TQ, TC, 8, 1>(p, hc, batch, hkv, device_id, props, stream);
    return by_heads<TQ, TC, 16, 1>(p, hc, batch, hkv, device_id, props, stream);
  } else if constexpr (sizeof(TC) == 2) {  // D 64 -> 8, 80 / 96 / 128 -> 10..16, 256 -> 32
    if (nvec <= 8) return by_heads<TQ, TC, 8, 1>(p, hc, batch, hkv, device_id, props, stream);
    if (nvec <= 16) return by_heads<TQ, TC, 16, 1>(p, hc, batch, hkv, device_id, props, stream);
    return by_heads<TQ, TC, 32, 1>(p, hc, batch, hkv, device_id, props, stream);
  } else {  // fp32: D 64 -> 16, 80 / 96 / 128 -> 20..32, 256 -> 64 (two per lane)
    if (nvec <= 16) return by_heads<TQ, TC, 16, 1>(p, hc, batch, hkv, device_id, props, stream);
    if (nvec <= 32) return by_heads<TQ, TC, 32, 1>(p, hc, batch, hkv, device_id, props, stream);
    return by_heads<TQ, TC, 32, 2>(p, hc, batch, hkv, device_id, props, stream);
  }
}

template <typename TQ>
void run(const Params& p, bool fp8, int64_t hc, int64_t batch, int64_t hkv, int32_t device_id) {
  cuda::DeviceScope scope(kOp, device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  const cudaStream_t stream = cuda::current_stream(device_id);
  if (fp8) {
    by_row<TQ, uint8_t>(p, hc, batch, hkv, device_id, props, stream);
  } else {
    by_row<TQ, TQ>(p, hc, batch, hkv, device_id, props, stream);
  }
  if (p.splits > 1) {
    cuda::launch(kOp, device_id, props, merge_kernel<TQ>, dim3(static_cast<unsigned>(batch * p.hq)),
                 dim3(kMergeThreads), 0, stream, p);
  }
}

}  // namespace attention_decode_cuda

// attention.paged_decode's kernel arguments (ops/attention/_decode.py) plus the split count and
// its float32 workspace (>= B * Hq * num_splits * (D + 2) elements when num_splits > 1; unread
// otherwise) and the trailing PDL flag.
void attention_decode_split_cuda(TensorView out, TensorView lse, bool has_lse, TensorView query,
                                 TensorView key_cache, TensorView value_cache, TensorView block_tables,
                                 TensorView seq_lens, TensorView sinks, bool has_sinks, TensorView k_scale,
                                 TensorView v_scale, bool fp8, double scale, double softcap, int64_t window_left,
                                 TensorView workspace, int64_t num_splits, bool enable_pdl) {
  namespace A = attention_decode_cuda;
  const char* op = A::kOp;
  cuda::PdlScope pdl(enable_pdl);
  check_ndim(op, "query", query, 3);
  check_ndim(op, "out", out, 3);
  check_ndim(op, "key_cache", key_cache, 4);
  check_ndim(op, "value_cache", value_cache, 4);
  check_ndim(op, "block_tables", block_tables, 2);
  check_ndim(op, "workspace", workspace, 1);
  const int32_t device_id =
      check_device(op, kDLCUDA, {{"query", &query}, {"out", &out}, {"key_cache", &key_cache},
                                 {"value_cache", &value_cache}, {"block_tables", &block_tables},
                                 {"seq_lens", &seq_lens}, {"workspace", &workspace}});
  const DType dt = check_same_dtype(op, {{"query", &query}, {"out", &out}});
  if (fp8) {
    check_fp8_bytes(op, "key_cache", key_cache);
    check_fp8_bytes(op, "value_cache", value_cache);
    check_device(op, kDLCUDA, {{"query", &query}, {"k_scale", &k_scale}, {"v_scale", &v_scale}});
    check_float32(op, "k_scale", k_scale);
    check_float32(op, "v_scale", v_scale);
    if (A::numel(k_scale) != 1 || A::numel(v_scale) != 1) {
      TVM_FFI_THROW(ValueError) << op << ": k_scale and v_scale must have one element each, got "
                                << A::numel(k_scale) << " and " << A::numel(v_scale);
    }
  } else {
    check_same_dtype(op, {{"query", &query}, {"key_cache", &key_cache}, {"value_cache", &value_cache}});
  }
  check_int32(op, "block_tables", block_tables);
  check_int32(op, "seq_lens", seq_lens);
  check_float32(op, "workspace", workspace);
  const int64_t bsz = query.size(0), hq = query.size(1), d = query.size(2);
  const int64_t nb = key_cache.size(0), ps = key_cache.size(1), hkv = key_cache.size(2);
  for (int i = 0; i < 3; ++i) check_size(op, "out", out, i, query.size(i), "query's shape");
  if (ps < 1 || hkv < 1 || hq < 1) {
    TVM_FFI_THROW(ValueError) << op << ": key_cache has page_size " << ps << " and " << hkv
                              << " KV heads, query " << hq << " heads: each must be at least 1";
  }
  if (hq % hkv != 0) {
    TVM_FFI_THROW(ValueError) << op << ": query has " << hq << " heads, key_cache " << hkv
                              << ": the query heads must be a multiple of the KV heads";
  }
  if (d != 64 && d != 80 && d != 96 && d != 128 && d != 256) {
    TVM_FFI_THROW(ValueError) << op << ": query.shape[2] (head_dim) is " << d
                              << "; this kernel is built for 64, 80, 96, 128 and 256";
  }
  check_size(op, "key_cache", key_cache, 3, d, "query's head_dim");
  for (int i = 0; i < 4; ++i) check_size(op, "value_cache", value_cache, i, key_cache.size(i), "key_cache's shape");
  check_size(op, "block_tables", block_tables, 0, bsz, "query's batch");
  check_vector(op, "seq_lens", seq_lens, bsz, "query's batch");
  check_last_dim_contiguous(op, "query", query);
  check_last_dim_contiguous(op, "out", out);
  check_last_dim_contiguous(op, "key_cache", key_cache);
  check_last_dim_contiguous(op, "value_cache", value_cache);
  A::check_nonneg(query, "query");
  A::check_nonneg(out, "out");
  A::check_nonneg(key_cache, "key_cache");
  A::check_nonneg(value_cache, "value_cache");
  A::check_nonneg(block_tables, "block_tables");
  if (has_lse) {
    check_ndim(op, "lse", lse, 2);
    check_device(op, kDLCUDA, {{"query", &query}, {"lse", &lse}});
    check_float32(op, "lse", lse);
    check_size(op, "lse", lse, 0, bsz, "query's batch");
    check_size(op, "lse", lse, 1, hq, "query's heads");
    A::check_nonneg(lse, "lse");
  }
  if (has_sinks) {
    check_device(op, kDLCUDA, {{"query", &query}, {"sinks", &sinks}});
    check_float32(op, "sinks", sinks);
    check_vector(op, "sinks", sinks, hq, "query's heads");
  }
  const int64_t width = block_tables.size(1);
  if (width * ps > 2147483647LL || bsz * hq > 2147483647LL) {
    TVM_FFI_THROW(ValueError) << op << ": block_tables [" << bsz << ", " << width << "] of " << ps
                              << "-token pages with " << hq << " heads: sizes exceed the kernel's 32-bit positions";
  }
  if (num_splits < 1 || num_splits > A::kMaxSplits) {
    TVM_FFI_THROW(ValueError) << op << ": num_splits is " << num_splits << "; expected 1.." << A::kMaxSplits;
  }
  const int64_t g = hq / hkv;
  const int64_t hc = A::heads_per_cta(g);
  const int64_t chunks = (g + hc - 1) / hc;
  if (hkv * chunks > 65535) {
    TVM_FFI_THROW(ValueError) << op << ": key_cache has " << hkv << " KV heads in " << chunks
                              << " chunks each: more than the grid's 65535";
  }
  if (num_splits > 1) {
    const int64_t need = bsz * hq * num_splits * (d + 2);
    if (A::numel(workspace) < need || A::stride_of(workspace, 0) > 1) {
      TVM_FFI_THROW(ValueError) << op << ": workspace has " << A::numel(workspace)
                                << " elements; num_splits " << num_splits << " needs a dense float32 vector of at least B * Hq * num_splits * (D + 2) = "
                                << need;
    }
    if (!cuda::aligned(data_ptr<void>(workspace), 16)) {
      TVM_FFI_THROW(ValueError) << op << ": workspace must be 16-byte aligned";
    }
  }
  // 16-byte copies of cache rows: the base and every stride that moves between rows aligned
  const int64_t csz = fp8 ? 1 : (dt == DType::kFloat32 ? 4 : 2);
  const int64_t vec = 16 / csz;
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"key_cache", &key_cache},
                                {"value_cache", &value_cache}}) {
    bool ok = cuda::aligned(data_ptr<void>(*t), 16);
    for (int i = 0; i < 3; ++i) ok = ok && A::stride_of(*t, i) % vec == 0;
    if (!ok) {
      TVM_FFI_THROW(ValueError) << op << ": " << name << "'s rows must be 16-byte aligned (its data pointer and its "
                                << "block, page and head strides multiples of " << vec << " elements)";
    }
  }
  if (bsz == 0) return;
  if (bsz > 2147483647LL) TVM_FFI_THROW(ValueError) << op << ": batch " << bsz << " exceeds the grid";

  A::Params p{};
  p.q = data_ptr<const void>(query);
  p.kc = data_ptr<const void>(key_cache);
  p.vc = data_ptr<const void>(value_cache);
  p.bt = data_ptr<const int32_t>(block_tables);
  p.lens = data_ptr<const int32_t>(seq_lens);
  p.sinks = has_sinks ? data_ptr<const float>(sinks) : nullptr;
  p.k_scale = fp8 ? data_ptr<const float>(k_scale) : nullptr;
  p.v_scale = fp8 ? data_ptr<const float>(v_scale) : nullptr;
  p.out = data_ptr<void>(out);
  p.lse = has_lse ? data_ptr<float>(lse) : nullptr;
  p.ws_o = num_splits > 1 ? data_ptr<float>(workspace) : nullptr;
  p.ws_ml = num_splits > 1 ? p.ws_o + bsz * hq * num_splits * d : nullptr;
  p.sq_b = A::stride_of(query, 0);
  p.sq_h = A::stride_of(query, 1);
  p.sk_b = A::stride_of(key_cache, 0);
  p.sk_p = A::stride_of(key_cache, 1);
  p.sk_h = A::stride_of(key_cache, 2);
  p.sv_b = A::stride_of(value_cache, 0);
  p.sv_p = A::stride_of(value_cache, 1);
  p.sv_h = A::stride_of(value_cache, 2);
  p.sbt_b = A::stride_of(block_tables, 0);
  p.sbt_m = A::stride_of(block_tables, 1);
  p.so_b = A::stride_of(out, 0);
  p.so_h = A::stride_of(out, 1);
  p.sl_b = has_lse ? A::stride_of(lse, 0) : 0;
  p.sl_h = has_lse ? A::stride_of(lse, 1) : 0;
  p.num_blocks = nb;
  p.hq = static_cast<int32_t>(hq);
  p.group = static_cast<int32_t>(g);
  p.chunks = static_cast<int32_t>(chunks);
  p.chunk_heads = static_cast<int32_t>((g + chunks - 1) / chunks);
  p.d = static_cast<int32_t>(d);
  p.nvec = static_cast<int32_t>(d * csz / 16);
  p.page_size = static_cast<int32_t>(ps);
  p.capacity = static_cast<int32_t>(width * ps);
  p.splits = static_cast<int32_t>(num_splits);
  p.window_left = static_cast<int32_t>(window_left < -1 ? -1 : (window_left > 2147483647LL ? 2147483647LL : window_left));
  p.scale = static_cast<float>(scale);
  p.softcap = static_cast<float>(softcap);
  OPMUX_DISPATCH_DTYPE(dt, float, __half, __nv_bfloat16,
                       [&] { A::run<scalar_t>(p, fp8, hc, bsz, hkv, device_id); });
}

// The split rule (host values only); paged_decode_cuda.num_splits mirrors it.
int64_t attention_decode_num_splits(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t bound,
                                    int64_t sm_count) {
  return attention_decode_cuda::num_splits(batch, q_heads, kv_heads, bound, sm_count);
}

}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_decode_split_cuda, opmux::attention_decode_split_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_decode_num_splits, opmux::attention_decode_num_splits);
