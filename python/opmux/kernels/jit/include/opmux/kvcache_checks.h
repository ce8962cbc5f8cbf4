// Argument validation for reshape_and_cache, shared by the CPU and CUDA units.
#pragma once

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct CacheArgs {
  DType dtype;  // of key / value
  int32_t device_id;
  int64_t tokens, heads, head_dim, num_blocks, block_size;
  int64_t k_tok, k_head, v_tok, v_head;  // key / value strides (elements)
  // cache strides (elements) of block, offset in block, head, d / x, d % x; element d of a head
  // row lives at (d / x) * [3] + (d % x) * [4] (x = D, [4] = 1 for NHD / HND; vLLM's paged key
  // [nb, H, D/x, bs, x] has chunks of x, its paged value [nb, H, D, bs] a d stride of bs)
  int64_t kc[5], vc[5];
  int64_t kx, vx;
  bool paged;
};

// key/value [T, H, D] (last dim dense), caches [num_blocks, block_size, H, D] (head_dim dense,
// other strides free and non-negative: NHD or a permuted HND view), or vLLM's paged key
// [num_blocks, H, D/x, block_size, x] (x dense) with value [num_blocks, H, D, block_size]; of
// key's dtype, or fp8 (e4m3fn or its uint8 view) with float32 one-element k_scale / v_scale;
// slot_mapping int64 [T].
inline CacheArgs check_cache_args(const char* op, int32_t device_type, const TensorView& key,
                                  const TensorView& value, const TensorView& kc,
                                  const TensorView& vc, const TensorView& slots,
                                  const TensorView& k_scale, const TensorView& v_scale, bool fp8) {
  CacheArgs a;
  a.device_id = check_device(op, device_type, {{"key", &key}, {"value", &value}, {"key_cache", &kc},
                                               {"value_cache", &vc}, {"slot_mapping", &slots}});
  check_ndim(op, "key", key, 3);
  check_ndim(op, "value", value, 3);
  a.paged = kc.ndim() == 5;
  if (!a.paged) check_ndim(op, "key_cache", kc, 4);
  check_ndim(op, "value_cache", vc, 4);
  if (fp8) {
    a.dtype = check_same_dtype(op, {{"key", &key}, {"value", &value}});
    check_fp8_bytes(op, "key_cache", kc);
    check_fp8_bytes(op, "value_cache", vc);
    check_device(op, device_type, {{"key", &key}, {"k_scale", &k_scale}, {"v_scale", &v_scale}});
    for (const auto& [name, s] : {std::pair<const char*, const TensorView*>{"k_scale", &k_scale}, {"v_scale", &v_scale}}) {
      check_float32(op, name, *s);
      int64_t n = 1;
      for (int d = 0; d < s->ndim(); ++d) n *= s->size(d);
      if (n != 1) TVM_FFI_THROW(ValueError) << op << ": " << name << " must have one element, got " << n;
    }
  } else {
    a.dtype = check_same_dtype(op, {{"key", &key}, {"value", &value}, {"key_cache", &kc}, {"value_cache", &vc}});
  }
  check_int64(op, "slot_mapping", slots);
  a.tokens = key.size(0);
  a.heads = key.size(1);
  a.head_dim = key.size(2);
  if (a.heads < 1 || a.head_dim < 1) {
    TVM_FFI_THROW(ValueError) << op << ": key has " << a.heads << " heads of dim " << a.head_dim
                              << "; H and D must be at least 1";
  }
  a.num_blocks = kc.size(0);
  a.block_size = a.paged ? kc.size(3) : kc.size(1);
  for (int d = 0; d < 3; ++d) check_size(op, "value", value, d, key.size(d), "key's shape");
  if (a.paged) {
    const int64_t x = kc.size(4);
    if (x < 1 || a.head_dim % x != 0) {
      TVM_FFI_THROW(ValueError) << op << ": the paged key_cache's x (" << x << ") must divide head_dim " << a.head_dim;
    }
    check_size(op, "key_cache", kc, 1, a.heads, "heads of key");
    check_size(op, "key_cache", kc, 2, a.head_dim / x, "head_dim / x");
    check_size(op, "value_cache", vc, 0, a.num_blocks, "num_blocks");
    check_size(op, "value_cache", vc, 1, a.heads, "heads of key");
    check_size(op, "value_cache", vc, 2, a.head_dim, "head_dim of key");
    check_size(op, "value_cache", vc, 3, a.block_size, "block_size");
    check_last_dim_contiguous(op, "key_cache", kc);
  } else {
    check_size(op, "key_cache", kc, 2, a.heads, "heads of key");
    check_size(op, "key_cache", kc, 3, a.head_dim, "head_dim of key");
    for (int d = 0; d < 4; ++d) check_size(op, "value_cache", vc, d, kc.size(d), "key_cache's shape");
    check_last_dim_contiguous(op, "key_cache", kc);
    check_last_dim_contiguous(op, "value_cache", vc);
  }
  check_vector(op, "slot_mapping", slots, a.tokens, "tokens of key");
  check_last_dim_contiguous(op, "key", key);
  check_last_dim_contiguous(op, "value", value);
  auto nonneg = [&](const char* name, int64_t s) {
    if (s < 0) TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative stride";
    return s;
  };
  a.k_tok = nonneg("key", key.stride(0));
  a.k_head = nonneg("key", key.stride(1));
  a.v_tok = nonneg("value", value.stride(0));
  a.v_head = nonneg("value", value.stride(1));
  for (int d = 0; d < kc.ndim(); ++d) nonneg("key_cache", kc.stride(d));
  for (int d = 0; d < 4; ++d) nonneg("value_cache", vc.stride(d));
  if (a.paged) {  // key [nb, H, D/x, bs, x], value [nb, H, D, bs]
    const int64_t kp[5] = {kc.stride(0), kc.stride(3), kc.stride(1), kc.stride(2), 1};
    const int64_t vp[5] = {vc.stride(0), vc.stride(3), vc.stride(1), 0, vc.stride(2)};
    for (int d = 0; d < 5; ++d) {
      a.kc[d] = kp[d];
      a.vc[d] = vp[d];
    }
    a.kx = kc.size(4);
    a.vx = a.head_dim;
  } else {
    for (int d = 0; d < 3; ++d) {
      a.kc[d] = kc.stride(d);
      a.vc[d] = vc.stride(d);
    }
    a.kc[3] = a.vc[3] = 0;
    a.kc[4] = a.vc[4] = 1;
    a.kx = a.vx = a.head_dim;
  }
  return a;
}

}  // namespace opmux
