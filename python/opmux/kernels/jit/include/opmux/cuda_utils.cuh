// CUDA helpers shared by the opmux CUDA units: float conversion, 16-byte vectors,
// warp/block reductions, stream and device queries, launch checks, PDL.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "opmux/common.h"

namespace opmux {
namespace cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements of T moved as one aligned access (N * sizeof(T) == 16 gives ld/st.global.v4).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
// Read-only for the kernel's lifetime (weights): use the non-coherent path.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_ro(const T* p) {
  if constexpr (sizeof(T) * N == 16) {
    uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<Vec<T, N>*>(&u);
  } else {
    return *reinterpret_cast<const Vec<T, N>*>(p);
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Elements per 16-byte vector.
template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Programmatic dependent launch (sm_90+): wait for the previous kernel's memory before the
// first global access, and let the next kernel start its prologue early. No-ops before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// Every kernel's first step: wait for the previous kernel's memory, then release the next
// kernel at once. Releasing early is safe (the next kernel's own pdl_wait() waits for this
// grid to complete and flush) and lets its launch overlap this kernel's whole run, not only
// its tail (H200 sweep, silu_and_mul I=14336 bf16 in a graph with PDL: T=16 1.21 us vs 1.32
// with the release after the stores; T=4096 gelu 93.5 vs 95.3).
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// ---- host side --------------------------------------------------------------------------

inline void check_cuda(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << op << ": " << what << " failed: " << cudaGetErrorName(err)
                                << ": " << cudaGetErrorString(err);
  }
}

inline cudaStream_t current_stream(int32_t device_id) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device_id));
}

struct DeviceProps {
  int sm_count = 0;
  int cc_major = 0;
  int smem_optin = 0;  // shared memory a block may opt in to (static + dynamic), bytes
  int smem_per_sm = 0;  // shared memory of one SM, every resident block's included, bytes
  int smem_reserved = 0;  // shared memory the system keeps per resident block, bytes
  int l2_bytes = 0;
};

// Cached per device id (queried once; attribute queries are cheap but not free).
inline DeviceProps device_props(const char* op, int32_t device_id) {
  constexpr int kMaxDevices = 64;
  static DeviceProps cache[kMaxDevices];
  if (device_id >= 0 && device_id < kMaxDevices && cache[device_id].sm_count > 0) {
    return cache[device_id];
  }
  DeviceProps p;
  check_cuda(cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, device_id), op,
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  check_cuda(cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, device_id),
             op, "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  check_cuda(cudaDeviceGetAttribute(&p.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id), op,
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  check_cuda(cudaDeviceGetAttribute(&p.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_id), op,
             "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
  check_cuda(cudaDeviceGetAttribute(&p.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device_id), op,
             "cudaDeviceGetAttribute(ReservedSharedMemoryPerBlock)");
  check_cuda(cudaDeviceGetAttribute(&p.l2_bytes, cudaDevAttrL2CacheSize, device_id), op,
             "cudaDeviceGetAttribute(L2CacheSize)");
  if (device_id >= 0 && device_id < kMaxDevices) cache[device_id] = p;  // benign race: same value
  return p;
}

// Makes `device_id` current for the launch and restores the previous device afterwards.
class DeviceScope {
 public:
  DeviceScope(const char* op, int32_t device_id) : op_(op) {
    check_cuda(cudaGetDevice(&prev_), op, "cudaGetDevice");
    if (prev_ != device_id) check_cuda(cudaSetDevice(device_id), op, "cudaSetDevice");
    target_ = device_id;
  }
  ~DeviceScope() {
    if (prev_ != target_) cudaSetDevice(prev_);  // never throw from a destructor
  }

 private:
  const char* op_;
  int prev_ = 0;
  int target_ = 0;
};

// PDL is safe only if the binary that runs contains griddepcontrol.wait, i.e. it was compiled
// from PTX >= 9.0 (an sm_80 build JIT-ed on a newer GPU has no wait). Cached per (kernel, device).
inline bool pdl_supported(const char* op, const void* kernel, int32_t device_id, int cc_major) {
  if (cc_major < 9) return false;
  static std::mutex mu;
  static std::map<std::pair<const void*, int32_t>, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(kernel, device_id);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, kernel), op, "cudaFuncGetAttributes");
  return cache[key] = attr.ptxVersion >= 90;
}

// Blocks per thread block cluster for `kernel`: `want` (a power of two) halved until the binary
// holds sm_90 code (PTX >= 9.0: an sm_80 build JIT-ed on a newer GPU has no cluster instructions,
// as pdl_supported) and the GPU can co-schedule such a cluster (cudaOccupancyMaxActiveClusters:
// MPS or green contexts may leave too few SMs); 1 below sm_90. Cached per (kernel, device, want).
template <typename... KArgs>
inline int cluster_blocks(const char* op, int32_t device_id, const DeviceProps& props, void (*kernel)(KArgs...),
                          dim3 block, size_t smem, int want) {
  if (want <= 1 || props.cc_major < 9) return 1;
  static std::mutex mu;
  static std::map<std::tuple<const void*, int32_t, int, size_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device_id, want, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)), op, "cudaFuncGetAttributes");
  int c = attr.ptxVersion >= 90 ? want : 1;
  for (; c > 1; c /= 2) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(c));
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute cl[1];
    cl[0].id = cudaLaunchAttributeClusterDimension;
    cl[0].val.clusterDim.x = static_cast<unsigned>(c);
    cl[0].val.clusterDim.y = 1;
    cl[0].val.clusterDim.z = 1;
    cfg.attrs = cl;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel), &cfg) == cudaSuccess && n > 0) break;
    cudaGetLastError();  // a refused query is an answer, not an error to surface later
  }
  return cache[key] = c;
}

// Whether the launches of the current entry point may use programmatic dependent launch: every
// CUDA entry point takes a trailing `bool enable_pdl` (as FlashInfer's) and holds a PdlScope for
// its duration, so the launch helpers below need no extra parameter. Thread-local: a call and its
// launches run on one host thread.
inline bool& pdl_enabled() {
  static thread_local bool enabled = true;
  return enabled;
}

class PdlScope {
 public:
  explicit PdlScope(bool enable) : prev_(pdl_enabled()) { pdl_enabled() = enable; }
  ~PdlScope() { pdl_enabled() = prev_; }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool prev_;
};

// Launches `kernel` on `stream` (the current device must be `device_id`), with programmatic
// stream serialization when the entry point enabled it and the GPU and binary support it (the
// kernels call pdl_wait() before touching global memory), in thread block clusters of `cluster_x`
// blocks when it is above 1 (sm_90+; grid.x a multiple of it), then surfaces any launch error as a
// RuntimeError.
template <typename... KArgs, typename... Args>
inline void launch_clustered(const char* op, int32_t device_id, const DeviceProps& props,
                             void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled() && pdl_supported(op, reinterpret_cast<const void*>(kernel), device_id, props.cc_major)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op,
             "kernel launch");
  check_cuda(cudaGetLastError(), op, "kernel launch");
}

// launch_clustered without clusters.
template <typename... KArgs, typename... Args>
inline void launch(const char* op, int32_t device_id, const DeviceProps& props,
                   void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_clustered(op, device_id, props, kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

// True when p is aligned to `bytes`.
inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace cuda
}  // namespace opmux
