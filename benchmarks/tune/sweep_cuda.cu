// Launch-layout sweeps of opmux's CUDA kernels on the GPU at hand (families: act, norm, quant,
// sampling: -DSWEEP_<FAMILY>) (METHOD.md: one program that
// checks and times several variants in one call). It includes the real kernel sources, so what
// it times is what the library runs; variants that the library does not (yet) launch are
// defined here. Build and run on the GPU machine (benchmarks/tune/run_sweeps.sh):
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I python/opmux/kernels/jit/include \
//        -I python/opmux/kernels/jit/csrc -I $TVM_FFI/include -DSWEEP_<FAMILY> sweep_cuda.cu \
//        -L $TVM_FFI/lib -ltvm_ffi -o sweep
//   ./sweep            # prints one line per (case, variant): us per launch, GB/s, % of copy
//
// Method: every variant is launched R times back to back inside one CUDA graph (programmatic
// dependent launch on, as the library launches), cycling over input sets that together exceed
// the L2 where the case is small; the median of 15 replays, in us per launch. Each variant's
// output is checked against the library's current launch before it is timed (bit-equal: the
// variants change the layout, not the arithmetic).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if defined(SWEEP_ACT)
#include "activation_cuda.cu"
#elif defined(SWEEP_NORM)
#include "layernorm_cuda.cu"
#elif defined(SWEEP_QUANT)
#include "quantization_cuda.cu"
#elif defined(SWEEP_SAMPLING)
#include "sampling_cuda.cu"
#endif

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace sweep {

static cudaStream_t g_stream;
static double g_copy_gbs = 0;

// A launch on the timed stream with programmatic dependent launch, as the library launches, in
// thread block clusters of `cluster` blocks along x when above 1; the launch's error, unchecked.
template <typename... KArgs, typename... Args>
cudaError_t try_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                       Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = g_stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
  CK(try_launch(kernel, grid, block, smem, 1u, args...));
}

// Median us per launch of fn(i) for i in [0, reps), captured in one graph.
double time_graph(const std::function<void(int)>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn(i);
  CK(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) fn(i);
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(exec, g_stream));
  std::vector<float> ms;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(a, g_stream));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms[ms.size() / 2] * 1000.0 / reps;
}

__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    b[i] = a[i];
}

// Device-to-device copy through SM loads and stores (as torch's copy_), read + write counted.
void copy_bandwidth() {
  const size_t n = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double us = time_graph(
      [&](int) {
        copy_kernel<<<sms * 8, 256, 0, g_stream>>>(static_cast<const uint4*>(a), static_cast<uint4*>(b), n / 16);
      },
      5);
  g_copy_gbs = 2.0 * n / (us * 1e3);
  std::printf("copy bandwidth: %.0f GB/s (2 GiB device-to-device copy kernel, read + write)\n", g_copy_gbs);
  CK(cudaFree(a));
  CK(cudaFree(b));
}

void report(const std::string& cs, const std::string& variant, double us, double bytes) {
  const double gbs = bytes / (us * 1e3);
  std::printf("%-34s %-40s %9.2f us %7.0f GB/s %5.1f%%\n", cs.c_str(), variant.c_str(), us, gbs,
              100.0 * gbs / g_copy_gbs);
  std::fflush(stdout);
}

// Input sets so the working set exceeds 3x the L2 (50 MB) where it can; at least 1.
int sets_for(size_t bytes) {
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(64, (size_t(150) << 20) / std::max<size_t>(bytes, 1))));
}
int reps_for(size_t bytes) {  // ~ >= 300 us of memory traffic per graph, at most 2000 launches
  const double us = bytes / 4.0e3;  // ~4 TB/s
  return static_cast<int>(std::max(20.0, std::min(2000.0, 300.0 / std::max(us, 0.15))));
}

void fill_random(void* p, size_t bytes, unsigned seed) {
  std::vector<uint16_t> h(bytes / 2);
  unsigned s = seed * 2654435761u + 1;
  for (auto& v : h) {  // bf16 values in [-4, 4): sign, exponent 124..128, random mantissa
    s = s * 1664525u + 1013904223u;
    const uint16_t mant = (s >> 9) & 0x7f, ex = 124 + ((s >> 16) % 5), sign = (s >> 31) & 1;
    v = static_cast<uint16_t>((sign << 15) | (ex << 7) | mant);
  }
  CK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

bool same(const void* a, const void* b, size_t bytes) {
  std::vector<char> x(bytes), y(bytes);
  CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
  return std::memcmp(x.data(), y.data(), bytes) == 0;
}

}  // namespace sweep

using namespace sweep;
using bf16 = __nv_bfloat16;

#if defined(SWEEP_ACT)
namespace act = opmux::activation_cuda;

// FlashInfer's layout: one block per row, threads loop over the row's vectors.
template <typename Act, typename T, int VEC>
__global__ void __launch_bounds__(1024) fi_row_kernel(act::SiluParams p) {
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  const int dv = static_cast<int>(p.d / VEC);
  opmux::cuda::pdl_wait();
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    const auto va = opmux::cuda::load_vec<T, VEC>(x + c * VEC);
    const auto vb = opmux::cuda::load_vec<T, VEC>(x + p.d + c * VEC);
    opmux::cuda::Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o.v[k] = opmux::cuda::from_float<T>(Act::apply(opmux::cuda::to_float(va.v[k])) * opmux::cuda::to_float(vb.v[k]));
    opmux::cuda::store_vec(out + c * VEC, o);
  }
  opmux::cuda::pdl_launch_dependents();
}

// The library's loop-free flat kernel (one vector per thread, its PDL entry) in 512- / 1024-thread
// blocks ("wide"), which the library's 256-thread launch bounds refuse: for the one-wave sizes,
// where FlashInfer's 1024-thread rows beat 256-thread blocks on an H100 at T = 128
// (docs/benchmarks/act_sweep_h100_s41.txt): is it the block count or the layout? (The 256-thread
// form, "flat threads=256 early trigger" in act_sweep_h100_s41/s42.txt, is the library's own
// kernel since session 42: "flat threads=256".)
template <typename Act, typename T, int VEC>
__global__ void __launch_bounds__(1024) gated_wide_kernel(act::SiluParams p, uint32_t dv, uint32_t total) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  opmux::cuda::pdl_enter();
  if (i < total) {
    const uint32_t r = i / dv, c = i - r * dv;
    const T* row = static_cast<const T*>(p.x) + static_cast<int64_t>(r) * p.x_stride + static_cast<int64_t>(c) * VEC;
    const auto va = opmux::cuda::load_vec<T, VEC>(row);
    const auto vb = opmux::cuda::load_vec<T, VEC>(row + p.d);
    opmux::cuda::Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o.v[k] = opmux::cuda::from_float<T>(Act::apply(opmux::cuda::to_float(va.v[k])) * opmux::cuda::to_float(vb.v[k]));
    opmux::cuda::store_vec(static_cast<T*>(p.out) + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(c) * VEC, o);
  }
}

// Flattened, U vectors per thread (U independent load pairs in flight), no loop.
template <typename Act, typename T, int VEC, int U>
__global__ void __launch_bounds__(256) gated_multi_kernel(act::SiluParams p, uint32_t dv, uint32_t total) {
  const uint32_t base = (blockIdx.x * blockDim.x) * U + threadIdx.x;
  opmux::cuda::pdl_wait();
  opmux::cuda::Vec<T, VEC> va[U], vb[U];
  const T* x = static_cast<const T*>(p.x);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint32_t i = base + u * blockDim.x;
    if (i < total) {
      const uint32_t r = i / dv, c = i - r * dv;
      const T* row = x + static_cast<int64_t>(r) * p.x_stride + static_cast<int64_t>(c) * VEC;
      va[u] = opmux::cuda::load_vec<T, VEC>(row);
      vb[u] = opmux::cuda::load_vec<T, VEC>(row + p.d);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint32_t i = base + u * blockDim.x;
    if (i < total) {
      const uint32_t r = i / dv, c = i - r * dv;
      opmux::cuda::Vec<T, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        o.v[k] = opmux::cuda::from_float<T>(Act::apply(opmux::cuda::to_float(va[u].v[k])) * opmux::cuda::to_float(vb[u].v[k]));
      opmux::cuda::store_vec(static_cast<T*>(p.out) + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(c) * VEC, o);
    }
  }
  opmux::cuda::pdl_launch_dependents();
}

template <typename Act>
void sweep_act(const char* name) {
  constexpr int VEC = 8;
  const int64_t d = 14336;
  // 32-512: where the flat layout's lead at T = 16 turns into the row layout's at T = 128 (H100)
  for (int64_t T : {1, 16, 32, 64, 128, 256, 512, 4096}) {
    const size_t in_bytes = T * 2 * d * 2, out_bytes = T * d * 2;
    const int sets = sets_for(in_bytes + out_bytes), reps = reps_for(in_bytes + out_bytes);
    std::vector<void*> xs(sets), outs(sets);
    for (int s = 0; s < sets; ++s) {
      CK(cudaMalloc(&xs[s], in_bytes));
      CK(cudaMalloc(&outs[s], out_bytes));
      fill_random(xs[s], in_bytes, 7 + s);
    }
    void* ref;
    CK(cudaMalloc(&ref, out_bytes));
    auto params = [&](int i) {
      act::SiluParams p;
      p.out = outs[i % sets];
      p.x = xs[i % sets];
      p.out_stride = d;
      p.x_stride = 2 * d;
      p.d = d;
      return p;
    };
    const std::string cs = std::string(name) + " T=" + std::to_string(T);
    const uint32_t dv = d / VEC, total = static_cast<uint32_t>(T * dv);
    {  // the library's own choice
      act::SiluParams p = params(0);
      p.out = ref;
      act::launch_gated<Act, bf16>("sweep", p, T, 0);
      CK(cudaStreamSynchronize(g_stream));
    }
    auto check_and_time = [&](const std::string& variant, const std::function<void(int)>& fn) {
      CK(cudaMemsetAsync(outs[0], 0xff, out_bytes, g_stream));
      fn(0);
      CK(cudaStreamSynchronize(g_stream));
      if (!same(outs[0], ref, out_bytes)) {
        std::printf("%-34s %-40s WRONG\n", cs.c_str(), variant.c_str());
        return;
      }
      report(cs, variant, time_graph(fn, reps), in_bytes + out_bytes);
    };
    check_and_time("library", [&](int i) { act::launch_gated<Act, bf16>("sweep", params(i), T, 0); });
    for (int threads : {32, 64, 128, 256}) {
      const unsigned blocks = (total + threads - 1) / threads;
      check_and_time("flat threads=" + std::to_string(threads), [&, threads, blocks](int i) {
        launch(act::gated_kernel<Act, bf16, VEC, uint32_t>, dim3(blocks), dim3(threads), 0, params(i), dv, total);
      });
    }
    for (int threads : {512, 1024}) {
      const unsigned blocks = (total + threads - 1) / threads;
      check_and_time("flat wide threads=" + std::to_string(threads), [&, threads, blocks](int i) {
        launch(gated_wide_kernel<Act, bf16, VEC>, dim3(blocks), dim3(threads), 0, params(i), dv, total);
      });
    }
    for (int threads : {128, 256}) {
      const unsigned blocks2 = (total + 2 * threads - 1) / (2 * threads);
      check_and_time("flat x2 threads=" + std::to_string(threads), [&, threads, blocks2](int i) {
        launch(gated_multi_kernel<Act, bf16, VEC, 2>, dim3(blocks2), dim3(threads), 0, params(i), dv, total);
      });
      const unsigned blocks4 = (total + 4 * threads - 1) / (4 * threads);
      check_and_time("flat x4 threads=" + std::to_string(threads), [&, threads, blocks4](int i) {
        launch(gated_multi_kernel<Act, bf16, VEC, 4>, dim3(blocks4), dim3(threads), 0, params(i), dv, total);
      });
    }
    for (int threads : {256, 512, 1024}) {
      check_and_time("row threads=" + std::to_string(threads), [&, threads](int i) {
        launch(fi_row_kernel<Act, bf16, VEC>, dim3(static_cast<unsigned>(T)), dim3(threads), 0, params(i));
      });
    }
    for (int s = 0; s < sets; ++s) {
      CK(cudaFree(xs[s]));
      CK(cudaFree(outs[s]));
    }
    CK(cudaFree(ref));
  }
}

void run_all() {
  sweep_act<act::Silu>("silu_and_mul I=14336");
  sweep_act<act::Gelu>("gelu_and_mul I=14336");
  sweep_act<act::GeluTanh>("gelu_tanh_and_mul I=14336");
}
#endif  // SWEEP_ACT

#if defined(SWEEP_NORM)
namespace ln = opmux::layernorm_cuda;

template <bool FUSED>
void sweep_norm(int64_t H, int64_t T) {
  constexpr int VEC = 8;
  const size_t row_bytes = H * 2;
  const size_t bytes = FUSED ? 4 * T * row_bytes : 2 * T * row_bytes;  // read/write each once
  const int sets = sets_for(bytes), reps = reps_for(bytes);
  std::vector<void*> as(sets), bs(sets);
  void* w;
  CK(cudaMalloc(&w, row_bytes));
  fill_random(w, row_bytes, 3);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&as[s], T * row_bytes));
    CK(cudaMalloc(&bs[s], T * row_bytes));
    fill_random(as[s], T * row_bytes, 11 + s);
    fill_random(bs[s], T * row_bytes, 101 + s);
  }
  auto params = [&](int i) {
    ln::NormParams p;
    p.a = as[i % sets];
    p.b = bs[i % sets];
    p.w = w;
    p.a_stride = H;
    p.b_stride = H;
    p.rows = T;
    p.hidden = static_cast<int>(H);
    p.eps = 1e-6f;
    return p;
  };
  const std::string cs = std::string(FUSED ? "fused_add_rmsnorm" : "rmsnorm") + " H=" + std::to_string(H) +
                         " T=" + std::to_string(T);
  // FUSED rewrites its inputs: every variant is timed, not checked (the arithmetic is shared)
  auto timed = [&](const std::string& variant, const std::function<void(int)>& fn) {
    report(cs, variant, time_graph(fn, reps), bytes);
  };
  timed("library", [&](int i) { ln::launch_norm<bf16, FUSED, false>("sweep", params(i), 0); });
  const int nvec = static_cast<int>(H / VEC);
  auto reg = [&](int per, int threads) {
    void (*k)(ln::NormParams) = nullptr;
    switch (per) {
      case 1: k = ln::norm_reg_kernel<bf16, VEC, 1, FUSED, false, ln::NormParams>; break;
      case 2: k = ln::norm_reg_kernel<bf16, VEC, 2, FUSED, false, ln::NormParams>; break;
      case 4: k = ln::norm_reg_kernel<bf16, VEC, 4, FUSED, false, ln::NormParams>; break;
      default: k = ln::norm_reg_kernel<bf16, VEC, 8, FUSED, false, ln::NormParams>; break;
    }
    timed("reg per=" + std::to_string(per) + " threads=" + std::to_string(threads), [&, k, threads](int i) {
      launch(k, dim3(static_cast<unsigned>(T)), dim3(threads), 0, params(i));
    });
  };
  for (int per : {1, 2, 4, 8}) {
    const int threads = (nvec + per - 1) / per;
    if (threads < 32 || threads > (per == 1 ? 1024 : 512)) continue;
    reg(per, threads);
  }
  for (int threads : {128, 256, 512}) {
    timed("loop threads=" + std::to_string(threads), [&, threads](int i) {
      launch(ln::norm_loop_kernel<bf16, VEC, FUSED, false, ln::NormParams>, dim3(static_cast<unsigned>(T)),
             dim3(threads), 0, params(i));
    });
  }
  for (int s = 0; s < sets; ++s) {
    CK(cudaFree(as[s]));
    CK(cudaFree(bs[s]));
  }
  CK(cudaFree(w));
}

void sweep_qk(int64_t T) {
  constexpr int VEC = 8, D = 128, HQ = 32, HK = 8;
  const size_t qb = T * HQ * D * 2, kb = T * HK * D * 2, bytes = 2 * (qb + kb);
  const int sets = sets_for(bytes), reps = reps_for(bytes);
  std::vector<void*> qs(sets), ks(sets);
  void *qw, *kw;
  CK(cudaMalloc(&qw, D * 2));
  CK(cudaMalloc(&kw, D * 2));
  fill_random(qw, D * 2, 5);
  fill_random(kw, D * 2, 6);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&qs[s], qb));
    CK(cudaMalloc(&ks[s], kb));
    fill_random(qs[s], qb, 21 + s);
    fill_random(ks[s], kb, 201 + s);
  }
  auto params = [&](int i) {
    ln::QkParams p;
    p.q = {qs[i % sets], qw, HQ * D, D, HQ, T * HQ};
    p.k = {ks[i % sets], kw, HK * D, D, HK, T * HK};
    p.rows = p.q.rows + p.k.rows;
    p.hidden = D;
    p.eps = 1e-6f;
    return p;
  };
  const std::string cs = "qk_norm 32+8 heads T=" + std::to_string(T);
  auto timed = [&](const std::string& variant, const std::function<void(int)>& fn) {
    report(cs, variant, time_graph(fn, reps), bytes);
  };
  timed("library", [&](int i) { ln::launch_norm<bf16, false, false>("sweep", params(i), 0); });
  const int64_t rows = T * (HQ + HK);
  for (int rpb : {4, 8, 16, 32, 64}) {  // 16 lanes x 8 bf16 per row
    const unsigned blocks = static_cast<unsigned>((rows + rpb - 1) / rpb);
    timed("subwarp16 rows/block=" + std::to_string(rpb), [&, rpb, blocks](int i) {
      launch(ln::norm_reg_kernel<bf16, VEC, 1, false, false, ln::QkParams, true>, dim3(blocks), dim3(16, rpb), 0,
             params(i));
    });
  }
  // fewer lanes per row, more vectors per lane: the per-row work (row address, division,
  // reduction, rsqrt) over 16 or 32 elements a lane (the prefill cases are SM-bound at 16 lanes)
  for (int rpb : {16, 32, 64}) {
    const unsigned blocks = static_cast<unsigned>((rows + rpb - 1) / rpb);
    timed("subwarp8 per=2 rows/block=" + std::to_string(rpb), [&, rpb, blocks](int i) {
      launch(ln::norm_reg_kernel<bf16, VEC, 2, false, false, ln::QkParams, true>, dim3(blocks), dim3(8, rpb), 0,
             params(i));
    });
    timed("subwarp4 per=4 rows/block=" + std::to_string(rpb), [&, rpb, blocks](int i) {
      launch(ln::norm_reg_kernel<bf16, VEC, 4, false, false, ln::QkParams, true>, dim3(blocks), dim3(4, rpb), 0,
             params(i));
    });
  }
  for (int rpb : {4, 8, 16, 32}) {  // a warp per row, 4 bf16 per lane
    const unsigned blocks = static_cast<unsigned>((rows + rpb - 1) / rpb);
    timed("warp(vec4) rows/block=" + std::to_string(rpb), [&, rpb, blocks](int i) {
      launch(ln::norm_reg_kernel<bf16, 4, 1, false, false, ln::QkParams>, dim3(blocks), dim3(32, rpb), 0, params(i));
    });
  }
  for (int s = 0; s < sets; ++s) {
    CK(cudaFree(qs[s]));
    CK(cudaFree(ks[s]));
  }
  CK(cudaFree(qw));
  CK(cudaFree(kw));
}

void run_all() {
  for (int64_t T : {1, 16, 4096, 16384, 32768}) sweep_norm<false>(4096, T);
  for (int64_t T : {1, 4096, 32768}) sweep_norm<false>(8192, T);
  for (int64_t T : {128, 4096, 32768}) sweep_norm<true>(4096, T);
  for (int64_t T : {128, 4096, 16384}) sweep_norm<true>(8192, T);
  for (int64_t T : {1, 128, 4096, 16384, 32768}) sweep_qk(T);
}
#endif  // SWEEP_NORM

#if defined(SWEEP_QUANT)
namespace qz = opmux::quantization_cuda;

void sweep_group(int64_t T, int H = 4096) {
  constexpr int VEC = 8, G = 128;
  const size_t xb = T * H * 2, qb = T * H, sb = T * (H / G) * 4, bytes = xb + qb + sb;
  const int sets = sets_for(bytes), reps = reps_for(bytes);
  std::vector<void*> xs(sets), qs(sets), ss(sets);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&xs[s], xb));
    CK(cudaMalloc(&qs[s], qb));
    CK(cudaMalloc(&ss[s], sb));
    fill_random(xs[s], xb, 31 + s);
  }
  void *rq, *rs;
  CK(cudaMalloc(&rq, qb));
  CK(cudaMalloc(&rs, sb));
  auto params = [&](int i) {
    qz::GroupParams p{};
    p.q = qs[i % sets];
    p.s = ss[i % sets];
    p.x = xs[i % sets];
    p.x_stride = H;
    p.q_stride = H;
    p.s_row = H / G;
    p.s_col = 1;
    p.groups = H / G;
    p.group_size = G;
    p.total = T * (H / G);
    p.lanes = G / VEC;
    p.eps = 1e-10f;
    p.qmax = 448.0f;
    return p;
  };
  {  // reference: the group-strided kernel (the library's layout before the row kernel)
    qz::GroupParams p = params(0);
    p.q = rq;
    p.s = rs;
    const unsigned blocks = static_cast<unsigned>((p.total + 31) / 32);
    launch(qz::per_group_kernel<bf16, VEC, uint32_t, uint8_t>, dim3(blocks), dim3(256), 0, p);
    CK(cudaStreamSynchronize(g_stream));
  }
  const std::string cs = "group_quant H=" + std::to_string(H) + " g=128 T=" + std::to_string(T);
  auto check_and_time = [&](const std::string& variant, const std::function<void(int)>& fn) {
    CK(cudaMemsetAsync(qs[0], 0xff, qb, g_stream));
    CK(cudaMemsetAsync(ss[0], 0xff, sb, g_stream));
    fn(0);
    CK(cudaStreamSynchronize(g_stream));
    if (!same(qs[0], rq, qb) || !same(ss[0], rs, sb)) {
      std::printf("%-34s %-40s WRONG\n", cs.c_str(), variant.c_str());
      return;
    }
    report(cs, variant, time_graph(fn, reps), bytes);
  };
  check_and_time("library", [&](int i) { qz::launch_per_group<bf16, uint8_t>("sweep", params(i), 0); });
  check_and_time("group-strided 256 x 2 groups", [&](int i) {
    launch(qz::per_group_kernel<bf16, VEC, uint32_t, uint8_t>,
           dim3(static_cast<unsigned>((T * (H / G) + 31) / 32)), dim3(256), 0, params(i));
  });
  const int nvec = H / VEC;
  auto row_kernel = [](int per) -> void (*)(qz::GroupParams) {
    return per == 1   ? qz::per_group_row_kernel<bf16, VEC, 1, uint8_t>
           : per == 2 ? qz::per_group_row_kernel<bf16, VEC, 2, uint8_t>
           : per == 4 ? qz::per_group_row_kernel<bf16, VEC, 4, uint8_t>
                      : qz::per_group_row_kernel<bf16, VEC, 8, uint8_t>;
  };
  // whole rows a block (splits 1), and rows split over blocks of `threads` x `per` vectors
  for (int per : {1, 2, 4, 8}) {
    for (int threads : {64, 128, 224, 256, 448, 512}) {
      if (nvec % (threads * per) != 0) continue;
      const int splits = nvec / (threads * per);
      if (splits > 1 && T > 128) continue;  // many rows fill the GPU by themselves
      if (splits == 1 && threads != nvec / per) continue;
      auto k = row_kernel(per);
      check_and_time("row per=" + std::to_string(per) + " threads=" + std::to_string(threads) +
                         " splits=" + std::to_string(splits),
                     [&, k, threads, splits](int i) {
                       launch(k, dim3(static_cast<unsigned>(T), static_cast<unsigned>(splits)), dim3(threads), 0,
                              params(i));
                     });
    }
  }
  for (int s = 0; s < sets; ++s) {
    CK(cudaFree(xs[s]));
    CK(cudaFree(qs[s]));
    CK(cudaFree(ss[s]));
  }
  CK(cudaFree(rq));
  CK(cudaFree(rs));
}

void run_all() {
  for (int64_t T : {1, 16, 128, 1024, 4096, 16384, 32768}) sweep_group(T);
  // wide rows at decode sizes: DeepSeek-V3's hidden 7168, Llama-3-8B's MLP-down input 14336
  for (int H : {7168, 14336})
    for (int64_t T : {1, 4, 16, 32, 64, 128}) sweep_group(T, H);
}
#endif  // SWEEP_QUANT

#if defined(SWEEP_SAMPLING)
namespace sp = opmux::sampling_cuda;

// Rows of probabilities shaped like a model's next-token distribution: softmax of logits with a
// heavy head (a few tokens carry most of the mass), fp32, each row its own draw.
void fill_probs(void* d, int64_t B, int64_t V, unsigned seed) {
  std::vector<float> h(static_cast<size_t>(B * V));
  unsigned s = seed * 2654435761u + 7;
  for (int64_t r = 0; r < B; ++r) {
    float* row = h.data() + r * V;
    double total = 0;
    for (int64_t i = 0; i < V; ++i) {
      s = s * 1664525u + 1013904223u;
      const float u = ((s >> 8) + 0.5f) / 16777216.0f;  // (0, 1)
      const float logit = 12.0f * u * u * u * u;      // most near 0, a few up to 12
      row[i] = std::exp(logit);
      total += row[i];
    }
    for (int64_t i = 0; i < V; ++i) row[i] = static_cast<float>(row[i] / total);
  }
  CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}

// Blocks per row (a thread block cluster on sm_90; 16 is a non-portable size) for each op at few
// rows: the library's rule (sampling_cuda.cu blocks_per_row: clusters only while rows leave half
// the SMs idle, each block at least kMinSlice = 8192 entries) against every size. Each size's
// output is compared with the one-block launch first: renorm / mask values by the largest
// difference (the cluster regroups the float sums), draws by how many rows drew the same id.
template <sp::Op OP>
void sweep_sampling(const char* name, int64_t B, int64_t V) {
  constexpr bool kIds = OP == sp::kTopKTopPSample || OP == sp::kMinPSample || OP == sp::kGreedy;
  const size_t xb = B * V * 4, ob = kIds ? B * 4 : xb, bytes = xb + (kIds ? 0 : xb);
  const int sets = sets_for(bytes), reps = reps_for(bytes) / 4 + 10;  // multi-pass: ~4x a read's time
  std::vector<void*> xs(sets), outs(sets);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&xs[s], xb));
    CK(cudaMalloc(&outs[s], ob));
    fill_probs(xs[s], B, V, 41 + s);
  }
  auto params = [&](int i, int c) {
    sp::Params p{};
    p.x = xs[i % sets];
    p.out = outs[i % sets];
    p.sx = V;
    p.so = V;
    p.rows = B;
    p.n = V;
    p.k_val = 50;
    p.p_val = OP == sp::kMinPSample ? 0.05f : 0.9f;
    p.seed_val = 1234;
    p.offset_val = i;
    p.vec = true;
    p.cluster = c;
    return p;
  };
  auto kernel = sp::sampling_kernel<OP, float>;
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  auto go = [&](int i, int c) {
    return try_launch(kernel, dim3(static_cast<unsigned>(B * c)), dim3(sp::kThreads), 0, static_cast<unsigned>(c),
                      params(i, c));
  };
  const opmux::cuda::DeviceProps props = opmux::cuda::device_props("sweep", 0);
  const int rule = sp::blocks_per_row(props, B, V);
  const std::string cs = std::string(name) + " B=" + std::to_string(B) + " V=" + std::to_string(V);
  std::vector<char> ref(ob), got(ob);
  for (int c : {1, 2, 4, 8, 16}) {
    if (c > 1 && props.cc_major < 9) break;
    const std::string variant = "blocks/row=" + std::to_string(c) + (c == rule ? " (library)" : "");
    cudaError_t e = go(0, c);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::printf("%-34s %-40s refused: %s\n", cs.c_str(), variant.c_str(), cudaGetErrorString(e));
      continue;
    }
    CK(cudaMemcpy((c == 1 ? ref : got).data(), outs[0], ob, cudaMemcpyDeviceToHost));
    std::string check = "reference";
    if (c > 1 && kIds) {
      int equal = 0;
      for (int64_t r = 0; r < B; ++r) equal += reinterpret_cast<int32_t*>(got.data())[r] == reinterpret_cast<int32_t*>(ref.data())[r];
      check = std::to_string(equal) + "/" + std::to_string(B) + " ids as 1 block";
    } else if (c > 1) {
      float worst = 0;
      const float* a = reinterpret_cast<const float*>(got.data());
      const float* b = reinterpret_cast<const float*>(ref.data());
      for (int64_t i = 0; i < B * V; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
      char buf[64];
      std::snprintf(buf, sizeof(buf), "max |diff| %.1e", worst);
      check = buf;
    }
    const double us = time_graph([&](int i) { CK(go(i, c)); }, reps);
    std::printf("%-34s %-40s %9.2f us  %s\n", cs.c_str(), variant.c_str(), us, check.c_str());
    std::fflush(stdout);
  }
  for (int s = 0; s < sets; ++s) {
    CK(cudaFree(xs[s]));
    CK(cudaFree(outs[s]));
  }
}

void run_all() {
  for (int64_t V : {32000, 128256, 151936}) {
    for (int64_t B : {1, 4, 16}) {
      sweep_sampling<sp::kTopKTopPSample>("top_k_top_p", B, V);
      sweep_sampling<sp::kTopKRenorm>("top_k_renorm", B, V);
      sweep_sampling<sp::kTopPRenorm>("top_p_renorm", B, V);
      sweep_sampling<sp::kTopKMask>("top_k_mask", B, V);
      sweep_sampling<sp::kMinPSample>("min_p", B, V);
    }
  }
}
#endif  // SWEEP_SAMPLING

int main() {
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  // the library's launchers take the stream from tvm-ffi's environment, as under torch
  if (TVMFFIEnvSetStream(kDLCUDA, 0, g_stream, nullptr) != 0) {
    std::fprintf(stderr, "TVMFFIEnvSetStream failed\n");
    return 1;
  }
  copy_bandwidth();
  run_all();
  return 0;
}
