// gemm.w8a8_block_fp8_matmul's skinny-M CUDA backend `skinny` (ops/gemm/skinny_cuda.py drives
// it; the op's rules: ops/gemm/op.py). Its own JIT module (gemm_skinny_cuda): a small unit that
// builds in seconds, apart from the CUTLASS unit gemm_cuda; the AOT library includes it too.
//
// At decode sizes (M <= 16 rows) the GEMM is one read of the weights b [N, K] e4m3: the
// CUTLASS and Triton kernels tile M to 64-128 rows and fill the GPU with few, wide tiles, and
// on the H200 read weights of 15-120 MB at 0.3-0.7 of the copy bandwidth. Here each warp
// streams its own columns of b with 16-byte loads straight into the operand registers of
// mma.sync m16n8k32 (e4m3 x e4m3 -> fp32, sm_89+): the 16 (padded) rows of a are the MMA's M, 8
// weight rows its N, and a 128-wide K block is four MMAs. Within a block the K order of the
// operands is permuted (the same permutation for a and b: thread t of a quad holds bytes
// [32 t, 32 t + 32) of the block, step s its words 2s and 2s+1), so every lane loads 32
// contiguous bytes of a weight row per K block: no shared memory, no shuffles.
//
//   grid (ceil(N / (8 * NT * WN)), 1), 256 threads = 8 warps = WN (along N) x WK (along K).
//   Warp (wn, wk) takes the NT 8-column tiles from n0 = blockIdx.x * 8 * NT * WN + 8 * NT * wn,
//   and the K blocks [wk * c, min(Kb, (wk + 1) * c)), c = ceil(Kb / WK). Per K block: the four
//   MMAs into a zeroed fp32 tile, then acc += tile * a_scale[m, kb] * b_scale[n / 128, kb] (the
//   definition's per-block promotion). The WK partial tiles are summed through shared memory in
//   wk order (deterministic) and warp wk = 0 writes out [M, N] in its dtype.
//
// Tails: rows m >= M, columns n >= N and K past K (a multiple of 16) load zeros and are never
// stored; every load address is inside its tensor. The host checks (the contract's, as the
// CUTLASS unit's: gemm/w8a8_block_checks.h) guard direct callers; this unit adds its own limits
// (M <= 16, K a multiple of 16, 16-byte aligned a and b rows, sm_89+ code) as ValueError /
// RuntimeError naming them.
//
// Exports (tvm-ffi; a trailing enable_pdl as every entry):
//   w8a8_block_fp8_matmul_skinny_cuda(out, a, b, a_scale, b_scale, tiles, k_warps, enable_pdl)
//     tiles: NT (1, 2 or 4 8-column tiles per warp), k_warps: WK (1, 2, 4 or 8); 0 for either
//     lets the unit choose (default_launch: one tile a warp, and as many warps along K as keep
//     four K blocks each and at most 32 warps per SM in all).
//   w8a8_block_fp8_matmul_skinny_cuda_default(m, n, k) -> NT * 16 + WK, the unit's choice on
//     the current device.
//   w8a8_block_fp8_matmul_skinny_cuda_ready(device_id) -> whether this library's code for that
//     GPU holds the kernel (an AOT library without sm_89+ code on an sm_89 GPU: no; the backend
//     then builds the unit for the GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>

#include "opmux/cuda_utils.cuh"
#include "opmux/gemm/w8a8_block_checks.h"

namespace opmux {
namespace gemm_skinny_cuda {

constexpr const char* kOp = "opmux.gemm.w8a8_block_fp8_matmul";
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlock = 128;       // the recipe's K block (and b_scale's N block)
constexpr int kMaxRows = 16;      // the MMA's M: the most rows of a this backend takes

__host__ __device__ __forceinline__ int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }

struct Params {
  const uint8_t* a;
  const uint8_t* b;
  const float* sa;
  const float* sb;
  void* out;
  int64_t m, n, k, kb;
  int64_t lda, ldb, ldo;  // elements (bytes for a and b)
  int64_t sa_m, sa_k;     // a_scale strides (0 for a size-1 dim)
  int64_t sb_n;           // b_scale's row stride
  int wk;                 // warps along K
};

// 16 bytes of a weight row, streamed: not kept in L1 (a's rows are, every warp rereads them).
__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_cached(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d, (void)a, (void)b0, (void)b1;  // no e4m3 MMA before sm_89: the host never launches there
#endif
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <typename T>
__device__ __forceinline__ void store(void* out, int64_t i, float v) {
  static_cast<T*>(out)[i] = cuda::from_float<T>(v);
}

// NT: 8-column tiles per warp. HI: whether rows 8-15 exist (M > 8): below, their operand
// registers stay zero and nothing of them is loaded.
template <typename T, int NT, bool HI>
__global__ void __launch_bounds__(kThreads, 2) skinny_kernel(const Params p) {
  // K blocks whose loads a warp issues together: 4 KB of weights in flight per warp (NT x
  // kUnroll 1 KB tiles) up to 8 rows, 2-4 KB above (a's second half of the rows takes the registers;
  // under two blocks an SM ptxas still spills 16-32 bytes in the NT = 4 and the 16-row NT = 2
  // instantiations)
  constexpr int kUnroll = HI ? (NT >= 4 ? 1 : 2) : 4 / NT;
  __shared__ float partial[kWarps][NT][4][32];
  cuda::pdl_enter();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;  // the MMA fragments' group (row / column) and quad index
  const int wn_count = kWarps / p.wk;
  const int wn = warp % wn_count, wk = warp / wn_count;
  const int64_t n0 = (int64_t(blockIdx.x) * wn_count + wn) * 8 * NT;
  const int64_t chunk = (p.kb + p.wk - 1) / p.wk;
  const int64_t kb_begin = imin(p.kb, wk * chunk);
  const int64_t kb_end = imin(p.kb, kb_begin + chunk);

  // This lane's weight rows (row n0 + 8 j + g of tile j; a row past N is never loaded nor
  // stored) and a rows (g, g + 8; absent rows load nothing). A warp's 8 * NT columns lie in one
  // 128-row block of b_scale (8 * NT divides 128 and n0).
  const uint8_t* brow = p.b + (n0 + g < p.n ? n0 + g : 0) * p.ldb;
  const int64_t brow_step = 8 * p.ldb;
  unsigned bvalid = 0;
#pragma unroll
  for (int j = 0; j < NT; ++j) bvalid |= (n0 + 8 * j + g < p.n ? 1u : 0u) << j;
  const bool lo_valid = g < p.m, hi_valid = HI && g + 8 < p.m;
  const uint8_t* arow_lo = p.a + (lo_valid ? g : 0) * p.lda;
  const uint8_t* arow_hi = p.a + (hi_valid ? g + 8 : 0) * p.lda;
  const float* sbrow = p.sb + (imin(n0, p.n - 1) / kBlock) * p.sb_n;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t kb = kb_begin; kb < kb_end; kb += kUnroll) {
    uint4 bq[kUnroll][NT][2], alo[kUnroll][2], ahi[kUnroll][2];
    float sa_lo[kUnroll], sa_hi[kUnroll], sbv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t blk = kb + u;
      const bool live = blk < kb_end;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t off = blk * kBlock + t * 32 + h * 16;  // this lane's 16 bytes of the block
        const bool in_k = live && off < p.k;                 // K is a multiple of 16
#pragma unroll
        for (int j = 0; j < NT; ++j)
          bq[u][j][h] = in_k && (bvalid >> j & 1u) ? load_stream(brow + j * brow_step + off) : zero;
        alo[u][h] = in_k && lo_valid ? load_cached(arow_lo + off) : zero;
        ahi[u][h] = in_k && hi_valid ? load_cached(arow_hi + off) : zero;
      }
      const int64_t sblk = live ? blk : kb_begin;
      sa_lo[u] = lo_valid ? __ldg(p.sa + g * p.sa_m + sblk * p.sa_k) : 0.f;
      sa_hi[u] = hi_valid ? __ldg(p.sa + (g + 8) * p.sa_m + sblk * p.sa_k) : 0.f;
      sbv[u] = __ldg(sbrow + sblk);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kb + u >= kb_end) break;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float tile[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          // step s: words 2s, 2s + 1 of the lane's 32 bytes (h = s / 2 selects the 16-byte half)
          const int h = s / 2, w0 = (2 * s) % 4, w1 = (2 * s + 1) % 4;
          const uint32_t af[4] = {word(alo[u][h], w0), word(ahi[u][h], w0), word(alo[u][h], w1),
                                  word(ahi[u][h], w1)};
          mma_e4m3(tile, af, word(bq[u][j][h], w0), word(bq[u][j][h], w1));
        }
        const float lo = sa_lo[u] * sbv[u], hi = sa_hi[u] * sbv[u];
        acc[j][0] += tile[0] * lo;
        acc[j][1] += tile[1] * lo;
        acc[j][2] += tile[2] * hi;
        acc[j][3] += tile[3] * hi;
      }
    }
  }

  if (p.wk > 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) partial[warp][j][r][lane] = acc[j][r];
    __syncthreads();
    if (wk != 0) return;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float s = partial[wn][j][r][lane];
        for (int q = 1; q < p.wk; ++q) s += partial[q * wn_count + wn][j][r][lane];
        acc[j][r] = s;
      }
  }
  // c0, c1: row g, columns 2t, 2t + 1 of the tile; c2, c3: row g + 8
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t row = g + (r >= 2 ? 8 : 0), col = n0 + 8 * j + 2 * t + (r & 1);
      if (row < p.m && col < p.n) store<T>(p.out, row * p.ldo + col, acc[j][r]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------

//: the launch choices the unit is compiled for (ops/gemm/_skinny_launch.py's TILES / K_WARPS)
inline bool valid_tiles(int64_t v) { return v == 1 || v == 2 || v == 4; }
inline bool valid_k_warps(int64_t v) { return v == 1 || v == 2 || v == 4 || v == 8; }

// The unit's own choice (an H100's tuner at M = 1: one tile a warp on 21 of 22 shapes,
// docs/benchmarks/gemm_skinny_h100_tuning.json): one 8-column tile a warp, and
// the most warps along K (up to 8) that keep four K blocks each and at most 32 warps per SM in
// all (more only queue behind the first waves).
inline std::pair<int, int> default_launch(int64_t n, int64_t k, int sm_count) {
  const int64_t kb = gemm::cdiv(k, kBlock);
  const int64_t column_warps = gemm::cdiv(n, 8);
  const int64_t target = 32 * int64_t(sm_count);
  int wk = 8;
  while (wk > 1 && (kb < 4 * wk || column_warps * wk > target)) wk /= 2;
  return {1, wk};
}

template <typename T, int NT>
void launch_tiles(const Params& p, bool hi, int32_t device_id, const cuda::DeviceProps& props, cudaStream_t stream) {
  const int64_t cols = int64_t(8) * NT * (kWarps / p.wk);
  const int64_t blocks = gemm::cdiv(p.n, cols);
  if (blocks > (int64_t(1) << 31) - 1) {
    TVM_FFI_THROW(ValueError) << kOp << ": N=" << p.n << " is too large for the skinny kernel's grid";
  }
  const dim3 grid(static_cast<unsigned>(blocks));
  if (hi) {
    cuda::launch(kOp, device_id, props, skinny_kernel<T, NT, true>, grid, dim3(kThreads), 0, stream, p);
  } else {
    cuda::launch(kOp, device_id, props, skinny_kernel<T, NT, false>, grid, dim3(kThreads), 0, stream, p);
  }
}

template <typename T>
void launch_typed(const Params& p, int nt, bool hi, int32_t device_id, const cuda::DeviceProps& props,
                  cudaStream_t stream) {
  switch (nt) {
    case 1: return launch_tiles<T, 1>(p, hi, device_id, props, stream);
    case 2: return launch_tiles<T, 2>(p, hi, device_id, props, stream);
    default: return launch_tiles<T, 4>(p, hi, device_id, props, stream);
  }
}

// Whether the image the driver picked for this device holds the e4m3 MMA (PTX of sm_89 or newer;
// a cubin records its virtual arch too): an sm_80 build run on a newer GPU would run the kernel's
// empty body. Cached per device.
inline bool image_has_mma(int32_t device_id) {
  static std::mutex mu;
  static int cached[64];  // 0 unknown, 1 yes, -1 no
  {
    std::lock_guard<std::mutex> lock(mu);
    if (device_id >= 0 && device_id < 64 && cached[device_id] != 0) return cached[device_id] > 0;
  }
  int major = 0, minor = 0;
  cuda::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id), kOp,
                   "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  cuda::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id), kOp,
                   "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
  cudaFuncAttributes attr;
  cuda::check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(skinny_kernel<__nv_bfloat16, 1, false>)),
                   kOp, "cudaFuncGetAttributes");
  const bool ok = major * 10 + minor >= 89 && attr.ptxVersion >= 89;
  std::lock_guard<std::mutex> lock(mu);
  if (device_id >= 0 && device_id < 64) cached[device_id] = ok ? 1 : -1;
  return ok;
}

inline void check_image(int32_t device_id) {
  if (!image_has_mma(device_id)) {
    TVM_FFI_THROW(RuntimeError) << kOp << ": the skinny kernel needs the fp8 (e4m3) MMA of sm_89 or newer, in "
                                << "the library's code for this GPU; this GPU or this build has none "
                                << "(compile for its arch, e.g. sm_90a)";
  }
}

void run(TensorView out, TensorView a, TensorView b, TensorView a_scale, TensorView b_scale, int64_t tiles,
         int64_t k_warps, bool enable_pdl) {
  const gemm::W8A8Args r = gemm::check_w8a8_block_args(kOp, kDLCUDA, out, a, b, a_scale, b_scale);
  if (!(tiles == 0 || valid_tiles(tiles)) || !(k_warps == 0 || valid_k_warps(k_warps))) {
    TVM_FFI_THROW(ValueError) << kOp << ": the skinny kernel takes tiles in {1, 2, 4} and k_warps in "
                              << "{1, 2, 4, 8} (0: the unit's choice); got tiles=" << tiles
                              << ", k_warps=" << k_warps;
  }
  if (r.m > kMaxRows) {
    TVM_FFI_THROW(ValueError) << kOp << ": the skinny kernel takes at most " << kMaxRows << " rows of a; got M="
                              << r.m;
  }
  if (r.k % 16 != 0) {
    TVM_FFI_THROW(ValueError) << kOp << ": the skinny kernel reads 16-byte chunks: K must be a multiple of 16, got "
                              << r.k;
  }
  const void* pa = data_ptr<const void>(a);
  const void* pb = data_ptr<const void>(b);
  if (!cuda::aligned(pa, 16) || !cuda::aligned(pb, 16) || (r.m > 1 && r.lda % 16 != 0) ||
      (r.n > 1 && r.ldb % 16 != 0)) {
    TVM_FFI_THROW(ValueError) << kOp << ": the skinny kernel needs 16-byte aligned a and b and row strides of "
                              << "16-byte multiples; got a.stride(0)=" << r.lda << ", b.stride(0)=" << r.ldb;
  }
  if (r.m == 0 || r.n == 0) return;
  cuda::DeviceScope scope(kOp, r.device_id);
  check_image(r.device_id);
  const cuda::DeviceProps props = cuda::device_props(kOp, r.device_id);
  auto choice = default_launch(r.n, r.k, props.sm_count);
  const int nt = tiles ? static_cast<int>(tiles) : choice.first;
  const int wk = k_warps ? static_cast<int>(k_warps) : choice.second;

  Params p{};
  p.a = static_cast<const uint8_t*>(pa);
  p.b = static_cast<const uint8_t*>(pb);
  p.sa = data_ptr<const float>(a_scale);
  p.sb = data_ptr<const float>(b_scale);
  p.out = data_ptr<void>(out);
  p.m = r.m;
  p.n = r.n;
  p.k = r.k;
  p.kb = r.kb;
  p.lda = r.lda;
  p.ldb = r.ldb;
  p.ldo = r.ldo;
  p.sa_m = r.sa_m;
  p.sa_k = r.sa_k;
  p.sb_n = r.sb_n;
  p.wk = wk;
  const bool hi = r.m > 8;
  const cudaStream_t stream = cuda::current_stream(r.device_id);
  cuda::PdlScope pdl(enable_pdl);
  switch (r.out_type) {
    case gemm::OutType::kBFloat16: launch_typed<__nv_bfloat16>(p, nt, hi, r.device_id, props, stream); break;
    case gemm::OutType::kFloat16: launch_typed<__half>(p, nt, hi, r.device_id, props, stream); break;
    default: launch_typed<float>(p, nt, hi, r.device_id, props, stream); break;
  }
}

}  // namespace gemm_skinny_cuda

void w8a8_block_fp8_matmul_skinny_cuda(TensorView out, TensorView a, TensorView b, TensorView a_scale,
                                       TensorView b_scale, int64_t tiles, int64_t k_warps, bool enable_pdl) {
  gemm_skinny_cuda::run(out, a, b, a_scale, b_scale, tiles, k_warps, enable_pdl);
}

bool w8a8_block_fp8_matmul_skinny_cuda_ready(int64_t device_id) {
  cuda::DeviceScope scope(gemm_skinny_cuda::kOp, static_cast<int32_t>(device_id));
  return gemm_skinny_cuda::image_has_mma(static_cast<int32_t>(device_id));
}

int64_t w8a8_block_fp8_matmul_skinny_cuda_default(int64_t m, int64_t n, int64_t k) {
  (void)m;
  int device = 0;
  cuda::check_cuda(cudaGetDevice(&device), gemm_skinny_cuda::kOp, "cudaGetDevice");
  const auto c = gemm_skinny_cuda::default_launch(n, k, cuda::device_props(gemm_skinny_cuda::kOp, device).sm_count);
  return c.first * 16 + c.second;
}

}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_skinny_cuda, opmux::w8a8_block_fp8_matmul_skinny_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_skinny_cuda_ready, opmux::w8a8_block_fp8_matmul_skinny_cuda_ready);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_skinny_cuda_default,
                              opmux::w8a8_block_fp8_matmul_skinny_cuda_default);
