// The sampling ops for CUDA tensors (the rules: ops/sampling/op.py's docstring). One 512-thread
// block per row, no sort; every step is a pass over the row (16-byte vector loads when the rows
// allow, a scalar tail) with block reductions in a fixed order, so a result never depends on
// timing (float sums never use atomics; integer counts may, their sums not depending on order):
//   * a threshold (the k-th largest value, the top-p boundary value) is found by a radix search on
//     the ordered int key of the values (opmux/sampling_philox.h; a probability's key is its bits):
//     the key interval [lo, lo + 2^bits) is a radix digit, first [0, 2^31) for probabilities,
//     [-2^31, 2^31) for logits; a pass histograms the keys in it by their next digit (one more bin
//     for the keys above it) and keeps the highest bin whose lower end still has stat(>= it) >=
//     need, so stat(>= lo) >= need > stat(>= lo + 2^bits) holds throughout, and the passes end on
//     the exact key of a row value (as FlashInfer's pivot search). Top-k counts 8-bit digits (256
//     bins, 4 passes) into per-warp histograms with shared-memory atomics; top-p sums the mass of
//     4-bit digits (16 bins, 8 passes) into per-thread columns (plain read-modify-write, summed in
//     a fixed order). The Triton backend runs a 2-way search;
//   * masks keep every value whose key is >= the threshold's (ties kept);
//   * the draw: u from Philox (seed, counter (offset lo, hi, row, 0): the Triton and CPU backends'
//     stream, so all three draw the same u), the kept mass, then chunks of the row with a block-wide
//     exclusive prefix scan until the first kept positive entry whose cumulative mass exceeds
//     u * mass (else the last kept positive entry, else 0);
//   * the top-k-first draw, after the top-k search: where the row's kept entries fit a list of
//     kListCap, every block holds them all (row order) and finds the top-p boundary over them (each
//     entry's mass above it, summed in order) and the draw, with no mass search over the row.
// Few rows over a large vocabulary (fewer rows than half the SMs) take a cluster of up to 8 blocks per
// row on sm_90 (thread block clusters): each block owns a contiguous slice of the row, and every
// reduction above ends with the blocks' partial results summed through distributed shared memory in
// rank order, so every block of the cluster takes the same decisions and the result is the one-block
// arithmetic regrouped (still independent of timing). The draw scans only in the block whose slice
// holds the crossing (the running mass over the slices, in rank order, brackets the target); its
// slice's last kept entry stands in should its own sums not cross it.
// Every op but greedy first copies each block's slice of the row into dynamic shared memory where
// one fits (the launch takes enough blocks per row, up to a cluster of 8, to make it fit: 151,936
// float32 entries over 4 blocks on an H100 / H200, or over 8 where two blocks share an SM over
// several waves: cached_blocks' rule), so a row is read from global memory once and every later
// pass reads shared memory (uncached rows are re-read from L2 or HBM by each pass). The slicing
// (cluster size, caching, the vector path) follows the batch and the GPU: the top-p mass sums, and
// so a draw at an exact boundary, may differ between batch sizes; for a given launch they never
// depend on timing.
// Per-row k / p / min_p come from device tensors or scalars, seed / offset from int64 device tensors
// or ints: nothing is read on the host, so a captured CUDA graph replays with the tensors' values.
#include <tvm/ffi/function.h>

#include <cooperative_groups.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "opmux/contracts/sampling.h"
#include "opmux/cuda_utils.cuh"
#include "opmux/sampling_checks.h"
#include "opmux/sampling_philox.h"

namespace opmux {
namespace sampling_cuda {

using cuda::to_float;
using sampling::ordered_key;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 16;    // per pass of the top-p (mass) search: a 16-way split of the key interval
constexpr int kBins8 = 256;  // per pass of the top-k (count) search: a 256-way split
constexpr int kUnroll = 4;   // 16-byte loads in flight per thread in a pass (a pass is load-latency bound)
constexpr int kMaxCluster = 8;  // blocks per row (the portable cluster size)
constexpr int64_t kMinSlice = 4096;  // elements per block of a cluster at least

enum Op { kTopKRenorm, kTopPRenorm, kTopKMask, kGreedy, kTopKTopPSample, kMinPSample };

struct Params {
  const void* x;
  void* out;
  int64_t sx, so, rows, n;
  const void* k_arr;  // nullptr: k_val
  bool k_i64;
  int64_t k_val;
  const float* p_arr;  // nullptr: p_val (top_p or min_p)
  float p_val;
  const int64_t* seed_t;  // nullptr: seed_val
  int64_t seed_val;
  const int64_t* offset_t;
  int64_t offset_val;
  bool joint, vec;
  int cluster;  // blocks per row (1: one block, no cluster)
  bool cached;  // each block copies its slice into dynamic shared memory first (cache_slice)
  bool out_vec;  // the output rows allow 16-byte stores (the renorms and the mask: out's start and row stride)
};

// The part of the row one block owns: [lo, lo + len) of n, lo a multiple of 8 elements (16-byte
// aligned for every dtype when the row is).
struct Slice {
  int64_t lo, len;
  int rank, blocks;
};

__device__ __forceinline__ Slice row_slice(int64_t n, int blocks) {
  const int rank = blocks > 1 ? static_cast<int>(blockIdx.x % blocks) : 0;
  const int64_t per = ((n + blocks - 1) / blocks + 7) / 8 * 8;
  const int64_t lo = per * rank < n ? per * rank : n;
  const int64_t hi = lo + per < n ? lo + per : n;
  return Slice{lo, hi - lo, rank, blocks};
}

struct Smem {
  float f[kWarps];
  int i[kWarps];
  float scan[kWarps];
  // a mass search pass's block totals per bin
  float bin_f[kBins + 1];
  // the cluster's exchange: this block's partials (read by the others), the totals
  float part_f[kBins + 1];
  int64_t part_l[2];
  float tot_f[kBins + 1];
  int64_t tot_l[2];
};

// A 16-byte vector of shared memory at a shared-window address: `ld.shared`, where a generic
// pointer's load goes through the L1TEX path (a long-scoreboard wait each pass over a cached slice).
template <typename T, int VEC>
__device__ __forceinline__ cuda::Vec<T, VEC> load_vec_shared(uint32_t addr) {
  static_assert(sizeof(T) * VEC == 16, "16-byte vectors");
  uint4 u;
  // the clobber keeps it after the writes that filled the slice (cache_slice, the kept lists)
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "r"(addr)
               : "memory");
  cuda::Vec<T, VEC> v;
  memcpy(&v, &u, 16);
  return v;
}

// f(i, v) for the VEC-wide vectors [0, n / VEC) this thread owns, `load(j)` giving vector j;
// kUnroll loads issued before any is used, each thread still visiting its vectors in order.
// Returns the elements covered.
template <typename T, typename L, typename F>
__device__ __forceinline__ int64_t for_each_vecs(int64_t n, L&& load, F&& f) {
  constexpr int VEC = cuda::kVec16<T>;
  const int64_t nv = n / VEC;
  int64_t j = threadIdx.x;
  for (; j + (kUnroll - 1) * kThreads < nv; j += kUnroll * kThreads) {
    cuda::Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load(j + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) f((j + u * kThreads) * VEC + e, to_float(v[u].v[e]));
    }
  }
  for (; j < nv; j += kThreads) {
    const cuda::Vec<T, VEC> v = load(j);
#pragma unroll
    for (int e = 0; e < VEC; ++e) f(j * VEC + e, to_float(v.v[e]));
  }
  return nv * VEC;
}

// Calls f(i, v) for the elements of x[0, n) this thread owns: VEC-wide aligned chunks (when `vec`;
// through `ld.shared` where x is a cached slice or a kept list), then the tail one by one.
// SHARED = false: x is never in shared memory (greedy: no second loop, its registers as before).
template <bool SHARED = true, typename T, typename F>
__device__ __forceinline__ void for_each(const T* x, int64_t n, bool vec, F&& f) {
  constexpr int VEC = cuda::kVec16<T>;
  int64_t done = 0;
  if (vec) {
    if (SHARED && __isShared(x)) {
      const uint32_t xs = static_cast<uint32_t>(__cvta_generic_to_shared(x));
      done = for_each_vecs<T>(
          n, [&](int64_t j) { return load_vec_shared<T, VEC>(xs + static_cast<uint32_t>(j) * 16u); }, f);
    } else {
      done = for_each_vecs<T>(n, [&](int64_t j) { return cuda::load_vec<T, VEC>(x + j * VEC); }, f);
    }
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) f(i, to_float(x[i]));
}

// Copies this block's slice x[0, n) into shared memory (buf: 16-byte aligned, room for n) and
// returns it: every later pass over the row (the threshold searches, the kept mass, the draw, the
// output) then reads shared memory instead of global memory, which a row is read from once. A
// bit copy, in 16-byte vectors where the row allows them (4x fewer shared-memory stores than one
// value at a time: measured on an H100 with the output pass's vectors and the renorms' kept mass
// without the last index, the top-k renorm 0.87-0.92x and the top-p renorm 0.77-0.99x their earlier
// time; docs/benchmarks/sampling_h200.md).
template <typename T>
__device__ __forceinline__ const T* cache_slice(const T* x, int64_t n, bool vec, T* buf) {
  constexpr int VEC = cuda::kVec16<T>;
  int done = 0;
  if (vec) {
    // 16-byte vectors, kUnroll loads in flight per thread (a slice is < 2^31 elements: it fits shared memory)
    const int nv = static_cast<int>(n / VEC);
    int j = threadIdx.x;
    for (; j + (kUnroll - 1) * kThreads < nv; j += kUnroll * kThreads) {
      cuda::Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = cuda::load_vec<T, VEC>(x + (j + u * kThreads) * VEC);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cuda::store_vec(buf + (j + u * kThreads) * VEC, v[u]);
    }
    for (; j < nv; j += kThreads) cuda::store_vec(buf + j * VEC, cuda::load_vec<T, VEC>(x + j * VEC));
    done = nv * VEC;
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < n; i += kThreads) buf[i] = x[i];
  __syncthreads();
  return buf;
}

// out[i] = f(x[i]) over this block's slice [0, n): 16-byte vectors where both rows allow it (`vec`:
// x's and out's slice starts aligned, a slice starting at a multiple of 8 elements), then the tail
// one by one. The renorms' and the mask's output pass: a quarter of the scalar pass's stores.
template <typename T, typename F>
__device__ __forceinline__ void map_slice(const T* x, T* out, int64_t n, bool vec, F&& f) {
  constexpr int VEC = cuda::kVec16<T>;
  int64_t done = 0;
  if (vec) {
    const int64_t nv = n / VEC;
    for (int64_t j = threadIdx.x; j < nv; j += kThreads) {
      const cuda::Vec<T, VEC> v = cuda::load_vec<T, VEC>(x + j * VEC);
      cuda::Vec<T, VEC> o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = f(v.v[e]);
      cuda::store_vec(out + j * VEC, o);
    }
    done = nv * VEC;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) out[i] = f(x[i]);
}

// Sums v[0, N) over the block (every thread gets the sums), in a fixed order.
template <int N, typename S>
__device__ __forceinline__ void block_sum(S (&v)[N], S* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    S a = v[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) red[warp * N + j] = a;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    S a = 0;
    for (int w = 0; w < kWarps; ++w) a += red[w * N + j];
    v[j] = a;
  }
  __syncthreads();
}

// The cluster's sums of v[0, N) (every block's block_sum result), added in rank order: every block
// of the cluster gets the same totals. The two cluster barriers also order the exchange against
// the next one's writes.
template <int N, typename S>
__device__ __forceinline__ void cluster_sum(S (&v)[N], S* part, S* tot, const Slice& sl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (sl.blocks == 1) return;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) part[j] = v[j];
  }
  cl.sync();
  if (threadIdx.x < N) {
    S a = 0;
    for (int b = 0; b < sl.blocks; ++b) a += cl.map_shared_rank(part, b)[threadIdx.x];
    tot[threadIdx.x] = a;
  }
  cl.sync();
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = tot[j];
#else
  if (sl.blocks > 1) __trap();  // a cluster launch needs the sm_90 code (the host checks the binary)
#endif
}

// The cluster's sum of `own` (each block's total) in rank order, and the running sums just
// before and just after this block's term: one block's `after` is bitwise the next one's `before`,
// so the intervals [before, after) tile [0, total) without gaps.
__device__ __forceinline__ float cluster_prefix(float own, float* before, float* after, Smem& sm, const Slice& sl) {
  *before = 0.0f;
  *after = own;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (sl.blocks == 1) return own;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) sm.part_f[0] = own;
  cl.sync();
  if (threadIdx.x == 0) {
    float a = 0.0f, b4 = 0.0f, aft = 0.0f;
    for (int b = 0; b < sl.blocks; ++b) {
      if (b == sl.rank) b4 = a;
      a += cl.map_shared_rank(sm.part_f, b)[0];
      if (b == sl.rank) aft = a;
    }
    sm.tot_f[0] = a;
    sm.tot_f[1] = b4;
    sm.tot_f[2] = aft;
  }
  cl.sync();
  *before = sm.tot_f[1];
  *after = sm.tot_f[2];
  return sm.tot_f[0];
#else
  if (sl.blocks > 1) __trap();  // a cluster launch needs the sm_90 code (the host checks the binary)
  return own;
#endif
}

// The cluster's extreme of an int64 (max, or min when MIN) over the blocks' values.
template <bool MIN>
__device__ __forceinline__ int64_t cluster_extreme(int64_t v, Smem& sm, const Slice& sl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (sl.blocks == 1) return v;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) sm.part_l[0] = v;
  cl.sync();
  if (threadIdx.x == 0) {
    int64_t a = v;
    for (int b = 0; b < sl.blocks; ++b) {
      const int64_t o = cl.map_shared_rank(sm.part_l, b)[0];
      a = MIN ? (o < a ? o : a) : (o > a ? o : a);
    }
    sm.tot_l[0] = a;
  }
  cl.sync();
  return sm.tot_l[0];
#else
  if (sl.blocks > 1) __trap();  // a cluster launch needs the sm_90 code (the host checks the binary)
  return v;
#endif
}

// A count search pass's memory: per-warp histograms (kBins8 digit bins and one for the keys above
// the digit, shared-memory atomics: integer sums do not depend on their order), the block's totals
// (16-byte aligned: the choice reads them as int4) and its partials for the cluster's exchange.
struct Count8 {
  __align__(16) int tot[kBins8 + 1];
  int part[2][kBins8 + 1];  // alternate passes' (one cluster barrier a pass: count_search)
  int w[kWarps][kBins8 + 1];
};

// The passes' histograms, either search's. Mass: one private column per thread, bin-major and
// thread-minor (thread t's bins at [b][t], all in its own bank: no conflicts, no atomics).
// The top-k-first draw's kept entries: a block's own (slice order) and the cluster's union of them
// (rank order: row order), values and row positions. They replace the histograms (the count
// search is over when they are written, and the union's path runs no mass search).
constexpr int kListCap = 1024;
struct KeptLists {
  __align__(16) float v[kListCap];
  int32_t pos[kListCap];
  __align__(16) float uv[kListCap];
  int32_t upos[kListCap];
  int count;  // this block's entries (-1: more than kListCap), read by the cluster
};

union Hist {
  float f[kBins + 1][kThreads];
  Count8 c8;
  KeptLists kept;
};
static_assert(sizeof(Count8) <= sizeof(float) * (kBins + 1) * kThreads, "the count search fits the mass columns");
static_assert(sizeof(KeptLists) <= sizeof(float) * (kBins + 1) * kThreads, "the kept lists fit the mass columns");

// One array for every search of a kernel (a non-template function: the searches' instantiations share
// it, and the kernels without a search allocate none).
__device__ __forceinline__ Hist& hist_smem() {
  __shared__ Hist h;
  return h;
}

// One more in the shared-memory counter at `addr` (a shared-window address) where `on`: a
// predicated reduction, no branch. Through a generic pointer the compiler re-derived the address
// (the cluster's shared window: a special-register read) and branched around each atomic, about
// 12 instructions an entry of the count search's first pass.
__device__ __forceinline__ void count_in(uint32_t addr, bool on) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t@p red.shared.add.u32 [%0], 1;\n\t}" ::"r"(addr),
      "r"(static_cast<uint32_t>(on))
      : "memory");
}

// The count search (top-k: the largest key t with count(>= t) >= need): passes of 8 bits (31-bit keys: 8, 8, 8, 7; 32-bit:
// 4 x 8), the keys of [lo, lo + span) counted into nb = min(256, span) bins of width 2^shift (keys at
// or past lo + span in bin 256, or a bin in [nb, 256], above every lower end), then the largest j in
// [1, nb) with count(>= lo + j * width) >= need, else 0. Every block of a cluster sums the same
// totals (rank order) and so takes the same j.
template <bool LOGITS, typename T>
__device__ int64_t count_search(const T* x, int64_t n, bool vec, int64_t lo, int bits, double need,
                                const Slice& sl) {
  Count8& c = hist_smem().c8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int* hw = c.w[warp];
  const uint32_t hw_s = static_cast<uint32_t>(__cvta_generic_to_shared(hw));
  int pass = 0;
  while (bits > 0) {
    const int shift = bits > 8 ? bits - 8 : 0;
    const int nb = 1 << (bits - shift);
    const int32_t lo32 = static_cast<int32_t>(lo);  // lo < 2^31
    // the warp's own histogram: the previous pass's readers are past its closing barrier
    for (int b = lane; b <= kBins8; b += 32) hw[b] = 0;
    __syncwarp();
    for_each(x, n, vec, [&](int64_t, float v) {
      const int32_t k = LOGITS ? ordered_key(v) : __float_as_int(v);
      // k - lo < 2^32: exact in 32-bit unsigned arithmetic
      const uint32_t off = static_cast<uint32_t>(k) - static_cast<uint32_t>(lo32);
      count_in(hw_s + 4u * min(off >> shift, static_cast<uint32_t>(kBins8)), k >= lo32);
    });
    __syncthreads();
    // the block's totals (thread b sums bin b over the warps), then the cluster's in rank order
    int a = 0;
    if (threadIdx.x <= kBins8) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) a += c.w[w][threadIdx.x];
    }
    if (sl.blocks == 1) {
      if (threadIdx.x <= kBins8) c.tot[threadIdx.x] = a;
      __syncthreads();
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // one cluster barrier a pass: the partials alternate buffers, so a block writes this pass's
      // while another may still read the last pass's; the buffer it wrote two passes ago was read
      // by every block before that block arrived at the last pass's barrier
      namespace cg = cooperative_groups;
      cg::cluster_group cl = cg::this_cluster();
      int* part = c.part[pass & 1];
      if (threadIdx.x <= kBins8) part[threadIdx.x] = a;
      cl.sync();
      if (threadIdx.x <= kBins8) {
        int s = 0;
        for (int r = 0; r < sl.blocks; ++r) s += cl.map_shared_rank(part, r)[threadIdx.x];
        c.tot[threadIdx.x] = s;
      }
      __syncthreads();
#else
      __trap();  // a cluster launch needs the sm_90 code (the host checks the binary)
#endif
    }
    // the choice, in every warp alike: lane l holds bins [8l, 8l + 8); count(>= lo + j * width) is
    // the bins from j up (bin 0's lower end is lo, kept by the invariant)
    const int4 q0 = reinterpret_cast<const int4*>(c.tot)[2 * lane];
    const int4 q1 = reinterpret_cast<const int4*>(c.tot)[2 * lane + 1];
    const int q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int own = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) own += q[e];
    int suf = own;  // the lanes from this one up
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_down_sync(0xffffffffu, suf, o);
      if (lane + o < 32) suf += y;
    }
    int s = suf - own + c.tot[kBins8];
    int j = 0;
#pragma unroll
    for (int e = 7; e >= 0; --e) {
      s += q[e];
      const int b = 8 * lane + e;
      if (j == 0 && b >= 1 && b < nb && static_cast<double>(s) >= need) j = b;
    }
    // the lanes' bins ascend with the lane: the highest lane with a j has the largest
    const unsigned has = __ballot_sync(0xffffffffu, j != 0);
    j = has != 0 ? __shfl_sync(0xffffffffu, j, 31 - __clz(static_cast<int>(has))) : 0;
    lo += static_cast<int64_t>(j) << shift;
    bits = shift;
    ++pass;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the other blocks' reads of this block's last partials end before it goes on (its shared memory
  // is reused, or the block exits)
  if (sl.blocks > 1) cooperative_groups::this_cluster().sync();
#endif
  return lo;
}

// The mass search: the largest probability key t with mass(>= t) >= need, given mass(>= lo) >=
// need > mass(>= lo + 2^bits); lo + 2^bits <= 2^31 and lo a multiple of 2^bits: a radix digit (as
// count_search's). Each pass sums the mass of the keys of [lo, lo + span) into nb = min(16, span)
// bins of width 2^shift (keys at or past lo + span in bin 16, counted for every bin's lower end;
// keys below lo skipped), then keeps the highest bin whose lower end still has mass >= need. The
// key is the value's bits, negative for a negative value (skipped, as its ordered key would be) and
// for -0 (whose ordered key 0 only ever counts toward mass(>= 0), at lo = 0, the bin-0 end that
// needs no test).
__device__ int64_t mass_search(const float* x, int64_t n, bool vec, int64_t lo, int bits, double need, Smem& sm,
                               const Slice& sl) {
  using S = float;
  S(*hist)[kThreads] = hist_smem().f;
  S* bins = sm.bin_f;
  S* part = sm.part_f;
  S* tot = sm.tot_f;
  S* col = &hist[0][threadIdx.x];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  while (bits > 0) {
    const int shift = bits > 4 ? bits - 4 : 0;
    const int nb = 1 << (bits - shift);
    const int32_t lo32 = static_cast<int32_t>(lo);  // lo < 2^31
#pragma unroll
    for (int b = 0; b <= kBins; ++b) col[b * kThreads] = 0;
    for_each(x, n, vec, [&](int64_t, float v) {
      const int32_t k = __float_as_int(v);
      if (k >= lo32) {
        // k - lo < 2^32: exact in 32-bit unsigned arithmetic; past lo + span: bin 16 (nb = 16) or
        // a bin in [nb, 16] (span < 16), above every lower end in both cases
        const uint32_t off = static_cast<uint32_t>(k) - static_cast<uint32_t>(lo32);
        const uint32_t b = min(off >> shift, static_cast<uint32_t>(kBins));
        col[b * kThreads] += v;
      }
    });
    __syncthreads();
    // the block's bins in a fixed order: warp w sums bin w (warp 0 also bin 16), lanes stride 32
    for (int b = warp; b <= kBins; b += kWarps) {
      S a = 0;
#pragma unroll
      for (int t = 0; t < kThreads / 32; ++t) a += hist[b][lane + 32 * t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) bins[b] = a;
    }
    __syncthreads();
    S v[kBins + 1];
#pragma unroll
    for (int b = 0; b <= kBins; ++b) v[b] = bins[b];
    cluster_sum(v, part, tot, sl);
    // stat(>= lo + j * width) = the bins from j up; bin 0's lower end is lo (kept by the
    // invariant, also should the float sums round it below need)
    S s = v[kBins];
    int j = 0;
#pragma unroll
    for (int b = kBins - 1; b >= 1; --b) {
      s += v[b];
      if (j == 0 && b < nb && static_cast<double>(s) >= need) j = b;
    }
    lo += static_cast<int64_t>(j) << shift;
    bits = shift;
  }
  return lo;
}

// The kept mass (key >= t) of the row and the last kept positive index of the row (-1: none);
// with `own`, this block's share: the running mass before and after its slice (0 and the mass
// without a cluster) and its slice's last kept positive index (row-global; -1: none).
struct OwnMass {
  float before, after;
  int64_t last;
};

// x[i] is the row's entry at sl.lo + (pos ? pos[i] : i) (pos: a kept list's positions, ascending).
// LAST = false: the mass alone (the renorms: no index tracking, one cluster exchange fewer; `last`
// and `own` unused).
template <bool LAST = true, typename T>
__device__ void kept_mass(const T* x, int64_t n, bool vec, int32_t t, Smem& sm, float* mass, int64_t* last,
                          const Slice& sl, OwnMass* own = nullptr, const int32_t* pos = nullptr) {
  float m[1] = {0.0f};
  int64_t l = -1;
  for_each(x, n, vec, [&](int64_t i, float v) {
    if (ordered_key(v) >= t) {
      m[0] += v;
      if constexpr (LAST) {
        const int64_t at = pos != nullptr ? pos[i] : i;
        if (v > 0.0f && at > l) l = at;
      }
    }
  });
  block_sum(m, sm.f);
  float before, after;
  m[0] = cluster_prefix(m[0], &before, &after, sm, sl);
  *mass = m[0];
  if constexpr (LAST) {
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t other = __shfl_xor_sync(0xffffffffu, l, o);
      l = other > l ? other : l;
    }
    __shared__ int64_t lred[kWarps];
    if ((threadIdx.x & 31) == 0) lred[threadIdx.x >> 5] = l;
    __syncthreads();
    l = -1;
    for (int w = 0; w < kWarps; ++w) l = lred[w] > l ? lred[w] : l;
    __syncthreads();
    l = l < 0 ? -1 : l + sl.lo;
    *last = cluster_extreme<false>(l, sm, sl);
    if (own != nullptr) *own = OwnMass{before, after, l};
  }
}

// Exclusive prefix sum of v over the block (threads in order); *total gets the block's sum. red:
// kWarps of scratch (Smem's scan or i).
template <typename S>
__device__ __forceinline__ S block_exclusive_scan(S v, S* red, S* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  S inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const S y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  S before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += red[w];
    all += red[w];
  }
  __syncthreads();
  *total = all;
  return before + inc - v;
}

// x[i0, i0 + 4) into q (a 16-byte load when `vec` and all four are in [0, n); 0 past n): the
// chunked scans' loads (4 entries a thread).
__device__ __forceinline__ void load4(const float* x, int64_t i0, int64_t n, bool vec, float (&q)[4]) {
  if (vec && i0 + 4 <= n) {
    const cuda::Vec<float, 4> v = cuda::load_vec<float, 4>(x + i0);
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = v.v[e];
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = i0 + e < n ? x[i0 + e] : 0.0f;
  }
}

// Inverse CDF over the entries with key >= t; returns the id (every thread). x: this block's slice,
// or kept entries (pos: their positions, ascending, as kept_mass's).
__device__ int32_t draw(const float* x, int64_t n, bool vec, int32_t t, float u, Smem& sm, const Slice& sl,
                        const int32_t* pos = nullptr) {
  float mass;
  int64_t last;
  OwnMass own;
  kept_mass(x, n, vec, t, sm, &mass, &last, sl, &own, pos);
  const float target = u * mass;
  // the one block whose running-mass interval holds the target scans (all of the row without a
  // cluster); should its own sums not cross it (float rounding), its slice's last kept entry is
  // the draw, as the whole row's is for one block
  const bool mine = own.before <= target && target < own.after;
  constexpr int VEC = 4;
  const int64_t chunk = static_cast<int64_t>(kThreads) * VEC;
  float carry = own.before;
  __shared__ int64_t found_red[kWarps];
  int64_t found = mine ? own.last : INT64_MAX;
  for (int64_t base = 0; base < n && mine; base += chunk) {
    const int64_t i0 = base + static_cast<int64_t>(threadIdx.x) * VEC;
    float q[VEC];
    load4(x, i0, n, vec, q);
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      q[e] = (i0 + e < n && ordered_key(q[e]) >= t && q[e] > 0.0f) ? q[e] : 0.0f;
      s += q[e];
    }
    float total;
    float c = carry + block_exclusive_scan(s, sm.scan, &total);
    int64_t hit = INT64_MAX;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      c += q[e];
      if (q[e] > 0.0f && c > target && hit == INT64_MAX) hit = i0 + e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t other = __shfl_xor_sync(0xffffffffu, hit, o);
      hit = other < hit ? other : hit;
    }
    if ((threadIdx.x & 31) == 0) found_red[threadIdx.x >> 5] = hit;
    __syncthreads();
    hit = INT64_MAX;
    for (int w = 0; w < kWarps; ++w) hit = found_red[w] < hit ? found_red[w] : hit;
    __syncthreads();
    if (hit != INT64_MAX) {
      found = (pos != nullptr ? pos[hit] : hit) + sl.lo;
      break;
    }
    carry += total;
  }
  found = cluster_extreme<true>(found, sm, sl);  // one owner at most
  if (found != INT64_MAX && found >= 0) return static_cast<int32_t>(found);
  return static_cast<int32_t>(last < 0 ? 0 : last);
}

// Copies the entries of the slice x[0, n) with key >= t into kl (values, row positions lo + i) in
// slice order (chunks of 4 entries a thread, a block scan where a chunk keeps any) and returns their
// count, or -1 past kListCap (block-uniform).
__device__ int gather_kept(const float* x, int64_t n, bool vec, int32_t t, int64_t lo, KeptLists& kl, Smem& sm) {
  constexpr int VEC = 4;
  const int64_t chunk = static_cast<int64_t>(kThreads) * VEC;
  int count = 0;
  for (int64_t base = 0; base < n; base += chunk) {
    const int64_t i0 = base + static_cast<int64_t>(threadIdx.x) * VEC;
    float q[VEC];
    load4(x, i0, n, vec, q);
    int c = 0;
#pragma unroll
    for (int e = 0; e < VEC; ++e) c += (i0 + e < n && ordered_key(q[e]) >= t) ? 1 : 0;
    if (__syncthreads_count(c) == 0) continue;  // most chunks keep nothing: one barrier
    int total;
    int at = count + block_exclusive_scan(c, sm.i, &total);
    if (count + total > kListCap) return -1;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (i0 + e < n && ordered_key(q[e]) >= t) {
        kl.v[at] = q[e];
        kl.pos[at] = static_cast<int32_t>(lo + i0 + e);
        ++at;
      }
    }
    count += total;
  }
  __syncthreads();
  return count;
}

// The cluster's kept entries in every block: the blocks' lists (own: this block's count, -1 when
// its list overflowed) copied in rank order into kl.uv / kl.upos (one block: its own list, in
// place). Returns their number, or -1 where a list overflowed or the union passes kListCap (the
// same answer in every block).
__device__ int kept_union(KeptLists& kl, int own, const Slice& sl) {
  if (sl.blocks == 1) return own;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) kl.count = own;
  cl.sync();
  int total = 0;
  bool ok = true;
  for (int b = 0; b < sl.blocks; ++b) {
    const int c = cl.map_shared_rank(&kl.count, b)[0];
    ok = ok && c >= 0;
    total += c > 0 ? c : 0;
  }
  ok = ok && total <= kListCap;
  if (ok) {
    int at = 0;
    for (int b = 0; b < sl.blocks; ++b) {
      const KeptLists* other = cl.map_shared_rank(&kl, b);
      const int c = other->count;
      for (int i = threadIdx.x; i < c; i += kThreads) {
        kl.uv[at + i] = other->v[i];
        kl.upos[at + i] = other->pos[i];
      }
      at += c;
    }
  }
  cl.sync();  // every read of another block's list is done before any block moves on (or exits)
  return ok ? total : -1;
#else
  __trap();  // a cluster launch needs the sm_90 code (the host checks the binary)
  return -1;
#endif
}

// The top-p boundary key over m entries that top-k kept (keys >= base, so values >= 0): the
// largest key t with mass(>= t) >= p * mass, each entry's mass(>= v_i) summed over the entries in
// order (m^2 / kThreads steps a thread, two entries a pass: fixed order, no search passes),
// else base (as top_p_key).
__device__ int32_t top_p_key_kept(const float* v, int m, int32_t base, float p, Smem& sm) {
  float tot[1] = {0.0f};
  for (int i = threadIdx.x; i < m; i += kThreads) tot[0] += v[i];
  block_sum(tot, sm.f);
  const float need = p * tot[0];
  if (!(need > 0.0f)) return base;
  int32_t best = INT32_MIN;
  // two entries a thread in one pass over j (two independent chains; each sum's order unchanged)
  for (int i = threadIdx.x; i < m; i += 2 * kThreads) {
    const int i2 = i + kThreads;
    const float v0 = v[i], v1 = i2 < m ? v[i2] : INFINITY;
    float s0 = 0.0f, s1 = 0.0f;
    for (int j = 0; j < m; ++j) {
      const float vj = v[j];
      s0 += vj >= v0 ? vj : 0.0f;
      s1 += vj >= v1 ? vj : 0.0f;
    }
    if (s0 >= need) best = max(best, ordered_key(v0));
    if (i2 < m && s1 >= need) best = max(best, ordered_key(v1));
  }
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if ((threadIdx.x & 31) == 0) sm.i[threadIdx.x >> 5] = best;
  __syncthreads();
  best = INT32_MIN;
  for (int w = 0; w < kWarps; ++w) best = max(best, sm.i[w]);
  __syncthreads();
  return best > base ? best : base;
}

__device__ __forceinline__ int64_t row_k(const Params& p, int64_t r) {
  if (p.k_arr == nullptr) return p.k_val;
  return p.k_i64 ? static_cast<const int64_t*>(p.k_arr)[r] : static_cast<const int32_t*>(p.k_arr)[r];
}
__device__ __forceinline__ float row_p(const Params& p, int64_t r) {
  return p.p_arr == nullptr ? p.p_val : p.p_arr[r];
}
__device__ __forceinline__ float row_uniform(const Params& p, int64_t r) {
  const int64_t seed = p.seed_t != nullptr ? *p.seed_t : p.seed_val;
  const int64_t offset = p.offset_t != nullptr ? *p.offset_t : p.offset_val;
  return sampling::uniform(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), r);
}

// The searches' first digits: probability keys in [0, 2^31) (a negative value's key is below 0:
// never counted, never kept), logit keys in [-2^31, 2^31).
constexpr int64_t kProbLo = 0, kLogitLo = -2147483648LL;
constexpr int kProbBits = 31, kLogitBits = 32;

template <bool LOGITS, typename T>
__device__ int32_t top_k_key(const T* x, int64_t n, bool vec, int64_t k, const Slice& sl) {
  return static_cast<int32_t>(count_search<LOGITS>(x, n, vec, LOGITS ? kLogitLo : kProbLo,
                                                   LOGITS ? kLogitBits : kProbBits, static_cast<double>(k), sl));
}

// The top-p boundary key over the values with key >= base.
__device__ int32_t top_p_key(const float* x, int64_t n, bool vec, int32_t base, float p, Smem& sm, const Slice& sl) {
  float mass;
  int64_t last;
  kept_mass(x, n, vec, base, sm, &mass, &last, sl);
  // no mass above base (an all-zero row): the whole row is kept, as the definition does (its
  // renorm is then 0 / 0, NaN, as the reference's); NaN mass likewise keeps the row
  if (!(p * mass > 0.0f)) return base;
  // the search starts at key 0 (the digit holding base); stat(>= base) >= p * mass, so its answer
  // is >= base unless the search's float sums round stat(>= base) below p * mass: then base, as a
  // search started at base ends
  const int64_t t = mass_search(x, n, vec, kProbLo, kProbBits, static_cast<double>(p * mass), sm, sl);
  return static_cast<int32_t>(t > base ? t : base);
}

template <Op OP, typename T>
__global__ void __launch_bounds__(kThreads) sampling_kernel(Params p) {
  cuda::pdl_enter();
  __shared__ Smem sm;
  const int64_t r = blockIdx.x / p.cluster;
  const int64_t n = p.n;  // the row's length; the block reads its slice [sl.lo, sl.lo + sl.len)
  const Slice sl = row_slice(n, p.cluster);
  const T* row = static_cast<const T*>(p.x) + r * p.sx;
  const T* x = row + sl.lo;
  const int64_t len = sl.len;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  bool vec = p.vec;
  if (p.cached) {  // the slice in shared memory (16-byte aligned: the vector path always holds)
    x = cache_slice(x, len, vec, reinterpret_cast<T*>(dyn_smem));
    vec = true;
  }
  if constexpr (OP == kGreedy) {
    float best = -INFINITY;
    int64_t idx = INT64_MAX;
    for_each<false>(x, len, vec, [&](int64_t i, float v) {
      if (v > best || (v == best && i < idx)) {
        best = v;
        idx = i;
      }
    });
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ob > best || (ob == best && oi < idx)) {
        best = ob;
        idx = oi;
      }
    }
    __shared__ float bred[kWarps];
    __shared__ int64_t ired[kWarps];
    if ((threadIdx.x & 31) == 0) {
      bred[threadIdx.x >> 5] = best;
      ired[threadIdx.x >> 5] = idx;
    }
    __syncthreads();
    for (int w = 0; w < kWarps; ++w) {
      if (bred[w] > best || (bred[w] == best && ired[w] < idx)) {
        best = bred[w];
        idx = ired[w];
      }
    }
    // the cluster: the largest value (NaN-free keys order it), then the lowest index holding it
    const int64_t key = cluster_extreme<false>(idx == INT64_MAX ? INT64_MIN : ordered_key(best + 0.0f), sm, sl);
    idx = (idx != INT64_MAX && ordered_key(best + 0.0f) == key) ? idx + sl.lo : INT64_MAX;
    idx = cluster_extreme<true>(idx, sm, sl);
    if (threadIdx.x == 0 && sl.rank == 0) {
      static_cast<int32_t*>(p.out)[r] = static_cast<int32_t>(idx == INT64_MAX ? 0 : idx);
    }
  } else if constexpr (OP == kTopKMask) {
    T* out = static_cast<T*>(p.out) + r * p.so + sl.lo;
    const int64_t k = row_k(p, r);
    const bool on = k > 0 && k < n;
    const int32_t t = on ? top_k_key<true>(x, len, vec, k, sl) : INT32_MIN;
    const T ninf = cuda::from_float<T>(-INFINITY);
    map_slice(x, out, len, vec && p.out_vec, [&](T v) { return ordered_key(to_float(v)) >= t ? v : ninf; });
  } else if constexpr (OP == kTopKRenorm || OP == kTopPRenorm) {
    float* out = static_cast<float*>(p.out) + r * p.so + sl.lo;
    const float* xf = reinterpret_cast<const float*>(x);
    int32_t t = 0;
    bool on;
    if constexpr (OP == kTopKRenorm) {
      const int64_t k = row_k(p, r);
      on = k > 0 && k < n;
      if (on) t = top_k_key<false>(xf, len, vec, k, sl);
    } else {
      const float pr = row_p(p, r);
      on = pr < 1.0f;
      if (on) t = top_p_key(xf, len, vec, 0, pr, sm, sl);
    }
    if (!on) {
      map_slice(xf, out, len, vec && p.out_vec, [](float v) { return v; });
      return;
    }
    float mass;
    kept_mass<false>(xf, len, vec, t, sm, &mass, nullptr, sl);
    const float inv = 1.0f / mass;
    map_slice(xf, out, len, vec && p.out_vec, [&](float v) { return ordered_key(v) >= t ? v * inv : 0.0f; });
  } else if constexpr (OP == kTopKTopPSample) {
    const float* xf = reinterpret_cast<const float*>(x);
    const int64_t k = row_k(p, r);
    const float pr = row_p(p, r);
    int32_t t = static_cast<int32_t>(kProbLo);
    const bool top_k = k > 0 && k < n;
    if (top_k) t = top_k_key<false>(xf, len, vec, k, sl);
    // top-k first: where the cluster's kept entries fit a list, every block holds them all and
    // finds the top-p boundary and the draw over them alone (no cluster exchange after the union)
    KeptLists& kl = hist_smem().kept;
    const int m = top_k && !p.joint ? kept_union(kl, gather_kept(xf, len, vec, t, sl.lo, kl, sm), sl) : -1;
    int32_t id;
    if (m >= 0) {
      const float* v = sl.blocks == 1 ? kl.v : kl.uv;
      const int32_t* at = sl.blocks == 1 ? kl.pos : kl.upos;
      if (pr < 1.0f) t = top_p_key_kept(v, m, t, pr, sm);
      id = draw(v, m, true, t, row_uniform(p, r), sm, Slice{0, m, 0, 1}, at);
    } else {
      if (pr < 1.0f) {
        const int32_t tp = top_p_key(xf, len, vec, p.joint ? static_cast<int32_t>(kProbLo) : t, pr, sm, sl);
        t = p.joint ? (tp > t ? tp : t) : tp;
      }
      id = draw(xf, len, vec, t, row_uniform(p, r), sm, sl);
    }
    if (threadIdx.x == 0 && sl.rank == 0) static_cast<int32_t*>(p.out)[r] = id;
  } else {  // kMinPSample
    const float* xf = reinterpret_cast<const float*>(x);
    float top[1] = {0.0f};
    for_each(xf, len, vec, [&](int64_t, float v) { top[0] = v > top[0] ? v : top[0]; });
    for (int o = 16; o > 0; o >>= 1) top[0] = fmaxf(top[0], __shfl_xor_sync(0xffffffffu, top[0], o));
    if ((threadIdx.x & 31) == 0) sm.f[threadIdx.x >> 5] = top[0];
    __syncthreads();
    for (int w = 0; w < kWarps; ++w) top[0] = fmaxf(top[0], sm.f[w]);
    __syncthreads();
    // a non-negative float orders as its bits: the cluster's max through the int64 exchange
    top[0] = __int_as_float(static_cast<int>(cluster_extreme<false>(__float_as_int(top[0]), sm, sl)));
    const int32_t t0 = ordered_key(row_p(p, r) * top[0]);
    const int32_t id = draw(xf, len, vec, t0 > 0 ? t0 : 0, row_uniform(p, r), sm, sl);
    if (threadIdx.x == 0 && sl.rank == 0) static_cast<int32_t*>(p.out)[r] = id;
  }
}

// 16-byte loads need every row start aligned: the base and the row stride.
template <typename T>
bool vec_ok(const void* base, int64_t stride) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % VEC == 0;
}

// Blocks per row wanted: one, unless the rows leave most SMs idle and the rows are long (sm_90
// clusters): then up to kMaxCluster, a power of two, each slice at least kMinSlice elements
// (cuda::cluster_blocks then checks the binary and the GPU).
int blocks_per_row(const cuda::DeviceProps& props, int64_t rows, int64_t n) {
  if (props.cc_major < 9) return 1;
  int c = 1;
  while (c < kMaxCluster && rows * c * 2 <= props.sm_count && n >= kMinSlice * c * 2) c *= 2;
  return c;
}

// Elements of a row's slice over `blocks` blocks (row_slice's arithmetic).
int64_t slice_len(int64_t n, int blocks) { return ((n + blocks - 1) / blocks + 7) / 8 * 8; }

// The fewest blocks per row (a power of two up to kMaxCluster; more than one only with clusters)
// whose slices fit `room` bytes of shared memory, or 0: the rows are not cached.
template <typename T>
int cache_blocks(const cuda::DeviceProps& props, int64_t n, int64_t room) {
  for (int c = 1; c <= (props.cc_major >= 9 ? kMaxCluster : 1); c *= 2) {
    if (slice_len(n, c) * static_cast<int64_t>(sizeof(T)) <= room) return c;
  }
  return 0;
}

// Where blocks cache their slices (OPMUX_SAMPLING_SMEM_CACHE, read once per process; the A/B of
// benchmarks/bench_sampling.py): kAuto, cached_blocks' rule; kOneWave, only where the cached blocks
// fit one wave; kWaves, also over several waves whatever the rows' size; kOff, never.
enum class CachePolicy { kAuto, kOneWave, kWaves, kOff };

// The knob's value (trimmed, lower case; unset or empty: auto), or -1 for a spelling that is none
// of the registry's choices (opmux/kernels/_env.py: SAMPLING_SMEM_CACHE).
int parse_cache_policy(std::string v) {
  const auto space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
  while (!v.empty() && space(v.back())) v.pop_back();
  size_t i = 0;
  while (i < v.size() && space(v[i])) ++i;
  v = v.substr(i);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v.empty() || v == "auto") return static_cast<int>(CachePolicy::kAuto);
  if (v == "one-wave") return static_cast<int>(CachePolicy::kOneWave);
  if (v == "waves") return static_cast<int>(CachePolicy::kWaves);
  if (v == "off") return static_cast<int>(CachePolicy::kOff);
  return -1;
}

CachePolicy cache_policy(const char* op) {
  static const char* raw = std::getenv("OPMUX_SAMPLING_SMEM_CACHE");
  static const int policy = raw == nullptr ? static_cast<int>(CachePolicy::kAuto) : parse_cache_policy(raw);
  if (policy < 0) {
    TVM_FFI_THROW(ValueError) << op << ": OPMUX_SAMPLING_SMEM_CACHE must be one of auto, one-wave, waves, off; got '"
                              << raw << "'";
  }
  return static_cast<CachePolicy>(policy);
}

// The static shared memory of sampling_kernel<OP, T> (its searches' histograms), with its dynamic
// shared memory opted in to what the SM leaves once per device (a launch asks for its slices only)
// and the carveout at its maximum (two cached blocks an SM need most of it). The statics are per
// instantiation: each kernel has its own static shared memory and its own opt-in.
template <Op OP, typename T>
int static_smem_for(const char* op, int32_t device_id, const cuda::DeviceProps& props) {
  auto kernel = sampling_kernel<OP, T>;
  // per device (each may run another architecture's binary); a device id past the table asks
  // every launch. Races between threads write the same values.
  constexpr int kDevices = 64;
  static int static_smem[kDevices] = {};  // + 1: 0 is "not read yet"
  static bool opted[kDevices] = {};
  const bool listed = device_id >= 0 && device_id < kDevices;
  int own = listed ? static_smem[device_id] - 1 : -1;
  if (own < 0) {
    cudaFuncAttributes attr;
    cuda::check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)), op,
                     "cudaFuncGetAttributes");
    own = static_cast<int>(attr.sharedSizeBytes);
    if (listed) static_smem[device_id] = own + 1;
  }
  const int room = props.smem_optin - own;
  if (room > 0 && !(listed && opted[device_id])) {
    const void* f = reinterpret_cast<const void*>(kernel);
    cuda::check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, room), op,
                     "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    cuda::check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          static_cast<int>(cudaSharedmemCarveoutMaxShared)),
                     op, "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
    if (listed) opted[device_id] = true;
  }
  return own;
}

// Blocks of sampling_kernel<OP, T> an SM holds with `smem` bytes of dynamic shared memory (its
// registers and shared memory; the carveout as static_smem_for sets it), asked once per device and size.
template <Op OP, typename T>
int blocks_per_sm(const char* op, int32_t device_id, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<int32_t, size_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device_id, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  cuda::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, sampling_kernel<OP, T>, kThreads, smem), op,
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return cache[key] = n;
}

// Blocks per row of the cached launch (0: no caching). Every op but greedy (one pass) reads its row
// several times; a block caching its slice in shared memory reads it from global memory once.
//   * Where the cached blocks fit one wave: the fewest blocks whose slices fit a block's room.
//   * Else, for the top-k filters (a count search, then one pass), and for the others where the
//     rows exceed the L2 cache (every pass of an uncached launch would read HBM): the fewest whose
//     slices let two blocks share an SM (one block's copy overlaps the other's passes).
//   * Else none: the passes re-read L2.
// Measured on an H100 (docs/benchmarks/sampling_h200.md): over several waves the top-k filters
// took 0.73-0.92x their uncached time at B = 64 / 256 (rows in L2 or not); the top-p renorm and
// the draw 1.1-1.3x where the rows fit L2 (B = 64 over 128,256 entries: 33 MB of 50), and past it
// (B = 256 over 128,256 / 151,936) the top-p renorm 0.93 / 0.82x its one-wave launch's time. (One
// cached block an SM over two waves had taken 1.3-1.5x.)
template <Op OP, typename T>
int cached_blocks(const char* op, int32_t device_id, const cuda::DeviceProps& props, int64_t rows, int64_t n) {
  if (OP == kGreedy) return 0;
  const CachePolicy policy = cache_policy(op);
  if (policy == CachePolicy::kOff) return 0;
  const int own = static_smem_for<OP, T>(op, device_id, props);
  const int room = props.smem_optin - own;
  int c = room > 0 ? cache_blocks<T>(props, n, room) : 0;
  if (c == 0 || rows * c <= props.sm_count) return c;
  if (policy == CachePolicy::kOneWave) return 0;
  const double bytes = static_cast<double>(rows) * static_cast<double>(n) * sizeof(T);
  constexpr bool kTopKFilter = OP == kTopKMask || OP == kTopKRenorm;
  if (policy == CachePolicy::kAuto && !kTopKFilter && bytes <= static_cast<double>(props.l2_bytes)) return 0;
  const int half = props.smem_per_sm / 2 - props.smem_reserved - own;
  c = half > 0 ? cache_blocks<T>(props, n, half) : 0;
  if (c == 0) return 0;
  // two blocks an SM also need the registers (64 a thread at 512 threads: the draw's kernels use
  // all of them): else the rule's premise fails, and so does the launch it measured
  return blocks_per_sm<OP, T>(op, device_id, static_cast<size_t>(slice_len(n, c)) * sizeof(T)) >= 2 ? c : 0;
}

template <Op OP, typename T>
void launch(const char* op, Params p, int32_t device_id) {
  if (p.rows == 0) return;
  if (p.rows > 2147483647) TVM_FFI_THROW(ValueError) << op << ": " << p.rows << " rows exceed the grid";
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  auto kernel = sampling_kernel<OP, T>;
  p.vec = vec_ok<T>(p.x, p.sx);
  p.out_vec = (OP == kTopKMask || OP == kTopKRenorm || OP == kTopPRenorm) && vec_ok<T>(p.out, p.so);
  int c = blocks_per_row(props, p.rows, p.n);
  int cache_c = cached_blocks<OP, T>(op, device_id, props, p.rows, p.n);
  if (cache_c > c) c = cache_c;
  // the cluster the GPU grants for these slices; fewer blocks than asked make bigger slices, so
  // ask again until the answer stands (without caching once the slices no longer fit)
  size_t smem = 0;
  for (;;) {
    smem = cache_c > 0 ? static_cast<size_t>(slice_len(p.n, c)) * sizeof(T) : 0;
    const int got = cuda::cluster_blocks(op, device_id, props, kernel, dim3(kThreads), smem, c);
    if (got == c) break;
    c = got;
    if (c < cache_c) cache_c = 0;
  }
  p.cluster = c;
  p.cached = cache_c > 0;
  cuda::launch_clustered(op, device_id, props, kernel, dim3(static_cast<unsigned>(p.rows * p.cluster)),
                         dim3(kThreads), smem, cuda::current_stream(device_id), static_cast<unsigned>(p.cluster), p);
}

Params base_params(const TensorView& x, const SampleRows& r) {
  Params p{};
  p.x = data_ptr<const void>(x);
  p.sx = r.stride;
  p.rows = r.rows;
  p.n = r.vocab;
  return p;
}

void set_k(Params& p, const TensorView& k_arr, bool has_k, bool i64, int64_t top_k) {
  p.k_val = top_k;
  p.k_arr = has_k ? data_ptr<const void>(k_arr) : nullptr;
  p.k_i64 = i64;
}

void set_p(Params& p, const TensorView& arr, bool has, double value) {
  p.p_val = static_cast<float>(value);
  p.p_arr = has ? data_ptr<const float>(arr) : nullptr;
}

void set_rng(Params& p, const TensorView& seed_t, bool has_seed, int64_t seed, const TensorView& offset_t,
             bool has_offset, int64_t offset) {
  p.seed_t = has_seed ? data_ptr<const int64_t>(seed_t) : nullptr;
  p.seed_val = seed;
  p.offset_t = has_offset ? data_ptr<const int64_t>(offset_t) : nullptr;
  p.offset_val = offset;
}

void top_k_renorm_probs_cuda(TensorView out, TensorView probs, TensorView k_arr, bool has_k, int64_t top_k,
                             bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.top_k_renorm_probs";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "probs", probs, true);
  Params p = base_params(probs, r);
  p.so = check_sample_out_rows(op, kDLCUDA, out, probs, r);
  set_k(p, k_arr, has_k, check_sample_k_arr(op, kDLCUDA, k_arr, has_k, probs, r), top_k);
  p.out = data_ptr<void>(out);
  launch<kTopKRenorm, float>(op, p, r.device_id);
}

void top_p_renorm_probs_cuda(TensorView out, TensorView probs, TensorView p_arr, bool has_p, double top_p,
                             bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.top_p_renorm_probs";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "probs", probs, true);
  Params p = base_params(probs, r);
  p.so = check_sample_out_rows(op, kDLCUDA, out, probs, r);
  check_sample_f32_arr(op, kDLCUDA, "top_p_arr", p_arr, has_p, probs, r);
  set_p(p, p_arr, has_p, top_p);
  p.out = data_ptr<void>(out);
  launch<kTopPRenorm, float>(op, p, r.device_id);
}

void top_k_mask_logits_cuda(TensorView out, TensorView logits, TensorView k_arr, bool has_k, int64_t top_k,
                            bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.top_k_mask_logits";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "logits", logits, false);
  Params p = base_params(logits, r);
  p.so = check_sample_out_rows(op, kDLCUDA, out, logits, r);
  set_k(p, k_arr, has_k, check_sample_k_arr(op, kDLCUDA, k_arr, has_k, logits, r), top_k);
  p.out = data_ptr<void>(out);
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch<kTopKMask, scalar_t>(op, p, r.device_id); });
}

void greedy_cuda(TensorView out, TensorView logits, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.greedy";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "logits", logits, false);
  check_sample_ids(op, kDLCUDA, out, logits, r);
  Params p = base_params(logits, r);
  p.out = data_ptr<void>(out);
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch<kGreedy, scalar_t>(op, p, r.device_id); });
}

void top_k_top_p_sampling_from_probs_cuda(TensorView out, TensorView probs, TensorView k_arr, bool has_k,
                                          int64_t top_k, TensorView p_arr, bool has_p, double top_p,
                                          TensorView seed_t, bool has_seed, int64_t seed, TensorView offset_t,
                                          bool has_offset, int64_t offset, tvm::ffi::String order,
                                          bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.top_k_top_p_sampling_from_probs";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "probs", probs, true);
  check_sample_ids(op, kDLCUDA, out, probs, r);
  Params p = base_params(probs, r);
  set_k(p, k_arr, has_k, check_sample_k_arr(op, kDLCUDA, k_arr, has_k, probs, r), top_k);
  check_sample_f32_arr(op, kDLCUDA, "top_p_arr", p_arr, has_p, probs, r);
  set_p(p, p_arr, has_p, top_p);
  check_sample_word(op, kDLCUDA, "seed_tensor", seed_t, has_seed, probs);
  check_sample_word(op, kDLCUDA, "offset_tensor", offset_t, has_offset, probs);
  set_rng(p, seed_t, has_seed, seed, offset_t, has_offset, offset);
  const std::string o(order);
  if (o != "top_k_first" && o != "joint") {
    TVM_FFI_THROW(ValueError) << op << ": filter_apply_order must be 'top_k_first' or 'joint', got '" << o << "'";
  }
  p.joint = o == "joint";
  p.out = data_ptr<void>(out);
  launch<kTopKTopPSample, float>(op, p, r.device_id);
}

void min_p_sampling_from_probs_cuda(TensorView out, TensorView probs, TensorView m_arr, bool has_m, double min_p,
                                    TensorView seed_t, bool has_seed, int64_t seed, TensorView offset_t,
                                    bool has_offset, int64_t offset, bool enable_pdl) {
  cuda::PdlScope pdl(enable_pdl);
  const char* op = "opmux.min_p_sampling_from_probs";
  const SampleRows r = check_sample_rows(op, kDLCUDA, "probs", probs, true);
  check_sample_ids(op, kDLCUDA, out, probs, r);
  Params p = base_params(probs, r);
  check_sample_f32_arr(op, kDLCUDA, "min_p_arr", m_arr, has_m, probs, r);
  set_p(p, m_arr, has_m, min_p);
  check_sample_word(op, kDLCUDA, "seed_tensor", seed_t, has_seed, probs);
  check_sample_word(op, kDLCUDA, "offset_tensor", offset_t, has_offset, probs);
  set_rng(p, seed_t, has_seed, seed, offset_t, has_offset, offset);
  p.out = data_ptr<void>(out);
  launch<kMinPSample, float>(op, p, r.device_id);
}

}  // namespace sampling_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_renorm_probs_cuda, opmux::sampling_cuda::top_k_renorm_probs_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_p_renorm_probs_cuda, opmux::sampling_cuda::top_p_renorm_probs_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_mask_logits_cuda, opmux::sampling_cuda::top_k_mask_logits_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(greedy_cuda, opmux::sampling_cuda::greedy_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_top_p_sampling_from_probs_cuda,
                              opmux::sampling_cuda::top_k_top_p_sampling_from_probs_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(min_p_sampling_from_probs_cuda, opmux::sampling_cuda::min_p_sampling_from_probs_cuda);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/sampling_cuda_lanes.inc"
