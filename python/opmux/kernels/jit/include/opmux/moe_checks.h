// Argument validation for the moe ops, shared by the CPU and CUDA units.
#pragma once

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

struct TopkArgs {
  DType dtype;
  int32_t device_id;
  int64_t tokens, experts, k, g_stride;
};

// topk_softmax(weights fp32 [T, k], ids int32 [T, k], gating [T, E], renormalize)
inline TopkArgs check_topk_args(const char* op, int32_t device_type, const TensorView& w,
                                const TensorView& ids, const TensorView& g) {
  TopkArgs a;
  a.device_id = check_device(op, device_type, {{"topk_weights", &w}, {"topk_ids", &ids}, {"gating_output", &g}});
  check_ndim(op, "gating_output", g, 2);
  check_ndim(op, "topk_weights", w, 2);
  check_ndim(op, "topk_ids", ids, 2);
  a.dtype = get_dtype(op, "gating_output", g);
  check_float32(op, "topk_weights", w);
  check_int32(op, "topk_ids", ids);
  a.tokens = g.size(0);
  a.experts = g.size(1);
  a.k = w.size(1);
  if (a.experts < 1 || a.k < 1 || a.k > a.experts) {
    TVM_FFI_THROW(ValueError) << op << ": need 1 <= topk <= experts, got topk " << a.k << " and "
                              << a.experts << " experts";
  }
  check_size(op, "topk_weights", w, 0, a.tokens, "tokens of gating_output");
  check_size(op, "topk_ids", ids, 0, a.tokens, "tokens of gating_output");
  check_size(op, "topk_ids", ids, 1, a.k, "topk");
  check_last_dim_contiguous(op, "gating_output", g);
  check_last_dim_contiguous(op, "topk_weights", w);
  check_last_dim_contiguous(op, "topk_ids", ids);
  if ((a.tokens > 1 && (w.stride(0) != a.k || ids.stride(0) != a.k))) {
    TVM_FFI_THROW(ValueError) << op << ": topk_weights and topk_ids must be contiguous [T, k]";
  }
  a.g_stride = row_stride(op, "gating_output", g);
  return a;
}

struct AlignArgs {
  int32_t device_id;
  int64_t numel, max_padded, max_blocks;
};

// moe_align_block_size(sorted_token_ids, expert_ids, num_tokens_post_padded, topk_ids,
//                      block_size, num_experts): vLLM's output sizes.
inline AlignArgs check_align_args(const char* op, int32_t device_type, const TensorView& sorted,
                                  const TensorView& experts, const TensorView& post,
                                  const TensorView& ids, int64_t block_size, int64_t num_experts) {
  AlignArgs a;
  a.device_id = check_device(op, device_type, {{"sorted_token_ids", &sorted}, {"expert_ids", &experts},
                                               {"num_tokens_post_padded", &post}, {"topk_ids", &ids}});
  check_ndim(op, "topk_ids", ids, 2);
  check_int32(op, "topk_ids", ids);
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
  a.max_padded = a.numel + num_experts * (block_size - 1);
  if (a.max_padded >= (int64_t(1) << 31)) {
    TVM_FFI_THROW(ValueError) << op << ": " << a.max_padded << " padded slots do not fit int32";
  }
  a.max_blocks = (a.max_padded + block_size - 1) / block_size;
  check_vector(op, "sorted_token_ids", sorted, a.max_padded, "T*k + E*(block_size-1)");
  check_vector(op, "expert_ids", experts, a.max_blocks, "cdiv(len(sorted_token_ids), block_size)");
  check_vector(op, "num_tokens_post_padded", post, 1, "one element");
  return a;
}

}  // namespace opmux
