// The serving lanes' checks of the moe routing ops (lane.h), mirroring moe/op.py's contract
// (check_topk / check_sigmoid, _check_route, _buffer and the generic guard): gating_output
// [T, E] float rows with a unit last stride; topk an int in [1, E]; renormalize a bool;
// correction_bias None or a dense float32 [E]; topk_softmax's moe_softcapping a float in
// [0, inf) and bias_on_logits a bool; topk_weights (float32), topk_ids (int32 / int64) and
// token_expert_indices (int32): None (weights and ids: allocated here as the contract does) or
// [T, k] rows on gating_output's device (unit last stride when k > 1, row stride >= k when
// T > 1), each element at its own address, and overlapping no other argument as the generic
// guard has it (lane::may_share). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

// A routing output (moe/op.py's _buffer): [T, k] of an accepted dtype on g's device, rows with a
// unit last stride (k > 1) that do not overlap (T > 1: row stride >= k), elements apart.
inline bool route_out(const TensorView& o, const TensorView& g, int64_t k, bool dtype_ok) {
  return dtype_ok && o.ndim() == 2 && o.size(0) == g.size(0) && o.size(1) == k && same_device(o, g) &&
         (k <= 1 || o.stride(1) == 1) && (o.size(0) <= 1 || o.stride(0) >= k) && distinct(o);
}

struct RouteArgs {
  int64_t k;
  bool renormalize;
  std::optional<TensorView> bias, w, ids, tei;
  Tensor w_new, ids_new;  // allocated here when the caller passed none
};

// The arguments every routing op shares; on success the weights and ids are set (allocated
// float32 / int32 [T, k] where absent, as the contract allocates them).
inline bool route_args(int32_t device_type, const TensorView& g, const AnyView& topk_arg,
                       const AnyView& renormalize_arg, const AnyView& bias_arg, const AnyView& w_arg,
                       const AnyView& ids_arg, const AnyView& tei_arg, RouteArgs* a) {
  if (g.ndim() != 2 || g.device().device_type != device_type || !is_float(g.dtype())) return false;
  const int64_t t = g.size(0), e = g.size(1);
  if (e < 1 || !rows_view(g, t, e)) return false;
  if (!int_arg(topk_arg, &a->k) || a->k < 1 || a->k > e) return false;
  if (!bool_arg(renormalize_arg, &a->renormalize)) return false;
  if (!opt_tensor(bias_arg, &a->bias) || !opt_tensor(w_arg, &a->w) || !opt_tensor(ids_arg, &a->ids) ||
      !opt_tensor(tei_arg, &a->tei))
    return false;
  const int64_t k = a->k;
  if (a->bias) {
    const TensorView& b = *a->bias;
    if (!is_dtype(b, kDLFloat, 32) || !same_device(b, g) || !vector(b, e)) return false;
  }
  if (a->w && !route_out(*a->w, g, k, is_dtype(*a->w, kDLFloat, 32))) return false;
  if (a->ids &&
      !route_out(*a->ids, g, k, is_dtype(*a->ids, kDLInt, 32) || is_dtype(*a->ids, kDLInt, 64)))
    return false;
  if (a->tei && !route_out(*a->tei, g, k, is_dtype(*a->tei, kDLInt, 32))) return false;
  // written tensors: apart from each other and from the read ones
  const std::optional<TensorView>* outs[3] = {&a->w, &a->ids, &a->tei};
  for (int i = 0; i < 3; ++i) {
    if (!*outs[i]) continue;
    const TensorView& o = **outs[i];
    if (!may_share(o, g, false) || (a->bias && !may_share(o, *a->bias, false))) return false;
    for (int j = i + 1; j < 3; ++j)
      if (*outs[j] && !may_share(o, **outs[j], true)) return false;
  }
  if (!a->w) {
    a->w_new = empty({t, k}, DLDataType{kDLFloat, 32, 1}, g.device());
    a->w = TensorView(a->w_new);
  }
  if (!a->ids) {
    a->ids_new = empty({t, k}, DLDataType{kDLInt, 32, 1}, g.device());
    a->ids = TensorView(a->ids_new);
  }
  return true;
}

// topk_softmax's own scoring arguments: moe_softcapping a float in [0, inf), bias_on_logits a bool.
inline bool softmax_scoring(const AnyView& cap_arg, const AnyView& bol_arg, double* cap, bool* bol) {
  return float_arg(cap_arg, cap) && *cap >= 0.0 && *cap < HUGE_VAL && bool_arg(bol_arg, bol);
}


// moe_align_block_size (moe/op.py check_align / values_align, the generic guard): topk_ids int32 /
// int64 [T, k], contiguous; block_size and num_experts ints in (0, 2^31); expert_map None;
// pad_sorted_token_ids a bool; unused_expert_id an int in (-2^31, 2^31); T * k + E * (bs - 1) <
// 2^31; cumsum_buffer None; sorted_token_ids / expert_ids / num_tokens_post_padded either all None
// (allocated here as the contract does: int32 [T*k + E*(bs-1)], [ceil(that / bs)], [1]; kernel
// padding on) or all given, as the contract takes caller buffers: dense int32 vectors on
// topk_ids' device of at least need = T*k + min(E, T*k)*(bs-1), need / bs and 1 elements (and
// < 2^31), apart from each other and from topk_ids (kernel padding as pad_sorted_token_ids says).
// The CPU ids range (the values hook) is the CPU lane's.
struct AlignLaneArgs {
  int64_t block_size, num_experts, unused;
  bool pad;
  std::optional<TensorView> sorted, experts, post;
  Tensor sorted_new, experts_new, post_new;
};
inline bool int32_out(const TensorView& o, const TensorView& ids, int64_t n) {
  return is_dtype(o, kDLInt, 32) && same_device(o, ids) && o.ndim() == 1 && o.size(0) >= n &&
         o.size(0) < (int64_t(1) << 31) && vector(o, o.size(0));
}
inline bool align_args(int32_t device_type, const TensorView& ids, const AnyView& bs_arg, const AnyView& e_arg,
                       const AnyView& map_arg, const AnyView& pad_arg, const AnyView& unused_arg,
                       const AnyView& sorted_arg, const AnyView& experts_arg, const AnyView& post_arg,
                       const AnyView& cumsum_arg, AlignLaneArgs* a) {
  constexpr int64_t kInt32 = int64_t(1) << 31;
  if (map_arg.type_index() != TypeIndex::kTVMFFINone || cumsum_arg.type_index() != TypeIndex::kTVMFFINone)
    return false;
  if (!int_arg(bs_arg, &a->block_size) || !int_arg(e_arg, &a->num_experts) || !bool_arg(pad_arg, &a->pad) ||
      !int_arg(unused_arg, &a->unused))
    return false;
  const int64_t bs = a->block_size, e = a->num_experts;
  if (bs <= 0 || bs >= kInt32 || e <= 0 || e >= kInt32 || a->unused <= -kInt32 || a->unused >= kInt32) return false;
  if (ids.device().device_type != device_type || ids.ndim() != 2 ||
      !(is_dtype(ids, kDLInt, 32) || is_dtype(ids, kDLInt, 64)))
    return false;
  const int64_t t = ids.size(0), k = ids.size(1), numel = t * k;
  if (numel > 0 && ((k > 1 && ids.stride(1) != 1) || (t > 1 && ids.stride(0) != k))) return false;
  if (numel >= kInt32) return false;
  const int64_t max_padded = numel + e * (bs - 1);
  if (max_padded >= kInt32) return false;
  if (!opt_tensor(sorted_arg, &a->sorted) || !opt_tensor(experts_arg, &a->experts) ||
      !opt_tensor(post_arg, &a->post))
    return false;
  const int given = !!a->sorted + !!a->experts + !!a->post;
  if (given == 0) {  // the contract's own buffers; its kernel pads
    a->pad = true;
    const DLDataType i32{kDLInt, 32, 1};
    a->sorted_new = empty({max_padded}, i32, ids.device());
    a->experts_new = empty({(max_padded + bs - 1) / bs}, i32, ids.device());
    a->post_new = empty({1}, i32, ids.device());
    a->sorted = TensorView(a->sorted_new);
    a->experts = TensorView(a->experts_new);
    a->post = TensorView(a->post_new);
    return true;
  }
  if (given != 3) return false;
  const int64_t need = numel + std::min(e, numel) * (bs - 1);
  const TensorView &so = *a->sorted, &ex = *a->experts, &po = *a->post;
  // the generic guard: the three written; topk_ids read
  return int32_out(so, ids, need) && int32_out(ex, ids, need / bs) && int32_out(po, ids, 1) && distinct(so) &&
         distinct(ex) && distinct(po) && may_share(so, ids, false) && may_share(so, ex, true) &&
         may_share(so, po, true) && may_share(ex, ids, false) && may_share(ex, po, true) &&
         may_share(po, ids, false);
}

// The CPU values hook: every id in [0, num_experts).
template <typename I>
inline bool ids_in_range(const TensorView& ids, int64_t num_experts) {
  const I* p = data_ptr<const I>(ids);
  const int64_t n = ids.size(0) * ids.size(1);
  for (int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= num_experts) return false;
  return true;
}

// batched_moe_align_block_size (moe/op.py check_batched / values_batched, the generic guard):
// expert_num_tokens int32 [E] (E >= 1), dense; max_tokens_per_batch and block_size ints in
// (0, 2^31); n = E * round_up(m, bs) < 2^31 and E * m < 2^31; sorted_ids / expert_ids /
// num_tokens_post_padded all given (the `outputs` hook's, or the caller's as _batched_buffer takes
// them: dense int32 vectors on the counts' device of at least n, n / bs and 1 elements, < 2^31),
// each holding its elements apart, apart from each other and from expert_num_tokens (no shared
// byte at all: stricter than the guard's same-view exception); or none of them (allocated here as
// the contract does: int32 [n], [n / bs], [1]; the lane returns them). The CPU counts range (the
// values hook) is the CPU lane's.
struct BatchedLaneArgs {
  int64_t m, block_size;
  std::optional<TensorView> sorted, experts, post;
  Tensor sorted_new, experts_new, post_new;  // allocated here when the caller passed none
};
inline bool batched_args(int32_t device_type, const TensorView& counts, const AnyView& m_arg, const AnyView& bs_arg,
                         const AnyView& sorted_arg, const AnyView& experts_arg, const AnyView& post_arg,
                         BatchedLaneArgs* a) {
  constexpr int64_t kInt32 = int64_t(1) << 31;
  if (!int_arg(m_arg, &a->m) || !int_arg(bs_arg, &a->block_size)) return false;
  const int64_t m = a->m, bs = a->block_size;
  if (m <= 0 || m >= kInt32 || bs <= 0 || bs >= kInt32) return false;
  if (counts.device().device_type != device_type || !is_dtype(counts, kDLInt, 32) || counts.ndim() != 1) return false;
  const int64_t e = counts.size(0);
  if (e < 1 || e >= kInt32 || !vector(counts, e)) return false;
  const int64_t n = e * ((m + bs - 1) / bs * bs);
  if (n >= kInt32 || e * m >= kInt32) return false;
  if (!opt_tensor(sorted_arg, &a->sorted) || !opt_tensor(experts_arg, &a->experts) || !opt_tensor(post_arg, &a->post))
    return false;
  const int given = !!a->sorted + !!a->experts + !!a->post;
  if (given == 0) {  // the contract's own buffers (the lane returns them)
    const DLDataType i32{kDLInt, 32, 1};
    a->sorted_new = empty({n}, i32, counts.device());
    a->experts_new = empty({n / bs}, i32, counts.device());
    a->post_new = empty({1}, i32, counts.device());
    a->sorted = TensorView(a->sorted_new);
    a->experts = TensorView(a->experts_new);
    a->post = TensorView(a->post_new);
    return true;
  }
  if (given != 3) return false;
  const TensorView &so = *a->sorted, &ex = *a->experts, &po = *a->post;
  return int32_out(so, counts, n) && int32_out(ex, counts, n / bs) && int32_out(po, counts, 1) && distinct(so) &&
         distinct(ex) && distinct(po) && may_share(so, counts, true) && may_share(ex, counts, true) &&
         may_share(po, counts, true) && may_share(so, ex, true) && may_share(so, po, true) && may_share(ex, po, true);
}

// The CPU values hook: every count in [0, max_tokens_per_batch].
inline bool counts_in_range(const TensorView& counts, int64_t m) {
  const int32_t* p = data_ptr<const int32_t>(counts);
  for (int64_t i = 0; i < counts.size(0); ++i)
    if (p[i] < 0 || p[i] > m) return false;
  return true;
}

}  // namespace lane
}  // namespace opmux
