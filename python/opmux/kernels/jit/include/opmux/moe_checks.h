// Argument validation for the moe ops, shared by the CPU and CUDA units.
#pragma once

#include <algorithm>
#include <cmath>

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct TopkArgs {
  DType dtype;
  int32_t device_id;
  int64_t tokens, experts, k, g_stride;
  int64_t w_stride, ids_stride, tei_stride;  // output row strides (elements)
  bool ids64;                                // topk_ids is int64 (else int32)
};

// Row stride of a [T, k] output (last dim dense, rows not overlapping).
inline int64_t out_row_stride(const char* op, const char* name, const TensorView& t, int64_t k) {
  check_last_dim_contiguous(op, name, t);
  const int64_t s = t.size(0) <= 1 ? k : t.stride(0);
  if (s < k) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has row stride " << s << " < topk " << k
                              << " (rows overlap)";
  }
  return s;
}

// topk_softmax(weights fp32 [T, k], ids int32/int64 [T, k], token_expert_indices int32 [T, k]
// (read only when has_tei), gating [T, E], correction_bias fp32 [E] (read only when has_bias))
inline TopkArgs check_topk_args(const char* op, int32_t device_type, const TensorView& w,
                                const TensorView& ids, const TensorView& tei, bool has_tei,
                                const TensorView& g, const TensorView& bias, bool has_bias,
                                double softcap) {
  TopkArgs a;
  a.device_id = check_device(op, device_type, {{"topk_weights", &w}, {"topk_ids", &ids}, {"gating_output", &g}});
  if (has_tei) check_device(op, device_type, {{"gating_output", &g}, {"token_expert_indices", &tei}});
  if (has_bias) check_device(op, device_type, {{"gating_output", &g}, {"correction_bias", &bias}});
  check_ndim(op, "gating_output", g, 2);
  check_ndim(op, "topk_weights", w, 2);
  check_ndim(op, "topk_ids", ids, 2);
  a.dtype = get_dtype(op, "gating_output", g);
  check_float32(op, "topk_weights", w);
  a.ids64 = is_dtype(ids, kDLInt, 64);
  if (!a.ids64) check_int32(op, "topk_ids", ids);
  a.tokens = g.size(0);
  a.experts = g.size(1);
  a.k = w.size(1);
  if (a.experts < 1 || a.k < 1 || a.k > a.experts) {
    TVM_FFI_THROW(ValueError) << op << ": need 1 <= topk <= experts, got topk " << a.k << " and "
                              << a.experts << " experts";
  }
  (void)softcap;  // finite and >= 0 is the Python contract's rule: any value stays in bounds
  check_size(op, "topk_weights", w, 0, a.tokens, "tokens of gating_output");
  check_size(op, "topk_ids", ids, 0, a.tokens, "tokens of gating_output");
  check_size(op, "topk_ids", ids, 1, a.k, "topk");
  check_last_dim_contiguous(op, "gating_output", g);
  a.w_stride = out_row_stride(op, "topk_weights", w, a.k);
  a.ids_stride = out_row_stride(op, "topk_ids", ids, a.k);
  a.tei_stride = a.k;
  if (has_tei) {
    check_ndim(op, "token_expert_indices", tei, 2);
    check_int32(op, "token_expert_indices", tei);
    check_size(op, "token_expert_indices", tei, 0, a.tokens, "tokens of gating_output");
    check_size(op, "token_expert_indices", tei, 1, a.k, "topk");
    a.tei_stride = out_row_stride(op, "token_expert_indices", tei, a.k);
  }
  if (has_bias) {
    check_float32(op, "correction_bias", bias);
    check_vector(op, "correction_bias", bias, a.experts, "one per expert");
  }
  a.g_stride = row_stride(op, "gating_output", g);
  return a;
}

// An alignment op's 1-D output buffer: at least `n` elements (`what` says why), unit stride, its
// length fitting int32 -> its length.
inline int64_t out_vector(const char* op, const char* name, const TensorView& t, int64_t n, const char* what) {
  check_ndim(op, name, t, 1);
  if (t.size(0) < n) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has " << t.size(0) << " elements, expected at least " << n
                              << " (" << what << ")";
  }
  check_last_dim_contiguous(op, name, t);
  if (t.size(0) >= (int64_t(1) << 31)) TVM_FFI_THROW(ValueError) << op << ": " << name << " is too long";
  return t.size(0);
}

struct AlignArgs {
  int32_t device_id;
  int64_t numel, n_sorted, n_blocks;
  bool ids64;
};

// moe_align_block_size(sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum (when
// has_cumsum), topk_ids, expert_map (when has_map), block_size, num_experts, ...): the buffers
// may be longer than the padded total can reach (every element is written).
inline AlignArgs check_align_args(const char* op, int32_t device_type, const TensorView& sorted,
                                  const TensorView& experts, const TensorView& post,
                                  const TensorView& cumsum, bool has_cumsum, const TensorView& ids,
                                  const TensorView& map, bool has_map, int64_t block_size,
                                  int64_t num_experts) {
  AlignArgs a;
  a.device_id = check_device(op, device_type, {{"sorted_token_ids", &sorted}, {"expert_ids", &experts},
                                               {"num_tokens_post_padded", &post}, {"topk_ids", &ids}});
  if (has_cumsum) check_device(op, device_type, {{"topk_ids", &ids}, {"cumsum_buffer", &cumsum}});
  if (has_map) check_device(op, device_type, {{"topk_ids", &ids}, {"expert_map", &map}});
  check_ndim(op, "topk_ids", ids, 2);
  a.ids64 = is_dtype(ids, kDLInt, 64);
  if (!a.ids64) check_int32(op, "topk_ids", ids);
  check_int32(op, "sorted_token_ids", sorted);
  check_int32(op, "expert_ids", experts);
  check_int32(op, "num_tokens_post_padded", post);
  if (block_size < 1 || num_experts < 1) {
    TVM_FFI_THROW(ValueError) << op << ": block_size and num_experts must be positive, got "
                              << block_size << " and " << num_experts;
  }
  if (block_size >= (int64_t(1) << 31) || num_experts >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << op << ": block_size " << block_size << " and num_experts " << num_experts
                              << " must fit int32";
  }
  a.numel = ids.size(0) * ids.size(1);
  // an empty topk_ids (k = 0) has no layout to check
  if (a.numel > 0 &&
      ((ids.size(1) > 1 && ids.stride(1) != 1) || (ids.size(0) > 1 && ids.stride(0) != ids.size(1)))) {
    TVM_FFI_THROW(ValueError) << op << ": topk_ids must be contiguous";
  }
  // the padded total is at most numel + min(E, numel) * (block_size - 1)
  const int64_t need = a.numel + std::min(num_experts, a.numel) * (block_size - 1);
  const int64_t max_padded = a.numel + num_experts * (block_size - 1);
  if (max_padded >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << op << ": " << max_padded << " padded slots do not fit int32";
  }
  a.n_sorted = out_vector(op, "sorted_token_ids", sorted, need, "T*k + min(E, T*k)*(block_size-1)");
  a.n_blocks = out_vector(op, "expert_ids", experts, need / block_size, "one per block");
  out_vector(op, "num_tokens_post_padded", post, 1, "one element");
  if (has_cumsum) {
    check_int32(op, "cumsum_buffer", cumsum);
    out_vector(op, "cumsum_buffer", cumsum, num_experts + 1, "num_experts + 1");
  }
  if (has_map) {
    check_int32(op, "expert_map", map);
    check_vector(op, "expert_map", map, num_experts, "one per expert");
  }
  return a;
}

struct BatchedArgs {
  int32_t device_id;
  int64_t num_experts, n_sorted, n_blocks;
};

// batched_moe_align_block_size(sorted_ids, expert_ids, num_tokens_post_padded, expert_num_tokens
// int32 [E], max_tokens_per_batch, block_size): buffers of at least E * round_up(m, block_size)
// slots and their blocks (every element is written).
inline BatchedArgs check_batched_args(const char* op, int32_t device_type, const TensorView& sorted,
                                      const TensorView& experts, const TensorView& post,
                                      const TensorView& counts, int64_t m, int64_t block_size) {
  BatchedArgs a;
  a.device_id = check_device(op, device_type, {{"sorted_ids", &sorted}, {"expert_ids", &experts},
                                               {"num_tokens_post_padded", &post}, {"expert_num_tokens", &counts}});
  check_ndim(op, "expert_num_tokens", counts, 1);
  check_int32(op, "expert_num_tokens", counts);
  check_last_dim_contiguous(op, "expert_num_tokens", counts);
  check_int32(op, "sorted_ids", sorted);
  check_int32(op, "expert_ids", experts);
  check_int32(op, "num_tokens_post_padded", post);
  a.num_experts = counts.size(0);
  if (a.num_experts < 1 || m < 1 || block_size < 1) {
    TVM_FFI_THROW(ValueError) << op << ": need at least one expert, max_tokens_per_batch >= 1 and block_size >= 1, got "
                              << a.num_experts << ", " << m << " and " << block_size;
  }
  if (m >= (int64_t(1) << 31) || block_size >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << op << ": max_tokens_per_batch " << m << " and block_size " << block_size
                              << " must fit int32";
  }
  const int64_t need = a.num_experts * ((m + block_size - 1) / block_size * block_size);
  if (need >= (int64_t(1) << 31) || a.num_experts * m >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << op << ": " << need << " padded slots do not fit int32";
  }
  a.n_sorted = out_vector(op, "sorted_ids", sorted, need, "E * round_up(max_tokens_per_batch, block_size)");
  a.n_blocks = out_vector(op, "expert_ids", experts, need / block_size, "one per block");
  out_vector(op, "num_tokens_post_padded", post, 1, "one element");
  return a;
}

}  // namespace opmux
