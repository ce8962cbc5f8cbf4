// gemm.w8a8_block_fp8_matmul for CUDA: DeepSeek-V3 block-scaled fp8 GEMM on Hopper (sm_90a),
// built on CUTLASS's warp-specialised TMA + wgmma mainloop with blockwise fp32 scaling
// (sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp: per 128-K block the wgmma
// partial sums are promoted into the fp32 accumulator times a_scale[m,kb] * b_scale[n/128,kb]),
// its consumer loop replaced by opmux/gemm/overlapped_promotion.h's, which promotes each 128-K
// block under the next block's wgmma batch (0.99-1.05x CUTLASS's loop, median 1.025x, best
// config against best config on an H100: docs/benchmarks/gemm_cutlass_h100.md), on every kernel
// but the cluster-less 128x128 one (kernel 1), which measured slower with it.
//
//   out[m, n] = sum_kb a_scale[m, kb] * b_scale[n / 128, kb] * sum_{k in kb} a[m, k] * b[n, k]
//
// a [M, K] e4m3, b [N, K] e4m3 (K-major weights), a_scale [M, ceil(K/128)] f32 (M-major or
// K-major), b_scale [ceil(N/128), ceil(K/128)] f32, out [M, N] bf16 / fp16 / fp32.
//
// Exports (tvm-ffi):
//   w8a8_block_fp8_matmul_cuda(out, a, b, a_scale, b_scale, enable_pdl)       heuristic config
//   w8a8_block_fp8_matmul_cuda_cfg(out, a, b, a_scale, b_scale, config_id, enable_pdl)
//                                                        config_id < 0: the heuristic's choice
//   w8a8_block_fp8_matmul_cuda_configs() -> int64       number of configs
//   w8a8_block_fp8_matmul_cuda_default_config(M, N, K) -> int64   the heuristic's choice
//
// Kernels (every one instantiated for bf16, fp16 and fp32 output):
//   k   schedule     swap-AB  CTA tile (kernel M x N x K)  cluster  meant for
//   0   cooperative  no       128 x 128 x 128              1x2x1    large M (A multicast along N)
//   1   cooperative  no       128 x 128 x 128              1x1x1    large M, few N tiles
//   2   ping-pong    no        64 x 128 x 128              1x1x1    mid M (tuner only so far)
//   3   ping-pong    yes      128 x  16 x 128              1x1x1    M <= 16   (decode)
//   4   ping-pong    yes      128 x  32 x 128              1x1x1    M <= 32   (tuner only so far)
//   5   cooperative  yes      128 x  64 x 128              1x1x1    M <= 64, and few 128x128 tiles
//   6   cooperative  no       128 x 128 x 128              2x1x1    B multicast along M
// A config (the config_id of the entries and the tables) is a kernel with the persistent tile
// scheduler's CTA swizzle and raster order: `kConfigs` below.
// Swap-AB computes out^T = b * a^T: N fills the 128-row wgmma side, the tokens are the kernel's
// N (16 / 32 / 64 columns), the activation scales become per-column (granularity 1) scales
// and out^T is stored column-major, i.e. out row-major. All use CUTLASS's persistent tile
// scheduler (no workspace); stage counts are CUTLASS's auto carve-out of 227 KB shared memory.
//
// Layout requirements (TMA: 16-byte aligned bases and 16-byte multiple global strides; the
// sizes M, N, K themselves are free, tails are zero-filled by TMA and clipped on store):
//   a.data % 16 == 0, b.data % 16 == 0, out.data % 16 == 0
//   M > 1 -> a.stride(0) % 16 == 0;  N > 1 -> b.stride(0) % 16 == 0  (elements = bytes, fp8)
//   M > 1 -> out.stride(0) * sizeof(out) % 16 == 0  (bf16/fp16: % 8 elements, fp32: % 4)
//   a_scale.data % 4, b_scale.data % 4 (float alignment; always true for float tensors)
// a_scale is read by TMA in M-major form: when it is M-major already with a 16-byte aligned
// base and (ceil(K/128) == 1 or a_scale.stride(1) % 4 == 0) (DeepGEMM / SGLang's TMA-aligned
// layout) it is used in place; otherwise (vLLM's K-major rows, unaligned columns) one small
// kernel first copies it into an M-major workspace [ceil(K/128), round_up(M, 4)] taken from
// tvm-ffi's environment allocator (torch's caching allocator under torch).
// Arch: the CUTLASS kernels exist only in the sm_90a image; other archs (sm_80, sm_100a,
// compute_90 PTX) compile to empty bodies and the entry raises before launching unless the
// device is compute capability 9.0 and the loaded image is the sm_90a one.
//
// PDL: with enable_pdl the GEMM (and the scale copy) launch with programmatic stream
// serialization; CUTLASS's kernels wait (griddepcontrol.wait) before their first global read.
#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <set>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "opmux/cuda_utils.cuh"
#include "opmux/gemm/cta_grid.h"
#include "opmux/gemm/overlapped_promotion.h"
#include "opmux/gemm/w8a8_block_checks.h"

namespace opmux {
namespace gemm_cuda {

using namespace cute;

constexpr const char* kOp = "opmux.gemm.w8a8_block_fp8_matmul";

// ---- the CUTLASS instantiations --------------------------------------------------------------

template <class ElementD, class TileShape, class ClusterShape, bool kCooperative, bool kSwap,
          bool kOverlap = true>
struct BlockFp8Gemm {
  using ElementAB = cutlass::float_e4m3_t;
  // Scale granularity along the kernel's M and N: a_scale is per row (1), b_scale per 128 rows
  // of b; swap-AB exchanges the operands.
  static constexpr int kGranM = kSwap ? 128 : 1;
  static constexpr int kGranN = kSwap ? 1 : 128;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
      kGranM, kGranN, 128, kSwap ? cute::GMMA::Major::K : cute::GMMA::Major::MN,
      kSwap ? cute::GMMA::Major::MN : cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  // out is row-major [M, N]; out^T (swap-AB) is the same memory seen column-major [N, M].
  using LayoutD =
      cute::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  using KernelSchedule =
      cute::conditional_t<kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise>;
  using EpilogueSchedule =
      cute::conditional_t<kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                          cutlass::epilogue::TmaWarpSpecialized>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, EpilogueSchedule>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  // CUTLASS's loads, pipeline and shared memory with a consumer loop that promotes each k-tile's
  // partial sums under the next k-tile's wgmma batch (opmux/gemm/overlapped_promotion.h), or
  // CUTLASS's own loop (kOverlap = false).
  using CollectiveMainloop =
      cute::conditional_t<kOverlap, gemm::OverlappedPromotionMma<BuiltMainloop>, BuiltMainloop>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
};

// The kernel entry: the CUTLASS kernel exists only in the sm_90a image. Every other image
// (sm_80, sm_100a, compute_90 PTX, ...) gets an empty body; the host refuses to launch there.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
    block_fp8_gemm_kernel(const __grid_constant__ typename Kernel::Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
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

// a_scale (any strides) -> M-major workspace ws[kb * ld + m].
__global__ void __launch_bounds__(256)
    scale_to_m_major_kernel(float* __restrict__ ws, const float* __restrict__ s, int64_t m_total,
                            int64_t kb_total, int64_t s_m, int64_t s_k, int64_t ld) {
  cuda::pdl_enter();
  const int64_t kb = blockIdx.y;
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < m_total;
       m += int64_t(gridDim.x) * blockDim.x) {
    ws[kb * ld + m] = s[m * s_m + kb * s_k];
  }
  (void)kb_total;
}

// ---- host side --------------------------------------------------------------------------------

struct Problem {
  const void* a;
  const void* b;
  const float* sa;   // a_scale, M-major: sa[kb * sa_ld + m]
  const float* sb;   // b_scale, K-major: sb[nb * sb_ld + kb]
  void* out;
  int m, n, k;
  int64_t lda, ldb, ldo;  // elements, already normalised for size-1 dims (16-byte multiples)
  int sa_ld;              // % 4 == 0
  int sb_ld;
  int kb, nb;
  int32_t device_id;
  int sm_count;
  cudaStream_t stream;
  bool pdl;
  int swizzle;  // the persistent scheduler's CTA swizzle: 1, 2, 4 or 8
  int raster;   // 0: CUTLASS's heuristic (along the shorter side), 1: along M, 2: along N
};

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
    cuda::check_cuda(cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device_id),
                     kOp, "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    cuda::check_cuda(cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, device_id),
                     kOp, "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
    if (c.major == 9 && c.minor == 0) {
      cudaFuncAttributes attr;
      cuda::check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(sm90a_probe_kernel)),
                       kOp, "cudaFuncGetAttributes");
      c.image_ok = attr.sharedSizeBytes == 0 && attr.binaryVersion == 90;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (device_id >= 0 && device_id < 64) cache[device_id] = c;
  }
  if (c.major != 9 || c.minor != 0) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": the CUDA (CUTLASS) kernel needs sm_90a (Hopper); this GPU is sm_"
                                << c.major << c.minor;
  }
  if (!c.image_ok) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": the CUDA (CUTLASS) kernel needs sm_90a (Hopper) code, but this library "
                                << "was built without an sm_90a image (compile with arch sm_90a)";
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

template <class Cfg>
void run_gemm(const Problem& p) {
  using Kernel = typename Cfg::Kernel;
  using ElementAB = typename Cfg::ElementAB;
  using ElementD = typename Kernel::ElementD;
  constexpr bool kSwap = Cfg::kGranN == 1;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
  using LayoutSFA = typename Cfg::LayoutSFA;
  using LayoutSFB = typename Cfg::LayoutSFB;

  // The kernel's problem: (M, N) = (m, n), or (n, m) with swap-AB.
  const int km = kSwap ? p.n : p.m;
  const int kn = kSwap ? p.m : p.n;
  const void* pa = kSwap ? p.b : p.a;
  const void* pb = kSwap ? p.a : p.b;
  const int64_t lda = kSwap ? p.ldb : p.lda;
  const int64_t ldb = kSwap ? p.lda : p.ldb;

  // A and B are K-major (unit stride along K).
  StrideA stride_a = cute::make_stride(lda, cute::Int<1>{}, lda * km);
  StrideB stride_b = cute::make_stride(ldb, cute::Int<1>{}, ldb * kn);
  StrideD stride_d;
  if constexpr (kSwap) {
    stride_d = cute::make_stride(cute::Int<1>{}, p.ldo, p.ldo * p.m);
  } else {
    stride_d = cute::make_stride(p.ldo, cute::Int<1>{}, p.ldo * p.m);
  }
  StrideC stride_c = stride_d;

  // Scale layouts ((gran, blocks), (128, kb), L) -> element offsets.
  const float* psfa;
  const float* psfb;
  LayoutSFA layout_sfa;
  LayoutSFB layout_sfb;
  if constexpr (kSwap) {
    // SFA: b_scale per 128 rows of the kernel's M (= N), K-major. SFB: a_scale per column, M-major.
    psfa = p.sb;
    psfb = p.sa;
    layout_sfa = LayoutSFA(
        make_shape(make_shape(Int<128>{}, p.nb), make_shape(Int<128>{}, p.kb), 1),
        make_stride(make_stride(Int<0>{}, p.sb_ld), make_stride(Int<0>{}, Int<1>{}), p.sb_ld * p.nb));
    layout_sfb = LayoutSFB(
        make_shape(make_shape(Int<1>{}, p.m), make_shape(Int<128>{}, p.kb), 1),
        make_stride(make_stride(Int<0>{}, Int<1>{}), make_stride(Int<0>{}, p.sa_ld), p.sa_ld * p.kb));
  } else {
    psfa = p.sa;
    psfb = p.sb;
    layout_sfa = LayoutSFA(
        make_shape(make_shape(Int<1>{}, p.m), make_shape(Int<128>{}, p.kb), 1),
        make_stride(make_stride(Int<0>{}, Int<1>{}), make_stride(Int<0>{}, p.sa_ld), p.sa_ld * p.kb));
    layout_sfb = LayoutSFB(
        make_shape(make_shape(Int<128>{}, p.nb), make_shape(Int<128>{}, p.kb), 1),
        make_stride(make_stride(Int<0>{}, p.sb_ld), make_stride(Int<0>{}, Int<1>{}), p.sb_ld * p.nb));
  }

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = p.device_id;
  hw_info.sm_count = p.sm_count;

  typename Kernel::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {km, kn, p.k, 1};
  args.mainloop = {static_cast<const ElementAB*>(pa), stride_a, static_cast<const ElementAB*>(pb), stride_b,
                   psfa, layout_sfa, psfb, layout_sfb};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = stride_c;
  args.epilogue.ptr_D = static_cast<ElementD*>(p.out);
  args.epilogue.dD = stride_d;
  args.hw_info = hw_info;
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrderOptions::AlongM
                                : p.raster == 2 ? RasterOrderOptions::AlongN
                                                : RasterOrderOptions::Heuristic;

  if (Kernel::get_workspace_size(args) != 0) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": internal error: the CUTLASS kernel asks for a workspace";
  }
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);

  auto* fn = &block_fp8_gemm_kernel<Kernel>;
  constexpr int kSmem = static_cast<int>(Kernel::SharedStorageSize);
  set_smem_attr<Kernel>(reinterpret_cast<const void*>(fn), kSmem, p.device_id);

  const dim3 grid = Kernel::get_grid_shape(params);
  const dim3 block = Kernel::get_block_shape();
  using ClusterShape = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = p.stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cute::size<0>(ClusterShape{});
  attrs[0].val.clusterDim.y = cute::size<1>(ClusterShape{});
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = p.pdl ? 2 : 1;
  cuda::check_cuda(cudaLaunchKernelEx(&cfg, fn, params), kOp, "kernel launch");
  cuda::check_cuda(cudaGetLastError(), kOp, "kernel launch");
}

template <class ElementD>
struct Kernels {
  using K0 = BlockFp8Gemm<ElementD, Shape<_128, _128, _128>, Shape<_1, _2, _1>, true, false>;
  // CUTLASS's own consumer loop: without a cluster's multicast, the stage the overlapped loop
  // holds longer was worth more (session 32's H100 A/B: id 8 0.93-1.02x with the overlapped loop,
  // slower on 14 of 24 cases; every clustered kernel faster on 20-21 of 24)
  using K1 = BlockFp8Gemm<ElementD, Shape<_128, _128, _128>, Shape<_1, _1, _1>, true, false, false>;
  using K2 = BlockFp8Gemm<ElementD, Shape<_64, _128, _128>, Shape<_1, _1, _1>, false, false>;
  using K3 = BlockFp8Gemm<ElementD, Shape<_128, _16, _128>, Shape<_1, _1, _1>, false, true>;
  using K4 = BlockFp8Gemm<ElementD, Shape<_128, _32, _128>, Shape<_1, _1, _1>, false, true>;
  using K5 = BlockFp8Gemm<ElementD, Shape<_128, _64, _128>, Shape<_1, _1, _1>, true, true>;
  using K6 = BlockFp8Gemm<ElementD, Shape<_128, _128, _128>, Shape<_2, _1, _1>, true, false>;

  static void run(int kernel, const Problem& p) {
    switch (kernel) {
      case 0: return run_gemm<K0>(p);
      case 1: return run_gemm<K1>(p);
      case 2: return run_gemm<K2>(p);
      case 3: return run_gemm<K3>(p);
      case 4: return run_gemm<K4>(p);
      case 5: return run_gemm<K5>(p);
      case 6: return run_gemm<K6>(p);
      default: TVM_FFI_THROW(RuntimeError) << kOp << ": internal error: no kernel " << kernel;
    }
  }
};

// A config: one of the kernels above with the persistent scheduler's CTA order (swizzle, raster;
// the raster is along the kernel's own M, the user's N on the swap-AB kernels, which keep CUTLASS's
// defaults). Ids 0-5 keep their meaning (tables name them); 6-8 are the three that won cases in an
// H100 sweep of 16 (kernels 0, 1 and 6 x swizzle 1-8 x raster, M 512-8192 on six model shapes).
// At launch a config is fitted to the M it runs on (opmux/gemm/cta_grid.h).
struct LaunchConfig {
  int kernel;
  int swizzle;
  int raster;
};
constexpr LaunchConfig kConfigs[] = {
    {0, 1, 0}, {1, 1, 0}, {2, 1, 0}, {3, 1, 0}, {4, 1, 0}, {5, 1, 0},
    {6, 2, 0},  // 6: 2x1 cluster (B multicast along M), swizzle 2
    {0, 8, 1},  // 7: 1x2 cluster, swizzle 8 along M: M >= 4096 on wide N
    {1, 4, 0},  // 8: no cluster, swizzle 4: M around 512
};
constexpr int64_t kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

// Kernel `kernel`'s grid as cta_grid.h sees it: its cluster shape, read from the kernel type.
template <class Gemm>
constexpr gemm::CtaGrid grid_of(int kernel, int swizzle) {
  using ClusterShape = typename Gemm::Kernel::DispatchPolicy::ClusterShape;
  return {kernel, swizzle, static_cast<int>(cute::size<0>(ClusterShape{})),
          static_cast<int>(cute::size<1>(ClusterShape{}))};
}

template <class ElementD>
void run_config(int64_t id, Problem p) {
  using K = Kernels<ElementD>;
  const LaunchConfig c = kConfigs[id];
  int kernel = c.kernel;
  p.swizzle = c.swizzle;
  p.raster = c.raster;
  if (kernel == 0 || kernel == 1 || kernel == 6) {
    // the 128x128 non-swapped kernels (the others keep CUTLASS's defaults), fitted to this
    // M x N: a swizzle or cluster that would pad the tile grid is reduced (opmux/gemm/cta_grid.h)
    const gemm::CtaGrid g0 = grid_of<typename K::K0>(0, 1), g1 = grid_of<typename K::K1>(1, 1);
    const gemm::CtaGrid g = kernel == 0 ? g0 : kernel == 1 ? g1 : grid_of<typename K::K6>(6, 1);
    const gemm::CtaGrid fitted = gemm::fit_cta_grid({g.kernel, c.swizzle, g.cm, g.cn}, p.m, p.n, g0, g1);
    kernel = fitted.kernel;
    p.swizzle = fitted.swizzle;
  }
  Kernels<ElementD>::run(kernel, p);
}

// The default choice on (M, N, K) where no tuned table speaks. Decode sizes from an H200 sweep
// (benchmarks/gemm_cuda_selftest.py): swap-AB 128x16 for M <= 16 (55.7 us for N=24576 K=7168,
// 3.2 TB/s of weights), swap-AB 128x64 up to M = 64 and, up to M = 256, wherever 128x128 tiles
// would not fill the GPU (M=128 N=7168: 9.4 us vs 11.7). From M = 257, H100 sweeps with the
// replays interleaved (benchmarks/gemm_cuda_configs.py; six model shapes,
// docs/benchmarks/gemm_cutlass_h100.md): with the overlapped consumer loop (session 32) id 6 (2x1
// cluster, swizzle 2; the fit turns its cluster along N on odd tile rows) at M = 512 ran at or
// above id 8 on 4 of 6 shapes and within 1.1% on the other two, and at or above CUTLASS's own loop's
// best id 8 on 5 of 6; id 7 (swizzle 8 along M) at M >= 4096 on N >= 10240 in whole groups of 16
// tiles, 1.00-1.13x id 0 on those 6 cases in session 31 (on N = 7168, 56 tiles, its padding to 64
// costs up to 0.85x); id 0 elsewhere.
inline int64_t default_config(int64_t m, int64_t n, int64_t k, int sm_count) {
  (void)k;
  if (m <= 16) return 3;
  if (m <= 64) return 5;
  const int64_t nb = ::opmux::gemm::cdiv(n, 128);
  const int64_t tiles128 = ::opmux::gemm::cdiv(m, 128) * nb;
  if (m <= 256) return tiles128 < sm_count ? 5 : 0;
  if (m <= 1024) return 6;
  if (m >= 4096 && n >= 10240 && nb % 16 == 0) return 7;
  return 0;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void run(TensorView out, TensorView a, TensorView b, TensorView a_scale, TensorView b_scale,
         int64_t config_id, bool enable_pdl) {
  const gemm::W8A8Args r = gemm::check_w8a8_block_args(kOp, kDLCUDA, out, a, b, a_scale, b_scale);
  if (config_id >= kNumConfigs) {
    TVM_FFI_THROW(ValueError) << kOp << ": config_id " << config_id << " is out of range; there are "
                              << kNumConfigs << " configs (0.." << kNumConfigs - 1
                              << ", or -1 for the default heuristic)";
  }
  if (r.m == 0 || r.n == 0) return;
  cuda::DeviceScope scope(kOp, r.device_id);
  check_arch(r.device_id);

  Problem p{};
  p.a = data_ptr<const void>(a);
  p.b = data_ptr<const void>(b);
  p.out = data_ptr<void>(out);
  p.m = static_cast<int>(r.m);
  p.n = static_cast<int>(r.n);
  p.k = static_cast<int>(r.k);
  p.kb = static_cast<int>(r.kb);
  p.nb = static_cast<int>(r.nb);
  // TMA: 16-byte aligned bases and 16-byte multiple strides. A row stride of a size-1 dim is
  // never used: give TMA an aligned placeholder.
  const int64_t out_align = 16 / r.out_esize;
  p.lda = r.m > 1 ? r.lda : (r.k + 15) / 16 * 16;
  p.ldb = r.n > 1 ? r.ldb : (r.k + 15) / 16 * 16;
  p.ldo = r.m > 1 ? r.ldo : (r.n + out_align - 1) / out_align * out_align;
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.out) || p.lda % 16 != 0 ||
      p.ldb % 16 != 0 || p.ldo % out_align != 0) {
    TVM_FFI_THROW(ValueError)
        << kOp << ": the CUDA (CUTLASS/TMA) kernel needs 16-byte aligned a, b, out data pointers and "
        << "16-byte multiple row strides (a.stride(0) % 16 == 0 if M > 1, b.stride(0) % 16 == 0 if "
        << "N > 1, out.stride(0) % " << out_align << " == 0 if M > 1 for this out dtype); got "
        << "a.stride(0)=" << r.lda << " b.stride(0)=" << r.ldb << " out.stride(0)=" << r.ldo
        << " (M=" << r.m << ", N=" << r.n << ", K=" << r.k << "), data pointers "
        << (aligned16(p.a) ? "" : "a ") << (aligned16(p.b) ? "" : "b ")
        << (aligned16(p.out) ? "" : "out ") << "misaligned";
  }
  const cuda::DeviceProps props = cuda::device_props(kOp, r.device_id);
  p.sm_count = props.sm_count;
  p.device_id = r.device_id;
  p.stream = cuda::current_stream(r.device_id);
  p.pdl = enable_pdl;
  p.sb = data_ptr<const float>(b_scale);
  p.sb_ld = static_cast<int>(r.nb > 1 ? r.sb_n : r.kb);

  // a_scale in M-major form with a 16-byte multiple column stride, in place or copied.
  const float* sa = data_ptr<const float>(a_scale);
  const bool m_major = r.m == 1 || r.sa_m == 1;
  const int64_t col = r.kb > 1 ? r.sa_k : (r.m + 3) / 4 * 4;
  tvm::ffi::Optional<tvm::ffi::Tensor> ws;  // lives until the GEMM is enqueued (stream-ordered free)
  if (m_major && aligned16(sa) && col % 4 == 0 && col < (int64_t(1) << 31) &&
      (r.m == 1 || col >= r.m)) {
    p.sa = sa;
    p.sa_ld = static_cast<int>(col);
  } else {
    const int64_t ld = (r.m + 3) / 4 * 4;
    if (ld * r.kb >= (int64_t(1) << 31)) {
      TVM_FFI_THROW(ValueError) << kOp << ": a_scale is too large for the CUDA kernel's scale copy";
    }
    DLDevice dev{kDLCUDA, r.device_id};
    try {
      ws = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::Shape({r.kb * ld}),
                                         DLDataType{kDLFloat, 32, 1}, dev);
    } catch (const std::exception& e) {
      TVM_FFI_THROW(RuntimeError) << kOp << ": a_scale is not in M-major TMA-aligned layout "
                                  << "(stride(0) == 1, stride(1) % 4 == 0, 16-byte aligned) and no "
                                  << "workspace could be allocated for the copy: " << e.what();
    }
    float* w = static_cast<float*>(ws.value().data_ptr());
    const unsigned gx = static_cast<unsigned>(std::min<int64_t>((r.m + 255) / 256, 1024));
    cuda::PdlScope pdl(enable_pdl);
    cuda::launch(kOp, r.device_id, props, scale_to_m_major_kernel, dim3(gx, static_cast<unsigned>(r.kb)),
                 dim3(256), 0, p.stream, w, sa, r.m, r.kb, r.sa_m, r.sa_k, ld);
    p.sa = w;
    p.sa_ld = static_cast<int>(ld);
  }

  const int id = static_cast<int>(config_id < 0 ? default_config(r.m, r.n, r.k, props.sm_count) : config_id);
  switch (r.out_type) {
    case gemm::OutType::kBFloat16: run_config<cutlass::bfloat16_t>(id, p); break;
    case gemm::OutType::kFloat16: run_config<cutlass::half_t>(id, p); break;
    default: run_config<float>(id, p); break;
  }
}

}  // namespace gemm_cuda

void w8a8_block_fp8_matmul_cuda(TensorView out, TensorView a, TensorView b, TensorView a_scale,
                                TensorView b_scale, bool enable_pdl) {
  gemm_cuda::run(out, a, b, a_scale, b_scale, -1, enable_pdl);
}

void w8a8_block_fp8_matmul_cuda_cfg(TensorView out, TensorView a, TensorView b, TensorView a_scale,
                                    TensorView b_scale, int64_t config_id, bool enable_pdl) {
  gemm_cuda::run(out, a, b, a_scale, b_scale, config_id, enable_pdl);
}

int64_t w8a8_block_fp8_matmul_cuda_configs() { return gemm_cuda::kNumConfigs; }

int64_t w8a8_block_fp8_matmul_cuda_default_config(int64_t m, int64_t n, int64_t k) {
  int device = 0;
  cuda::check_cuda(cudaGetDevice(&device), gemm_cuda::kOp, "cudaGetDevice");
  return gemm_cuda::default_config(m, n, k, cuda::device_props(gemm_cuda::kOp, device).sm_count);
}

}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_cuda, opmux::w8a8_block_fp8_matmul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_cuda_cfg, opmux::w8a8_block_fp8_matmul_cuda_cfg);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_cuda_configs, opmux::w8a8_block_fp8_matmul_cuda_configs);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_cuda_default_config,
                              opmux::w8a8_block_fp8_matmul_cuda_default_config);
