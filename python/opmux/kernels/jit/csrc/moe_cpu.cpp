// MoE routing for CPU tensors.
//   topk_softmax_cpu(topk_weights, topk_ids, gating_output, renormalize): fp32 softmax over
//     experts, top-k by logit (ties -> lower expert index), optional renormalization.
//   moe_align_block_size_cpu(sorted_token_ids, expert_ids, num_tokens_post_padded, topk_ids,
//     block_size, num_experts): a stable counting sort by expert (vLLM layout). Every id is
//     validated before anything is written; a bad id raises ValueError naming it.
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry points.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"

namespace opmux {
namespace moe_cpu {

using cpu::to_float;

OPMUX_CPU_INLINE float max_f(float a, float b) { return a < b ? b : a; }  // std::max order

// One token. x, e: scratch for the row in float (experts entries each).
// Softmax max and sum are branch-free loops that vectorize. Top-k of a NaN-free row: one scan
// keeping the k best (logit, index) pairs sorted, best first; an entry only displaces strictly
// smaller logits, so of equal logits the lower index ranks first (the k-pass "first index of
// the largest untaken logit" order, -inf included). A row with a NaN takes the plain k-pass
// scalar scan, in which NaN ranks above every number (as torch.sort has it) and the weights are
// NaN (the softmax of a NaN row), like the reference.
template <typename T>
OPMUX_CPU_CLONES void topk_row(float* w, int32_t* ids, const T* row, int64_t experts, int64_t k,
                               bool renormalize, float* x, float* e, char* taken) {
  float m = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < experts; ++i) {
    x[i] = to_float(row[i]);
    m = max_f(m, x[i]);
    nan |= x[i] != x[i];
  }
  float sum = 0.f;
  for (int64_t i = 0; i < experts; ++i) {
    e[i] = cpu::exp_f(x[i] - m);
    sum += e[i];
  }
  float total = 0.f;
  if (!nan) {
    // ids[0..n) sorted by (logit descending, index ascending); w[] holds the logits meanwhile.
    int64_t n = 0;
    for (int64_t i = 0; i < experts; ++i) {
      const float v = x[i];
      if (n == k && !(v > w[k - 1])) continue;  // the common case: not in the top k
      int64_t j = n < k ? n++ : k - 1;
      for (; j > 0 && w[j - 1] < v; --j) {  // strict: equal logits keep the lower index first
        w[j] = w[j - 1];
        ids[j] = ids[j - 1];
      }
      w[j] = v;
      ids[j] = static_cast<int32_t>(i);
    }
    for (int64_t j = 0; j < k; ++j) {
      const float p = e[ids[j]] / sum;
      w[j] = p;
      total += p;
    }
  } else {
    for (int64_t i = 0; i < experts; ++i) taken[i] = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < experts; ++i)  // strict: the lower index first on ties; NaN ranks
        if (!taken[i] && (best < 0 || x[i] > x[best] || (x[i] != x[i] && x[best] == x[best])))  // first
          best = i;
      taken[best] = 1;
      const float p = e[best] / sum;
      w[j] = p;
      ids[j] = static_cast<int32_t>(best);
      total += p;
    }
  }
  if (renormalize)
    for (int64_t j = 0; j < k; ++j) w[j] /= total;
}

// gating g [tokens, experts] (row stride g_stride); weights w and ids [tokens, k], dense.
struct TopkRows {
  int64_t tokens, experts, k, g_stride;
};

template <typename T>
void topk_impl(float* w, int32_t* ids, const T* g, const TopkRows& a, bool renormalize) {
  const bool parallel = a.tokens > 1 && a.tokens * a.experts >= (1 << 15);
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel if (parallel)
#endif
  {
    constexpr int64_t kStack = 512;  // experts kept on the stack; more go to the heap
    float xs[kStack], es[kStack];
    char ts[kStack];
    std::vector<float> xv, ev;
    std::vector<char> tv;
    float* x = xs;
    float* e = es;
    char* taken = ts;
    if (a.experts > kStack) {
      xv.resize(a.experts);
      ev.resize(a.experts);
      tv.resize(a.experts);
      x = xv.data();
      e = ev.data();
      taken = tv.data();
    }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < a.tokens; ++t)
      topk_row(w + t * a.k, ids + t * a.k, g + t * a.g_stride, a.experts, a.k, renormalize, x, e,
               taken);
  }
}

// moe_align_block_size on topk_ids flattened to `numel` ids, into sorted [max_padded] and
// experts [max_blocks] (vLLM's sizes: numel + num_experts * (block_size - 1) and its cdiv by
// block_size) and post[0]. Returns -1, or the flat index of the first id outside
// [0, num_experts), in which case nothing has been written.
inline int64_t moe_align_impl(int32_t* sorted, int32_t* experts, int32_t* post, const int32_t* ids,
                              int64_t numel, int64_t block_size, int64_t num_experts,
                              int64_t max_padded, int64_t max_blocks) {
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t i = 0; i < numel; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= num_experts) return i;
    ++counts[e];
  }
  std::vector<int64_t> next(num_experts);  // write cursor per expert
  int64_t pos = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    next[e] = pos;
    const int64_t padded = (counts[e] + block_size - 1) / block_size * block_size;
    for (int64_t b = pos / block_size; b < (pos + padded) / block_size; ++b) experts[b] = static_cast<int32_t>(e);
    pos += padded;
  }
  for (int64_t b = pos / block_size; b < max_blocks; ++b) experts[b] = -1;
  const int32_t pad = static_cast<int32_t>(numel);
  for (int64_t i = 0; i < max_padded; ++i) sorted[i] = pad;
  for (int64_t i = 0; i < numel; ++i) sorted[next[ids[i]]++] = static_cast<int32_t>(i);  // stable
  post[0] = static_cast<int32_t>(pos);
  return -1;
}

}  // namespace moe_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/moe_checks.h"

namespace opmux {
namespace moe_cpu {

void topk_softmax_cpu(TensorView topk_weights, TensorView topk_ids, TensorView gating_output, bool renormalize) {
  const char* op = "opmux.topk_softmax";
  TopkArgs a = check_topk_args(op, kDLCPU, topk_weights, topk_ids, gating_output);
  if (a.tokens == 0) return;
  const TopkRows rows{a.tokens, a.experts, a.k, a.g_stride};
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    topk_impl<scalar_t>(data_ptr<float>(topk_weights), data_ptr<int32_t>(topk_ids),
                        data_ptr<const scalar_t>(gating_output), rows, renormalize);
  });
}

void moe_align_block_size_cpu(TensorView sorted_token_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                              TensorView topk_ids, int64_t block_size, int64_t num_experts) {
  const char* op = "opmux.moe_align_block_size";
  AlignArgs a = check_align_args(op, kDLCPU, sorted_token_ids, expert_ids, num_tokens_post_padded, topk_ids,
                                 block_size, num_experts);
  const int32_t* ids = data_ptr<const int32_t>(topk_ids);
  const int64_t bad = moe_align_impl(data_ptr<int32_t>(sorted_token_ids), data_ptr<int32_t>(expert_ids),
                                     data_ptr<int32_t>(num_tokens_post_padded), ids, a.numel, block_size,
                                     num_experts, a.max_padded, a.max_blocks);
  if (bad >= 0) {
    const int64_t k = topk_ids.size(1);
    TVM_FFI_THROW(ValueError) << op << ": topk_ids[" << bad / k << ", " << bad % k << "] = " << ids[bad]
                              << " is out of range [0, " << num_experts << ") (num_experts)";
  }
}

}  // namespace moe_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_softmax_cpu, opmux::moe_cpu::topk_softmax_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_align_block_size_cpu, opmux::moe_cpu::moe_align_block_size_cpu);
#endif  // OPMUX_CPU_KERNELS_ONLY
