// reshape_and_cache for CPU tensors (vLLM's reshape_and_cache_flash, and reshape_and_cache's paged
// layout): key/value rows copied into the cache slot given by slot_mapping; slot -1 skips a token.
// Caches are [num_blocks, block_size, H, D] views with a dense head_dim and any block / page /
// head strides (NHD, or HND passed as its permuted view), or vLLM's paged key [num_blocks, H,
// D/x, block_size, x] with value [num_blocks, H, D, block_size]. An fp8 cache (e4m3fn bytes) gets fp8(x / scale): an IEEE
// division, saturated to +-448 (vLLM's convention). Every slot is validated before the first
// write: an out-of-range slot raises ValueError naming it and leaves the caches untouched.
// The block ops follow (ops/kvcache/_blocks.py): copy_blocks (blocks copied as bytes within one
// cache), concat_and_cache_mla (MLA's [kv_c | k_pe] rows at their slots, fp8 with a scale) and
// gather_cache (sequences read through their block tables into consecutive rows).
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry point.
#include <cstdint>
#include <cstring>

#include "opmux/cpu_types.h"
#include "opmux/fp8_cpu.h"

namespace opmux {
namespace kvcache_cpu {

// Shapes and strides of one reshape_and_cache call: key / value [tokens, heads, head_dim],
// caches [num_blocks, block_size, heads, head_dim] (head_dim dense). Strides in elements.
struct CacheLayout {
  int64_t tokens, heads, head_dim, block_size;
  int64_t elt_bytes;                     // of key / value: 4 (float32) or 2 (float16 / bfloat16)
  int64_t k_tok, k_head, v_tok, v_head;  // key / value strides
  int64_t kc_block, kc_page, kc_head;    // key cache strides (block, offset in block, head)
  int64_t vc_block, vc_page, vc_head;    // value cache strides
  // element d of a head row at (d / x) * dhi + (d % x) * dlo: x = D, dlo = 1 for NHD / HND
  // (set by default); vLLM's paged key has chunks of x, its paged value a d stride of bs
  int64_t kc_dhi = 0, kc_dlo = 1, kx = 0, vc_dhi = 0, vc_dlo = 1, vx = 0;  // x = 0: head_dim
};

// Where one cache's head rows go.
struct RowDst {
  int64_t head, dhi, dlo, x;
  bool dense(int64_t head_dim) const { return dlo == 1 && x == head_dim; }
};

// The first t whose slot is neither -1 nor in [0, num_slots), or -1 when all are valid.
inline int64_t first_bad_slot(const int64_t* slots, int64_t tokens, int64_t num_slots) {
  for (int64_t t = 0; t < tokens; ++t)
    if (slots[t] < -1 || slots[t] >= num_slots) return t;
  return -1;
}

// One token's rows into one cache (elements of `elt` bytes): one copy when both sides hold the
// heads as one row of H * D elements, one per head for dense head rows, one per chunk of x
// (vLLM's paged key) or per element (its paged value) otherwise.
inline void copy_token(char* dst, const RowDst& o, const char* src, int64_t src_head, const CacheLayout& a) {
  const int64_t elt = a.elt_bytes, row = a.head_dim * elt;
  if (o.dense(a.head_dim)) {
    if (a.heads == 1 || (o.head == a.head_dim && src_head == a.head_dim)) {
      std::memcpy(dst, src, a.heads * row);
      return;
    }
    for (int64_t h = 0; h < a.heads; ++h) std::memcpy(dst + h * o.head * elt, src + h * src_head * elt, row);
    return;
  }
  for (int64_t h = 0; h < a.heads; ++h) {
    char* d0 = dst + h * o.head * elt;
    const char* s0 = src + h * src_head * elt;
    for (int64_t c = 0; c < a.head_dim; c += o.x) {
      char* dc = d0 + (c / o.x) * o.dhi * elt;
      if (o.dlo == 1) {
        std::memcpy(dc, s0 + c * elt, o.x * elt);
      } else {
        for (int64_t i = 0; i < o.x; ++i) std::memcpy(dc + i * o.dlo * elt, s0 + (c + i) * elt, elt);
      }
    }
  }
}

// token(t, blk, off) for every token t with a slot >= 0 (slots validated by the caller): block
// and offset in the block. A small call (!parallel) enters no OpenMP region at all: `omp
// parallel for if (false)` still forms a team of one in libgomp, about 0.2 us a call (as much as
// a one-token copy).
template <typename Token>
inline void for_each_slot(const int64_t* slots, int64_t tokens, int64_t block_size, bool parallel,
                          const Token& token) {
  const auto one = [&](int64_t t) {
    const int64_t s = slots[t];
    if (s >= 0) token(t, s / block_size, s % block_size);
  };
  if (!parallel) {
    for (int64_t t = 0; t < tokens; ++t) one(t);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t t = 0; t < tokens; ++t) one(t);
}

inline RowDst key_dst(const CacheLayout& a) {
  return {a.kc_head, a.kc_dhi, a.kc_dlo, a.kx > 0 ? a.kx : a.head_dim};
}
inline RowDst value_dst(const CacheLayout& a) {
  return {a.vc_head, a.vc_dhi, a.vc_dlo, a.vx > 0 ? a.vx : a.head_dim};
}

// Copies every token with a slot >= 0 (slots already validated); caches of key's dtype.
inline void reshape_and_cache_impl(const char* k, const char* v, char* kc, char* vc,
                                   const int64_t* slots, const CacheLayout& a) {
  if (a.tokens == 0 || a.heads * a.head_dim == 0) return;
  const int64_t elt = a.elt_bytes;
  const RowDst ko = key_dst(a), vo = value_dst(a);
  const bool parallel = a.tokens > 1 && a.tokens * a.heads * a.head_dim >= (1 << 16);
  for_each_slot(slots, a.tokens, a.block_size, parallel, [&](int64_t t, int64_t blk, int64_t off) {
    copy_token(kc + (blk * a.kc_block + off * a.kc_page) * elt, ko, k + t * a.k_tok * elt, a.k_head, a);
    copy_token(vc + (blk * a.vc_block + off * a.vc_page) * elt, vo, v + t * a.v_tok * elt, a.v_head, a);
  });
}

// q[0..n) = e4m3(x[i] / scale) (branch-free: the loop vectorizes).
template <typename T>
inline void quantize_row(uint8_t* q, const T* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) q[i] = cpu::float_to_e4m3fn_branchless(cpu::to_float(x[i]) / scale);
}

// One head row into its place: dense, or element d at (d / x) * dhi + (d % x) * dlo.
template <typename T>
inline void quantize_head(uint8_t* q, const RowDst& o, const T* x, int64_t n, float scale) {
  if (o.dense(n)) {
    quantize_row(q, x, n, scale);
    return;
  }
  for (int64_t d = 0; d < n; ++d)
    q[(d / o.x) * o.dhi + (d % o.x) * o.dlo] = cpu::float_to_e4m3fn(cpu::to_float(x[d]) / scale);
}

// The same for an fp8 cache: caches hold e4m3fn bytes (strides in bytes = elements).
template <typename T>
void reshape_and_cache_fp8_impl(const T* k, const T* v, uint8_t* kc, uint8_t* vc, const int64_t* slots,
                                const CacheLayout& a, float k_scale, float v_scale) {
  if (a.tokens == 0 || a.heads * a.head_dim == 0) return;
  const RowDst ko = key_dst(a), vo = value_dst(a);
  const bool parallel = a.tokens > 1 && a.tokens * a.heads * a.head_dim >= (1 << 15);
  for_each_slot(slots, a.tokens, a.block_size, parallel, [&](int64_t t, int64_t blk, int64_t off) {
    uint8_t* kd = kc + blk * a.kc_block + off * a.kc_page;
    uint8_t* vd = vc + blk * a.vc_block + off * a.vc_page;
    for (int64_t h = 0; h < a.heads; ++h) {
      quantize_head(kd + h * a.kc_head, ko, k + t * a.k_tok + h * a.k_head, a.head_dim, k_scale);
      quantize_head(vd + h * a.vc_head, vo, v + t * a.v_tok + h * a.v_head, a.head_dim, v_scale);
    }
  });
}

// -- the block ops ----------------------------------------------------------------------------
// copy_blocks: cache[dst] = cache[src] per (src, dst) pair, each block one dense region of
// block_bytes, stride_bytes apart (indices validated by the caller; a pair onto itself skipped).
inline void copy_blocks_impl(char* base, const int64_t* pairs, int64_t n, int64_t block_bytes, int64_t stride_bytes) {
  const bool parallel = n > 1 && n * block_bytes >= (1 << 18);
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = pairs[2 * i], d = pairs[2 * i + 1];
    if (s != d) std::memcpy(base + d * stride_bytes, base + s * stride_bytes, block_bytes);
  }
}

// concat_and_cache_mla: the token's [kv_c | k_pe] row (elements of `elt` bytes) at its slot.
struct MlaLayout {
  int64_t tokens, rank, pe, block_size, c_tok, pe_tok, cache_block, cache_page;  // strides in elements
};

// row(t, e): token t's entry, at element e of the cache (slots validated, -1 skipped); in
// parallel from `parallel_from` elements written.
template <typename Row>
inline void for_each_mla_slot(const int64_t* slots, const MlaLayout& a, int64_t parallel_from, const Row& row) {
  const bool parallel = a.tokens > 1 && a.tokens * (a.rank + a.pe) >= parallel_from;
  for_each_slot(slots, a.tokens, a.block_size, parallel, [&](int64_t t, int64_t blk, int64_t off) {
    row(t, blk * a.cache_block + off * a.cache_page);
  });
}

inline void concat_and_cache_mla_impl(const char* kv_c, const char* k_pe, char* cache, const int64_t* slots,
                                      const MlaLayout& a, int64_t elt) {
  for_each_mla_slot(slots, a, 1 << 16, [&](int64_t t, int64_t e) {
    char* dst = cache + e * elt;
    std::memcpy(dst, kv_c + t * a.c_tok * elt, a.rank * elt);
    std::memcpy(dst + a.rank * elt, k_pe + t * a.pe_tok * elt, a.pe * elt);
  });
}

template <typename T>
void concat_and_cache_mla_fp8_impl(const T* kv_c, const T* k_pe, uint8_t* cache, const int64_t* slots,
                                   const MlaLayout& a, float scale) {
  for_each_mla_slot(slots, a, 1 << 15, [&](int64_t t, int64_t e) {
    quantize_row(cache + e, kv_c + t * a.c_tok, a.rank, scale);
    quantize_row(cache + e + a.rank, k_pe + t * a.pe_tok, a.pe, scale);
  });
}

// gather_cache: sequence b's tokens [cu[b], cu[b+1]) from the blocks of its block_table row
// (starting at column starts[b] / block_size) into dst rows cu[b]..; all values validated first.
struct GatherLayout {
  int64_t batch, width, block_size, entry_bytes, cache_block, cache_page, dst_row, table_row;  // bytes but table_row
};

inline void gather_cache_impl(const char* src, char* dst, const int32_t* table, const int32_t* cu,
                              const int32_t* starts, const GatherLayout& a) {
  const bool parallel = a.batch > 1 && (int64_t(cu[a.batch]) - cu[0]) * a.entry_bytes >= (1 << 18);
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) if (parallel)
#endif
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t lo = cu[b], n = int64_t(cu[b + 1]) - lo;
    const int32_t* row = table + b * a.table_row + (starts ? starts[b] / a.block_size : 0);
    for (int64_t i = 0; i < n; ++i) {
      const char* e = src + row[i / a.block_size] * a.cache_block + (i % a.block_size) * a.cache_page;
      std::memcpy(dst + (lo + i) * a.dst_row, e, a.entry_bytes);
    }
  }
}

}  // namespace kvcache_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/block_checks.h"
#include "opmux/kvcache_checks.h"
#include "opmux/contracts/kvcache.h"

namespace opmux {
namespace kvcache_cpu {

// Every slot in [0, num_slots) or -1 (skip), checked before the first write: else ValueError
// naming the first bad one.
inline void check_slots(const char* op, const int64_t* slots, int64_t tokens, int64_t num_slots) {
  const int64_t t = first_bad_slot(slots, tokens, num_slots);
  if (t >= 0) {
    TVM_FFI_THROW(ValueError) << op << ": slot_mapping[" << t << "] = " << slots[t]
                              << " is out of range: valid slots are [0, " << num_slots
                              << ") (num_blocks * block_size), or -1 to skip";
  }
}

void reshape_and_cache_cpu(TensorView key, TensorView value, TensorView key_cache, TensorView value_cache,
                           TensorView slot_mapping, TensorView k_scale, TensorView v_scale, bool fp8) {
  const char* op = "opmux.reshape_and_cache";
  CacheArgs a = check_cache_args(op, kDLCPU, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, fp8);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  check_slots(op, slots, a.tokens, a.num_blocks * a.block_size);
  CacheLayout l;
  l.tokens = a.tokens;
  l.heads = a.heads;
  l.head_dim = a.head_dim;
  l.block_size = a.block_size;
  l.elt_bytes = a.dtype == DType::kFloat32 ? 4 : 2;
  l.k_tok = a.k_tok;
  l.k_head = a.k_head;
  l.v_tok = a.v_tok;
  l.v_head = a.v_head;
  l.kc_block = a.kc[0];
  l.kc_page = a.kc[1];
  l.kc_head = a.kc[2];
  l.vc_block = a.vc[0];
  l.vc_page = a.vc[1];
  l.vc_head = a.vc[2];
  l.kc_dhi = a.kc[3];
  l.kc_dlo = a.kc[4];
  l.kx = a.kx;
  l.vc_dhi = a.vc[3];
  l.vc_dlo = a.vc[4];
  l.vx = a.vx;
  if (!fp8) {
    reshape_and_cache_impl(data_ptr<const char>(key), data_ptr<const char>(value), data_ptr<char>(key_cache),
                           data_ptr<char>(value_cache), slots, l);
    return;
  }
  const float ks = *data_ptr<const float>(k_scale), vs = *data_ptr<const float>(v_scale);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    reshape_and_cache_fp8_impl(data_ptr<const scalar_t>(key), data_ptr<const scalar_t>(value),
                               data_ptr<uint8_t>(key_cache), data_ptr<uint8_t>(value_cache), slots, l, ks, vs);
  });
}

void copy_blocks_cpu(TensorView cache, TensorView block_mapping) {
  const char* op = "opmux.copy_blocks";
  check_device(op, kDLCPU, {{"cache", &cache}, {"block_mapping", &block_mapping}});
  const BlockCache c = check_block_cache(op, "cache", cache);
  const int64_t n = check_block_mapping(op, block_mapping);
  const int64_t* pairs = data_ptr<const int64_t>(block_mapping);
  for (int64_t i = 0; i < 2 * n; ++i) {
    if (pairs[i] < 0 || pairs[i] >= c.num_blocks) {
      TVM_FFI_THROW(ValueError) << op << ": block_mapping[" << i / 2 << ", " << i % 2 << "] = " << pairs[i]
                                << " is out of range: valid " << (i % 2 ? "destination" : "source")
                                << " blocks are [0, " << c.num_blocks << ")";
    }
  }
  if (c.block_bytes == 0) return;
  copy_blocks_impl(data_ptr<char>(cache), pairs, n, c.block_bytes, c.stride_bytes);
}

void concat_and_cache_mla_cpu(TensorView kv_c, TensorView k_pe, TensorView kv_cache, TensorView slot_mapping,
                              TensorView scale, bool fp8) {
  const char* op = "opmux.concat_and_cache_mla";
  const MlaArgs m = check_mla_args(op, kDLCPU, kv_c, k_pe, kv_cache, slot_mapping, scale, fp8);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  check_slots(op, slots, m.tokens, m.num_blocks * m.block_size);
  const MlaLayout l{m.tokens, m.rank, m.pe, m.block_size, m.c_tok, m.pe_tok, m.cache_block, m.cache_page};
  if (!fp8) {
    concat_and_cache_mla_impl(data_ptr<const char>(kv_c), data_ptr<const char>(k_pe), data_ptr<char>(kv_cache), slots,
                              l, m.dtype == DType::kFloat32 ? 4 : 2);
    return;
  }
  const float s = *data_ptr<const float>(scale);
  OPMUX_DISPATCH_DTYPE(m.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    concat_and_cache_mla_fp8_impl(data_ptr<const scalar_t>(kv_c), data_ptr<const scalar_t>(k_pe),
                                  data_ptr<uint8_t>(kv_cache), slots, l, s);
  });
}

void gather_cache_cpu(TensorView src_cache, TensorView dst, TensorView block_table, TensorView cu_seq_lens,
                      TensorView seq_starts, bool has_starts) {
  const char* op = "opmux.gather_cache";
  const GatherArgs g = check_gather_args(op, kDLCPU, src_cache, dst, block_table, cu_seq_lens, seq_starts, has_starts);
  const int32_t* table = data_ptr<const int32_t>(block_table);
  const int32_t* cu = data_ptr<const int32_t>(cu_seq_lens);
  const int32_t* starts = has_starts ? data_ptr<const int32_t>(seq_starts) : nullptr;
  for (int64_t b = 0; b < g.batch; ++b) {  // every value first: nothing is written on an error
    const int64_t lo = cu[b], hi = cu[b + 1], first = starts ? starts[b] : 0;
    if (lo < 0 || hi < lo) {
      TVM_FFI_THROW(ValueError) << op << ": cu_seq_lens[" << b << "] = " << lo << ", cu_seq_lens[" << b + 1
                                << "] = " << hi << ": they must be non-decreasing from 0";
    }
    if (hi > g.rows) {
      TVM_FFI_THROW(ValueError) << op << ": cu_seq_lens[" << b + 1 << "] = " << hi << " exceeds dst's " << g.rows
                                << " rows";
    }
    if (first < 0) TVM_FFI_THROW(ValueError) << op << ": seq_starts[" << b << "] = " << first << " is negative";
    const int64_t col0 = first / g.block_size, need = col0 + (hi - lo + g.block_size - 1) / g.block_size;
    if (need > g.width) {
      TVM_FFI_THROW(ValueError) << op << ": sequence " << b << " needs " << need << " entries of block_table[" << b
                                << "], which has " << g.width;
    }
    for (int64_t c = col0; c < need; ++c) {
      const int32_t blk = table[b * g.table_row + c];
      if (blk < 0 || blk >= g.num_blocks) {
        TVM_FFI_THROW(ValueError) << op << ": block_table[" << b << ", " << c << "] = " << blk
                                  << " is out of range: valid blocks are [0, " << g.num_blocks << ")";
      }
    }
  }
  if (g.entry_bytes == 0) return;
  const GatherLayout l{g.batch, g.width, g.block_size, g.entry_bytes, g.cache_block, g.cache_page, g.dst_row, g.table_row};
  gather_cache_impl(data_ptr<const char>(src_cache), data_ptr<char>(dst), table, cu, starts, l);
}

}  // namespace kvcache_cpu
}  // namespace opmux

// The serving lanes, generated from the contracts (ops/kvcache; opmux/lane.h)
#include "opmux/contracts/kvcache_cpu_lanes.inc"

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cpu, opmux::kvcache_cpu::reshape_and_cache_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(copy_blocks_cpu, opmux::kvcache_cpu::copy_blocks_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(concat_and_cache_mla_cpu, opmux::kvcache_cpu::concat_and_cache_mla_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gather_cache_cpu, opmux::kvcache_cpu::gather_cache_cpu);
#endif  // OPMUX_CPU_KERNELS_ONLY
