// The comm op group (issue #31) for CUDA: tensor-parallel all-reduce over a peer-accessible
// ("symmetric") buffer, alone or fused with residual add + RMSNorm + optional per-token fp8 quant.
//
// Exports (tvm-ffi typed functions; no `enable_pdl`: these kernels never use PDL, see below):
//   comm_all_reduce_cuda(out, x, ptrs, counters, rank, world, cap, algo, timeout_ms)
//   comm_all_reduce_add_rmsnorm_cuda(x, residual, weight, eps, q, scale, ptrs, counters, rank,
//                                    world, cap, algo, timeout_ms)
// ptrs: CPU int64 [world], the base addresses of every rank's buffer (rank order), read on the
// host and passed BY VALUE in the kernel parameters (a CUDA graph capture bakes them in); the
// buffer and counters layout: opmux/comm_layout.h. Nothing is allocated, nothing synchronizes
// with the host: both calls are CUDA-graph safe. One buffer + counters pair serves both exports;
// every rank must make the same calls (op, shapes, dtype, algo) in the same order on one stream
// (or graph), since the grids, the halves and the barrier epochs are derived from that sequence.
//
// ALGORITHMS (block b of a call always pairs with block b of every peer; the grid is a
// deterministic function of the message shape, dtype, world and algo, <= kMaxBlocks blocks):
//  * one-shot (algo 1): block b copies its chunk of x into its own buffer's `in` region, barrier,
//    then reads that chunk from every rank's `in` region, sums and writes out. Chunks: the
//    message in 16-byte vectors (VEC = 16 / sizeof(T) elements), nvec = ceil(numel / VEC);
//    grid = clamp(ceil(nvec / 512), 1, 64); chunk = ceil(nvec / grid) vectors; block b owns
//    elements [b * chunk * VEC, min((b + 1) * chunk * VEC, numel)).
//  * two-shot (algo 2: reduce-scatter + all-gather): share = ceil(nvec / world) vectors, rank s
//    owns elements [s * share * VEC, (s + 1) * share * VEC) (clipped to numel); grid =
//    clamp(ceil(share / 512), 1, 64); chunk = ceil(share / grid) vectors; block b's range of
//    share s is [s * share + b * chunk, s * share + min((b + 1) * chunk, share)) vectors. Block b
//    copies its range of EVERY share into `in`, barrier 1, reduces its range of its own share from
//    every rank's `in` into its own `result` region, barrier 2, then copies its range of every
//    share s from rank s's `result` into out. The block that reads a range in phase 2 has the
//    index of the block that wrote it on its owner in phase 1, so per-block barriers suffice.
//  * fused (comm_all_reduce_add_rmsnorm_cuda): the message is x's rows packed densely (row i at
//    element i * H of a region). one-shot: grid = min(64, rows); block b owns rows b, b + grid,
//    ...: copies them in, barrier, then per row: reduce from every rank, residual add, norm, quant.
//    two-shot: rank s owns rows [s * R, (s + 1) * R) with R = ceil(rows / world); grid = min(64,
//    R); block b's rows of share s are s * R + b, s * R + b + grid, ... (< the share's end). Block
//    b copies in its rows of every share, barrier 1, reduces its rows of its own share into its
//    `result` (the sum rounded to the dtype: exactly what one-shot computes), barrier 2, then for
//    its rows of every share s reads the rounded sum from rank s's `result` and does the residual
//    add, norm and quant ITSELF, on its own residual: every rank recomputes the epilogue from the
//    gathered sum (less remote traffic than gathering res, y and q; and each rank's results are
//    those of the unfused chain on that rank, whatever its residual holds).
//
// ROUNDING (bit-identical on every rank, and equal to the unfused chain):
//  * sum: acc = float(x_0[i]); acc += float(x_r[i]) for r = 1 .. world-1, in rank order, in fp32;
//    out[i] = round_to_dtype(acc) (round to nearest even; fp32 as is). Every rank (one-shot) or
//    the owner (two-shot) computes it in that order, so all ranks hold the same bits.
//  * fused, per row, the chain all_reduce -> opmux fused_add_rmsnorm -> per_token_quant_fp8:
//    s = round(sum); res = round(float(s) + float(residual)); residual = res;
//    y = round((float(res) * rstd) * float(w)), rstd = rsqrtf(sumsq / H + eps); x = y;
//    with q: amax = max |float(y)| (NaN-propagating), sc = max(amax / 448, 1 / (448 * 512)),
//    scale[row] = sc, q = e4m3_satfinite(float(y) * (1 / sc)) (IEEE division, round to nearest
//    even). sumsq is an fp32 sum whose order depends on the thread layout: the kernel reproduces
//    opmux fused_add_rmsnorm's exactly (norm_layout() below mirrors layernorm_cuda.cu's
//    launch_norm<FUSED> choice of threads per row T and vector width for the same rows, H and
//    alignment of x, residual and weight: thread t < T sums the squares of vectors t, t + T, ... in
//    order, then the same warp butterfly and per-warp partials; idle lanes add exact zeros, which
//    changes no sum of squares; T > 512 runs as two "virtual" warps per real warp, so blocks stay
//    <= 512 threads), so the results are bit-equal to the chain's, not just close. Fused blocks:
//    T threads (at least 32; ceil(T / 64) warps when T > 512); all-reduce blocks: 512 threads.
//
// MEMORY ORDERING. Barrier (per block b, epoch k = the block's k-th barrier, counted in
// counters[b], equal on every rank): release: __syncthreads(); then thread p (one per peer p !=
// rank) runs __threadfence_system() and st.release.sys of k into peer p's flags[b][rank]; acquire:
// the same thread spins with ld.acquire.sys on its own flags[b][p] until it is >= k (a serial-
// number comparison, (int32)(flag - k) >= 0: a peer may already be one barrier ahead, never two,
// as its next barrier needs this rank; the difference stays in {-1, 0, 1}, so uint32 wrap-around is
// harmless), then __syncthreads(). So everything this rank's block wrote before the barrier (its
// `in` chunk, its `result` range) is visible to every peer's block b after it, and vice versa.
// Data in the buffer is loaded with ld.global.cg (L2, never the non-coherent path: peers write it
// during the kernel).
// Why one barrier per phase and two halves suffice: call n uses half h = n & 1 (the call count
// is counters[kCounterCall]; the last block of a call to finish bumps it, after every block has
// read it). Within a call each region is written before a barrier and only read after it (and
// one-shot's `in` / two-shot's `in` and `result` are distinct regions), so no reader of call n
// sees a partial write of call n. Across calls a rank writes half h again in call n + 2 only. Call
// n + 1 on this rank completed (stream order: no PDL, so kernel n + 2 starts after kernel n + 1
// finished) and so passed at least one barrier with every peer (every call has a block 0 and
// every block passes a barrier with all peers); a peer's block reached that barrier only inside
// its kernel n + 1, which started after its kernel n, and every read it made of half h in call n,
// had finished. Hence: peer's reads of half h (call n) -> its release in call n + 1 -> this rank's
// acquire in call n + 1 -> this rank's writes of half h in call n + 2. The flags need no double
// buffering: they only grow (per block), and waits compare with >=.
// No PDL: with programmatic dependent launch a peer's kernel n + 1 could start before its kernel n
// finished reading, breaking the argument above; these kernels neither wait on nor trigger it,
// and are launched without the attribute.
//
// TIMEOUT: every spin reads %globaltimer (ns); after timeout_ms (> 0; 0 waits forever) it prints
// "opmux comm: rank R block B waited T ms for rank P: a peer left the call or never joined" and
// runs __trap(): a rank whose peer died fails (the CUDA context is lost, the process should exit)
// instead of hanging forever.
//
// Assumptions (the Python side's job, not checkable here): ptrs[r] is rank r's buffer of
// buffer_bytes(cap) bytes, mapped into this process; counters were zeroed together with the
// buffers; all blocks of a call can be resident at once on every rank (<= 64 blocks of <= 1024
// threads, one per SM; the pairs of blocks wait on each other across ranks); out does not
// partially overlap x (out == x, in place, is fine). Build without --use_fast_math.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "opmux/checks.h"
#include "opmux/comm_layout.h"
#include "opmux/cuda_fp8.cuh"
#include "opmux/cuda_utils.cuh"
#include "opmux/dtype_checks.h"

namespace opmux {
namespace comm_cuda {

using comm::kMaxBlocks;
using comm::kMaxWorld;
using cuda::from_float;
using cuda::load_vec;
using cuda::load_vec_ro;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;

constexpr int kReduceThreads = 512;    // all-reduce blocks (and the vectors per block the grid aims at)
constexpr int kMaxNormThreads = 512;   // fused blocks (norm_block)
constexpr float kFp8Max = 448.0f;

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

struct Peers {
  char* base[kMaxWorld];  // every rank's buffer, rank order (entries >= world unused)
};

// What every kernel needs for its barriers and halves.
struct Sync {
  Peers peers;
  int32_t* counters;   // this rank's, comm_layout.h
  int64_t cap;         // bytes of one data region
  int64_t timeout_ns;  // 0: wait forever
  int rank;
  int world;
};

struct ReduceParams {
  Sync s;
  const void* x;
  void* out;
  int64_t numel;
  int64_t share;  // two-shot: elements of one rank's share (a multiple of VEC)
  int64_t chunk;  // elements of one block's chunk of the message (one-shot) or of a share (two-shot)
};

struct NormParams {
  Sync s;
  void* x;         // [rows, H], row stride x_stride: read (copy-in), then y written
  void* residual;  // [rows, H], row stride r_stride: read, res written
  const void* w;   // [H]
  uint8_t* q;      // [rows, H] fp8 bytes, dense; nullptr: no quant
  float* scale;    // [rows]
  int64_t x_stride;
  int64_t r_stride;
  int64_t rows;
  int64_t rows_share;  // two-shot: rows per rank, ceil(rows / world); one-shot: rows
  int hidden;
  int norm_threads;  // T: the threads opmux fused_add_rmsnorm reduces a row with (norm_row)
  float eps;
  float min_scale;
  bool q_vec;  // q rows take VEC-byte stores
};

// ---- synchronization ----------------------------------------------------------------------

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// flags[block][src] of the buffer at `base`
__device__ __forceinline__ uint32_t* flag_ptr(char* base, int block, int src) {
  return reinterpret_cast<uint32_t*>(base) + block * kMaxWorld + src;
}

__device__ __forceinline__ bool reached(uint32_t flag, uint32_t epoch) {
  return static_cast<int32_t>(flag - epoch) >= 0;
}

// The slow path of a wait: spin (acquire) until the flag reaches `epoch`, or time out.
__device__ __noinline__ void wait_flag(const uint32_t* f, uint32_t epoch, int64_t timeout_ns, int rank,
                                       int peer) {
  const uint64_t start = globaltimer();
  while (!reached(ld_acquire_sys(f), epoch)) {
    if (timeout_ns > 0) {
      const uint64_t waited = globaltimer() - start;
      if (waited > static_cast<uint64_t>(timeout_ns)) {
        printf("opmux comm: rank %d block %d waited %lld ms for rank %d: a peer left the call or never joined\n",
               rank, static_cast<int>(blockIdx.x), static_cast<long long>(waited / 1000000ull), peer);
        __trap();
      }
    }
  }
}

// Block blockIdx.x's barrier with the same block of every peer (header: MEMORY ORDERING).
__device__ __forceinline__ void barrier(const Sync& s, uint32_t epoch) {
  __syncthreads();
  const int peer = threadIdx.x;  // blockDim.x >= 32 >= world
  if (peer < s.world && peer != s.rank) {
    __threadfence_system();
    st_release_sys(flag_ptr(s.peers.base[peer], blockIdx.x, s.rank), epoch);
    const uint32_t* f = flag_ptr(s.peers.base[s.rank], blockIdx.x, peer);
    if (!reached(ld_acquire_sys(f), epoch)) wait_flag(f, epoch, s.timeout_ns, s.rank, peer);
  }
  __syncthreads();
}

struct CallState {
  uint32_t call;   // calls completed before this one: the half is call & 1
  uint32_t epoch;  // barriers this block index completed before this call
};

// Thread 0 reads the counters (L2: the previous kernel wrote them), every thread gets them.
__device__ __forceinline__ CallState begin_call(const Sync& s) {
  __shared__ uint32_t st[2];
  if (threadIdx.x == 0) {
    st[0] = static_cast<uint32_t>(__ldcg(s.counters + comm::kCounterCall));
    st[1] = static_cast<uint32_t>(__ldcg(s.counters + comm::kCounterEpoch + blockIdx.x));
  }
  __syncthreads();
  return {st[0], st[1]};
}

// Thread 0 stores the block's epoch and counts the block done; the last block of the call
// (every other block has counted itself, after its thread 0 read the call count) resets the
// count and bumps the call count, for the next kernel.
__device__ __forceinline__ void end_call(const Sync& s, const CallState& c, uint32_t epoch) {
  if (threadIdx.x != 0) return;
  s.counters[comm::kCounterEpoch + blockIdx.x] = static_cast<int32_t>(epoch);
  __threadfence();
  const int done = atomicAdd(s.counters + comm::kCounterDone, 1);
  if (done == static_cast<int>(gridDim.x) - 1) {
    __threadfence();
    s.counters[comm::kCounterDone] = 0;
    s.counters[comm::kCounterCall] = static_cast<int32_t>(c.call + 1);
  }
}

// ---- data movement --------------------------------------------------------------------------

// VEC elements of the buffer (own or a peer's) at p, aligned to their size: ld.global.cg.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> ld_buf(const T* p) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * VEC;
  Vec<T, VEC> v;
  if constexpr (kBytes == 16) {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
    memcpy(&v, &u, 16);
  } else if constexpr (kBytes == 4) {
    const unsigned u = __ldcg(reinterpret_cast<const unsigned*>(p));
    memcpy(&v, &u, 4);
  } else {
    static_assert(kBytes == 2, "buffer access of 2, 4 or 16 bytes");
    const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&v, &u, 2);
  }
  return v;
}

// x / out of the plain all-reduce: one vector access when XVEC (16-byte aligned), else elements.
template <typename T, int VEC, bool XVEC>
__device__ __forceinline__ Vec<T, VEC> load_x(const T* p) {
  if constexpr (XVEC) {
    return load_vec<T, VEC>(p);
  } else {
    Vec<T, VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; ++k) v.v[k] = p[k];
    return v;
  }
}

template <typename T, int VEC, bool XVEC>
__device__ __forceinline__ void store_x(T* p, const Vec<T, VEC>& v) {
  if constexpr (XVEC) {
    store_vec(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = v.v[k];
  }
}

// round(sum over r in rank order of float(region_r[e])) for the VEC elements at byte `off` of
// every rank's buffer: all loads first (world requests in flight), then the fp32 sum.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> reduce_peers(const Sync& s, int64_t off) {
  Vec<T, VEC> v[kMaxWorld];
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r)
    if (r < s.world) v[r] = ld_buf<T, VEC>(reinterpret_cast<const T*>(s.peers.base[r] + off));
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = to_float(v[0].v[k]);
#pragma unroll
  for (int r = 1; r < kMaxWorld; ++r)
    if (r < s.world) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += to_float(v[r].v[k]);
    }
  Vec<T, VEC> o;
#pragma unroll
  for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(acc[k]);
  return o;
}

// ---- plain all-reduce -----------------------------------------------------------------------

// Copies x[lo, hi) to the same elements of the region `dst` (lo a multiple of VEC).
template <typename T, bool XVEC>
__device__ __forceinline__ void copy_in(T* dst, const T* x, int64_t lo, int64_t hi) {
  constexpr int VEC = cuda::kVec16<T>;
  const int64_t n = hi - lo;
  if (n <= 0) return;
  const int64_t nv = n / VEC;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x)
    store_vec(dst + lo + j * VEC, load_x<T, VEC, XVEC>(x + lo + j * VEC));
  for (int64_t i = nv * VEC + threadIdx.x; i < n; i += blockDim.x) dst[lo + i] = x[lo + i];
}

// out[lo, hi) = the rank-order sum of elements [lo, hi) of every rank's region at byte `region`.
template <typename T, bool XVEC>
__device__ __forceinline__ void reduce_range(const Sync& s, int64_t region, T* out, int64_t lo, int64_t hi) {
  constexpr int VEC = cuda::kVec16<T>;
  const int64_t n = hi - lo;
  if (n <= 0) return;
  const int64_t nv = n / VEC;
  constexpr int64_t kSize = sizeof(T);
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x)
    store_x<T, VEC, XVEC>(out + lo + j * VEC, reduce_peers<T, VEC>(s, region + (lo + j * VEC) * kSize));
  for (int64_t i = nv * VEC + threadIdx.x; i < n; i += blockDim.x)
    out[lo + i] = reduce_peers<T, 1>(s, region + (lo + i) * kSize).v[0];
}

template <typename T, bool XVEC>
__global__ void __launch_bounds__(kReduceThreads) one_shot_kernel(ReduceParams p) {
  const CallState c = begin_call(p.s);
  const int64_t in = comm::in_offset(static_cast<int>(c.call & 1u), p.s.cap);
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * p.chunk;
  const int64_t hi = imin(lo + p.chunk, p.numel);
  copy_in<T, XVEC>(reinterpret_cast<T*>(p.s.peers.base[p.s.rank] + in), static_cast<const T*>(p.x), lo, hi);
  const uint32_t epoch = c.epoch + 1;
  barrier(p.s, epoch);
  reduce_range<T, XVEC>(p.s, in, static_cast<T*>(p.out), lo, hi);
  end_call(p.s, c, epoch);
}

template <typename T, bool XVEC>
__global__ void __launch_bounds__(kReduceThreads) two_shot_kernel(ReduceParams p) {
  constexpr int VEC = cuda::kVec16<T>;
  const CallState c = begin_call(p.s);
  const int half = static_cast<int>(c.call & 1u);
  const int64_t in = comm::in_offset(half, p.s.cap);
  const int64_t result = comm::result_offset(half, p.s.cap);
  const int world = p.s.world, rank = p.s.rank;
  // block blockIdx.x's range of share `sh`: elements [lo, hi)
  auto range = [&](int sh, int64_t& lo, int64_t& hi) {
    const int64_t base = sh * p.share;
    lo = base + static_cast<int64_t>(blockIdx.x) * p.chunk;
    hi = imin(imin(lo + p.chunk, base + p.share), p.numel);
  };
  T* mine_in = reinterpret_cast<T*>(p.s.peers.base[rank] + in);
  T* mine_result = reinterpret_cast<T*>(p.s.peers.base[rank] + result);
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  int64_t lo, hi;
  for (int sh = 0; sh < world; ++sh) {  // phase 0: the block's range of every share, in
    range(sh, lo, hi);
    copy_in<T, XVEC>(mine_in, x, lo, hi);
  }
  uint32_t epoch = c.epoch + 1;
  barrier(p.s, epoch);
  range(rank, lo, hi);  // phase 1: reduce the block's range of this rank's share into result
  reduce_range<T, true>(p.s, in, mine_result, lo, hi);
  barrier(p.s, ++epoch);
  for (int i = 0; i < world; ++i) {  // phase 2: gather every share's range from its owner
    const int sh = (rank + i) % world;  // the own share first, then the peers' in turn
    range(sh, lo, hi);
    const int64_t n = hi - lo;
    if (n <= 0) continue;
    const T* src = reinterpret_cast<const T*>(p.s.peers.base[sh] + result);
    const int64_t nv = n / VEC;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x)
      store_x<T, VEC, XVEC>(out + lo + j * VEC, ld_buf<T, VEC>(src + lo + j * VEC));
    for (int64_t e = nv * VEC + threadIdx.x; e < n; e += blockDim.x) out[lo + e] = ld_buf<T, 1>(src + lo + e).v[0];
  }
  end_call(p.s, c, epoch);
}

// ---- fused all-reduce + residual add + RMSNorm (+ per-token fp8 quant) ---------------------

// The norm's thread layout. fused_add_rmsnorm reduces a row with T threads (norm_threads): thread
// t sums the squares of vectors t, t + T, ... in order, warp w's butterfly sum goes to partial[w],
// and (T > 32) every warp butterflies the partials of the k = ceil(T / 32) warps. Here "virtual"
// thread t = 32 * vw + lane, its virtual warp vw run by real warp vw % RW (RW = blockDim.x / 32
// >= ceil(k / kMaxVirt)), keeps its own partial sum: the same sums in the same order with at most
// 512 real threads (1024 would cap registers at 64 and spill).
constexpr int kMaxVirt = 2;

// The row's sum over the virtual threads, as layernorm_cuda.cu's row_sum computes it; v[i] is
// virtual warp (warp + i * RW)'s lane value (0 where that warp or thread does not exist: idle
// lanes add exact zeros, which changes no sum of squares). Every thread gets the total.
__device__ __forceinline__ float virtual_row_sum(const float (&v)[kMaxVirt], int k) {
  __shared__ float partial[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rw = blockDim.x >> 5;
  if (k == 1) return cuda::warp_sum(v[0]);  // then blockDim.x == 32
#pragma unroll
  for (int i = 0; i < kMaxVirt; ++i) {
    const float w = cuda::warp_sum(v[i]);
    const int vw = warp + i * rw;
    if (lane == 0 && vw < k) partial[vw] = w;
  }
  __syncthreads();
  return cuda::warp_sum(lane < k ? partial[lane] : 0.f);  // each warp reduces all partials itself
}

template <typename T, int VEC>
__device__ __forceinline__ void store_q(uint8_t* q, const Vec<T, VEC>& v, float inv, bool q_vec) {
  if (q_vec) {
    cuda::store_fp8<T, VEC>(q, v, inv);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      Vec<T, 1> e;
      e.v[0] = v.v[k];
      cuda::store_fp8<T, 1>(q + k, e, inv);
    }
  }
}

// Block blockIdx.x's rows of share `sh`: first, first + gridDim.x, ... < end.
struct RowRange {
  int64_t first, end;
};

__device__ __forceinline__ RowRange block_rows(const NormParams& p, int sh) {
  const int64_t base = sh * p.rows_share;
  return {base + blockIdx.x, imin(base + p.rows_share, p.rows)};
}

// The epilogue of one row: s = the row's rounded sum (one-shot: reduced from every rank's `in`
// now; two-shot: read from its owner's `result`), then the chain's residual add, norm and quant.
// Every element pass walks the virtual threads' vectors (fused_add_rmsnorm's layout), so each
// thread re-reads only its own stores.
template <typename T, int VEC, bool TWO>
__device__ __forceinline__ void norm_row(const NormParams& p, int64_t row, int64_t src_off, const T* owner) {
  const int nt = p.norm_threads;
  const int k = (nt + 31) >> 5;  // virtual warps
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rw = blockDim.x >> 5;
  const int nvec = p.hidden / VEC;
  T* __restrict__ xr = static_cast<T*>(p.x) + row * p.x_stride;
  T* __restrict__ rr = static_cast<T*>(p.residual) + row * p.r_stride;
  const T* __restrict__ w = static_cast<const T*>(p.w);
  const int64_t elem0 = row * p.hidden;  // the row's first element in a region
  constexpr int64_t kSize = sizeof(T);
  float sum[kMaxVirt];
#pragma unroll
  for (int i = 0; i < kMaxVirt; ++i) {
    sum[i] = 0.f;
    const int vw = warp + i * rw, vt = vw * 32 + lane;
    if (vw >= k || vt >= nt) continue;
    for (int j = vt; j < nvec; j += nt) {
      Vec<T, VEC> sv;
      if constexpr (TWO) {
        sv = ld_buf<T, VEC>(owner + elem0 + static_cast<int64_t>(j) * VEC);
      } else {
        sv = reduce_peers<T, VEC>(p.s, src_off + (elem0 + static_cast<int64_t>(j) * VEC) * kSize);
      }
      Vec<T, VEC> rv = load_vec<T, VEC>(rr + j * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) rv.v[e] = from_float<T>(to_float(sv.v[e]) + to_float(rv.v[e]));
      store_vec(rr + j * VEC, rv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float f = to_float(rv.v[e]);
        sum[i] += f * f;
      }
    }
  }
  const float rstd = rsqrtf(virtual_row_sum(sum, k) / static_cast<float>(p.hidden) + p.eps);
  const bool quant = p.q != nullptr;
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxVirt; ++i) {
    const int vw = warp + i * rw, vt = vw * 32 + lane;
    if (vw >= k || vt >= nt) continue;
    for (int j = vt; j < nvec; j += nt) {
      const Vec<T, VEC> rv = load_vec<T, VEC>(rr + j * VEC);  // this thread's own store above
      const Vec<T, VEC> wv = load_vec_ro<T, VEC>(w + j * VEC);
      Vec<T, VEC> o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = from_float<T>((to_float(rv.v[e]) * rstd) * to_float(wv.v[e]));
      store_vec(xr + j * VEC, o);
      if (quant) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) m = cuda::nan_max(m, fabsf(to_float(o.v[e])));
      }
    }
  }
  if (quant) {  // uniform
    const float sc = cuda::nan_max(cuda::block_max(m) / kFp8Max, p.min_scale);
    if (threadIdx.x == 0) p.scale[row] = sc;
    const float inv = 1.0f / sc;
    uint8_t* qr = p.q + elem0;
#pragma unroll
    for (int i = 0; i < kMaxVirt; ++i) {
      const int vw = warp + i * rw, vt = vw * 32 + lane;
      if (vw >= k || vt >= nt) continue;
      for (int j = vt; j < nvec; j += nt)
        store_q<T, VEC>(qr + j * VEC, load_vec<T, VEC>(xr + j * VEC), inv, p.q_vec);  // own store above
    }
  }
  __syncthreads();  // the reductions' shared partials are reused by the next row
}

template <typename T, int VEC, bool TWO>
__global__ void __launch_bounds__(kMaxNormThreads) add_rmsnorm_kernel(NormParams p) {
  const CallState c = begin_call(p.s);
  const int half = static_cast<int>(c.call & 1u);
  const int64_t in = comm::in_offset(half, p.s.cap);
  const int64_t result = comm::result_offset(half, p.s.cap);
  const int nvec = p.hidden / VEC;
  const int rank = p.s.rank;
  const int shares = TWO ? p.s.world : 1;
  const int64_t step = gridDim.x;
  T* mine_in = reinterpret_cast<T*>(p.s.peers.base[rank] + in);
  const T* x = static_cast<const T*>(p.x);
  for (int sh = 0; sh < shares; ++sh) {  // copy the block's rows in (their dense places)
    const RowRange rr = block_rows(p, sh);
    for (int64_t row = rr.first; row < rr.end; row += step) {
      const T* xr = x + row * p.x_stride;
      T* dst = mine_in + row * p.hidden;
      for (int j = threadIdx.x; j < nvec; j += blockDim.x) store_vec(dst + j * VEC, load_vec<T, VEC>(xr + j * VEC));
    }
  }
  uint32_t epoch = c.epoch + 1;
  barrier(p.s, epoch);
  if constexpr (TWO) {  // reduce the block's rows of this rank's share into its result region
    T* mine_result = reinterpret_cast<T*>(p.s.peers.base[rank] + result);
    const RowRange rr = block_rows(p, rank);
    constexpr int64_t kSize = sizeof(T);
    for (int64_t row = rr.first; row < rr.end; row += step) {
      const int64_t elem0 = row * p.hidden;
      for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
        const int64_t e = elem0 + static_cast<int64_t>(j) * VEC;
        store_vec(mine_result + e, reduce_peers<T, VEC>(p.s, in + e * kSize));
      }
    }
    barrier(p.s, ++epoch);
  }
  for (int i = 0; i < shares; ++i) {
    const int sh = TWO ? (rank + i) % shares : 0;
    const T* owner = reinterpret_cast<const T*>(p.s.peers.base[sh] + result);
    const RowRange rr = block_rows(p, sh);
    for (int64_t row = rr.first; row < rr.end; row += step) norm_row<T, VEC, TWO>(p, row, in, owner);
  }
  end_call(p.s, c, epoch);
}

// ---- host side ------------------------------------------------------------------------------

// The threads per row opmux fused_add_rmsnorm (layernorm_cuda.cu launch_norm<T, FUSED = true>)
// reduces a row of `hidden` elements with, for `rows` rows, as `vec` (16-byte) or scalar
// elements. Keep in step with launch_norm: the fused op's sum of squares, hence rstd, is
// bit-equal to the unfused chain's only while both pick the same layout.
inline int norm_threads(int64_t rows, int64_t hidden, bool vec_ok, int vec16) {
  constexpr int kMax = 512;  // kMaxThreads<true>
  constexpr int kMaxPer = 4;
  const int64_t nvec = hidden / (vec_ok ? vec16 : 1);
  int per = 1;
  while (per < kMaxPer && nvec > static_cast<int64_t>(per) * kMax) per *= 2;
  bool use_reg = vec_ok && nvec <= static_cast<int64_t>(per) * kMax;
  if (vec_ok && per >= 2 && nvec <= 1024) {
    per = 1;
    use_reg = true;
  }
  if (vec_ok && rows >= 4096 && nvec > kMax / 2 && nvec <= 2 * kMax) use_reg = false;
  auto round_up32 = [](int64_t n) { return static_cast<int>((n + 31) / 32 * 32); };
  if (use_reg) {
    const int64_t need = (nvec + per - 1) / per;
    if (need < 32) {
      int t = 1;
      while (t < need) t *= 2;
      return t;
    }
    return round_up32(need);
  }
  return round_up32(std::min<int64_t>(nvec, rows >= 4096 ? 256 : kMax));
}

// The fused kernel's block for a norm layout of T threads (<= 1024): T (at least a warp) up to
// 512, else one real warp per two virtual ones (norm_row).
inline int norm_block(int t) {
  const int k = (t + 31) / 32;
  return 32 * (k <= kMaxNormThreads / 32 ? k : (k + kMaxVirt - 1) / kMaxVirt);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every dimension dense (torch's rule: a dimension of size 1 may have any stride).
inline void check_contiguous(const char* op, const char* name, const TensorView& t) {
  int64_t expected = 1;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) {
      TVM_FFI_THROW(ValueError) << op << ": " << name << " must be contiguous, but dimension " << d
                                << " has stride " << t.stride(d) << " (expected " << expected
                                << "); call .contiguous() first";
    }
    expected *= t.size(d);
  }
}

// The group arguments shared by both exports; returns the Sync the kernels get (but timeout).
inline Sync check_group(const char* op, const TensorView& ptrs, const TensorView& counters, int32_t device_id,
                        int64_t rank, int64_t world, int64_t cap, int64_t algo, int64_t timeout_ms,
                        int64_t message_bytes) {
  if (world < 1 || world > kMaxWorld) {  // 1: the kernels on one GPU (its barriers are no-ops)
    TVM_FFI_THROW(ValueError) << op << ": world must be in [1, " << kMaxWorld << "], got " << world;
  }
  if (rank < 0 || rank >= world) {
    TVM_FFI_THROW(ValueError) << op << ": rank must be in [0, world = " << world << "), got " << rank;
  }
  if (algo != comm::kAlgoOneShot && algo != comm::kAlgoTwoShot) {
    TVM_FFI_THROW(ValueError) << op << ": algo must be " << comm::kAlgoOneShot << " (one-shot) or "
                              << comm::kAlgoTwoShot << " (two-shot), got " << algo;
  }
  if (cap <= 0 || cap % comm::kCapAlign != 0 || cap > (std::numeric_limits<int64_t>::max() - comm::kFlagsBytes) / 4) {
    TVM_FFI_THROW(ValueError) << op << ": cap must be a positive multiple of " << comm::kCapAlign
                              << " (bytes of one data region), got " << cap;
  }
  if (message_bytes > cap) {
    TVM_FFI_THROW(ValueError) << op << ": the message is " << message_bytes << " bytes, more than cap = " << cap
                              << " (register a larger buffer, or split the call)";
  }
  if (timeout_ms < 0) {
    TVM_FFI_THROW(ValueError) << op << ": timeout_ms must be >= 0 (0: wait forever), got " << timeout_ms;
  }
  // ptrs: CPU int64 [world], read here
  const DLDevice pd = ptrs.device();
  if (pd.device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << op << ": ptrs must be a CPU tensor (read on the host at launch), got "
                              << device_name(pd.device_type) << ":" << pd.device_id;
  }
  check_int64(op, "ptrs", ptrs);
  check_vector(op, "ptrs", ptrs, world, "world");
  // counters: int32, >= kCounters elements, dense, on x's device
  check_int32(op, "counters", counters);
  check_ndim(op, "counters", counters, 1);
  if (counters.size(0) < comm::kCounters) {
    TVM_FFI_THROW(ValueError) << op << ": counters has " << counters.size(0) << " elements, needs at least "
                              << comm::kCounters << " (int32)";
  }
  check_last_dim_contiguous(op, "counters", counters);
  const DLDevice cd = counters.device();
  if (cd.device_type != kDLCUDA || cd.device_id != device_id) {
    TVM_FFI_THROW(ValueError) << op << ": counters must be on the data's device cuda:" << device_id << ", got "
                              << device_name(cd.device_type) << ":" << cd.device_id;
  }
  Sync s = {};
  const int64_t* pv = data_ptr<const int64_t>(ptrs);
  for (int64_t r = 0; r < world; ++r) {
    const int64_t a = pv[r];
    if (a == 0 || a % 16 != 0) {
      TVM_FFI_THROW(ValueError) << op << ": ptrs[" << r << "] = " << a
                                << " is not a buffer address (nonzero, 16-byte aligned)";
    }
    s.peers.base[r] = reinterpret_cast<char*>(static_cast<uintptr_t>(a));
  }
  s.counters = data_ptr<int32_t>(counters);
  s.cap = cap;
  // 0: forever; clamped so that the nanoseconds fit
  s.timeout_ns = std::min<int64_t>(timeout_ms, std::numeric_limits<int64_t>::max() / 1000000) * 1000000;
  s.rank = static_cast<int>(rank);
  s.world = static_cast<int>(world);
  return s;
}

template <typename T>
void launch_all_reduce(const char* op, ReduceParams p, bool two_shot, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const int64_t nvec = ceil_div(p.numel, VEC);
  int64_t grid;
  if (two_shot) {
    const int64_t share = ceil_div(nvec, p.s.world);
    grid = std::clamp<int64_t>(ceil_div(share, kReduceThreads), 1, kMaxBlocks);
    p.share = share * VEC;
    p.chunk = ceil_div(share, grid) * VEC;
  } else {
    grid = std::clamp<int64_t>(ceil_div(nvec, kReduceThreads), 1, kMaxBlocks);
    p.share = p.numel;
    p.chunk = ceil_div(nvec, grid) * VEC;
  }
  const bool xvec = cuda::aligned(p.x, 16) && cuda::aligned(p.out, 16);
  void (*kernel)(ReduceParams) = nullptr;
  if (two_shot) {
    kernel = xvec ? two_shot_kernel<T, true> : two_shot_kernel<T, false>;
  } else {
    kernel = xvec ? one_shot_kernel<T, true> : one_shot_kernel<T, false>;
  }
  cuda::PdlScope no_pdl(false);  // never PDL (header: a peer must not run ahead)
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  cuda::launch(op, device_id, props, kernel, dim3(static_cast<unsigned>(grid)), dim3(kReduceThreads), 0,
               cuda::current_stream(device_id), p);
}

void comm_all_reduce_cuda(TensorView out, TensorView x, TensorView ptrs, TensorView counters, int64_t rank,
                          int64_t world, int64_t cap, int64_t algo, int64_t timeout_ms) {
  const char* op = "opmux.comm.all_reduce";
  const int32_t dev = check_device(op, kDLCUDA, {{"x", &x}, {"out", &out}});
  const DType dtype = check_same_dtype(op, {{"x", &x}, {"out", &out}});
  if (out.ndim() != x.ndim()) {
    TVM_FFI_THROW(ValueError) << op << ": out must have x's shape, but it is " << out.ndim() << "-D and x "
                              << x.ndim() << "-D";
  }
  int64_t numel = 1;
  for (int d = 0; d < x.ndim(); ++d) {
    check_size(op, "out", out, d, x.size(d), "x's shape");
    numel *= x.size(d);
  }
  check_contiguous(op, "x", x);
  check_contiguous(op, "out", out);
  const int64_t elem = dtype == DType::kFloat32 ? 4 : 2;
  ReduceParams p = {};
  p.s = check_group(op, ptrs, counters, dev, rank, world, cap, algo, timeout_ms, numel * elem);
  if (numel == 0) return;  // the same on every rank: no call, no count
  p.x = data_ptr<const void>(x);
  p.out = data_ptr<void>(out);
  p.numel = numel;
  const bool two_shot = algo == comm::kAlgoTwoShot;
  OPMUX_DISPATCH_DTYPE(dtype, float, __half, __nv_bfloat16,
                       [&] { launch_all_reduce<scalar_t>(op, p, two_shot, dev); });
}

template <typename T>
void launch_add_rmsnorm(const char* op, NormParams p, bool two_shot, int32_t device_id) {
  constexpr int VEC = cuda::kVec16<T>;
  const int64_t sz = sizeof(T);
  // fused_add_rmsnorm's vector condition (layernorm_cuda.cu vec_aligned, a = x, b = residual)
  const bool vec_ok = p.hidden % VEC == 0 && cuda::aligned(p.x, 16) && cuda::aligned(p.residual, 16) &&
                      cuda::aligned(p.w, 16) && (p.x_stride * sz) % 16 == 0 && (p.r_stride * sz) % 16 == 0;
  p.norm_threads = norm_threads(p.rows, p.hidden, vec_ok, VEC);
  p.q_vec = p.q != nullptr && cuda::aligned(p.q, VEC);
  const int block = norm_block(p.norm_threads);
  int64_t grid;
  if (two_shot) {
    p.rows_share = ceil_div(p.rows, p.s.world);
    grid = std::min<int64_t>(kMaxBlocks, p.rows_share);
  } else {
    p.rows_share = p.rows;
    grid = std::min<int64_t>(kMaxBlocks, p.rows);
  }
  void (*kernel)(NormParams) = nullptr;
  if (vec_ok) {
    kernel = two_shot ? add_rmsnorm_kernel<T, VEC, true> : add_rmsnorm_kernel<T, VEC, false>;
  } else {
    kernel = two_shot ? add_rmsnorm_kernel<T, 1, true> : add_rmsnorm_kernel<T, 1, false>;
  }
  cuda::PdlScope no_pdl(false);
  cuda::DeviceScope scope(op, device_id);
  const cuda::DeviceProps props = cuda::device_props(op, device_id);
  cuda::launch(op, device_id, props, kernel, dim3(static_cast<unsigned>(grid)), dim3(block), 0,
               cuda::current_stream(device_id), p);
}

void comm_all_reduce_add_rmsnorm_cuda(TensorView x, TensorView residual, TensorView weight, double eps,
                                      TensorView q, TensorView scale, TensorView ptrs, TensorView counters,
                                      int64_t rank, int64_t world, int64_t cap, int64_t algo,
                                      int64_t timeout_ms) {
  const char* op = "opmux.comm.all_reduce_add_rmsnorm";
  const RowsArgs r = check_norm_args(op, kDLCUDA, "x", x, "residual", residual, weight, eps);
  check_eps(op, eps);
  if (r.hidden > (int64_t{1} << 30)) {
    TVM_FFI_THROW(ValueError) << op << ": hidden size " << r.hidden << " exceeds 2^30";
  }
  if (r.rows > 0 && r.hidden > 0 && data_ptr<char>(x) == data_ptr<char>(residual)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (both are updated in place)";
  }
  const bool quant = q.numel() > 0 || scale.numel() > 0;
  if (quant) {
    check_fp8_bytes(op, "q", q);
    check_ndim(op, "q", q, 2);
    check_size(op, "q", q, 0, r.rows, "rows of x");
    check_size(op, "q", q, 1, r.hidden, "hidden size of x");
    check_contiguous(op, "q", q);
    check_float32(op, "scale", scale);
    check_vector(op, "scale", scale, r.rows, "rows of x");
    check_device(op, kDLCUDA, {{"x", &x}, {"q", &q}, {"scale", &scale}});
  }
  const int64_t elem = r.dtype == DType::kFloat32 ? 4 : 2;
  NormParams p = {};
  p.s = check_group(op, ptrs, counters, r.device_id, rank, world, cap, algo, timeout_ms, r.rows * r.hidden * elem);
  if (r.rows == 0 || r.hidden == 0) return;  // the same on every rank: no call, no count
  p.x = data_ptr<void>(x);
  p.residual = data_ptr<void>(residual);
  p.w = data_ptr<const void>(weight);
  p.q = quant ? data_ptr<uint8_t>(q) : nullptr;
  p.scale = quant ? data_ptr<float>(scale) : nullptr;
  p.x_stride = row_stride(op, "x", x);
  p.r_stride = row_stride(op, "residual", residual);
  p.rows = r.rows;
  p.hidden = static_cast<int>(r.hidden);
  p.eps = static_cast<float>(eps);
  p.min_scale = static_cast<float>(1.0 / (448.0 * 512.0));  // as per_token_quant_fp8_cuda rounds it
  const bool two_shot = algo == comm::kAlgoTwoShot;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, __half, __nv_bfloat16,
                       [&] { launch_add_rmsnorm<scalar_t>(op, p, two_shot, r.device_id); });
}

}  // namespace comm_cuda
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(comm_all_reduce_cuda, opmux::comm_cuda::comm_all_reduce_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(comm_all_reduce_add_rmsnorm_cuda, opmux::comm_cuda::comm_all_reduce_add_rmsnorm_cuda);
