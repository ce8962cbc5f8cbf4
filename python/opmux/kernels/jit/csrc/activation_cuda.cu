// Activations for CUDA tensors, computed in float. Gated: out[r, c] = act(x[r, c]) * x[r, d + c]
// for act = silu, gelu (exact, erf) and gelu_tanh (tanh approximation), fatrelu and swiglustep;
// mul_and_silu (the halves swapped, optionally in vLLM's rounding), swigluoai (interleaved gate /
// up pairs); one kernel template (Layout). Element-wise: gelu_new / gelu_fast (the tanh form) and
// gelu_quick, the same flat layout without the up load.
//
// The rows x (d / VEC) output vectors are flattened into one index space and the grid covers
// it: each thread owns one output vector, so its gate and up loads (two independent 16-byte
// loads) are issued back to back with no loop-carried state. Index i maps to row r = i / dv and
// vector column c = i - r * dv; the gate vector is at x + r * x_stride + c * VEC and the up
// vector d elements further. A grid-stride loop remains only in the 64-bit index form, as a
// guard for grids the launch could not cover (more than 2^31 - 1 blocks); the 32-bit form's grid
// always covers its vectors and has no loop (for_each_vector).
#include <tvm/ffi/function.h>

#include <algorithm>
#include <type_traits>

#include "opmux/checks.h"
#include "opmux/contracts/activation.h"
#include "opmux/cuda_utils.cuh"

namespace opmux {
namespace activation_cuda {

using cuda::from_float;
using cuda::load_vec;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;

// 8 resident 256-thread blocks per SM (2048 threads, the sm_80/sm_90 maximum) keeps
// 64 KB of loads in flight per SM; without the loop-carried state of the old grid-stride loop
// every activation fits the 32 registers this allows (checked with -Xptxas -v: no spills). The
// 64-bit index path (> 2^32 vectors, never a serving shape) needs a few more: 6 blocks there.
constexpr int kMaxThreads = 256;
template <typename IndexT>
constexpr int kMinBlocks = std::is_same_v<IndexT, uint32_t> ? 8 : 6;

struct SiluParams {
  void* out;
  const void* x;
  int64_t out_stride;  // elements
  int64_t x_stride;
  int64_t d;           // output width in elements
  float p0 = 0.0f;     // fatrelu's threshold, swigluoai's alpha
  float p1 = 0.0f;     // the swiglu limit
};

// Where a gated pair is: kHalves gate x[c], up x[d + c]; kSwapped (mul_and_silu) gate x[d + c],
// up x[c]; kPairs (swigluoai) gate x[2c], up x[2c + 1].
enum Layout { kHalves, kSwapped, kPairs };

// Clamps as selects: a NaN v compares false and stays NaN (torch.clamp's result).
__device__ __forceinline__ float clamp_hi(float v, float l) { return v > l ? l : v; }
__device__ __forceinline__ float clamp_abs(float v, float l) { return v > l ? l : (v < -l ? -l : v); }

// Accuracy: __expf (ex2.approx after a multiply by log2 e) has a relative error of a few 1e-7
// over the whole range, growing with |argument| to ~5e-6 only where the result is then divided
// into a near-zero output; __fdividef is 2 ulp and returns 0 once the denominator exceeds
// 2^126 (the true quotient is < 1e-37 there). Both stay within the float32 parity tolerance
// (atol = rtol = 1e-5) and cost two MUFU ops per element, far below what the memory-bound
// kernel can hide. IEEE division and expf were measurably slower on H200.
struct Silu {
  static __device__ __forceinline__ float apply(float g) { return __fdividef(g, 1.0f + __expf(-g)); }
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) { return apply(g) * u; }
};
// vLLM's rounding, selected by its compat entry: silu by IEEE expf and division (vLLM's kernel
// and torch's CUDA silu: bit-equal), rounded to T, then the product in T (vLLM's T * T is the
// float product of the two rounded values, exact in float for every T, rounded once to T).
template <typename T>
struct SiluVllm {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) {
    return to_float(from_float<T>(g / (1.0f + expf(-g)))) * u;
  }
};
// gelu_new / gelu_fast in vLLM's rounding (its gelu_new_kernel / gelu_fast_kernel): each step
// rounded to T (rt; nothing for float), tanhf; selected by vLLM's compat entries.
template <typename T>
__device__ __forceinline__ float rt(float v) {
  return to_float(from_float<T>(v));
}
template <typename T>
struct GeluNewVllm {
  static __device__ __forceinline__ float apply(float x) {
    const float x3 = rt<T>(rt<T>(x * x) * x);
    const float t = rt<T>(tanhf(rt<T>(0.79788456f * rt<T>(x + rt<T>(0.044715f * x3)))));
    return rt<T>(0.5f * x) * rt<T>(1.0f + t);
  }
};
template <typename T>
struct GeluFastVllm {
  static __device__ __forceinline__ float apply(float x) {
    const float s = rt<T>(1.0f + rt<T>(rt<T>(0.044715f * x) * x));
    const float t = rt<T>(tanhf(rt<T>(rt<T>(x * 0.79788456f) * s)));
    return rt<T>(0.5f * x) * rt<T>(1.0f + t);
  }
};
// gelu (erf) and gelu_tanh in vLLM's rounding: its gelu_kernel / gelu_tanh_kernel (erff, tanhf,
// IEEE division; torch's CUDA gelu is the same expression), rounded to T before the product.
template <typename T>
struct GeluVllm {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) {
    return to_float(from_float<T>(g * 0.5f * (1.0f + erff(g * 0.70710678118654752f)))) * u;
  }
};
template <typename T>
struct GeluTanhVllm {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) {
    constexpr float kBeta = 0.79788456080286536f, kKappa = 0.044715f;
    const float cube = g * g * g;
    return to_float(from_float<T>(0.5f * g * (1.0f + tanhf(kBeta * (g + kKappa * cube))))) * u;
  }
};
// x * sigmoid(1.702 x), element-wise (Silu's accuracy note applies)
struct GeluQuick {
  static __device__ __forceinline__ float apply(float g) {
    return __fdividef(g, 1.0f + __expf(-1.702f * g));
  }
};
// gate kept where > threshold, else 0 (F.threshold's test: a NaN gate passes through)
struct Fatrelu {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams& p) {
    return (g <= p.p0 ? 0.0f : g) * u;
  }
};
struct SwigluStep {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams& p) {
    return clamp_hi(Silu::apply(g), p.p1) * clamp_abs(u, p.p1);
  }
};
// gpt-oss: g = min(gate, limit); (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)
struct SwigluOai {
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams& p) {
    const float c = clamp_hi(g, p.p1);
    return (clamp_abs(u, p.p1) + 1.0f) * __fdividef(c, 1.0f + __expf(-p.p0 * c));
  }
};
// Exact GELU through erff: erfcf (the cancellation-free form) is several times the
// instructions and was the bottleneck (141 us vs 97 us for torch.compile at T=4096,
// I=14336). For g << 0, 1 + erff(.) cancels, but the absolute error stays below
// 0.5 * |g| * 2 ulp(1) ~ 1e-7 * |g|, well inside the float32 atol of 1e-5.
struct Gelu {
  static __device__ __forceinline__ float apply(float g) {
    return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
  }
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) { return apply(g) * u; }
};
// 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z)): the sigmoid form has no cancellation for g < 0,
// and with __expf / __fdividef it is as cheap as tanh.approx.f32 but accurate enough for
// float32 outputs too (tanh.approx's 2^-11 relative error would miss the fp16 tolerance for
// |g * up| of a few units), so one path serves all dtypes.
struct GeluTanh {
  static __device__ __forceinline__ float apply(float g) {
    const float z = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return __fdividef(g, 1.0f + __expf(-2.0f * z));
  }
  static __device__ __forceinline__ float gated(float g, float u, const SiluParams&) { return apply(g) * u; }
};

// The gate and up values of output element k of a vector: va / vb are the vectors at the gate and
// up addresses (kHalves, kSwapped), or the two consecutive vectors of VEC / 2 pairs each (kPairs).
template <Layout L, typename T, int VEC>
__device__ __forceinline__ float pair_out(const Vec<T, VEC>& va, const Vec<T, VEC>& vb, int k, bool up) {
  if constexpr (L == kPairs) {
    if constexpr (VEC == 1) {
      return to_float(up ? vb.v[0] : va.v[0]);
    } else {
      const int j = 2 * k + (up ? 1 : 0);
      return to_float(j < VEC ? va.v[j] : vb.v[j - VEC]);
    }
  } else {
    return to_float(up ? vb.v[k] : va.v[k]);
  }
}
// Offsets (elements) of the two loads of output vector c of a row.
template <Layout L, int VEC>
__device__ __forceinline__ void pair_offsets(int64_t c, int64_t d, int64_t& oa, int64_t& ob) {
  if constexpr (L == kHalves) {
    oa = c * VEC;
    ob = d + c * VEC;
  } else if constexpr (L == kSwapped) {
    oa = d + c * VEC;
    ob = c * VEC;
  } else if constexpr (VEC == 1) {
    oa = 2 * c;
    ob = 2 * c + 1;
  } else {
    oa = 2 * c * VEC;
    ob = 2 * c * VEC + VEC;
  }
}

// IndexT is uint32_t when total + (grid stride) cannot overflow it (checked on the host), which
// makes the division by dv cheap; int64_t otherwise. The uint32_t grids cover every vector (the
// host launches cdiv(total, threads) blocks), so each thread takes its one vector with no loop:
// on an H100 (benchmarks/tune/sweep_cuda.cu, I = 14336 bf16) that took 0.95-0.99x the time of the
// same kernel's grid-stride loop at T = 16 to 512 for silu and gelu_tanh, 0.97-0.99x for gelu
// from T = 32 (docs/benchmarks/act_sweep_h100_s42.txt). The int64_t form keeps the loop: its grid is capped.
template <typename IndexT, typename Body>
__device__ __forceinline__ void for_each_vector(IndexT total, Body body) {
  const IndexT first = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (std::is_same_v<IndexT, uint32_t>) {
    if (first < total) body(first);
  } else {
    const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
    for (IndexT i = first; i < total; i += stride) body(i);
  }
}

template <typename Act, typename T, int VEC, typename IndexT, Layout L = kHalves>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks<IndexT>) gated_kernel(SiluParams p, IndexT dv, IndexT total) {
  T* __restrict__ out = static_cast<T*>(p.out);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  cuda::pdl_enter();
  for_each_vector(total, [&](IndexT i) {
    const IndexT r = i / dv;
    const IndexT c = i - r * dv;
    const T* row = x + static_cast<int64_t>(r) * p.x_stride;
    int64_t oa, ob;
    pair_offsets<L, VEC>(static_cast<int64_t>(c), p.d, oa, ob);
    const Vec<T, VEC> va = load_vec<T, VEC>(row + oa);
    const Vec<T, VEC> vb = load_vec<T, VEC>(row + ob);
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o.v[k] = from_float<T>(Act::gated(pair_out<L, T, VEC>(va, vb, k, false), pair_out<L, T, VEC>(va, vb, k, true), p));
    store_vec(out + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(c) * VEC, o);
  });
}

// Element-wise: out[r, c] = act(x[r, c]), the flat layout of gated_kernel (p.d: the row width).
template <typename Act, typename T, int VEC, typename IndexT>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks<IndexT>) act_kernel(SiluParams p, IndexT dv, IndexT total) {
  T* __restrict__ out = static_cast<T*>(p.out);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  cuda::pdl_enter();
  for_each_vector(total, [&](IndexT i) {
    const IndexT r = i / dv;
    const IndexT c = i - r * dv;
    const Vec<T, VEC> va =
        load_vec<T, VEC>(x + static_cast<int64_t>(r) * p.x_stride + static_cast<int64_t>(c) * VEC);
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(Act::apply(to_float(va.v[k])));
    store_vec(out + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(c) * VEC, o);
  });
}

// Rows of a compute-heavy activation (exact-erf GELU) at prefill: a block per row, 256 threads
// looping over the row's vectors, so each thread's erf work of one vector overlaps the loads of
// its next (H200 sweep, I = 14336 bf16, T = 4096: 90.4 us vs 95.3 for the flat layout; silu and
// the tanh form are load-bound and gain nothing).
template <typename Act, typename T, int VEC>
__global__ void __launch_bounds__(256) gated_row_kernel(SiluParams p) {
  const int64_t r = blockIdx.x;
  const T* __restrict__ x = static_cast<const T*>(p.x) + r * p.x_stride;
  T* __restrict__ out = static_cast<T*>(p.out) + r * p.out_stride;
  const int dv = static_cast<int>(p.d / VEC);
  cuda::pdl_enter();
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    const Vec<T, VEC> va = load_vec<T, VEC>(x + c * VEC);
    const Vec<T, VEC> vb = load_vec<T, VEC>(x + p.d + c * VEC);
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(Act::apply(to_float(va.v[k])) * to_float(vb.v[k]));
    store_vec(out + c * VEC, o);
  }
}

// Elementwise: act_kernel (no up half); else gated_kernel in layout L.
template <typename Act, typename T, Layout L = kHalves, bool Elementwise = false>
void launch_gated(const char* op, const SiluParams& p, int64_t rows, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  // 16-byte path when every gate, up and out vector is 16-byte aligned: bases aligned, row
  // strides and d whole multiples of 16 bytes (d % VEC == 0 also aligns the up half).
  const bool vec_ok = p.d % VEC == 0 && cuda::aligned(p.out, 16) && cuda::aligned(p.x, 16) &&
                      (p.out_stride * sizeof(T)) % 16 == 0 && (p.x_stride * sizeof(T)) % 16 == 0;
  const int vec = vec_ok ? VEC : 1;
  const int64_t dv = p.d / vec;
  const int64_t total = rows * dv;

  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  // One vector per thread, 256 threads per block at every size: the launch-layout sweep on the
  // H200 (benchmarks/tune, 2026-11-30) found 256 as fast as or faster than 32-128 at T = 1, 128
  // and 4096 (I = 14336 bf16) and 23% faster at T = 16 (1.30 us vs 1.68 with 64 threads), and
  // faster than FlashInfer's block-per-row layout below T = 4096.
  const int threads = kMaxThreads;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, INT32_MAX));
  const int64_t stride = blocks * threads;
  const cudaStream_t stream = cuda::current_stream(device_id);
  if constexpr (std::is_same_v<Act, Gelu> && !Elementwise && L == kHalves) {
    if (vec_ok && rows >= 1024 && rows <= INT32_MAX && dv >= 2 * 256) {
      cuda::launch(op, device_id, props, gated_row_kernel<Act, T, VEC>, dim3(static_cast<unsigned>(rows)),
                   dim3(256), 0, stream, p);
      return;
    }
    // Less than a block per SM (decode sizes: T <= 18 at I = 14336 bf16 on 132 SMs): each
    // thread's erff chain over VEC elements is the kernel's latency, so the same work goes to 4x
    // the threads, a quarter vector each, as torch.compile's kernel spreads it (on an H100: T = 1 /
    // 16 1.22 / 1.87 us against 1.35 / 2.49, docs/benchmarks/h200.md and
    // gelu_and_mul_spread_h100.json). vLLM's rounding (GeluVllm) keeps the full-vector launch.
    constexpr int kSpread = VEC >= 4 ? VEC / 4 : 1;
    if (vec_ok && kSpread < VEC && blocks < props.sm_count) {
      const int64_t dvs = p.d / kSpread, totals = rows * dvs;
      const int64_t blocks_s = (totals + threads - 1) / threads;
      if (totals + blocks_s * threads <= static_cast<int64_t>(UINT32_MAX)) {
        cuda::launch(op, device_id, props, gated_kernel<Act, T, kSpread, uint32_t, L>,
                     dim3(static_cast<unsigned>(blocks_s)), dim3(threads), 0, stream, p, static_cast<uint32_t>(dvs),
                     static_cast<uint32_t>(totals));
        return;
      }
    }
  }
  const dim3 grid(static_cast<unsigned>(blocks)), block(threads);
  // Largest index formed (the 64-bit form's loop) is < total + stride.
  if (total + stride <= static_cast<int64_t>(UINT32_MAX)) {
    void (*kernel)(SiluParams, uint32_t, uint32_t);
    if constexpr (Elementwise) {
      kernel = vec_ok ? act_kernel<Act, T, VEC, uint32_t> : act_kernel<Act, T, 1, uint32_t>;
    } else {
      kernel = vec_ok ? gated_kernel<Act, T, VEC, uint32_t, L> : gated_kernel<Act, T, 1, uint32_t, L>;
    }
    cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p, static_cast<uint32_t>(dv),
                 static_cast<uint32_t>(total));
  } else {
    void (*kernel)(SiluParams, int64_t, int64_t);
    if constexpr (Elementwise) {
      kernel = vec_ok ? act_kernel<Act, T, VEC, int64_t> : act_kernel<Act, T, 1, int64_t>;
    } else {
      kernel = vec_ok ? gated_kernel<Act, T, VEC, int64_t, L> : gated_kernel<Act, T, 1, int64_t, L>;
    }
    cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p, dv, total);
  }
}

template <typename Act, Layout L = kHalves>
void run(const char* op, TensorView out, TensorView x, float p0 = 0.0f, float p1 = 0.0f) {
  RowsArgs r = check_silu_and_mul_args(op, kDLCUDA, out, x);
  if (r.rows == 0 || r.hidden == 0) return;
  SiluParams p;
  p.out = data_ptr<void>(out);
  p.x = data_ptr<const void>(x);
  p.out_stride = row_stride(op, "out", out);
  p.x_stride = row_stride(op, "x", x);
  p.d = r.hidden;
  p.p0 = p0;
  p.p1 = p1;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_gated<Act, scalar_t, L>(op, p, r.rows, r.device_id); });
}

template <typename Act, template <typename> class VllmAct = GeluNewVllm>
void run_act(const char* op, TensorView out, TensorView x, bool vllm_rounding = false) {
  RowsArgs r = check_elementwise_args(op, kDLCUDA, out, x);
  if (r.rows == 0 || r.hidden == 0) return;
  SiluParams p;
  p.out = data_ptr<void>(out);
  p.x = data_ptr<const void>(x);
  p.out_stride = row_stride(op, "out", out);
  p.x_stride = row_stride(op, "x", x);
  p.d = r.hidden;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16, [&] {
    if (vllm_rounding) {
      launch_gated<VllmAct<scalar_t>, scalar_t, kHalves, true>(op, p, r.rows, r.device_id);
    } else {
      launch_gated<Act, scalar_t, kHalves, true>(op, p, r.rows, r.device_id);
    }
  });
}

// A gated op in vLLM's rounding: VllmAct<T> per dtype, in layout L.
template <template <typename> class VllmAct, Layout L>
void run_vllm(const char* op, TensorView out, TensorView x) {
  RowsArgs r = check_silu_and_mul_args(op, kDLCUDA, out, x);
  if (r.rows == 0 || r.hidden == 0) return;
  SiluParams p;
  p.out = data_ptr<void>(out);
  p.x = data_ptr<const void>(x);
  p.out_stride = row_stride(op, "out", out);
  p.x_stride = row_stride(op, "x", x);
  p.d = r.hidden;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16, [&] {
    launch_gated<VllmAct<scalar_t>, scalar_t, L>(op, p, r.rows, r.device_id);
  });
}

void silu_and_mul_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  if (vllm_rounding) return run_vllm<SiluVllm, kHalves>("opmux.silu_and_mul", out, x);
  run<Silu>("opmux.silu_and_mul", out, x);
}
void gelu_and_mul_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  if (vllm_rounding) return run_vllm<GeluVllm, kHalves>("opmux.gelu_and_mul", out, x);
  run<Gelu>("opmux.gelu_and_mul", out, x);
}
void gelu_tanh_and_mul_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  if (vllm_rounding) return run_vllm<GeluTanhVllm, kHalves>("opmux.gelu_tanh_and_mul", out, x);
  run<GeluTanh>("opmux.gelu_tanh_and_mul", out, x);
}

void mul_and_silu_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  if (vllm_rounding) return run_vllm<SiluVllm, kSwapped>("opmux.mul_and_silu", out, x);
  run<Silu, kSwapped>("opmux.mul_and_silu", out, x);
}
void fatrelu_and_mul_cuda(TensorView out, TensorView x, double threshold, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<Fatrelu>("opmux.fatrelu_and_mul", out, x, static_cast<float>(threshold));
}
void swiglustep_and_mul_cuda(TensorView out, TensorView x, double limit, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<SwigluStep>("opmux.swiglustep_and_mul", out, x, 0.0f, static_cast<float>(limit));
}
void swigluoai_and_mul_cuda(TensorView out, TensorView x, double alpha, double limit, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run<SwigluOai, kPairs>("opmux.swigluoai_and_mul", out, x, static_cast<float>(alpha), static_cast<float>(limit));
}
void gelu_new_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run_act<GeluTanh, GeluNewVllm>("opmux.gelu_new", out, x, vllm_rounding);
}
void gelu_fast_cuda(TensorView out, TensorView x, bool vllm_rounding, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run_act<GeluTanh, GeluFastVllm>("opmux.gelu_fast", out, x, vllm_rounding);
}
void gelu_quick_cuda(TensorView out, TensorView x, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  run_act<GeluQuick>("opmux.gelu_quick", out, x);
}


}  // namespace activation_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_cuda, opmux::activation_cuda::silu_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul_cuda, opmux::activation_cuda::gelu_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul_cuda, opmux::activation_cuda::gelu_tanh_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul_and_silu_cuda, opmux::activation_cuda::mul_and_silu_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fatrelu_and_mul_cuda, opmux::activation_cuda::fatrelu_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(swiglustep_and_mul_cuda, opmux::activation_cuda::swiglustep_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(swigluoai_and_mul_cuda, opmux::activation_cuda::swigluoai_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_new_cuda, opmux::activation_cuda::gelu_new_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_fast_cuda, opmux::activation_cuda::gelu_fast_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_quick_cuda, opmux::activation_cuda::gelu_quick_cuda);
// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/activation_cuda_lanes.inc"
