// reshape_and_cache for CPU tensors (NHD paged layout): key/value rows copied into the cache
// slot given by slot_mapping; slot -1 skips a token. Every slot is validated before the first
// write: an out-of-range slot raises ValueError naming it and leaves the caches untouched.
#include <tvm/ffi/function.h>

#include <cstring>

#include "opmux/kvcache_checks.h"

namespace opmux {
namespace kvcache_cpu {

void reshape_and_cache_cpu(TensorView key, TensorView value, TensorView key_cache, TensorView value_cache,
                           TensorView slot_mapping) {
  const char* op = "opmux.reshape_and_cache";
  CacheArgs a = check_cache_args(op, kDLCPU, key, value, key_cache, value_cache, slot_mapping);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  const int64_t num_slots = a.num_blocks * a.block_size;
  for (int64_t t = 0; t < a.tokens; ++t) {
    if (slots[t] < -1 || slots[t] >= num_slots) {
      TVM_FFI_THROW(ValueError) << op << ": slot_mapping[" << t << "] = " << slots[t]
                                << " is out of range: valid slots are [0, " << num_slots
                                << ") (num_blocks * block_size), or -1 to skip";
    }
  }
  if (a.tokens == 0 || a.heads * a.head_dim == 0) return;
  const int64_t elt = a.dtype == DType::kFloat32 ? 4 : 2;
  const char* k = data_ptr<const char>(key);
  const char* v = data_ptr<const char>(value);
  char* kc = data_ptr<char>(key_cache);
  char* vc = data_ptr<char>(value_cache);
  const int64_t row = a.head_dim * elt, hd = a.heads * a.head_dim;
  const bool parallel = a.tokens > 1 && a.tokens * hd >= (1 << 16);
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
    for (int64_t h = 0; h < a.heads; ++h) {
      std::memcpy(kd + h * row, k + (t * a.k_tok + h * a.k_head) * elt, row);
      std::memcpy(vd + h * row, v + (t * a.v_tok + h * a.v_head) * elt, row);
    }
  }
}

}  // namespace kvcache_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(reshape_and_cache_cpu, opmux::kvcache_cpu::reshape_and_cache_cpu);
