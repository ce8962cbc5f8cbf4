// moe.fused_experts' decode-regime CUDA backend `cuda` (ops/moe/fused_experts_cuda.py drives it;
// the op's rules: ops/moe/op.py and its definition ops/moe/_experts.py's reference). Its own JIT
// module (moe_decode_cuda), like moe_grouped_cuda; the AOT library includes it like every unit.
//
// At decode sizes the op is a read of the touched experts' weights (DeepSeek-V3 fp8, one token:
// 8 experts, 352 MB). These kernels are GEMVs on the CUDA cores that keep that read streaming:
// every lane of a warp walks a weight row in 16-byte chunks (ld.global.nc, several rows and
// chunks in flight), multiplies them against the token's activation staged once per block in
// shared memory (float32; fp8 e4m3 weights converted exactly, two per instruction), and the
// warp's row sums are reduced by shuffles. No tensor-core tile is padded around a single column.
//
//   up    grid (M * topk slots, N / (8 * RW)): warp w of a block takes RW output columns n of its
//         slot (token t = s / topk, local expert e); each is the dot of w1[e]'s gate row and up
//         row with x[t] (fp8: per 128-wide group, the group's product times w1_scale[e, row / 128,
//         g] * xs[t, g]), each sum rounded to the output dtype (the router weight first when it
//         applies on the input), the gated activation in fp32, one rounding into act [S, N].
//         A slot whose expert is outside [0, E) or mapped to -1 writes zeros and reads no weight.
//   down  grid (M, K / (8 * CW)): warp w takes CW output columns c of token t, JB of the token's
//         slots at a time (their rows in flight together); for each slot j with an expert, the
//         dot of w2[e_j, c] with the slot's act row (fp8: the
//         row quantized per 1x128 group by the op's per_token_group_quant_fp8, scales as above),
//         times the routed weight, rounded to the output dtype; the topk terms summed in fp32 in
//         slot order and rounded once into out [M, K] (0 where no slot has an expert).
//
// The arithmetic is the definition's, as the Triton decode path computes it: fp32 sums, the same
// rounding points; only the order inside each fp32 sum differs. RW / CW are chosen on the host
// (pick: the grid that fills its waves of resident blocks best).
//
// Latency: each warp issues its first weight loads before the activation is staged and the block
// synchronises; the down kernel issues them even before waiting on the previous kernel (PDL:
// that kernel, the up kernel or the activation's quantization, never writes w2 or topk_ids),
// the up kernel only after (whatever precedes it may have written w1). A direct caller of
// moe_decode_down_cuda with enable_pdl must likewise launch it right behind a kernel that waits
// for its own predecessors (griddepcontrol.wait, as every opmux kernel does first) and writes
// neither w2, w2_scale, topk_ids nor expert_map; otherwise those reads may see older values (the
// ids stay bounds-checked: never an out-of-bounds access, possibly the wrong experts).
//
// Memory safety whatever the ids hold (no host check: it would synchronise): an id outside [0,
// num_ids), or mapped outside [0, E), makes its slot absent; nothing is loaded through it.
// Offsets are int64. The host checks (ValueError naming the argument) guard direct callers:
// ndim, dtypes, shapes, devices, unit last strides, 16-byte aligned weight rows and activation
// rows, the shared-memory size.
//
// Exports (tvm-ffi; each takes a trailing enable_pdl):
//   moe_decode_up_cuda(act, x, xs, w1, w1_scale, topk_weights, topk_ids, expert_map, activation,
//                      mul_weight, vllm_rounding, alpha, limit, rows_per_warp, enable_pdl)
//   moe_decode_down_cuda(out, a, as, w2, w2_scale, topk_weights, topk_ids, expert_map, mul_weight,
//                        rows_per_warp, enable_pdl)
// rows_per_warp: the output columns a warp takes (up: 1, 2, 4; down: 1, 2, 4, 8), 0 to let the
// unit choose (the grid that fills its waves of resident blocks best: tests and tuning force it).
// fp8 is the weights' dtype (float8_e4m3fn): x / a are then the quantized rows (e4m3 bytes, whole
// 128-groups) and xs / as their float32 scales; else x / a have the weights' dtype and xs / as
// are unused (empty). expert_map: int32 [num_ids] or empty.
#include <cuda_fp8.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "opmux/cuda_utils.cuh"
#include "opmux/dtype_checks.h"

namespace opmux {
namespace moe_decode_cuda {

using cuda::from_float;
using cuda::to_float;

constexpr const char* kOp = "moe.fused_experts";
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 128;
//: 16-byte loads in flight per lane per step (rows x chunks)
constexpr int kInFlight = 8;
//: the activation codes (ops/moe/fused_experts_decode.py's ACT_CODES, the Triton kernels')
constexpr int kSilu = 0, kGelu = 1, kSwigluOai = 5;

// How a slot finds its local expert.
struct Slots {
  const void* ids;
  int64_t ids_stride;
  const int32_t* map;  // nullptr: no expert map
  int64_t num_ids;     // the map's length, else E
  int64_t experts;     // E (local)
  int topk;
  bool ids64;
};

// The local expert of token t's slot j, or -1 when no expert of this rank computes it.
__device__ __forceinline__ int64_t local_expert(const Slots& s, int64_t t, int j) {
  const int64_t i = t * s.ids_stride + j;
  int64_t e = s.ids64 ? static_cast<const int64_t*>(s.ids)[i] : static_cast<const int32_t*>(s.ids)[i];
  if (e < 0 || e >= s.num_ids) return -1;
  if (s.map != nullptr) {
    e = s.map[e];
    if (e < 0 || e >= s.experts) return -1;
  }
  return e;
}

__device__ __forceinline__ uint4 load_stream(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// 16 e4m3 values (one 16-byte chunk) as float32, exactly (two per conversion instruction).
__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&f)[16]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[i] & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[i] >> 16), __NV_E4M3);
    const float2 l = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    f[4 * i] = l.x;
    f[4 * i + 1] = l.y;
    f[4 * i + 2] = h.x;
    f[4 * i + 3] = h.y;
  }
}

// The activation elements of one 16-byte weight chunk, in registers: 16 float32 (fp8 weights)
// or 16 / sizeof(T) values of T.
template <typename T, bool FP8>
struct XChunk {
  static constexpr int kElems = FP8 ? 16 : 16 / static_cast<int>(sizeof(T));
  using Vals = typename std::conditional<FP8, float[16], cuda::Vec<T, kElems>>::type;
};

// Sum of one 16-byte chunk of weights times the chunk's activations (registers).
template <typename T, bool FP8>
__device__ __forceinline__ float dot_chunk(const uint4& w, const typename XChunk<T, FP8>::Vals& x) {
  float a0 = 0.f, a1 = 0.f;
  if constexpr (FP8) {
    float f[16];
    fp8x16_to_float(w, f);
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      a0 = fmaf(f[i], x[i], a0);
      a1 = fmaf(f[i + 1], x[i + 1], a1);
    }
  } else {
    constexpr int V = XChunk<T, FP8>::kElems;
    const cuda::Vec<T, V> wv = *reinterpret_cast<const cuda::Vec<T, V>*>(&w);
#pragma unroll
    for (int i = 0; i < V; i += 2) {
      a0 = fmaf(to_float(wv.v[i]), to_float(x.v[i]), a0);
      if (i + 1 < V) a1 = fmaf(to_float(wv.v[i + 1]), to_float(x.v[i + 1]), a1);
    }
  }
  return a0 + a1;
}

// A weight row and, for fp8, its block scales along the reduction (one per 128-group).
struct Row {
  const uint8_t* w;   // the row's first byte
  const float* s;     // fp8: &scale[e, row / 128, 0]
};

// The activation row a group of weight rows multiplies (shared memory), or none (no expert: the
// group's rows load nothing).
struct Act {
  const void* x;      // fp8: float32 [C * 16]; else T [C * 16 / sizeof(T)]
  const float* xs;    // fp8: its scale per 128-group
  bool on;
};

// Chunks of each row a lane has in flight per step: about kInFlight loads for R rows.
template <int R>
constexpr int kSteps = R >= kInFlight ? 1 : kInFlight / R;

// One step's loads: chunks c0, c0 + 32, ... (U of them) of every row whose slot has an expert.
template <int G, int RPG, int U>
__device__ __forceinline__ void load_step(uint4 (&b)[G * RPG][U], const Row (&rows)[G * RPG], const Act (&acts)[G],
                                          int64_t c0, int64_t C) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = c0 + 32 * u;
#pragma unroll
    for (int r = 0; r < G * RPG; ++r)
      if (acts[r / RPG].on && c < C) b[r][u] = load_stream(rows[r].w + c * 16);
  }
}

// acc[g * RPG + r] += rows[g * RPG + r] . acts[g].x over C 16-byte chunks: the warp's lanes
// stride the chunks, U chunks of each of the G * RPG rows in flight per step; `b` holds the first
// step's loads (issued by the caller: before the activation is staged, so the two latencies
// overlap), each next step is loaded once a step is used. Each chunk of an activation row is
// read from shared memory once for its RPG rows. FP8: each chunk's sum times the row's
// scale[g] * xs[g] (g = chunk / 8).
template <typename T, bool FP8, int G, int RPG, int U>
__device__ __forceinline__ void rows_dot(uint4 (&b)[G * RPG][U], const Row (&rows)[G * RPG], const Act (&acts)[G],
                                         int64_t s_step, int64_t C, int lane, float (&acc)[G * RPG]) {
  constexpr int E = XChunk<T, FP8>::kElems;
  for (int64_t c0 = lane; c0 < C; c0 += 32 * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= C) break;
      const int64_t grp = c >> 3;  // fp8: 8 chunks of 16 per 128-group
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (!acts[g].on) continue;
        typename XChunk<T, FP8>::Vals x;
        if constexpr (FP8) {
          const float4* xp = reinterpret_cast<const float4*>(static_cast<const float*>(acts[g].x) + c * E);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 v = xp[i];
            x[4 * i] = v.x;
            x[4 * i + 1] = v.y;
            x[4 * i + 2] = v.z;
            x[4 * i + 3] = v.w;
          }
          const float sx = acts[g].xs[grp];
#pragma unroll
          for (int r = g * RPG; r < (g + 1) * RPG; ++r)
            acc[r] = fmaf(dot_chunk<T, true>(b[r][u], x), __ldg(rows[r].s + grp * s_step) * sx, acc[r]);
        } else {
          x = *reinterpret_cast<const cuda::Vec<T, E>*>(static_cast<const T*>(acts[g].x) + c * E);
#pragma unroll
          for (int r = g * RPG; r < (g + 1) * RPG; ++r) acc[r] += dot_chunk<T, false>(b[r][u], x);
        }
      }
    }
    if (c0 + 32 * U < C) load_step<G, RPG, U>(b, rows, acts, c0 + 32 * U, C);
  }
}

// Stages row `src` (n elements) into shared memory: fp8 bytes as float32 values, else as T.
// n % 16 == 0 (fp8) or n * sizeof(T) % 16 == 0, src 16-byte aligned (checked on the host).
template <typename T, bool FP8>
__device__ __forceinline__ void stage_row(void* dst, const void* src, int64_t n) {
  const int64_t chunks = FP8 ? n / 16 : n * static_cast<int64_t>(sizeof(T)) / 16;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 v = __ldcg(static_cast<const uint4*>(src) + c);  // written by the previous kernel: L2, not nc
    if constexpr (FP8) {
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
      float4* d = static_cast<float4*>(dst) + 4 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[i] & 0xffffu), __NV_E4M3);
        const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[i] >> 16), __NV_E4M3);
        const float2 l = __half22float2(*reinterpret_cast<const __half2*>(&lo));
        const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&hi));
        d[i] = make_float4(l.x, l.y, h.x, h.y);
      }
    } else {
      static_cast<uint4*>(dst)[c] = v;
    }
  }
}

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// The gated activation of (gate a, up b), both already rounded to T, in fp32 (the Triton decode
// path's: ops/moe/fused_experts_decode.py _up_kernel).
template <typename T>
__device__ __forceinline__ float gated(int act, bool vllm, float a, float b, float alpha, float limit) {
  if (act == kSwigluOai) {
    const float g = a > limit ? limit : a;
    const float u = b < -limit ? -limit : (b > limit ? limit : b);
    return (u + 1.0f) * __fdividef(g, 1.0f + __expf(-alpha * g));
  }
  if (vllm) {  // vLLM's rounding: the activation rounded to T before the product
    const float v = act == kSilu ? a / (1.0f + expf(-a)) : 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
    return round_to<T>(v) * b;
  }
  // gelu through erfc (no cancellation in the negative tail, as the Triton path); once per output
  const float v = act == kSilu ? __fdividef(a, 1.0f + __expf(-a)) : 0.5f * a * erfcf(a * -0.70710678118654752f);
  return v * b;
}

template <typename T>
struct UpParams {
  T* act;
  int64_t act_stride;
  const void* x;        // fp8: e4m3 bytes [M, >= K]; else T [M, K]
  int64_t x_stride;     // elements (bytes for fp8)
  const float* xs;      // fp8: [M, ceil(K / 128)]
  int64_t xs_stride;
  const uint8_t* w1;    // [E, 2N, K] as bytes
  int64_t w_e, w_n;     // bytes
  const float* ws;      // fp8: [E, ceil(2N / 128), ceil(K / 128)]
  int64_t ws_e, ws_n, ws_k;
  const float* tw;
  int64_t tw_stride;
  Slots slots;
  int64_t n, k;
  float alpha, limit;
  int act_code;  // kSilu, kGelu or kSwigluOai (a runtime branch once per output: one kernel for all)
  bool vllm;   // vLLM's rounding of the activation (not swigluoai)
  bool mul_weight;
};

template <typename T, bool FP8, int RW>
__global__ void __launch_bounds__(kThreads, 2) up_kernel(const UpParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t s = blockIdx.x;
  const int64_t t = s / p.slots.topk;
  const int j = static_cast<int>(s - t * p.slots.topk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * RW;
  cuda::pdl_enter();
  const int64_t e = local_expert(p.slots, t, j);
  T* act = p.act + s * p.act_stride;
  if (e < 0) {  // no expert of this rank: a zero row (the down kernel skips the slot; zeros keep
                // the row's fp8 quantization, which reads every row, finite)
    if (lane < RW && n0 + lane < p.n) act[n0 + lane] = from_float<T>(0.f);
    return;
  }
  const int64_t xbytes = FP8 ? p.k * 4 : p.k * static_cast<int64_t>(sizeof(T));
  float* xs = reinterpret_cast<float*>(smem + xbytes);
  // rows 2i / 2i + 1 of the warp's i-th column: gate / up (clamped in bounds; the store drops them)
  Row rows[2 * RW];
  const uint8_t* base = p.w1 + e * p.w_e;
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int64_t col = min(n0 + i, p.n - 1);
    const int64_t g_row = p.act_code == kSwigluOai ? 2 * col : col;
    const int64_t u_row = p.act_code == kSwigluOai ? 2 * col + 1 : col + p.n;
    rows[2 * i] = {base + g_row * p.w_n, FP8 ? p.ws + e * p.ws_e + (g_row / kGroup) * p.ws_n : nullptr};
    rows[2 * i + 1] = {base + u_row * p.w_n, FP8 ? p.ws + e * p.ws_e + (u_row / kGroup) * p.ws_n : nullptr};
  }
  const int64_t chunks = FP8 ? p.k / 16 : p.k * static_cast<int64_t>(sizeof(T)) / 16;
  const Act acts[1] = {{smem, xs, n0 < p.n}};  // a warp past N loads nothing
  constexpr int U = kSteps<2 * RW>;
  uint4 b[2 * RW][U];
  load_step<1, 2 * RW, U>(b, rows, acts, lane, chunks);  // in flight while the token row is staged
  stage_row<T, FP8>(smem, static_cast<const uint8_t*>(p.x) + t * p.x_stride * (FP8 ? 1 : sizeof(T)), p.k);
  if constexpr (FP8) {
    const int64_t groups = (p.k + kGroup - 1) / kGroup;
    for (int64_t g = threadIdx.x; g < groups; g += kThreads) xs[g] = p.xs[t * p.xs_stride + g];
  }
  __syncthreads();
  if (n0 >= p.n) return;
  float acc[2 * RW];
#pragma unroll
  for (int r = 0; r < 2 * RW; ++r) acc[r] = 0.f;
  rows_dot<T, FP8, 1, 2 * RW, U>(b, rows, acts, p.ws_k, chunks, lane, acc);
#pragma unroll
  for (int r = 0; r < 2 * RW; ++r) acc[r] = cuda::warp_sum(acc[r]);
  const float w = p.mul_weight ? p.tw[t * p.tw_stride + j] : 1.0f;
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    if (lane == i && n0 + i < p.n) {
      // the first product rounded to T (the router weight first when it applies on the input)
      const float a = round_to<T>(p.mul_weight ? acc[2 * i] * w : acc[2 * i]);
      const float b = round_to<T>(p.mul_weight ? acc[2 * i + 1] * w : acc[2 * i + 1]);
      act[n0 + i] = from_float<T>(gated<T>(p.act_code, p.vllm, a, b, p.alpha, p.limit));
    }
  }
}

template <typename T>
struct DownParams {
  T* out;
  int64_t out_stride;
  const void* a;       // fp8: e4m3 bytes [S, >= N]; else T [S, N]
  int64_t a_stride;    // elements (bytes for fp8)
  const float* as;     // fp8: [S, ceil(N / 128)]
  int64_t as_stride;
  const uint8_t* w2;   // [E, K, N] as bytes
  int64_t w_e, w_k;    // bytes
  const float* ws;     // fp8: [E, ceil(K / 128), ceil(N / 128)]
  int64_t ws_e, ws_k, ws_n;
  const float* tw;
  int64_t tw_stride;
  Slots slots;
  int64_t n, k;
  bool mul_weight;
};

template <typename T, bool FP8, int CW, int JB>
__global__ void __launch_bounds__(kThreads, 2) down_kernel(const DownParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t t = blockIdx.x;
  const int topk = p.slots.topk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * CW;
  const int64_t groups = (p.n + kGroup - 1) / kGroup;
  const int64_t row_bytes = FP8 ? p.n * 4 : p.n * static_cast<int64_t>(sizeof(T));
  // shared memory: the token's topk act rows, then (fp8) their group scales
  unsigned char* rows_s = smem;
  float* as = reinterpret_cast<float*>(rows_s + topk * row_bytes);
  const int64_t chunks = FP8 ? p.n / 16 : row_bytes / 16;
  // the rows of JB slots starting at j0: the slot's expert read from topk_ids (no expert: none)
  Row rows[JB * CW];
  Act acts[JB];
  auto group = [&](int j0) {
#pragma unroll
    for (int jj = 0; jj < JB; ++jj) {
      const int j = j0 + jj;
      // lane 0 reads the id and the warp takes its value: one expert per slot for the whole warp
      // (the warp sums below mix its lanes) whatever another kernel does to topk_ids meanwhile
      const int64_t e0 = lane == 0 && j < topk ? local_expert(p.slots, t, j) : -1;
      const int64_t e = __shfl_sync(0xffffffffu, e0, 0);
      const int64_t eo = e < 0 ? 0 : e;
      acts[jj] = {rows_s + (j < topk ? j : 0) * row_bytes, as + (j < topk ? j : 0) * groups, e >= 0 && c0 < p.k};
#pragma unroll
      for (int i = 0; i < CW; ++i) {
        const int64_t c = min(c0 + i, p.k - 1);
        rows[jj * CW + i] = {p.w2 + eo * p.w_e + c * p.w_k, FP8 ? p.ws + eo * p.ws_e + (c / kGroup) * p.ws_k : nullptr};
      }
    }
  };
  constexpr int U = kSteps<JB * CW>;
  uint4 b[JB * CW][U];
  // the first weights are read before waiting for the previous kernel (it never writes w2 or the
  // ids; with PDL this overlaps its tail), then the act rows it wrote are staged
  cuda::pdl_launch_dependents();
  group(0);
  load_step<JB, CW, U>(b, rows, acts, lane, chunks);
  cuda::pdl_wait();
  for (int j = 0; j < topk; ++j) {
    const int64_t s = t * topk + j;
    stage_row<T, FP8>(rows_s + j * row_bytes,
                      static_cast<const uint8_t*>(p.a) + s * p.a_stride * (FP8 ? 1 : sizeof(T)), p.n);
    if constexpr (FP8)
      for (int64_t g = threadIdx.x; g < groups; g += kThreads) as[j * groups + g] = p.as[s * p.as_stride + g];
  }
  __syncthreads();
  if (c0 >= p.k) return;
  float total[CW];
#pragma unroll
  for (int i = 0; i < CW; ++i) total[i] = 0.f;
  // JB slots at a time, their CW rows each in flight together (few columns, many slots: the loads
  // of a token's experts overlap instead of following one another)
  for (int j0 = 0; j0 < topk; j0 += JB) {
    if (j0 > 0) {
      group(j0);
      load_step<JB, CW, U>(b, rows, acts, lane, chunks);
    }
    float acc[JB * CW];
#pragma unroll
    for (int r = 0; r < JB * CW; ++r) acc[r] = 0.f;
    rows_dot<T, FP8, JB, CW, U>(b, rows, acts, p.ws_n, chunks, lane, acc);
#pragma unroll
    for (int jj = 0; jj < JB; ++jj) {
      const int j = j0 + jj;
      if (!acts[jj].on) continue;
      const float w = p.mul_weight ? p.tw[t * p.tw_stride + j] : 1.0f;
#pragma unroll
      for (int i = 0; i < CW; ++i) {
        const float v = cuda::warp_sum(acc[jj * CW + i]);
        total[i] += round_to<T>(p.mul_weight ? v * w : v);  // each expert's term rounded to T, in slot order
      }
    }
  }
#pragma unroll
  for (int i = 0; i < CW; ++i)
    if (lane == i && c0 + i < p.k) p.out[t * p.out_stride + c0 + i] = from_float<T>(total[i]);
}

// ---- host -------------------------------------------------------------------------------------

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The widest 16-byte multiple the rows must hold: fp8 rows of 16 elements, else 16 bytes.
inline void check_rows(const TensorView& t, const char* name, bool fp8, int64_t elem) {
  check_last_dim_contiguous(kOp, name, t);
  const int64_t len = t.size(t.ndim() - 1);
  const bool ok_len = fp8 ? len % 16 == 0 : (len * elem) % 16 == 0;
  bool ok_stride = cuda::aligned(data_ptr<const void>(t), 16);
  for (int d = 0; d + 1 < t.ndim(); ++d)
    if (t.size(d) > 1 && (t.stride(d) * elem) % 16 != 0) ok_stride = false;
  if (!ok_len || !ok_stride) {
    TVM_FFI_THROW(ValueError) << kOp << ": the decode kernels read " << name
                              << " 16 bytes at a time: its rows need a 16-byte aligned start, strides of whole 16-byte "
                                 "units and a last dimension of whole 16-byte chunks"
                              << (fp8 ? " (a multiple of 16 fp8 elements)" : "") << "; got shape[-1] " << len;
  }
}

inline Slots slots_of(const TensorView& ids, const TensorView& map, int64_t experts) {
  check_ndim(kOp, "topk_ids", ids, 2);
  check_last_dim_contiguous(kOp, "topk_ids", ids);
  const bool ids64 = is_dtype(ids, kDLInt, 64);
  if (!ids64 && !is_dtype(ids, kDLInt, 32)) {
    TVM_FFI_THROW(ValueError) << kOp << ": topk_ids has dtype " << dtype_name(ids.dtype()) << ", expected int32 or int64";
  }
  const bool has_map = map.numel() > 0;
  if (has_map) {
    check_ndim(kOp, "expert_map", map, 1);
    check_int32(kOp, "expert_map", map);
    check_last_dim_contiguous(kOp, "expert_map", map);
  }
  Slots s;
  s.ids = data_ptr<const void>(ids);
  s.ids_stride = row_stride(kOp, "topk_ids", ids);
  s.map = has_map ? data_ptr<const int32_t>(map) : nullptr;
  s.num_ids = has_map ? map.size(0) : experts;
  s.experts = experts;
  s.topk = static_cast<int>(ids.size(1));
  s.ids64 = ids64;
  return s;
}

// Resident blocks of `fn` per SM with `smem` bytes of dynamic shared memory (cached: the
// occupancy query is host arithmetic, but a call should not repeat it).
template <typename Kernel>
inline int resident_blocks(Kernel* fn, size_t smem, int32_t device_id) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int32_t>, int> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(fn), smem, device_id);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  cuda::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kThreads, smem), kOp,
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return cache[key] = std::max(n, 1);
}

// Of the candidates (rows or columns per warp, its kernel), the one whose grid fills its waves of
// resident blocks best (a partial last wave leaves SMs idle at the end of a call that is one
// read); ties to more work per warp (fewer blocks staging the same activations). `forced`
// (1, 2, 4, 8; 0: choose) is the tuner's and the tests' override.
template <typename Kernel, size_t N>
inline std::pair<Kernel*, int> pick(const std::pair<Kernel*, int> (&cands)[N], int64_t items, int64_t outer,
                                    size_t smem, const cuda::DeviceProps& props, int32_t device_id, int64_t forced) {
  if (forced != 0) {
    for (const auto& c : cands)
      if (c.second == forced) return c;
    TVM_FFI_THROW(ValueError) << kOp << ": rows_per_warp " << forced << " is not one of this kernel's choices (0: auto, "
                              << cands[0].second << " to " << cands[N - 1].second << ")";
  }
  std::pair<Kernel*, int> best = cands[0];
  double best_eff = -1.0;
  for (const auto& c : cands) {
    const int64_t blocks = outer * cdiv(items, static_cast<int64_t>(kWarps) * c.second);
    const int64_t wave = static_cast<int64_t>(props.sm_count) * resident_blocks(c.first, smem, device_id);
    const double eff = static_cast<double>(blocks) / static_cast<double>(cdiv(blocks, wave) * wave);
    if (eff >= best_eff - 1e-9) {
      best = c;
      best_eff = eff;
    }
  }
  return best;
}

// Lets `fn` take `smem` bytes of dynamic shared memory on the current device (an attribute set
// once per kernel, device and larger size: not a driver call per launch).
template <typename Kernel>
inline void allow_smem(Kernel* fn, size_t smem, const cuda::DeviceProps& props, int32_t device_id) {
  if (smem > static_cast<size_t>(props.smem_optin)) {
    TVM_FFI_THROW(ValueError) << kOp << ": the decode kernels stage the activation rows in shared memory: " << smem
                              << " bytes are needed, this GPU allows " << props.smem_optin;
  }
  if (smem <= 48 * 1024) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int32_t>, size_t> allowed;
  const auto key = std::make_pair(reinterpret_cast<const void*>(fn), device_id);
  std::lock_guard<std::mutex> lock(mu);
  auto it = allowed.find(key);
  if (it != allowed.end() && it->second >= smem) return;
  cuda::check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), kOp,
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  allowed[key] = smem;
}

template <typename T, bool FP8>
void launch_up(const UpParams<T>& p, int64_t slots, int64_t forced, int32_t device_id, const cuda::DeviceProps& props,
               cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(FP8 ? p.k * 4 + cdiv(p.k, kGroup) * 4 : p.k * sizeof(T));
  using K = void(const UpParams<T>);
  // up to 4 columns a warp: 8 rows (gate and up), the most loads in flight per lane
  const std::pair<K*, int> cands[] = {{up_kernel<T, FP8, 1>, 1}, {up_kernel<T, FP8, 2>, 2}, {up_kernel<T, FP8, 4>, 4}};
  for (const auto& c : cands) allow_smem(c.first, smem, props, device_id);
  const auto [fn, w] = pick(cands, p.n, slots, smem, props, device_id, forced);
  cuda::launch(kOp, device_id, props, fn, dim3(static_cast<unsigned>(slots), static_cast<unsigned>(cdiv(p.n, kWarps * w))),
               dim3(kThreads), smem, stream, p);
}

// The down kernel with CW columns a warp and JB slots in flight together (CW * JB <= 8).
template <typename T, bool FP8, int CW>
inline auto down_for(int jb) -> void (*)(const DownParams<T>) {
  if constexpr (CW == 1) {
    return jb >= 8 ? down_kernel<T, FP8, 1, 8> : jb >= 4 ? down_kernel<T, FP8, 1, 4> : jb >= 2 ? down_kernel<T, FP8, 1, 2>
                                                                                          : down_kernel<T, FP8, 1, 1>;
  } else if constexpr (CW == 2) {
    return jb >= 4 ? down_kernel<T, FP8, 2, 4> : jb >= 2 ? down_kernel<T, FP8, 2, 2> : down_kernel<T, FP8, 2, 1>;
  } else if constexpr (CW == 4) {
    return jb >= 2 ? down_kernel<T, FP8, 4, 2> : down_kernel<T, FP8, 4, 1>;
  } else {
    return down_kernel<T, FP8, 8, 1>;
  }
}

template <typename T, bool FP8>
void launch_down(const DownParams<T>& p, int64_t m, int64_t forced, int32_t device_id, const cuda::DeviceProps& props,
                 cudaStream_t stream) {
  const int topk = p.slots.topk;
  const size_t smem =
      static_cast<size_t>(topk * (FP8 ? p.n * 4 + cdiv(p.n, kGroup) * 4 : p.n * sizeof(T)));
  int slots_pow2 = 1;
  while (slots_pow2 < topk && slots_pow2 < 8) slots_pow2 *= 2;
  // slots in flight: as many as the token has, up to 8 rows a warp
  auto jb = [&](int cw) { return std::min(slots_pow2, 8 / cw); };
  using K = void(const DownParams<T>);
  const std::pair<K*, int> cands[] = {{down_for<T, FP8, 1>(jb(1)), 1},
                                      {down_for<T, FP8, 2>(jb(2)), 2},
                                      {down_for<T, FP8, 4>(jb(4)), 4},
                                      {down_for<T, FP8, 8>(jb(8)), 8}};
  for (const auto& c : cands) allow_smem(c.first, smem, props, device_id);
  const auto [fn, w] = pick(cands, p.k, m, smem, props, device_id, forced);
  cuda::launch(kOp, device_id, props, fn, dim3(static_cast<unsigned>(m), static_cast<unsigned>(cdiv(p.k, kWarps * w))),
               dim3(kThreads), smem, stream, p);
}

// The weights' form: fp8 (float8_e4m3fn bytes with block scales) or the activations' dtype.
inline bool weight_form(const TensorView& w, const char* name, DType dt) {
  if (is_dtype(w, kDLFloat8_e4m3fn, 8)) return true;
  if (get_dtype(kOp, name, w) != dt) {
    TVM_FFI_THROW(ValueError) << kOp << ": " << name << " has dtype " << dtype_name(w.dtype())
                              << "; expected float8_e4m3fn or the activations' dtype";
  }
  return false;
}

inline void check_scales(const TensorView& s, const char* name, int64_t e, int64_t rows, int64_t cols) {
  check_ndim(kOp, name, s, 3);
  check_float32(kOp, name, s);
  check_size(kOp, name, s, 0, e, "the experts");
  check_size(kOp, name, s, 1, cdiv(rows, kGroup), "ceil(rows / 128)");
  check_size(kOp, name, s, 2, cdiv(cols, kGroup), "ceil(columns / 128)");
  if (s.stride(0) < 0 || s.stride(1) < 0 || s.stride(2) < 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": " << name << " has a negative stride";
  }
}

inline int64_t elem_size(DType) { return 2; }

// The output's dtype: float16 or bfloat16 (float32 calls run on the Triton backend; the unit keeps
// its instantiations to the serving dtypes).
inline DType dtype_16bit(const char* name, const TensorView& t) {
  const DType d = get_dtype(kOp, name, t);
  if (d == DType::kFloat32) {
    TVM_FFI_THROW(ValueError) << kOp << ": " << name
                              << " is float32; the decode kernels take float16 or bfloat16 (the Triton backend runs float32)";
  }
  return d;
}

template <typename F>
inline void dispatch_16bit(DType d, F&& f) {
  if (d == DType::kFloat16) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

// The routing arguments of both entries: topk in [1, kThreads], topk_weights [M, topk] float32.
inline void check_routing(const TensorView& topk_weights, int64_t m, int64_t topk) {
  if (topk < 1 || topk > kThreads) {
    TVM_FFI_THROW(ValueError) << kOp << ": topk is " << topk << "; the decode kernels take 1 to " << kThreads;
  }
  check_size(kOp, "topk_weights", topk_weights, 0, m, "topk_ids' tokens");
  check_size(kOp, "topk_weights", topk_weights, 1, topk, "topk_ids' topk");
  check_float32(kOp, "topk_weights", topk_weights);
  check_last_dim_contiguous(kOp, "topk_weights", topk_weights);
}

// The activation rows a product reads, `rows` of them with `cols` columns: fp8 e4m3 rows (at least
// `cols` columns, whole 16-byte chunks) with their float32 group scales, else rows of dtype `dt`.
inline void check_activation(const TensorView& x, const char* x_name, const TensorView& xs, const char* xs_name,
                             int64_t rows, int64_t cols, bool fp8, DType dt) {
  check_size(kOp, x_name, x, 0, rows, "its rows");
  if (fp8) {
    check_fp8_bytes(kOp, x_name, x);
    if (x.size(1) < cols) {
      TVM_FFI_THROW(ValueError) << kOp << ": " << x_name << " (the quantized rows) has " << x.size(1)
                                << " columns, fewer than " << cols;
    }
    check_rows(x, x_name, true, 1);
    check_ndim(kOp, xs_name, xs, 2);
    check_float32(kOp, xs_name, xs);
    check_size(kOp, xs_name, xs, 0, rows, "its rows");
    if (xs.size(1) < cdiv(cols, kGroup)) {
      TVM_FFI_THROW(ValueError) << kOp << ": " << xs_name << " has " << xs.size(1)
                                << " group scales a row, fewer than ceil(" << cols << " / 128)";
    }
    check_last_dim_contiguous(kOp, xs_name, xs);
  } else {
    if (get_dtype(kOp, x_name, x) != dt) {
      TVM_FFI_THROW(ValueError) << kOp << ": " << x_name << " has dtype " << dtype_name(x.dtype())
                                << ", expected the output's";
    }
    check_size(kOp, x_name, x, 1, cols, "the weights' columns");
    check_rows(x, x_name, false, elem_size(dt));
  }
}

}  // namespace moe_decode_cuda

void moe_decode_up_cuda(TensorView act, TensorView x, TensorView xs, TensorView w1, TensorView w1_scale,
                        TensorView topk_weights, TensorView topk_ids, TensorView expert_map, int64_t activation,
                        bool mul_weight, bool vllm_rounding, double alpha, double limit, int64_t rows_per_warp,
                        bool enable_pdl) {
  namespace D = moe_decode_cuda;
  const char* op = D::kOp;
  check_ndim(op, "act", act, 2);
  check_ndim(op, "x", x, 2);
  check_ndim(op, "w1", w1, 3);
  check_ndim(op, "topk_weights", topk_weights, 2);
  const DType dt = D::dtype_16bit("act", act);
  const int32_t device_id = check_device(op, kDLCUDA, {{"act", &act}, {"x", &x}, {"w1", &w1},
                                                       {"topk_weights", &topk_weights}, {"topk_ids", &topk_ids}});
  const bool fp8 = D::weight_form(w1, "w1", dt);
  const int64_t experts = w1.size(0), n2 = w1.size(1), k = w1.size(2), n = n2 / 2;
  const int64_t m = topk_ids.size(0), topk = topk_ids.size(1), slots = m * topk;
  if (n2 % 2 != 0 || n < 1 || k < 1 || experts < 1) {
    TVM_FFI_THROW(ValueError) << op << ": w1 [E, 2N, K] has shape [" << experts << ", " << n2 << ", " << k
                              << "]: E, N and K must be at least 1 and 2N even";
  }
  if (activation != D::kSilu && activation != D::kGelu && activation != D::kSwigluOai) {
    TVM_FFI_THROW(ValueError) << op << ": activation code " << activation << " is not one of 0 (silu), 1 (gelu), 5 (swigluoai)";
  }
  D::check_routing(topk_weights, m, topk);
  check_size(op, "act", act, 0, slots, "M * topk");
  check_size(op, "act", act, 1, n, "N");
  check_last_dim_contiguous(op, "act", act);
  D::Slots sl = D::slots_of(topk_ids, expert_map, experts);
  const int64_t welem = fp8 ? 1 : D::elem_size(dt);
  D::check_rows(w1, "w1", fp8, welem);
  D::check_activation(x, "x", xs, "xs", m, k, fp8, dt);
  if (fp8) {
    D::check_scales(w1_scale, "w1_scale", experts, n2, k);
    check_device(op, kDLCUDA, {{"act", &act}, {"xs", &xs}, {"w1_scale", &w1_scale}});
  }
  if (expert_map.numel() > 0) check_device(op, kDLCUDA, {{"act", &act}, {"expert_map", &expert_map}});
  if (m == 0) return;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  cudaStream_t stream = cuda::current_stream(device_id);
  cuda::PdlScope pdl(enable_pdl);
  D::dispatch_16bit(dt, [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    D::UpParams<T> p{};
    p.act = data_ptr<T>(act);
    p.act_stride = row_stride(op, "act", act);
    p.x = data_ptr<const void>(x);
    p.x_stride = row_stride(op, "x", x);
    p.xs = fp8 ? data_ptr<const float>(xs) : nullptr;
    p.xs_stride = fp8 ? row_stride(op, "xs", xs) : 0;
    p.w1 = data_ptr<const uint8_t>(w1);
    p.w_e = w1.stride(0) * welem;
    p.w_n = w1.stride(1) * welem;
    p.ws = fp8 ? data_ptr<const float>(w1_scale) : nullptr;
    p.ws_e = fp8 ? w1_scale.stride(0) : 0;
    p.ws_n = fp8 ? w1_scale.stride(1) : 0;
    p.ws_k = fp8 ? w1_scale.stride(2) : 0;
    p.tw = data_ptr<const float>(topk_weights);
    p.tw_stride = row_stride(op, "topk_weights", topk_weights);
    p.slots = sl;
    p.n = n;
    p.k = k;
    p.alpha = static_cast<float>(alpha);
    p.limit = static_cast<float>(limit);
    p.mul_weight = mul_weight;
    p.act_code = static_cast<int>(activation);
    p.vllm = vllm_rounding && activation != D::kSwigluOai;
    if (fp8) {
      D::launch_up<T, true>(p, slots, rows_per_warp, device_id, props, stream);
    } else {
      D::launch_up<T, false>(p, slots, rows_per_warp, device_id, props, stream);
    }
  });
}

void moe_decode_down_cuda(TensorView out, TensorView a, TensorView as, TensorView w2, TensorView w2_scale,
                          TensorView topk_weights, TensorView topk_ids, TensorView expert_map, bool mul_weight,
                          int64_t rows_per_warp, bool enable_pdl) {
  namespace D = moe_decode_cuda;
  const char* op = D::kOp;
  check_ndim(op, "out", out, 2);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "w2", w2, 3);
  check_ndim(op, "topk_weights", topk_weights, 2);
  const DType dt = D::dtype_16bit("out", out);
  const int32_t device_id = check_device(op, kDLCUDA, {{"out", &out}, {"a", &a}, {"w2", &w2},
                                                       {"topk_weights", &topk_weights}, {"topk_ids", &topk_ids}});
  const bool fp8 = D::weight_form(w2, "w2", dt);
  const int64_t experts = w2.size(0), k = w2.size(1), n = w2.size(2);
  const int64_t m = topk_ids.size(0), topk = topk_ids.size(1), slots = m * topk;
  if (n < 1 || k < 1 || experts < 1) {
    TVM_FFI_THROW(ValueError) << op << ": w2 [E, K, N] has shape [" << experts << ", " << k << ", " << n
                              << "]: each must be at least 1";
  }
  D::check_routing(topk_weights, m, topk);
  check_size(op, "out", out, 0, m, "topk_ids' tokens");
  check_size(op, "out", out, 1, k, "K");
  check_last_dim_contiguous(op, "out", out);
  D::Slots sl = D::slots_of(topk_ids, expert_map, experts);
  const int64_t welem = fp8 ? 1 : D::elem_size(dt);
  D::check_rows(w2, "w2", fp8, welem);
  D::check_activation(a, "a", as, "as", slots, n, fp8, dt);
  if (fp8) {
    D::check_scales(w2_scale, "w2_scale", experts, k, n);
    check_device(op, kDLCUDA, {{"out", &out}, {"as", &as}, {"w2_scale", &w2_scale}});
  }
  if (expert_map.numel() > 0) check_device(op, kDLCUDA, {{"out", &out}, {"expert_map", &expert_map}});
  if (m == 0) return;
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  cudaStream_t stream = cuda::current_stream(device_id);
  cuda::PdlScope pdl(enable_pdl);
  D::dispatch_16bit(dt, [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    D::DownParams<T> p{};
    p.out = data_ptr<T>(out);
    p.out_stride = row_stride(op, "out", out);
    p.a = data_ptr<const void>(a);
    p.a_stride = row_stride(op, "a", a);
    p.as = fp8 ? data_ptr<const float>(as) : nullptr;
    p.as_stride = fp8 ? row_stride(op, "as", as) : 0;
    p.w2 = data_ptr<const uint8_t>(w2);
    p.w_e = w2.stride(0) * welem;
    p.w_k = w2.stride(1) * welem;
    p.ws = fp8 ? data_ptr<const float>(w2_scale) : nullptr;
    p.ws_e = fp8 ? w2_scale.stride(0) : 0;
    p.ws_k = fp8 ? w2_scale.stride(1) : 0;
    p.ws_n = fp8 ? w2_scale.stride(2) : 0;
    p.tw = data_ptr<const float>(topk_weights);
    p.tw_stride = row_stride(op, "topk_weights", topk_weights);
    p.slots = sl;
    p.n = n;
    p.k = k;
    p.mul_weight = mul_weight;
    if (fp8) {
      D::launch_down<T, true>(p, m, rows_per_warp, device_id, props, stream);
    } else {
      D::launch_down<T, false>(p, m, rows_per_warp, device_id, props, stream);
    }
  });
}

}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_decode_up_cuda, opmux::moe_decode_up_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_decode_down_cuda, opmux::moe_decode_down_cuda);
