// MoE routing for CPU tensors.
//   topk_softmax_cpu(topk_weights, topk_ids, gating_output, renormalize): fp32 softmax over
//     experts, top-k by logit (ties -> lower expert index), optional renormalization.
//   moe_align_block_size_cpu(sorted_token_ids, expert_ids, num_tokens_post_padded, topk_ids,
//     block_size, num_experts): a stable counting sort by expert (vLLM layout). Every id is
//     validated before anything is written; a bad id raises ValueError naming it.
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "opmux/cpu_types.h"
#include "opmux/moe_checks.h"

namespace opmux {
namespace moe_cpu {

using cpu::to_float;

template <typename T>
void topk_impl(float* w, int32_t* ids, const T* g, const TopkArgs& a, bool renormalize) {
  const bool parallel = a.tokens > 1 && a.tokens * a.experts >= (1 << 15);
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t t = 0; t < a.tokens; ++t) {
    std::vector<float> x(a.experts);
    std::vector<char> taken(a.experts, 0);
    const T* row = g + t * a.g_stride;
    float m = -INFINITY;
    for (int64_t e = 0; e < a.experts; ++e) {
      x[e] = to_float(row[e]);
      m = std::max(m, x[e]);
    }
    float sum = 0.f;
    for (int64_t e = 0; e < a.experts; ++e) sum += std::exp(x[e] - m);
    float total = 0.f;
    for (int64_t j = 0; j < a.k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < a.experts; ++e)  // strict '>' keeps the lower index on ties
        if (!taken[e] && (best < 0 || x[e] > x[best])) best = e;
      taken[best] = 1;
      const float p = std::exp(x[best] - m) / sum;
      w[t * a.k + j] = p;
      ids[t * a.k + j] = static_cast<int32_t>(best);
      total += p;
    }
    if (renormalize)
      for (int64_t j = 0; j < a.k; ++j) w[t * a.k + j] /= total;
  }
}

void topk_softmax_cpu(TensorView topk_weights, TensorView topk_ids, TensorView gating_output, bool renormalize) {
  const char* op = "opmux.topk_softmax";
  TopkArgs a = check_topk_args(op, kDLCPU, topk_weights, topk_ids, gating_output);
  if (a.tokens == 0) return;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    topk_impl<scalar_t>(data_ptr<float>(topk_weights), data_ptr<int32_t>(topk_ids),
                        data_ptr<const scalar_t>(gating_output), a, renormalize);
  });
}

void moe_align_block_size_cpu(TensorView sorted_token_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                              TensorView topk_ids, int64_t block_size, int64_t num_experts) {
  const char* op = "opmux.moe_align_block_size";
  AlignArgs a = check_align_args(op, kDLCPU, sorted_token_ids, expert_ids, num_tokens_post_padded, topk_ids,
                                 block_size, num_experts);
  const int32_t* ids = data_ptr<const int32_t>(topk_ids);
  const int64_t k = topk_ids.size(1);
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t i = 0; i < a.numel; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= num_experts) {
      TVM_FFI_THROW(ValueError) << op << ": topk_ids[" << i / k << ", " << i % k << "] = " << e
                                << " is out of range [0, " << num_experts << ") (num_experts)";
    }
    ++counts[e];
  }
  int32_t* sorted = data_ptr<int32_t>(sorted_token_ids);
  int32_t* experts = data_ptr<int32_t>(expert_ids);
  std::vector<int64_t> next(num_experts);  // write cursor per expert
  int64_t pos = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    next[e] = pos;
    const int64_t padded = (counts[e] + block_size - 1) / block_size * block_size;
    for (int64_t b = pos / block_size; b < (pos + padded) / block_size; ++b) experts[b] = static_cast<int32_t>(e);
    pos += padded;
  }
  for (int64_t b = pos / block_size; b < a.max_blocks; ++b) experts[b] = -1;
  const int32_t pad = static_cast<int32_t>(a.numel);
  for (int64_t i = 0; i < a.max_padded; ++i) sorted[i] = pad;
  for (int64_t i = 0; i < a.numel; ++i) sorted[next[ids[i]]++] = static_cast<int32_t>(i);  // stable
  data_ptr<int32_t>(num_tokens_post_padded)[0] = static_cast<int32_t>(pos);
}

}  // namespace moe_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_softmax_cpu, opmux::moe_cpu::topk_softmax_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_align_block_size_cpu, opmux::moe_cpu::moe_align_block_size_cpu);
