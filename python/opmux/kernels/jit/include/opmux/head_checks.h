// Argument validation for the per-head ops (qk_norm, rotary_embedding), shared by the CPU and
// CUDA units. Their q / k tensors are 3-D [tokens, heads, head_dim]: the Python wrapper views
// [T, H * D] and [T, H, D] inputs that way without copying, so token and head strides are free
// (a q slice of a fused qkv projection has token stride (Hq + 2 Hk) * D) but the last dim is dense.
#pragma once

#include "opmux/common.h"

namespace opmux {

// One [tokens, heads, head_dim] tensor, addressed as base + t * token_stride + h * head_stride.
struct Heads {
  int64_t tokens;
  int64_t heads;
  int64_t token_stride;  // elements
  int64_t head_stride;
};

// Non-negative strides (size-1 dims count as stride 0), dense last dim.
inline Heads check_heads(const char* op, const char* name, const TensorView& t) {
  check_ndim(op, name, t, 3);
  check_last_dim_contiguous(op, name, t);
  Heads h;
  h.tokens = t.size(0);
  h.heads = t.size(1);
  h.token_stride = t.size(0) <= 1 ? 0 : t.stride(0);
  h.head_stride = t.size(1) <= 1 ? 0 : t.stride(1);
  if (h.token_stride < 0 || h.head_stride < 0) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative stride (" << t.stride(0)
                              << ", " << t.stride(1) << "); only non-negative strides are supported";
  }
  return h;
}

struct QkNormArgs {
  DType dtype;
  int32_t device_id;
  int64_t head_dim;
  Heads q, k;
};

// qk_norm(q, k, q_weight, k_weight, eps): q [Tq, Hq, D], k [Tk, Hk, D], weights [D]; all one
// dtype. q and k are normalized in place.
inline QkNormArgs check_qk_norm_args(const char* op, int32_t device_type, const TensorView& q,
                                     const TensorView& k, const TensorView& q_weight,
                                     const TensorView& k_weight, double eps) {
  QkNormArgs a;
  a.q = check_heads(op, "q", q);
  a.k = check_heads(op, "k", k);
  check_ndim(op, "q_weight", q_weight, 1);
  check_ndim(op, "k_weight", k_weight, 1);
  a.device_id = check_device(
      op, device_type, {{"q", &q}, {"k", &k}, {"q_weight", &q_weight}, {"k_weight", &k_weight}});
  a.dtype = check_same_dtype(
      op, {{"q", &q}, {"k", &k}, {"q_weight", &q_weight}, {"k_weight", &k_weight}});
  a.head_dim = q.size(2);
  check_size(op, "k", k, 2, a.head_dim, "q's head_dim");
  check_size(op, "q_weight", q_weight, 0, a.head_dim, "head_dim");
  check_size(op, "k_weight", k_weight, 0, a.head_dim, "head_dim");
  check_last_dim_contiguous(op, "q_weight", q_weight);
  check_last_dim_contiguous(op, "k_weight", k_weight);
  // eps > 0 and q, k distinct are the Python contract's rules: neither reaches out of bounds
  (void)eps;
  return a;
}

struct RopeArgs {
  DType dtype;        // of query and key
  DType cache_dtype;  // float32 or the query dtype
  int32_t device_id;
  int64_t head_size;
  int64_t rot_dim;    // rotary_dim: the cache's width, <= head_size, even
  int64_t max_pos;
  int64_t cache_stride;
  Heads q, k;
};

// rotary_embedding(positions, query, key, cos_sin_cache, is_neox): positions int64 [T],
// query [T, Hq, head_size], key [T, Hk, head_size], cos_sin_cache [max_position, rotary_dim].
inline RopeArgs check_rope_args(const char* op, int32_t device_type, const TensorView& positions,
                                const TensorView& query, const TensorView& key,
                                const TensorView& cache) {
  RopeArgs a;
  check_ndim(op, "positions", positions, 1);
  a.q = check_heads(op, "query", query);
  a.k = check_heads(op, "key", key);
  check_ndim(op, "cos_sin_cache", cache, 2);
  a.device_id = check_device(op, device_type,
                             {{"positions", &positions}, {"query", &query}, {"key", &key},
                              {"cos_sin_cache", &cache}});
  const DLDataType pd = positions.dtype();
  if (!(pd.code == kDLInt && pd.bits == 64 && pd.lanes == 1)) {
    const bool integer = pd.code == kDLInt || pd.code == kDLUInt;
    TVM_FFI_THROW(ValueError) << op << ": positions has dtype " << dtype_name(pd)
                              << (integer ? std::to_string(pd.bits) : std::string())
                              << "; expected int64";
  }
  a.dtype = check_same_dtype(op, {{"query", &query}, {"key", &key}});
  a.cache_dtype = get_dtype(op, "cos_sin_cache", cache);
  if (a.cache_dtype != a.dtype && a.cache_dtype != DType::kFloat32) {
    TVM_FFI_THROW(ValueError) << op << ": cos_sin_cache has dtype " << dtype_name(cache.dtype())
                              << "; expected float32 or " << dtype_name(query.dtype())
                              << " (the query dtype)";
  }
  const int64_t tokens = positions.size(0);
  check_size(op, "query", query, 0, tokens, "the number of positions");
  check_size(op, "key", key, 0, tokens, "the number of positions");
  a.head_size = query.size(2);
  check_size(op, "key", key, 2, a.head_size, "query's head_size");
  a.rot_dim = cache.size(1);
  if (a.rot_dim <= 0 || a.rot_dim % 2 != 0 || a.rot_dim > a.head_size) {
    TVM_FFI_THROW(ValueError) << op << ": cos_sin_cache.shape[1] (rotary_dim) is " << a.rot_dim
                              << "; it must be even, positive and <= head_size " << a.head_size;
  }
  a.max_pos = cache.size(0);
  check_last_dim_contiguous(op, "positions", positions);
  check_last_dim_contiguous(op, "cos_sin_cache", cache);
  a.cache_stride = row_stride(op, "cos_sin_cache", cache);
  // query and key distinct is the Python contract's rule (overlap): it is not a bounds matter
  return a;
}

}  // namespace opmux
