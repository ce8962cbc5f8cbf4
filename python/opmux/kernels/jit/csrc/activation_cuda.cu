// Gated activations for CUDA tensors: out[r, c] = act(x[r, c]) * x[r, d + c], computed in float,
// for act = silu, gelu (exact, erf) and gelu_tanh (tanh approximation); one kernel template.
//
// The rows x (d / VEC) output vectors are flattened into one index space and walked by a
// grid-stride loop, kU vectors per thread per step so several loads are in flight. Index
// i maps to row r = i / dv and vector column c = i - r * dv; the gate vector is at
// x + r * x_stride + c * VEC and the up vector d elements further.
#include <tvm/ffi/function.h>

#include <algorithm>

#include "opmux/checks.h"
#include "opmux/cuda_utils.cuh"

namespace opmux {
namespace activation_cuda {

using cuda::from_float;
using cuda::load_vec;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;

// Vectors per thread per grid-stride step. Measured on H200 (bf16, I=14336): full occupancy
// with 1 vector per step (<= 40 registers) beats 2 or 4 vectors at lower occupancy.
constexpr int kU = 1;
constexpr int kMinBlocks = 6;  // 1536 resident threads per SM; 8 (<= 32 regs) spills bf16 on sm_90a

struct SiluParams {
  void* out;
  const void* x;
  int64_t out_stride;  // elements
  int64_t x_stride;
  int64_t d;           // output width in elements
};

struct Silu {
  static __device__ __forceinline__ float apply(float g) { return g / (1.0f + __expf(-g)); }
};
// Full-precision erfcf / expf (the fast approximations would miss float32 parity; the kernel
// is bound by memory). 1 + erf(g / sqrt 2) and 1 + tanh(z) cancel for negative g; erfc and
// the sigmoid form 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z)) keep the tail accurate.
struct Gelu {
  static __device__ __forceinline__ float apply(float g) {
    return 0.5f * g * erfcf(g * -0.70710678118654752f);
  }
};
struct GeluTanh {
  static __device__ __forceinline__ float apply(float g) {
    const float z = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return g / (1.0f + expf(-2.0f * z));
  }
};

// Resident blocks per SM that an activation's register budget is sized for: erfcf needs more
// than the registers kMinBlocks leaves (it spills there), so the erf gelu takes fewer blocks.
template <typename Act>
constexpr int kActMinBlocks = kMinBlocks;
template <>
constexpr int kActMinBlocks<Gelu> = 4;

// IndexT is uint32_t when total + kU * (grid stride) cannot overflow it (checked on the host),
// which makes the division cheap; int64_t otherwise.
template <typename Act, typename T, int VEC, typename IndexT>
__global__ void __launch_bounds__(256, kActMinBlocks<Act>) gated_kernel(SiluParams p, IndexT dv, IndexT total) {
  T* __restrict__ out = static_cast<T*>(p.out);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  cuda::pdl_wait();
  for (IndexT base = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; base < total;
       base += kU * stride) {
    Vec<T, VEC> va[kU], vb[kU];
    int64_t out_off[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const IndexT i = base + u * stride;
      if (i < total) {
        const IndexT r = i / dv;
        const IndexT c = i - r * dv;
        const T* row = x + static_cast<int64_t>(r) * p.x_stride + static_cast<int64_t>(c) * VEC;
        va[u] = load_vec<T, VEC>(row);
        vb[u] = load_vec<T, VEC>(row + p.d);
        out_off[u] = static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(c) * VEC;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (base + u * stride < total) {
        Vec<T, VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          o.v[k] = from_float<T>(Act::apply(to_float(va[u].v[k])) * to_float(vb[u].v[k]));
        store_vec(out + out_off[u], o);
      }
    }
  }
  cuda::pdl_launch_dependents();
}

template <typename Act, typename T>
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
  // Few vectors: small blocks spread them over more SMs. Many: one resident wave (1536
  // threads per SM, see __launch_bounds__) and a grid-stride loop.
  const int threads = total >= static_cast<int64_t>(props.sm_count) * 1024 ? 256 : 64;
  const int64_t max_blocks = static_cast<int64_t>(props.sm_count) * (kActMinBlocks<Act> * 256 / threads);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, max_blocks));
  const int64_t stride = blocks * threads;
  const cudaStream_t stream = cuda::current_stream(device_id);
  const dim3 grid(static_cast<unsigned>(blocks)), block(threads);
  // Largest index formed in the loop is < total + kU * stride.
  if (total + kU * stride <= static_cast<int64_t>(UINT32_MAX)) {
    auto kernel = vec_ok ? gated_kernel<Act, T, VEC, uint32_t> : gated_kernel<Act, T, 1, uint32_t>;
    cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p, static_cast<uint32_t>(dv),
                 static_cast<uint32_t>(total));
  } else {
    auto kernel = vec_ok ? gated_kernel<Act, T, VEC, int64_t> : gated_kernel<Act, T, 1, int64_t>;
    cuda::launch(op, device_id, props, kernel, grid, block, 0, stream, p, dv, total);
  }
}

template <typename Act>
void run(const char* op, TensorView out, TensorView x) {
  RowsArgs r = check_silu_and_mul_args(op, kDLCUDA, out, x);
  if (r.rows == 0 || r.hidden == 0) return;
  SiluParams p;
  p.out = data_ptr<void>(out);
  p.x = data_ptr<const void>(x);
  p.out_stride = row_stride(op, "out", out);
  p.x_stride = row_stride(op, "x", x);
  p.d = r.hidden;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_gated<Act, scalar_t>(op, p, r.rows, r.device_id); });
}

void silu_and_mul_cuda(TensorView out, TensorView x) { run<Silu>("opmux.silu_and_mul", out, x); }
void gelu_and_mul_cuda(TensorView out, TensorView x) { run<Gelu>("opmux.gelu_and_mul", out, x); }
void gelu_tanh_and_mul_cuda(TensorView out, TensorView x) {
  run<GeluTanh>("opmux.gelu_tanh_and_mul", out, x);
}

}  // namespace activation_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul_cuda, opmux::activation_cuda::silu_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul_cuda, opmux::activation_cuda::gelu_and_mul_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul_cuda, opmux::activation_cuda::gelu_tanh_and_mul_cuda);
