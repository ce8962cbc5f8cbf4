// reshape_and_cache for CPU tensors (NHD paged layout): key/value rows copied into the cache
// slot given by slot_mapping; slot -1 skips a token. Every slot is validated before the first
// write: an out-of-range slot raises ValueError naming it and leaves the caches untouched.
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry point.
#include <cstdint>
#include <cstring>

namespace opmux {
namespace kvcache_cpu {

// Shapes and strides of one reshape_and_cache call: key / value [tokens, heads, head_dim],
// caches [num_blocks, block_size, heads, head_dim] with dense blocks. Strides in elements.
struct CacheLayout {
  int64_t tokens, heads, head_dim, block_size;
  int64_t elt_bytes;                     // 4 (float32) or 2 (float16 / bfloat16)
  int64_t k_tok, k_head, v_tok, v_head;  // key / value strides
  int64_t kc_block, vc_block;            // cache block strides
};

// The first t whose slot is neither -1 nor in [0, num_slots), or -1 when all are valid.
inline int64_t first_bad_slot(const int64_t* slots, int64_t tokens, int64_t num_slots) {
  for (int64_t t = 0; t < tokens; ++t)
    if (slots[t] < -1 || slots[t] >= num_slots) return t;
  return -1;
}

// Copies every token with a slot >= 0 (slots already validated).
inline void reshape_and_cache_impl(const char* k, const char* v, char* kc, char* vc,
                                   const int64_t* slots, const CacheLayout& a) {
  if (a.tokens == 0 || a.heads * a.head_dim == 0) return;
  const int64_t elt = a.elt_bytes;
  const int64_t row = a.head_dim * elt, hd = a.heads * a.head_dim;
  const bool parallel = a.tokens > 1 && a.tokens * hd >= (1 << 16);
  const bool dense = (a.heads == 1 || (a.k_head == a.head_dim && a.v_head == a.head_dim));
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    const int64_t blk = s / a.block_size, off = s % a.block_size;
    char* kd = kc + (blk * a.kc_block + off * hd) * elt;
    char* vd = vc + (blk * a.vc_block + off * hd) * elt;
    if (dense) {  // the token's heads are one row of H * D elements: one copy each
      std::memcpy(kd, k + t * a.k_tok * elt, hd * elt);
      std::memcpy(vd, v + t * a.v_tok * elt, hd * elt);
      continue;
    }
    for (int64_t h = 0; h < a.heads; ++h) {
      std::memcpy(kd + h * row, k + (t * a.k_tok + h * a.k_head) * elt, row);
      std::memcpy(vd + h * row, v + (t * a.v_tok + h * a.v_head) * elt, row);
    }
  }
}

}  // namespace kvcache_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/kvcache_checks.h"

namespace opmux {
namespace kvcache_cpu {

void reshape_and_cache_cpu(TensorView key, TensorView value, TensorView key_cache, TensorView value_cache,
                           TensorView slot_mapping) {
  const char* op = "opmux.reshape_and_cache";
  CacheArgs a = check_cache_args(op, kDLCPU, key, value, key_cache, value_cache, slot_mapping);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  const int64_t num_slots = a.num_blocks * a.block_size;
  const int64_t t = first_bad_slot(slots, a.tokens, num_slots);
  if (t >= 0) {
    TVM_FFI_THROW(ValueError) << op << ": slot_mapping[" << t << "] = " << slots[t]
                              << " is out of range: valid slots are [0, " << num_slots
                              << ") (num_blocks * block_size), or -1 to skip";
  }
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
  l.kc_block = a.kc_block;
  l.vc_block = a.vc_block;
  reshape_and_cache_impl(data_ptr<const char>(key), data_ptr<const char>(value),
                         data_ptr<char>(key_cache), data_ptr<char>(value_cache), slots, l);
}

}  // namespace kvcache_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cpu, opmux::kvcache_cpu::reshape_and_cache_cpu);
#endif  // OPMUX_CPU_KERNELS_ONLY
