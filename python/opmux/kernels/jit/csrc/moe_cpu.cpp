// MoE routing for CPU tensors.
//   topk_softmax_cpu(topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
//     correction_bias, has_bias, renormalize, moe_softcapping, bias_on_logits): optional tanh
//     softcap, fp32 softmax over experts, top-k by logit (or by softmax + bias: DeepSeek's
//     correction bias; or the bias added to the logits: sgl-kernel's), ties -> lower expert
//     index, optional renormalization; int32 or int64 ids; token_expert_indices [i, j] = j*T + i.
//   topk_sigmoid_cpu(topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
//     correction_bias, has_bias, renormalize): the same kernel with sigmoid scores (Scoring):
//     weights sigmoid(x), chosen by sigmoid(x) (+ correction_bias), ties -> lower expert index.
//   batched_moe_align_block_size_cpu(sorted_ids, expert_ids, num_tokens_post_padded,
//     expert_num_tokens, max_tokens_per_batch, block_size): vLLM's batched layout (no sort).
//   moe_align_block_size_cpu(sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum,
//     has_cumsum, topk_ids, expert_map, has_map, block_size, num_experts, pad, unused_expert_id):
//     a stable counting sort by (mapped) expert (vLLM layout). Every id is validated before
//     anything is written; a bad id raises ValueError naming it.
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

// The scoring function: topk_softmax's softmax over experts, or topk_sigmoid's sigmoid per
// expert (weights sigmoid(x), chosen by sigmoid(x), + bias when given: DeepSeek's / vLLM's).
enum Scoring { kSoftmax = 0, kSigmoid = 1 };

// How the routing scores are made (the op's options; softcap and bias_on_logits: softmax only).
struct TopkMode {
  bool renormalize;
  float softcap;       // 0: off
  const float* bias;   // nullptr: none
  bool bias_on_logits; // sgl-kernel's: bias added before the softmax; else DeepSeek's
};

// One token. x, e: scratch for the row in float (experts entries each).
// x holds the ranking key: the (softcapped, maybe biased) logit, or softmax + bias in
// DeepSeek's mode. Softmax max and sum are branch-free loops that vectorize. Top-k of a
// NaN-free row: one scan keeping the k best (key, index) pairs sorted, best first; an entry
// only displaces strictly smaller keys, so of equal keys the lower index ranks first (the
// k-pass "first index of the largest untaken key" order, -inf included). A row with a NaN key
// (a NaN logit or correction_bias) takes the plain k-pass scalar scan, in which NaN ranks above
// every number (as torch.sort has it); a NaN logit makes the weights NaN (the softmax of a NaN
// row), like the reference.
template <Scoring S, typename T, typename I>
OPMUX_CPU_CLONES void topk_row(float* w, I* ids, const T* row, int64_t experts, int64_t k,
                               const TopkMode& mode, float* x, float* e, char* taken) {
  float m = -INFINITY;
  bool nan = false;
  const float cap = mode.softcap;
  const bool bias_logits = S == kSoftmax && mode.bias != nullptr && mode.bias_on_logits;
  for (int64_t i = 0; i < experts; ++i) {
    float v = to_float(row[i]);
    if (S == kSoftmax && cap > 0.f) v = cpu::tanh_f(v / cap) * cap;
    if (bias_logits) v += mode.bias[i];
    x[i] = v;
    m = max_f(m, v);
    nan |= v != v;
  }
  float sum = 0.f;
  if (S == kSigmoid) {  // e: the scores (the weights); x: the ranking key, score (+ bias)
    sum = 1.f;
    for (int64_t i = 0; i < experts; ++i) e[i] = cpu::sigmoid_f(x[i]);
    if (mode.bias != nullptr) {
      for (int64_t i = 0; i < experts; ++i) {
        x[i] = e[i] + mode.bias[i];
        nan |= x[i] != x[i];  // a NaN bias: the key ranks first (the scan below), as the reference
      }
    } else {
      for (int64_t i = 0; i < experts; ++i) x[i] = e[i];
    }
  } else {
    for (int64_t i = 0; i < experts; ++i) {
      e[i] = cpu::exp_f(x[i] - m);
      sum += e[i];
    }
    if (mode.bias != nullptr && !mode.bias_on_logits) {  // DeepSeek: rank by softmax + bias
      for (int64_t i = 0; i < experts; ++i) {
        x[i] = e[i] / sum + mode.bias[i];
        nan |= x[i] != x[i];  // a NaN bias, as above
      }
    }
  }
  float total = 0.f;
  if (!nan) {
    // ids[0..n) sorted by (key descending, index ascending); w[] holds the keys meanwhile.
    int64_t n = 0;
    for (int64_t i = 0; i < experts; ++i) {
      const float v = x[i];
      if (n == k && !(v > w[k - 1])) continue;  // the common case: not in the top k
      int64_t j = n < k ? n++ : k - 1;
      for (; j > 0 && w[j - 1] < v; --j) {  // strict: equal keys keep the lower index first
        w[j] = w[j - 1];
        ids[j] = ids[j - 1];
      }
      w[j] = v;
      ids[j] = static_cast<I>(i);
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
      ids[j] = static_cast<I>(best);
      total += p;
    }
  }
  if (mode.renormalize)
    for (int64_t j = 0; j < k; ++j) w[j] /= total;
}

// gating g [tokens, experts] (row stride g_stride); weights w, ids and token_expert_indices
// [tokens, k] with row strides w_stride, ids_stride, tei_stride (tei may be null).
struct TopkRows {
  int64_t tokens, experts, k, g_stride, w_stride, ids_stride, tei_stride;
};

template <Scoring S, typename T, typename I>
void topk_impl(float* w, I* ids, int32_t* tei, const T* g, const TopkRows& a, const TopkMode& mode) {
  const bool parallel = a.tokens > 1 && a.tokens * a.experts >= (1 << 15);
  // One thread's rows (called outside a parallel region: all of them). A small call enters no
  // OpenMP region at all: `omp parallel if (false)` still forms a team of one in libgomp, about
  // 0.2 us a call, as much as a one-token routing.
  const auto rows = [&] {
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
    for (int64_t t = 0; t < a.tokens; ++t) {
      topk_row<S>(w + t * a.w_stride, ids + t * a.ids_stride, g + t * a.g_stride, a.experts, a.k, mode, x, e,
               taken);
      if (tei != nullptr)
        for (int64_t j = 0; j < a.k; ++j) tei[t * a.tei_stride + j] = static_cast<int32_t>(j * a.tokens + t);
    }
  };
  if (!parallel) return rows();
#ifdef _OPENMP
#pragma omp parallel
#endif
  rows();
}

// moe_align_block_size on topk_ids flattened to `numel` ids, into sorted [n_sorted] and
// experts [n_blocks] (at least what the padded total can reach), post[0] and cumsum[0..E]
// (when not null). With `map`, id e is placed as expert map[e] (-1: left out). `pad`: every
// slot of `sorted` not holding an entry gets numel (else only the entries are written); blocks
// past the total get `fill`. Returns -1, or the flat index of the first id outside
// [0, num_experts) (-2 - e for an expert e mapped outside [-1, num_experts)), in which case
// nothing has been written.
template <typename I>
int64_t moe_align_impl(int32_t* sorted, int32_t* experts, int32_t* post, int32_t* cumsum, const I* ids,
                       const int32_t* map, int64_t numel, int64_t block_size, int64_t num_experts,
                       int64_t n_sorted, int64_t n_blocks, bool pad, int32_t fill) {
  if (map != nullptr)
    for (int64_t e = 0; e < num_experts; ++e)
      if (map[e] < -1 || map[e] >= num_experts) return -2 - e;
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t i = 0; i < numel; ++i) {
    const I e = ids[i];
    if (e < 0 || e >= num_experts) return i;
    const int64_t b = map != nullptr ? map[e] : static_cast<int64_t>(e);
    if (b >= 0) ++counts[b];
  }
  std::vector<int64_t> next(num_experts);  // write cursor per expert
  int64_t pos = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    next[e] = pos;
    if (cumsum != nullptr) cumsum[e] = static_cast<int32_t>(pos);
    const int64_t padded = (counts[e] + block_size - 1) / block_size * block_size;
    for (int64_t b = pos / block_size; b < (pos + padded) / block_size; ++b) experts[b] = static_cast<int32_t>(e);
    pos += padded;
  }
  if (cumsum != nullptr) cumsum[num_experts] = static_cast<int32_t>(pos);
  for (int64_t b = pos / block_size; b < n_blocks; ++b) experts[b] = fill;
  const int32_t none = static_cast<int32_t>(numel);
  if (pad)
    for (int64_t i = 0; i < n_sorted; ++i) sorted[i] = none;
  for (int64_t i = 0; i < numel; ++i) {  // stable
    const int64_t b = map != nullptr ? map[ids[i]] : static_cast<int64_t>(ids[i]);
    if (b >= 0) sorted[next[b]++] = static_cast<int32_t>(i);
  }
  post[0] = static_cast<int32_t>(pos);
  return -1;
}

// batched_moe_align_block_size: expert x's counts[x] tokens (rows x * m + j of the batched
// layout [E, m]) in order, padded to a multiple of block_size with the sentinel E * m; blocks
// -> their expert, -1 past the total; every slot of sorted [n_sorted] and experts [n_blocks]
// is written, post[0] gets the total. Returns -1, or the first expert whose count is outside
// [0, m] (nothing written then).
inline int64_t batched_align_impl(int32_t* sorted, int32_t* experts, int32_t* post, const int32_t* counts,
                                  int64_t num_experts, int64_t m, int64_t block_size, int64_t n_sorted,
                                  int64_t n_blocks) {
  for (int64_t x = 0; x < num_experts; ++x)
    if (counts[x] < 0 || counts[x] > m) return x;
  const int32_t sentinel = static_cast<int32_t>(num_experts * m);
  int64_t pos = 0;
  for (int64_t x = 0; x < num_experts; ++x) {
    const int64_t c = counts[x];
    const int64_t padded = (c + block_size - 1) / block_size * block_size;
    for (int64_t j = 0; j < c; ++j) sorted[pos + j] = static_cast<int32_t>(x * m + j);
    for (int64_t j = c; j < padded; ++j) sorted[pos + j] = sentinel;
    for (int64_t b = pos / block_size; b < (pos + padded) / block_size; ++b) experts[b] = static_cast<int32_t>(x);
    pos += padded;
  }
  for (int64_t i = pos; i < n_sorted; ++i) sorted[i] = sentinel;
  for (int64_t b = pos / block_size; b < n_blocks; ++b) experts[b] = -1;
  post[0] = static_cast<int32_t>(pos);
  return -1;
}

}  // namespace moe_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/moe_checks.h"
#include "opmux/contracts/moe.h"

namespace opmux {
namespace moe_cpu {

template <Scoring S>
void topk_dispatch(const TopkArgs& a, const TopkRows& rows, const TopkMode& mode, TensorView topk_weights,
                   TensorView topk_ids, int32_t* tei, TensorView gating_output) {
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    const scalar_t* g = data_ptr<const scalar_t>(gating_output);
    float* w = data_ptr<float>(topk_weights);
    if (a.ids64) {
      topk_impl<S, scalar_t, int64_t>(w, data_ptr<int64_t>(topk_ids), tei, g, rows, mode);
    } else {
      topk_impl<S, scalar_t, int32_t>(w, data_ptr<int32_t>(topk_ids), tei, g, rows, mode);
    }
  });
}

void topk_softmax_cpu(TensorView topk_weights, TensorView topk_ids, TensorView token_expert_indices, bool has_tei,
                      TensorView gating_output, TensorView correction_bias, bool has_bias, bool renormalize,
                      double moe_softcapping, bool bias_on_logits) {
  const char* op = "opmux.topk_softmax";
  TopkArgs a = check_topk_args(op, kDLCPU, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                               correction_bias, has_bias, moe_softcapping);
  if (a.tokens == 0) return;
  const TopkRows rows{a.tokens, a.experts, a.k, a.g_stride, a.w_stride, a.ids_stride, a.tei_stride};
  const TopkMode mode{renormalize, static_cast<float>(moe_softcapping),
                      has_bias ? data_ptr<const float>(correction_bias) : nullptr, bias_on_logits};
  int32_t* tei = has_tei ? data_ptr<int32_t>(token_expert_indices) : nullptr;
  topk_dispatch<kSoftmax>(a, rows, mode, topk_weights, topk_ids, tei, gating_output);
}

void topk_sigmoid_cpu(TensorView topk_weights, TensorView topk_ids, TensorView token_expert_indices, bool has_tei,
                      TensorView gating_output, TensorView correction_bias, bool has_bias, bool renormalize) {
  const char* op = "opmux.topk_sigmoid";
  TopkArgs a = check_topk_args(op, kDLCPU, topk_weights, topk_ids, token_expert_indices, has_tei, gating_output,
                               correction_bias, has_bias, 0.0);
  if (a.tokens == 0) return;
  const TopkRows rows{a.tokens, a.experts, a.k, a.g_stride, a.w_stride, a.ids_stride, a.tei_stride};
  const TopkMode mode{renormalize, 0.f, has_bias ? data_ptr<const float>(correction_bias) : nullptr, false};
  int32_t* tei = has_tei ? data_ptr<int32_t>(token_expert_indices) : nullptr;
  topk_dispatch<kSigmoid>(a, rows, mode, topk_weights, topk_ids, tei, gating_output);
}

void moe_align_block_size_cpu(TensorView sorted_token_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                              TensorView cumsum_buffer, bool has_cumsum, TensorView topk_ids, TensorView expert_map,
                              bool has_map, int64_t block_size, int64_t num_experts, bool pad_sorted_token_ids,
                              int64_t unused_expert_id) {
  const char* op = "opmux.moe_align_block_size";
  AlignArgs a = check_align_args(op, kDLCPU, sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum_buffer,
                                 has_cumsum, topk_ids, expert_map, has_map, block_size, num_experts);
  int32_t* cumsum = has_cumsum ? data_ptr<int32_t>(cumsum_buffer) : nullptr;
  const int32_t* map = has_map ? data_ptr<const int32_t>(expert_map) : nullptr;
  const int32_t fill = static_cast<int32_t>(unused_expert_id);
  int64_t bad = -1;
  int64_t bad_id = 0;
  if (a.ids64) {
    const int64_t* ids = data_ptr<const int64_t>(topk_ids);
    bad = moe_align_impl(data_ptr<int32_t>(sorted_token_ids), data_ptr<int32_t>(expert_ids),
                         data_ptr<int32_t>(num_tokens_post_padded), cumsum, ids, map, a.numel, block_size,
                         num_experts, a.n_sorted, a.n_blocks, pad_sorted_token_ids, fill);
    if (bad >= 0) bad_id = ids[bad];
  } else {
    const int32_t* ids = data_ptr<const int32_t>(topk_ids);
    bad = moe_align_impl(data_ptr<int32_t>(sorted_token_ids), data_ptr<int32_t>(expert_ids),
                         data_ptr<int32_t>(num_tokens_post_padded), cumsum, ids, map, a.numel, block_size,
                         num_experts, a.n_sorted, a.n_blocks, pad_sorted_token_ids, fill);
    if (bad >= 0) bad_id = ids[bad];
  }
  if (bad >= 0) {
    const int64_t k = topk_ids.size(1);
    TVM_FFI_THROW(ValueError) << op << ": topk_ids[" << bad / k << ", " << bad % k << "] = " << bad_id
                              << " is out of range [0, " << num_experts << ") (num_experts)";
  }
  if (bad < -1) {
    const int64_t e = -2 - bad;
    TVM_FFI_THROW(ValueError) << op << ": expert_map[" << e << "] = " << map[e]
                              << " is out of range: local expert ids are [0, " << num_experts
                              << "), or -1 for an expert not on this rank";
  }
}

void batched_moe_align_block_size_cpu(TensorView sorted_ids, TensorView expert_ids, TensorView num_tokens_post_padded,
                                      TensorView expert_num_tokens, int64_t max_tokens_per_batch, int64_t block_size) {
  const char* op = "opmux.batched_moe_align_block_size";
  BatchedArgs a = check_batched_args(op, kDLCPU, sorted_ids, expert_ids, num_tokens_post_padded, expert_num_tokens,
                                     max_tokens_per_batch, block_size);
  const int32_t* counts = data_ptr<const int32_t>(expert_num_tokens);
  const int64_t bad = batched_align_impl(data_ptr<int32_t>(sorted_ids), data_ptr<int32_t>(expert_ids),
                                         data_ptr<int32_t>(num_tokens_post_padded), counts, a.num_experts,
                                         max_tokens_per_batch, block_size, a.n_sorted, a.n_blocks);
  if (bad >= 0) {
    TVM_FFI_THROW(ValueError) << op << ": expert_num_tokens[" << bad << "] = " << counts[bad]
                              << " is out of range [0, " << max_tokens_per_batch << "] (max_tokens_per_batch)";
  }
}

}  // namespace moe_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_softmax_cpu, opmux::moe_cpu::topk_softmax_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(topk_sigmoid_cpu, opmux::moe_cpu::topk_sigmoid_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batched_moe_align_block_size_cpu, opmux::moe_cpu::batched_moe_align_block_size_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_align_block_size_cpu, opmux::moe_cpu::moe_align_block_size_cpu);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/moe_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
