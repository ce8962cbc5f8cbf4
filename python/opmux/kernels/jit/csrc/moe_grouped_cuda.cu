// moe.fused_experts, fp8 block-scaled form, for CUDA sm_90a: the pieces of the "cutlass" backend
// (ops/moe/fused_experts_cutlass.py orchestrates them; the activation and the 1x128 group
// quantization are opmux's own ops between them). Its own JIT module (moe_grouped_cuda), so
// moe_cuda keeps its compile time; the AOT library includes it like every unit.
//
//   route   topk_ids [M, topk] (int32 / int64) and expert_map -> offsets [E + 1] (exclusive
//           starts of each local expert's rows, offsets[E] = R valid slots) and inv [M * topk]
//           (slot t * topk + j -> its row in expert order, or -1: an id outside [0, E) / the
//           map, or mapped to -1, goes nowhere). Rows are compact (no padding); their order
//           inside an expert is the order of shared-memory atomics (not deterministic; every
//           row's products are computed alike wherever it sits, so the results are).
//   gather  quantized hidden rows and their 1x128 scales into expert order: a[r] = q[slot / topk],
//           sa[r] = qs[slot / topk] (* topk_weights[slot] with apply_router_weight_on_input).
//   scale   sa[r, :] *= topk_weights[slot] (the routed weight folded into the second product's
//           activation scales: acc * w in fp32, rounded once in the epilogue).
//   gemm    the grouped GEMM, one group per local expert, on CUTLASS's sm90 ptr-array kernel
//           with blockwise scaling (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_
//           scaling.hpp: per 128-K block the wgmma partial sums are promoted into the fp32
//           accumulator times sa[r, kb] * sb[e, n / 128, kb]):
//             d[r, c] = sum_kb sa[r, kb] * sb[e, (n0 + c) / 128, kb] * sum_{k in kb} a[r, k] * b[e, n0 + c, k]
//           for the rows r in [offsets[e], offsets[e + 1]) and c in [0, n): b [E, Nb, K] e4m3
//           (K-major weights), columns n0 .. n0 + n of it (the down projection in column chunks),
//           d [rows, ldd] bf16 / fp16. The group arrays (problem shapes from offsets, pointers,
//           strides, scale layouts) are written on the device by a small kernel before each
//           GEMM: no host synchronisation anywhere, CUDA-graph safe.
//   reduce  out[t, c0 + c] = sum over j (in order, fp32) of y[inv[t * topk + j], c] for the
//           slots that have a row, rounded once (0 where none).
//
// Exports (tvm-ffi; every CUDA entry takes a trailing enable_pdl):
//   moe_grouped_route_cuda(offsets, inv, topk_ids, expert_map, enable_pdl)
//   moe_grouped_gather_cuda(a, sa, q, qs, inv, topk_weights, weighted, enable_pdl)
//   moe_grouped_scale_cuda(sa, inv, topk_weights, enable_pdl)
//   moe_grouped_gemm_cuda(d, a, sa, b, sb, offsets, n0, n, config_id, enable_pdl)
//   moe_grouped_reduce_cuda(out, y, inv, c0, enable_pdl)
//   moe_grouped_configs() -> int64
//
// GEMM configs (each instantiated for bf16 and fp16 d; the choices of SGLang's sm90 blockwise
// MoE GEMM, which serves DeepSeek-V3 on H100 / H200):
//   id  schedule     swap-AB  CTA tile (kernel M x N x K)  cluster  meant for
//   0   cooperative  no       128 x 128 x 128              1x2x1    many rows per expert (A multicast along N)
//   1   ping-pong    yes      128 x  32 x 128              2x1x1    few rows per expert (decode .. ~48)
// Swap-AB computes d^T = b * a^T: the weight rows fill the 128-row wgmma side, an expert's rows
// are the kernel's N (32 per tile), and d^T is stored column-major, i.e. d row-major. Both use
// CUTLASS's persistent group scheduler (sm_count CTAs: the problem shapes live on the device)
// and CUTLASS's auto carve-out of 227 KB shared memory for the stage count.
//
// Layout requirements (checked; the Python backend meets them by construction):
//   K % 128 == 0 (a.shape[1], b.shape[2]); n0 % 128 == 0; a, sa, d, b rows dense (unit last
//   stride); a.stride(0) % 16 == 0, d.stride(0) % 8 == 0 (16-byte rows for TMA); a, b, d
//   16-byte aligned; sa, sb K-major (sa [rows, K / 128] rows, sb [E, ceil(Nb / 128), K / 128]
//   dense); offsets non-decreasing with offsets[E] <= rows (route writes them so).
// Arch: the CUTLASS kernels exist only in the sm_90a image; other archs compile to empty bodies
// and the GEMM entry raises before launching unless the device is sm_90 and the loaded image
// is the sm_90a one (the other kernels are plain CUDA and run anywhere).
//
// PDL: every kernel, the GEMM included (its entry waits before CUTLASS runs: the ptr-array
// kernels have no griddepcontrol.wait of their own), starts with cuda::pdl_enter(); with
// enable_pdl the launches carry programmatic stream serialization.
//
// NDEBUG: CUTLASS's device-side asserts are calls, and a call inside the mainloop makes ptxas
// serialize the wgmma pipeline (ptxas C7510 "wgmma.mma_async instructions are serialized due to
// wgmma pipeline crossing function boundary" on all four kernels without it, none with it).
// Defined here for this unit's JIT build; the build's -DNDEBUG (jit/compile/build.py) covers
// the AOT translation unit, where an earlier unit may have parsed the CUTLASS headers already.
#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif
#ifndef NDEBUG
#define NDEBUG 1
#define OPMUX_MOE_GROUPED_DEFINED_NDEBUG 1
#endif

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "opmux/cuda_utils.cuh"
#include "opmux/dtype_checks.h"
#include "opmux/gemm/overlapped_promotion.h"

namespace opmux {
namespace moe_grouped_cuda {

using namespace cute;

constexpr const char* kOp = "opmux.moe.fused_experts[cutlass]";
constexpr int kBlock = 128;            // the fp8 recipe's scale block
constexpr int kRouteThreads = 1024;    // route: one block
constexpr int64_t kMaxExperts = 4096;  // route's shared memory: 2 ints per expert

__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- routing --------------------------------------------------------------------------------

template <typename Id>
__device__ __forceinline__ int local_expert(const Id* __restrict__ ids, int64_t slot, int topk,
                                            int64_t id_stride, const int32_t* __restrict__ map,
                                            int64_t n_map, int experts) {
  const int64_t t = slot / topk;
  const int64_t id = static_cast<int64_t>(ids[t * id_stride + slot % topk]);
  if (map == nullptr) return id >= 0 && id < experts ? static_cast<int>(id) : -1;
  if (id < 0 || id >= n_map) return -1;
  const int32_t local = map[id];
  return local >= 0 && local < experts ? local : -1;
}

// One block: counts per local expert (shared-memory atomics), their exclusive scan, then each
// slot's row. 2 * experts ints of dynamic shared memory.
template <typename Id>
__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(int32_t* __restrict__ offsets, int32_t* __restrict__ inv, const Id* __restrict__ ids,
                 int64_t slots, int topk, int64_t id_stride, const int32_t* __restrict__ map,
                 int64_t n_map, int experts) {
  cuda::pdl_enter();
  extern __shared__ int32_t smem_route[];
  int32_t* count = smem_route;
  int32_t* cursor = smem_route + experts;
  __shared__ int32_t warp_total[kRouteThreads / 32];
  const int tid = threadIdx.x;
  for (int e = tid; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t s = tid; s < slots; s += blockDim.x) {
    const int e = local_expert(ids, s, topk, id_stride, map, n_map, experts);
    if (e >= 0) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // exclusive scan: each thread a contiguous run of experts, then a block scan of the run sums
  const int per = (experts + blockDim.x - 1) / blockDim.x;
  const int lo = min(experts, tid * per), hi = min(experts, lo + per);
  int32_t run = 0;
  for (int e = lo; e < hi; ++e) run += count[e];
  const int lane = tid & 31, warp = tid >> 5;
  int32_t incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    int32_t w = lane < nw ? warp_total[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    if (lane < nw) warp_total[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int32_t start = incl - run + (warp > 0 ? warp_total[warp - 1] : 0);
  for (int e = lo; e < hi; ++e) {
    offsets[e] = start;
    cursor[e] = start;
    start += count[e];
  }
  if (tid == blockDim.x - 1) offsets[experts] = warp_total[blockDim.x / 32 - 1];
  __syncthreads();
  for (int64_t s = tid; s < slots; s += blockDim.x) {
    const int e = local_expert(ids, s, topk, id_stride, map, n_map, experts);
    inv[s] = e >= 0 ? atomicAdd(&cursor[e], 1) : -1;
  }
}

// ---- gather / scale / reduce ----------------------------------------------------------------

// One block per slot: its token's quantized row (16-byte vectors) and scales into row inv[slot].
__global__ void __launch_bounds__(256)
    gather_kernel(uint8_t* __restrict__ a, float* __restrict__ sa, const uint8_t* __restrict__ q,
                  const float* __restrict__ qs, const int32_t* __restrict__ inv,
                  const float* __restrict__ tw, int64_t k, int64_t kb, int64_t lda, int64_t ld_sa,
                  int64_t ldq, int64_t qs_m, int64_t qs_k, int64_t tw_stride, int topk, bool weighted) {
  cuda::pdl_enter();
  const int64_t slot = blockIdx.x;
  const int32_t r = inv[slot];
  if (r < 0) return;
  const int64_t t = slot / topk;
  const uint4* src = reinterpret_cast<const uint4*>(q + t * ldq);
  uint4* dst = reinterpret_cast<uint4*>(a + static_cast<int64_t>(r) * lda);
  for (int64_t i = threadIdx.x; i < k / 16; i += blockDim.x) dst[i] = src[i];
  const float w = weighted ? tw[t * tw_stride + slot % topk] : 1.0f;
  for (int64_t i = threadIdx.x; i < kb; i += blockDim.x) {
    sa[static_cast<int64_t>(r) * ld_sa + i] = qs[t * qs_m + i * qs_k] * w;
  }
}

// sa[inv[slot], :] *= topk_weights[slot]: one thread per (slot, scale).
__global__ void __launch_bounds__(256)
    scale_kernel(float* __restrict__ sa, const int32_t* __restrict__ inv, const float* __restrict__ tw,
                 int64_t slots, int64_t kb, int64_t ld_sa, int64_t tw_stride, int topk) {
  cuda::pdl_enter();
  const int64_t total = slots * kb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t slot = i / kb;
    const int32_t r = inv[slot];
    if (r >= 0) sa[static_cast<int64_t>(r) * ld_sa + i % kb] *= tw[(slot / topk) * tw_stride + slot % topk];
  }
}

// out[t, c0 + c] = round(sum_j fp32(y[inv[t * topk + j], c])): block (t, column tile); kVec
// columns per thread (16-byte loads of y; out stores vectorised where its rows allow).
template <typename T, bool kVecOut>
__global__ void __launch_bounds__(256)
    reduce_kernel(T* __restrict__ out, const T* __restrict__ y, const int32_t* __restrict__ inv,
                  int64_t width, int64_t ldy, int64_t ldo, int64_t c0, int topk) {
  cuda::pdl_enter();
  constexpr int kVec = cuda::kVec16<T>;
  const int64_t t = blockIdx.x;
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * kVec;
  if (c >= width) return;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int j = 0; j < topk; ++j) {
    const int32_t r = inv[t * topk + j];
    if (r < 0) continue;
    const auto v = cuda::load_vec<T, kVec>(y + static_cast<int64_t>(r) * ldy + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += cuda::to_float(v.v[i]);
  }
  T* dst = out + t * ldo + c0 + c;
  if constexpr (kVecOut) {
    cuda::Vec<T, kVec> o;
#pragma unroll
    for (int i = 0; i < kVec; ++i) o.v[i] = cuda::from_float<T>(acc[i]);
    cuda::store_vec<T, kVec>(dst, o);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = cuda::from_float<T>(acc[i]);
  }
}

// ---- the CUTLASS grouped GEMM ---------------------------------------------------------------

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;

template <class ElementD, class TileShape, class ClusterShape, bool kSwap>
struct GroupedFp8Gemm {
  using ElementAB = cutlass::float_e4m3_t;
  using Element = ElementD;
  static constexpr bool kSwapAB = kSwap;
  // granularity along the kernel's M and N: the activation rows 1, the weight rows 128
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<kSwap ? 128 : 1, kSwap ? 1 : 128, 128,
                                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using LayoutD = cute::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  using KernelSchedule =
      cute::conditional_t<kSwap, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
  using EpilogueSchedule = cute::conditional_t<kSwap, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  // d = the fp32 accumulator rounded once (no alpha / beta, no C)
  using Identity = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD,
      LayoutD*, kAlignD, EpilogueSchedule, Identity>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>, 16, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  // CUTLASS's loads, pipeline and shared memory with a consumer loop that promotes each k-tile's
  // partial sums under the next k-tile's wgmma batch (opmux/gemm/overlapped_promotion.h).
  using CollectiveMainloop = gemm::OverlappedPromotionMma<BuiltMainloop>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// The per-group arrays the ptr-array kernel reads, in one workspace (each array 128-byte
// aligned), followed by CUTLASS's own workspace (its TMA descriptors per SM).
template <class Cfg>
struct GroupArrays {
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  Shape3* shapes;
  const cutlass::float_e4m3_t** pa;
  const cutlass::float_e4m3_t** pb;
  const float** psfa;
  const float** psfb;
  typename Cfg::Element** pd;
  typename Cfg::StrideA* sta;
  typename Cfg::StrideB* stb;
  typename Cfg::StrideD* std_;
  typename Cfg::LayoutSFA* lsfa;
  typename Cfg::LayoutSFB* lsfb;

  static int64_t align(int64_t x) { return (x + 127) / 128 * 128; }
  // bytes for `groups` groups; carves the arrays out of `base` when it is not null
  static int64_t carve(GroupArrays* g, char* base, int64_t groups) {
    int64_t off = 0;
    auto take = [&](auto*& ptr, int64_t bytes) {
      using P = std::remove_reference_t<decltype(ptr)>;
      if (base != nullptr) ptr = reinterpret_cast<P>(base + off);
      off = align(off + bytes);
    };
    GroupArrays dummy;
    GroupArrays& t = g != nullptr ? *g : dummy;
    take(t.shapes, groups * int64_t(sizeof(Shape3)));
    take(t.pa, groups * int64_t(sizeof(void*)));
    take(t.pb, groups * int64_t(sizeof(void*)));
    take(t.psfa, groups * int64_t(sizeof(void*)));
    take(t.psfb, groups * int64_t(sizeof(void*)));
    take(t.pd, groups * int64_t(sizeof(void*)));
    take(t.sta, groups * int64_t(sizeof(typename Cfg::StrideA)));
    take(t.stb, groups * int64_t(sizeof(typename Cfg::StrideB)));
    take(t.std_, groups * int64_t(sizeof(typename Cfg::StrideD)));
    take(t.lsfa, groups * int64_t(sizeof(typename Cfg::LayoutSFA)));
    take(t.lsfb, groups * int64_t(sizeof(typename Cfg::LayoutSFB)));
    return off;
  }
};

// A K-major (row-major [rows, K]) operand's stride: (ld, 1, 0); a column-major d^T: (1, ld, 0).
template <class S>
__device__ __forceinline__ S stride_of(int64_t ld) {
  S s{};
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

struct GemmOperands {
  const uint8_t* a;  // [rows, K] e4m3, row stride lda
  const float* sa;   // [rows, K / 128], row stride ld_sa
  const uint8_t* b;  // [E, Nb, K] e4m3 (dense)
  const float* sb;   // [E, ceil(Nb / 128), K / 128] (dense)
  void* d;           // [rows, ldd] bf16 / fp16
  const int32_t* offsets;
  int64_t lda, ld_sa, ldd;
  int64_t nb_rows;  // Nb
  int64_t n0, n, k;
  int experts;
};

// One thread per group: its problem shape, pointers, strides and scale layouts.
template <class Cfg>
__global__ void __launch_bounds__(128) group_args_kernel(GroupArrays<Cfg> g, GemmOperands p) {
  cuda::pdl_enter();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= p.experts) return;
  const int64_t start = p.offsets[e];
  const int m = static_cast<int>(p.offsets[e + 1] - start);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int64_t kb = p.k / kBlock;
  const int64_t nb_scale = cdiv(p.nb_rows, kBlock);
  const auto* a = reinterpret_cast<const cutlass::float_e4m3_t*>(p.a + start * p.lda);
  const auto* b = reinterpret_cast<const cutlass::float_e4m3_t*>(p.b + (e * p.nb_rows + p.n0) * p.k);
  const float* sa = p.sa + start * p.ld_sa;
  const float* sb = p.sb + (e * nb_scale + p.n0 / kBlock) * kb;
  auto* d = static_cast<typename Cfg::Element*>(p.d) + start * p.ldd;
  using SC = typename Cfg::ScaleConfig;
  if constexpr (Cfg::kSwapAB) {
    // kernel: (n weight rows) x (m expert rows) x K; A = weights, B = activations
    g.shapes[e] = make_shape(n, m, k);
    g.pa[e] = b;
    g.pb[e] = a;
    g.psfa[e] = sb;
    g.psfb[e] = sa;
    g.sta[e] = stride_of<typename Cfg::StrideA>(p.k);
    g.stb[e] = stride_of<typename Cfg::StrideB>(p.lda);
    g.std_[e] = stride_of<typename Cfg::StrideD>(p.ldd);
    // scale layouts: the weight block scales' row stride is kb (dense), the activation rows' ld_sa
    auto la = SC::tile_atom_to_shape_SFA(make_shape(n, m, k, 1));
    auto lb = SC::tile_atom_to_shape_SFB(make_shape(n, m, k, 1));
    g.lsfa[e] = la;
    g.lsfb[e] = lb;
    cute::get<0, 1>(g.lsfb[e].stride()) = static_cast<int32_t>(p.ld_sa);
  } else {
    g.shapes[e] = make_shape(m, n, k);
    g.pa[e] = a;
    g.pb[e] = b;
    g.psfa[e] = sa;
    g.psfb[e] = sb;
    g.sta[e] = stride_of<typename Cfg::StrideA>(p.lda);
    g.stb[e] = stride_of<typename Cfg::StrideB>(p.k);
    g.std_[e] = stride_of<typename Cfg::StrideD>(p.ldd);
    auto la = SC::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    auto lb = SC::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
    g.lsfa[e] = la;
    g.lsfb[e] = lb;
    cute::get<0, 1>(g.lsfa[e].stride()) = static_cast<int32_t>(p.ld_sa);
  }
  g.pd[e] = d;
}

// The kernel entry: the CUTLASS kernel exists only in the sm_90a image. Every other image gets
// an empty body; the host refuses to launch there. The ptr-array kernels read the group arrays
// without a griddepcontrol.wait of their own: wait here first.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
    grouped_gemm_kernel(const __grid_constant__ typename Kernel::Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  cuda::pdl_enter();
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
#endif
}

// Probe: its image has static shared memory unless it is the sm_90a one, so
// cudaFuncGetAttributes tells (without a launch, graph-capture safe) whether the image the
// driver picked for this device carries the CUTLASS kernels.
__global__ void sm90a_probe_kernel(int* out) {
#if !(defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __shared__ int marker[32];
  marker[threadIdx.x % 32] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (out != nullptr) out[threadIdx.x] = marker[(threadIdx.x + 1) % 32];
#else
  if (out != nullptr) out[threadIdx.x] = 0;
#endif
}

inline void check_arch(int32_t device_id) {
  struct Cached {
    int major = -1, minor = -1;
    bool image_ok = false;
  };
  static std::mutex mu;
  static Cached cache[64];
  Cached c;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (device_id >= 0 && device_id < 64) c = cache[device_id];
  }
  if (c.major < 0) {
    cuda::check_cuda(cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device_id), kOp,
                     "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    cuda::check_cuda(cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, device_id), kOp,
                     "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
    if (c.major == 9 && c.minor == 0) {
      cudaFuncAttributes attr;
      cuda::check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(sm90a_probe_kernel)), kOp,
                       "cudaFuncGetAttributes");
      c.image_ok = attr.sharedSizeBytes == 0 && attr.binaryVersion == 90;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (device_id >= 0 && device_id < 64) cache[device_id] = c;
  }
  if (c.major != 9 || c.minor != 0) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": the CUTLASS grouped GEMM needs sm_90a (Hopper); this GPU is sm_"
                                << c.major << c.minor;
  }
  if (!c.image_ok) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": the CUTLASS grouped GEMM needs sm_90a (Hopper) code, but this "
                                << "library was built without an sm_90a image (compile with arch sm_90a)";
  }
}

template <class Kernel>
void set_smem_attr(const void* fn, int smem, int32_t device_id) {
  static std::mutex mu;
  static std::set<int32_t> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(device_id)) return;
  cuda::check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), kOp,
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  done.insert(device_id);
}

inline tvm::ffi::Tensor workspace(int64_t bytes, int32_t device_id, const char* what) {
  DLDevice dev{kDLCUDA, device_id};
  try {
    return tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::Shape({bytes}),
                                          DLDataType{kDLUInt, 8, 1}, dev);
  } catch (const std::exception& e) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": no workspace for " << what << " (" << bytes << " bytes): " << e.what();
  }
  return tvm::ffi::Tensor();  // unreachable
}

template <class Cfg>
void run_gemm(const GemmOperands& p, int32_t device_id, const cuda::DeviceProps& props, cudaStream_t stream,
              bool pdl) {
  using Kernel = typename Cfg::Kernel;
  using Arrays = GroupArrays<Cfg>;
  const int64_t groups = p.experts;

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device_id;
  hw_info.sm_count = props.sm_count;

  // the arguments with null arrays size CUTLASS's workspace (it depends on the SM count only)
  typename Kernel::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.hw_info = hw_info;
  args.problem_shape = {static_cast<int>(groups), nullptr, nullptr};
  const int64_t arrays_bytes = Arrays::carve(nullptr, nullptr, groups);
  const int64_t cutlass_bytes = static_cast<int64_t>(Kernel::get_workspace_size(args));
  tvm::ffi::Tensor ws = workspace(arrays_bytes + Arrays::align(cutlass_bytes) + 128, device_id, "the group arrays");
  char* base = static_cast<char*>(ws.data_ptr());
  base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + 127) / 128 * 128);
  Arrays g{};
  Arrays::carve(&g, base, groups);
  void* cutlass_ws = cutlass_bytes > 0 ? base + arrays_bytes : nullptr;

  {
    cuda::PdlScope scope(pdl);
    const unsigned blocks = static_cast<unsigned>(cdiv(groups, 128));
    cuda::launch(kOp, device_id, props, group_args_kernel<Cfg>, dim3(blocks), dim3(128), 0, stream, g, p);
  }

  args.problem_shape = {static_cast<int>(groups), g.shapes, nullptr};
  args.mainloop = {g.pa, g.sta, g.pb, g.stb, g.psfa, g.lsfa, g.psfb, g.lsfb};
  args.epilogue = {{}, nullptr, g.std_, g.pd, g.std_};
  if (Kernel::initialize_workspace(args, cutlass_ws, stream, nullptr) != cutlass::Status::kSuccess) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": CUTLASS could not initialize its workspace";
  }
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, cutlass_ws);

  auto* fn = &grouped_gemm_kernel<Kernel>;
  constexpr int kSmem = static_cast<int>(Kernel::SharedStorageSize);
  set_smem_attr<Kernel>(reinterpret_cast<const void*>(fn), kSmem, device_id);

  const dim3 grid = Kernel::get_grid_shape(params);
  const dim3 block = Kernel::get_block_shape();
  using ClusterShape = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(ClusterShape{});
  attrs[0].val.clusterDim.y = cute::size<1>(ClusterShape{});
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = pdl ? 2 : 1;
  cuda::check_cuda(cudaLaunchKernelEx(&cfg, fn, params), kOp, "grouped GEMM launch");
  cuda::check_cuda(cudaGetLastError(), kOp, "grouped GEMM launch");
}

template <class ElementD>
struct Configs {
  using C0 = GroupedFp8Gemm<ElementD, Shape<_128, _128, _128>, Shape<_1, _2, _1>, false>;
  using C1 = GroupedFp8Gemm<ElementD, Shape<_128, _32, _128>, Shape<_2, _1, _1>, true>;

  static void run(int64_t id, const GemmOperands& p, int32_t device_id, const cuda::DeviceProps& props,
                  cudaStream_t stream, bool pdl) {
    if (id == 1) return run_gemm<C1>(p, device_id, props, stream, pdl);
    return run_gemm<C0>(p, device_id, props, stream, pdl);
  }
};

constexpr int64_t kNumConfigs = 2;

// ---- host entries ---------------------------------------------------------------------------

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

inline void check_rows(const char* name, const TensorView& t, int64_t rows, int64_t cols) {
  check_ndim(kOp, name, t, 2);
  check_size(kOp, name, t, 0, rows, "rows");
  check_size(kOp, name, t, 1, cols, "columns");
  check_last_dim_contiguous(kOp, name, t);
  row_stride(kOp, name, t);
}

inline void check_ids(const TensorView& ids) {
  check_ndim(kOp, "topk_ids", ids, 2);
  check_last_dim_contiguous(kOp, "topk_ids", ids);
  row_stride(kOp, "topk_ids", ids);
  if (!is_dtype(ids, kDLInt, 32) && !is_dtype(ids, kDLInt, 64)) {
    TVM_FFI_THROW(ValueError) << kOp << ": topk_ids has dtype " << dtype_name(ids.dtype())
                              << ", expected int32 or int64";
  }
}

void route(TensorView offsets, TensorView inv, TensorView topk_ids, TensorView expert_map, bool enable_pdl) {
  check_ids(topk_ids);
  const int64_t m = topk_ids.size(0), topk = topk_ids.size(1), slots = m * topk;
  check_ndim(kOp, "offsets", offsets, 1);
  check_int32(kOp, "offsets", offsets);
  check_int32(kOp, "inv", inv);
  const int64_t experts = offsets.size(0) - 1;
  if (experts < 1 || experts > kMaxExperts) {
    TVM_FFI_THROW(ValueError) << kOp << ": offsets must hold E + 1 entries for 1 <= E <= " << kMaxExperts
                              << " local experts, got " << offsets.size(0);
  }
  check_vector(kOp, "offsets", offsets, experts + 1, "E + 1");
  check_vector(kOp, "inv", inv, slots, "M * topk");
  const bool has_map = expert_map.numel() > 0;
  if (has_map) {
    check_ndim(kOp, "expert_map", expert_map, 1);
    check_int32(kOp, "expert_map", expert_map);
    check_last_dim_contiguous(kOp, "expert_map", expert_map);
  }
  const int32_t device_id =
      has_map ? check_device(kOp, kDLCUDA, {{"offsets", &offsets}, {"inv", &inv}, {"topk_ids", &topk_ids},
                                            {"expert_map", &expert_map}})
              : check_device(kOp, kDLCUDA, {{"offsets", &offsets}, {"inv", &inv}, {"topk_ids", &topk_ids}});
  if (slots >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << kOp << ": " << m << " tokens x topk " << topk << " rows do not fit int32";
  }
  cuda::DeviceScope scope(kOp, device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  cudaStream_t stream = cuda::current_stream(device_id);
  cuda::PdlScope pdl(enable_pdl);
  const int32_t* map = has_map ? data_ptr<const int32_t>(expert_map) : nullptr;
  const int64_t n_map = has_map ? expert_map.size(0) : 0;
  const size_t smem = static_cast<size_t>(2 * experts * sizeof(int32_t));
  const int64_t id_stride = topk_ids.size(0) > 1 ? topk_ids.stride(0) : topk;
  if (is_dtype(topk_ids, kDLInt, 32)) {
    cuda::launch(kOp, device_id, props, route_kernel<int32_t>, dim3(1), dim3(kRouteThreads), smem, stream,
                 data_ptr<int32_t>(offsets), data_ptr<int32_t>(inv), data_ptr<const int32_t>(topk_ids), slots,
                 static_cast<int>(topk), id_stride, map, n_map, static_cast<int>(experts));
  } else {
    cuda::launch(kOp, device_id, props, route_kernel<int64_t>, dim3(1), dim3(kRouteThreads), smem, stream,
                 data_ptr<int32_t>(offsets), data_ptr<int32_t>(inv), data_ptr<const int64_t>(topk_ids), slots,
                 static_cast<int>(topk), id_stride, map, n_map, static_cast<int>(experts));
  }
}

void gather(TensorView a, TensorView sa, TensorView q, TensorView qs, TensorView inv, TensorView topk_weights,
            bool weighted, bool enable_pdl) {
  check_ndim(kOp, "q", q, 2);
  check_ndim(kOp, "topk_weights", topk_weights, 2);
  const int64_t m = q.size(0), k = q.size(1), topk = topk_weights.size(1), slots = m * topk;
  const int64_t kb = k / kBlock;
  if (k % kBlock != 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": K = " << k << " must be a multiple of 128";
  }
  check_fp8_bytes(kOp, "q", q);
  check_fp8_bytes(kOp, "a", a);
  check_float32(kOp, "qs", qs);
  check_float32(kOp, "sa", sa);
  check_float32(kOp, "topk_weights", topk_weights);
  check_int32(kOp, "inv", inv);
  check_rows("q", q, m, k);
  check_ndim(kOp, "qs", qs, 2);
  check_size(kOp, "qs", qs, 0, m, "M");
  check_size(kOp, "qs", qs, 1, kb, "K / 128");
  check_rows("topk_weights", topk_weights, m, topk);
  check_vector(kOp, "inv", inv, slots, "M * topk");
  check_ndim(kOp, "a", a, 2);
  check_rows("a", a, a.size(0), k);
  check_rows("sa", sa, a.size(0), kb);
  if (a.size(0) < slots) {
    TVM_FFI_THROW(ValueError) << kOp << ": a has " << a.size(0) << " rows, fewer than the M * topk = " << slots
                              << " slots";
  }
  const int32_t device_id =
      check_device(kOp, kDLCUDA, {{"a", &a}, {"sa", &sa}, {"q", &q}, {"qs", &qs}, {"inv", &inv},
                                  {"topk_weights", &topk_weights}});
  const int64_t ldq = m > 1 ? q.stride(0) : k, lda = a.size(0) > 1 ? a.stride(0) : k;
  if (!aligned16(data_ptr<const void>(q)) || !aligned16(data_ptr<const void>(a)) || ldq % 16 || lda % 16) {
    TVM_FFI_THROW(ValueError) << kOp << ": q and a need 16-byte aligned data and row strides";
  }
  if (slots == 0) return;
  cuda::DeviceScope scope(kOp, device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  cuda::PdlScope pdl(enable_pdl);
  cuda::launch(kOp, device_id, props, gather_kernel, dim3(static_cast<unsigned>(slots)), dim3(256), 0,
               cuda::current_stream(device_id), data_ptr<uint8_t>(a), data_ptr<float>(sa),
               data_ptr<const uint8_t>(q), data_ptr<const float>(qs), data_ptr<const int32_t>(inv),
               data_ptr<const float>(topk_weights), k, kb, lda, sa.size(0) > 1 ? sa.stride(0) : kb, ldq,
               qs.stride(0), qs.stride(1), topk_weights.size(0) > 1 ? topk_weights.stride(0) : topk,
               static_cast<int>(topk), weighted);
}

void scale(TensorView sa, TensorView inv, TensorView topk_weights, bool enable_pdl) {
  check_ndim(kOp, "topk_weights", topk_weights, 2);
  check_float32(kOp, "sa", sa);
  check_float32(kOp, "topk_weights", topk_weights);
  check_int32(kOp, "inv", inv);
  const int64_t m = topk_weights.size(0), topk = topk_weights.size(1), slots = m * topk;
  check_rows("topk_weights", topk_weights, m, topk);
  check_vector(kOp, "inv", inv, slots, "M * topk");
  check_ndim(kOp, "sa", sa, 2);
  check_rows("sa", sa, sa.size(0), sa.size(1));
  if (sa.size(0) < slots) {
    TVM_FFI_THROW(ValueError) << kOp << ": sa has " << sa.size(0) << " rows, fewer than the " << slots << " slots";
  }
  const int32_t device_id =
      check_device(kOp, kDLCUDA, {{"sa", &sa}, {"inv", &inv}, {"topk_weights", &topk_weights}});
  const int64_t kb = sa.size(1);
  if (slots == 0 || kb == 0) return;
  cuda::DeviceScope scope(kOp, device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  cuda::PdlScope pdl(enable_pdl);
  const int64_t total = slots * kb;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(cdiv(total, 256), int64_t(props.sm_count) * 8));
  cuda::launch(kOp, device_id, props, scale_kernel, dim3(blocks), dim3(256), 0, cuda::current_stream(device_id),
               data_ptr<float>(sa), data_ptr<const int32_t>(inv), data_ptr<const float>(topk_weights), slots, kb,
               sa.size(0) > 1 ? sa.stride(0) : kb, m > 1 ? topk_weights.stride(0) : topk, static_cast<int>(topk));
}

void gemm(TensorView d, TensorView a, TensorView sa, TensorView b, TensorView sb, TensorView offsets, int64_t n0,
          int64_t n, int64_t config_id, bool enable_pdl) {
  check_ndim(kOp, "a", a, 2);
  check_ndim(kOp, "b", b, 3);
  check_ndim(kOp, "sb", sb, 3);
  check_ndim(kOp, "offsets", offsets, 1);
  check_fp8_bytes(kOp, "a", a);
  check_fp8_bytes(kOp, "b", b);
  check_float32(kOp, "sa", sa);
  check_float32(kOp, "sb", sb);
  check_int32(kOp, "offsets", offsets);
  const int64_t rows = a.size(0), k = a.size(1), experts = b.size(0), nb_rows = b.size(1);
  if (k % kBlock != 0 || k == 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": K = " << k << " must be a positive multiple of 128";
  }
  if (experts < 1 || experts >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << kOp << ": b must hold at least one expert";
  }
  if (n0 < 0 || n0 % kBlock != 0 || n < 1 || n0 + n > nb_rows) {
    TVM_FFI_THROW(ValueError) << kOp << ": columns [" << n0 << ", " << n0 + n << ") are not a slice of b's "
                              << nb_rows << " rows starting at a multiple of 128";
  }
  if (config_id < 0 || config_id >= kNumConfigs) {
    TVM_FFI_THROW(ValueError) << kOp << ": config_id " << config_id << " is out of range [0, " << kNumConfigs << ")";
  }
  check_rows("a", a, rows, k);
  check_rows("sa", sa, rows, k / kBlock);
  check_size(kOp, "b", b, 2, k, "K, a.shape[1]");
  check_size(kOp, "sb", sb, 0, experts, "E");
  check_size(kOp, "sb", sb, 1, cdiv(nb_rows, kBlock), "ceil(b.shape[1] / 128)");
  check_size(kOp, "sb", sb, 2, k / kBlock, "K / 128");
  check_vector(kOp, "offsets", offsets, experts + 1, "E + 1");
  check_rows("d", d, rows, n);
  const bool b_dense = b.stride(2) == 1 && b.stride(1) == k && (experts == 1 || b.stride(0) == nb_rows * k);
  const int64_t nbs = cdiv(nb_rows, kBlock), kbs = k / kBlock;
  const bool sb_dense = (kbs == 1 || sb.stride(2) == 1) && (nbs == 1 || sb.stride(1) == kbs) &&
                        (experts == 1 || sb.stride(0) == nbs * kbs);
  if (!b_dense || !sb_dense) {
    TVM_FFI_THROW(ValueError) << kOp << ": b and sb must be dense (contiguous)";
  }
  const int32_t device_id = check_device(
      kOp, kDLCUDA, {{"d", &d}, {"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}, {"offsets", &offsets}});
  const bool bf16 = is_dtype(d, kDLBfloat, 16);
  if (!bf16 && !is_dtype(d, kDLFloat, 16)) {
    TVM_FFI_THROW(ValueError) << kOp << ": d has dtype " << dtype_name(d.dtype()) << ", expected bfloat16 or float16";
  }
  GemmOperands p{};
  p.a = data_ptr<const uint8_t>(a);
  p.sa = data_ptr<const float>(sa);
  p.b = data_ptr<const uint8_t>(b);
  p.sb = data_ptr<const float>(sb);
  p.d = data_ptr<void>(d);
  p.offsets = data_ptr<const int32_t>(offsets);
  p.lda = rows > 1 ? a.stride(0) : k;
  p.ld_sa = rows > 1 ? sa.stride(0) : k / kBlock;
  p.ldd = rows > 1 ? d.stride(0) : (n + 7) / 8 * 8;
  p.nb_rows = nb_rows;
  p.n0 = n0;
  p.n = n;
  p.k = k;
  p.experts = static_cast<int>(experts);
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.d) || p.lda % 16 != 0 || p.ldd % 8 != 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": the grouped GEMM (TMA) needs 16-byte aligned a, b, d and 16-byte row "
                              << "strides (a.stride(0) % 16 == 0, d.stride(0) % 8 == 0); got a.stride(0)=" << p.lda
                              << " d.stride(0)=" << p.ldd;
  }
  if (rows >= (int64_t(1) << 31) || n >= (int64_t(1) << 31) || k >= (int64_t(1) << 31) ||
      p.ld_sa >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << kOp << ": the grouped GEMM's sizes must fit int32";
  }
  if (rows == 0) return;
  cuda::DeviceScope scope(kOp, device_id);
  check_arch(device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  cudaStream_t stream = cuda::current_stream(device_id);
  if (bf16) {
    Configs<cutlass::bfloat16_t>::run(config_id, p, device_id, props, stream, enable_pdl);
  } else {
    Configs<cutlass::half_t>::run(config_id, p, device_id, props, stream, enable_pdl);
  }
}

void reduce(TensorView out, TensorView y, TensorView inv, int64_t c0, bool enable_pdl) {
  check_ndim(kOp, "out", out, 2);
  check_ndim(kOp, "y", y, 2);
  check_int32(kOp, "inv", inv);
  check_ndim(kOp, "inv", inv, 1);
  const int64_t m = out.size(0), width = y.size(1);
  if (m == 0) return;
  if (inv.size(0) % m != 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": inv has " << inv.size(0) << " slots, not a multiple of M = " << m;
  }
  const int64_t topk = inv.size(0) / m;
  check_vector(kOp, "inv", inv, m * topk, "M * topk");
  check_last_dim_contiguous(kOp, "out", out);
  row_stride(kOp, "out", out);
  check_rows("y", y, y.size(0), width);
  if (c0 < 0 || c0 + width > out.size(1) || y.size(0) < m * topk) {
    TVM_FFI_THROW(ValueError) << kOp << ": y [" << y.size(0) << ", " << width << "] at column " << c0
                              << " does not fit out [" << m << ", " << out.size(1) << "] with " << m * topk << " slots";
  }
  const int32_t device_id = check_device(kOp, kDLCUDA, {{"out", &out}, {"y", &y}, {"inv", &inv}});
  const bool bf16 = is_dtype(out, kDLBfloat, 16);
  if ((!bf16 && !is_dtype(out, kDLFloat, 16)) || !is_dtype(y, out.dtype().code, 16)) {
    TVM_FFI_THROW(ValueError) << kOp << ": out and y must both be bfloat16 or both float16";
  }
  const int64_t ldy = y.size(0) > 1 ? y.stride(0) : width;
  const int64_t ldo = m > 1 ? out.stride(0) : out.size(1);
  if (width % 8 != 0 || ldy % 8 != 0 || !aligned16(data_ptr<const void>(y))) {
    TVM_FFI_THROW(ValueError) << kOp << ": y needs 16-byte aligned rows (width and row stride multiples of 8)";
  }
  if (width == 0) return;
  const bool vec_out = aligned16(data_ptr<const void>(out)) && ldo % 8 == 0 && c0 % 8 == 0;
  cuda::DeviceScope scope(kOp, device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, device_id);
  cuda::PdlScope pdl(enable_pdl);
  cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>(cdiv(width, 256 * 8)));
  auto go = [&](auto* o, const auto* yy, auto kernel) {
    cuda::launch(kOp, device_id, props, kernel, grid, dim3(256), 0, stream, o, yy, data_ptr<const int32_t>(inv),
                 width, ldy, ldo, c0, static_cast<int>(topk));
  };
  if (bf16) {
    using T = __nv_bfloat16;
    if (vec_out) go(data_ptr<T>(out), data_ptr<const T>(y), reduce_kernel<T, true>);
    else go(data_ptr<T>(out), data_ptr<const T>(y), reduce_kernel<T, false>);
  } else {
    using T = __half;
    if (vec_out) go(data_ptr<T>(out), data_ptr<const T>(y), reduce_kernel<T, true>);
    else go(data_ptr<T>(out), data_ptr<const T>(y), reduce_kernel<T, false>);
  }
}

}  // namespace moe_grouped_cuda

void moe_grouped_route_cuda(TensorView offsets, TensorView inv, TensorView topk_ids, TensorView expert_map,
                            bool enable_pdl) {
  moe_grouped_cuda::route(offsets, inv, topk_ids, expert_map, enable_pdl);
}

void moe_grouped_gather_cuda(TensorView a, TensorView sa, TensorView q, TensorView qs, TensorView inv,
                             TensorView topk_weights, bool weighted, bool enable_pdl) {
  moe_grouped_cuda::gather(a, sa, q, qs, inv, topk_weights, weighted, enable_pdl);
}

void moe_grouped_scale_cuda(TensorView sa, TensorView inv, TensorView topk_weights, bool enable_pdl) {
  moe_grouped_cuda::scale(sa, inv, topk_weights, enable_pdl);
}

void moe_grouped_gemm_cuda(TensorView d, TensorView a, TensorView sa, TensorView b, TensorView sb,
                           TensorView offsets, int64_t n0, int64_t n, int64_t config_id, bool enable_pdl) {
  moe_grouped_cuda::gemm(d, a, sa, b, sb, offsets, n0, n, config_id, enable_pdl);
}

void moe_grouped_reduce_cuda(TensorView out, TensorView y, TensorView inv, int64_t c0, bool enable_pdl) {
  moe_grouped_cuda::reduce(out, y, inv, c0, enable_pdl);
}

int64_t moe_grouped_configs() { return moe_grouped_cuda::kNumConfigs; }

}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_route_cuda, opmux::moe_grouped_route_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_gather_cuda, opmux::moe_grouped_gather_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_scale_cuda, opmux::moe_grouped_scale_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_gemm_cuda, opmux::moe_grouped_gemm_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_reduce_cuda, opmux::moe_grouped_reduce_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_configs, opmux::moe_grouped_configs);

#ifdef OPMUX_MOE_GROUPED_DEFINED_NDEBUG
#undef NDEBUG
#undef OPMUX_MOE_GROUPED_DEFINED_NDEBUG
#endif
