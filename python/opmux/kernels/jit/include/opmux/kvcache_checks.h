// Argument validation for reshape_and_cache, shared by the CPU and CUDA units.
#pragma once

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct CacheArgs {
  DType dtype;
  int32_t device_id;
  int64_t tokens, heads, head_dim, num_blocks, block_size;
  int64_t k_tok, k_head, v_tok, v_head;  // key / value strides (elements)
  int64_t kc_block, vc_block;            // cache block strides (elements)
};

// key/value [T, H, D] (last dim dense), caches [num_blocks, block_size, H, D] (each block dense),
// slot_mapping int64 [T].
inline CacheArgs check_cache_args(const char* op, int32_t device_type, const TensorView& key,
                                  const TensorView& value, const TensorView& kc,
                                  const TensorView& vc, const TensorView& slots) {
  CacheArgs a;
  a.device_id = check_device(op, device_type, {{"key", &key}, {"value", &value}, {"key_cache", &kc},
                                               {"value_cache", &vc}, {"slot_mapping", &slots}});
  check_ndim(op, "key", key, 3);
  check_ndim(op, "value", value, 3);
  check_ndim(op, "key_cache", kc, 4);
  check_ndim(op, "value_cache", vc, 4);
  a.dtype = check_same_dtype(op, {{"key", &key}, {"value", &value}, {"key_cache", &kc}, {"value_cache", &vc}});
  check_int64(op, "slot_mapping", slots);
  a.tokens = key.size(0);
  a.heads = key.size(1);
  a.head_dim = key.size(2);
  if (a.heads < 1 || a.head_dim < 1) {
    TVM_FFI_THROW(ValueError) << op << ": key has " << a.heads << " heads of dim " << a.head_dim
                              << "; H and D must be at least 1";
  }
  a.num_blocks = kc.size(0);
  a.block_size = kc.size(1);
  for (int d = 0; d < 3; ++d) check_size(op, "value", value, d, key.size(d), "key's shape");
  check_size(op, "key_cache", kc, 2, a.heads, "heads of key");
  check_size(op, "key_cache", kc, 3, a.head_dim, "head_dim of key");
  for (int d = 0; d < 4; ++d) check_size(op, "value_cache", vc, d, kc.size(d), "key_cache's shape");
  check_vector(op, "slot_mapping", slots, a.tokens, "tokens of key");
  check_last_dim_contiguous(op, "key", key);
  check_last_dim_contiguous(op, "value", value);
  const int64_t hd = a.heads * a.head_dim;
  for (const auto& [name, c] : {std::pair<const char*, const TensorView*>{"key_cache", &kc}, {"value_cache", &vc}}) {
    const bool dense = (c->size(3) <= 1 || c->stride(3) == 1) && (c->size(2) <= 1 || c->stride(2) == a.head_dim) &&
                       (c->size(1) <= 1 || c->stride(1) == hd);
    if (!dense || c->stride(0) < 0) {
      TVM_FFI_THROW(ValueError) << op << ": " << name
                                << " is non-contiguous within a block; each [block_size, H, D] block must be dense";
    }
  }
  auto nonneg = [&](const char* name, int64_t s) {
    if (s < 0) TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative stride";
    return s;
  };
  a.k_tok = nonneg("key", key.stride(0));
  a.k_head = nonneg("key", key.stride(1));
  a.v_tok = nonneg("value", value.stride(0));
  a.v_head = nonneg("value", value.stride(1));
  a.kc_block = kc.stride(0);
  a.vc_block = vc.stride(0);
  return a;
}

}  // namespace opmux
