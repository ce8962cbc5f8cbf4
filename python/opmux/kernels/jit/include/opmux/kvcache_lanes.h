// The serving lane's checks of kvcache.reshape_and_cache (lane.h), mirroring kvcache/op.py's
// serving fast path: k_scale and v_scale None (a cache of key's dtype; fp8 caches and their
// scales are the contract's); key / value [T, H, D] (H, D >= 1) of one float dtype with a unit
// last stride (D > 1); key_cache / value_cache [num_blocks, block_size, H, D] of key's dtype
// (NHD, or HND as its permuted view) with a unit head_dim stride (D > 1) and no negative
// stride; slot_mapping int64 [T], dense when T > 1; all on key's device. The caches (written)
// each hold their elements apart and overlap nothing as the generic guard has it
// (lane::may_share). The values hook (CPU slots in [-1, num_blocks * block_size)) is the CPU
// lane's; CUDA slots are not read (nor by the contract). Shared by the CPU and CUDA units.
#pragma once

#include "opmux/lane.h"

namespace opmux {
namespace lane {

inline bool cache_args(int32_t device_type, const TensorView& key, const TensorView& value,
                       const TensorView& kc, const TensorView& vc, const TensorView& slots,
                       const AnyView& k_scale, const AnyView& v_scale) {
  if (k_scale.type_index() != TypeIndex::kTVMFFINone || v_scale.type_index() != TypeIndex::kTVMFFINone)
    return false;
  if (key.device().device_type != device_type || !is_float(key.dtype()) || key.ndim() != 3 ||
      value.ndim() != 3 || kc.ndim() != 4 || vc.ndim() != 4 || slots.ndim() != 1)
    return false;
  const int64_t t = key.size(0), h = key.size(1), d = key.size(2);
  if (h < 1 || d < 1 || kc.size(2) != h || kc.size(3) != d || slots.size(0) != t) return false;
  for (int i = 0; i < 3; ++i)
    if (value.size(i) != key.size(i)) return false;
  for (int i = 0; i < 4; ++i)
    if (vc.size(i) != kc.size(i)) return false;
  for (const TensorView* x : {&value, &kc, &vc})
    if (!same_dtype(x->dtype(), key.dtype()) || !same_device(*x, key)) return false;
  if (!is_dtype(slots, kDLInt, 64) || !same_device(slots, key) || !vector(slots, t)) return false;
  if (d > 1 && (key.stride(2) != 1 || value.stride(2) != 1 || kc.stride(3) != 1 || vc.stride(3) != 1))
    return false;
  for (int i = 0; i < 2; ++i)  // the kernels' non-negative strides (torch views: always)
    if (key.stride(i) < 0 || value.stride(i) < 0) return false;
  for (int i = 0; i < 4; ++i)
    if (kc.stride(i) < 0 || vc.stride(i) < 0) return false;
  // the generic guard: key_cache, value_cache written; key, value, slot_mapping read
  return distinct(kc) && distinct(vc) && may_share(kc, key, false) && may_share(kc, value, false) &&
         may_share(kc, vc, true) && may_share(kc, slots, false) && may_share(vc, key, false) &&
         may_share(vc, value, false) && may_share(vc, slots, false);
}

// -- the block ops (kvcache/_blocks.py) ------------------------------------------------------------
inline bool no_negative_stride(const TensorView& t) {
  for (int i = 0; i < t.ndim(); ++i)
    if (t.stride(i) < 0) return false;
  return true;
}
inline bool byte_dtype(const TensorView& t) {  // a cache of any dtype the kernels copy as bytes
  const DLDataType d = t.dtype();
  return d.lanes == 1 && d.bits >= 8 && d.bits % 8 == 0;
}

// _dense_blocks: every block t[b] one dense region (its inner strides a permutation of a contiguous
// layout), blocks apart, no stride negative.
inline bool dense_blocks(const TensorView& t) {
  const int nd = t.ndim();
  if (nd < 2 || nd > 8 || !no_negative_stride(t)) return false;
  for (int i = 0; i < nd; ++i)
    if (t.size(i) == 0) return true;
  int64_t st[8], n[8];
  int k = 0;
  for (int i = 1; i < nd; ++i)
    if (t.size(i) > 1) st[k] = t.stride(i), n[k] = t.size(i), ++k;
  for (int i = 1; i < k; ++i)  // sorted by (stride, size) as Python's sorted()
    for (int j = i; j > 0 && (st[j] < st[j - 1] || (st[j] == st[j - 1] && n[j] < n[j - 1])); --j)
      std::swap(st[j], st[j - 1]), std::swap(n[j], n[j - 1]);
  int64_t expect = 1;
  for (int i = 0; i < k; ++i) {
    if (st[i] != expect) return false;
    expect *= n[i];
  }
  return t.size(0) <= 1 || t.stride(0) >= expect;
}

// copy_blocks (copy_blocks_check, the generic guard): block_mapping int64 [n, 2], contiguous (n > 1:
// strides (2, 1); n == 1: a unit last stride), on the cache's device; cache (written, any dtype)
// dense blocks, each element at its own address, overlapping block_mapping nowhere. The CPU
// values hook (both columns in [0, num_blocks)) is the CPU lane's.
inline bool copy_blocks_args(int32_t device_type, const TensorView& cache, const TensorView& m) {
  if (m.device().device_type != device_type || !same_device(cache, m) || !is_dtype(m, kDLInt, 64) || m.ndim() != 2 ||
      m.size(1) != 2)
    return false;
  const int64_t n = m.size(0);
  if ((n > 1 && (m.stride(0) != 2 || m.stride(1) != 1)) || (n == 1 && m.stride(1) != 1)) return false;
  return byte_dtype(cache) && dense_blocks(cache) && distinct(cache) && may_share(cache, m, false);
}
inline bool pairs_in_range(const TensorView& m, int64_t num_blocks) {
  const int64_t* p = data_ptr<const int64_t>(m);
  for (int64_t i = 0; i < 2 * m.size(0); ++i)
    if (p[i] < 0 || p[i] >= num_blocks) return false;
  return true;
}

// concat_and_cache_mla (mla_check's full checks, the generic guard) for a cache of kv_c's dtype:
// scale None; kv_c [T, R] and k_pe [T, P] of one float dtype, kv_cache [num_blocks, block_size,
// R + P] of that dtype, slot_mapping int64 [T], all on kv_c's device, each with a unit last stride
// (or one element there) and no negative stride; kv_cache (written) holding its elements apart and
// overlapping no other argument. The CPU values hook (slots in [-1, num_blocks * block_size)) is
// the CPU lane's.
inline bool mla_args(int32_t device_type, const TensorView& kv_c, const TensorView& k_pe, const TensorView& cache,
                     const TensorView& slots, const AnyView& scale) {
  if (scale.type_index() != TypeIndex::kTVMFFINone) return false;
  if (kv_c.device().device_type != device_type || !is_float(kv_c.dtype()) || kv_c.ndim() != 2 || k_pe.ndim() != 2 ||
      cache.ndim() != 3 || slots.ndim() != 1)
    return false;
  const int64_t t = kv_c.size(0), r = kv_c.size(1), p = k_pe.size(1);
  if (k_pe.size(0) != t || cache.size(2) != r + p || slots.size(0) != t) return false;
  for (const TensorView* x : {&k_pe, &cache})
    if (!same_dtype(x->dtype(), kv_c.dtype())) return false;
  if (!is_dtype(slots, kDLInt, 64)) return false;
  for (const TensorView* x : {&k_pe, &cache, &slots})
    if (!same_device(*x, kv_c)) return false;
  for (const TensorView* x : {&kv_c, &k_pe, &cache, &slots})
    if ((x->size(x->ndim() - 1) > 1 && x->stride(x->ndim() - 1) != 1) || !no_negative_stride(*x)) return false;
  return distinct(cache) && may_share(cache, kv_c, false) && may_share(cache, k_pe, false) &&
         may_share(cache, slots, false);
}

// gather_cache (gather_check, the generic guard): src_cache [num_blocks, block_size >= 1, entry...]
// (any dtype) with C-contiguous entries (dims 2..); dst [rows, entry...] of its dtype, C-contiguous
// entries (dims 1..); block_table int32 [batch, width] with contiguous rows; cu_seq_lens int32
// [batch + 1] and seq_starts None or int32 [batch], dense; all on src_cache's device, no stride
// negative; dst (written) holding its elements apart and overlapping no other argument. The CPU
// values hook (gather_values) is the CPU lane's.
inline bool c_dense(const TensorView& t, int first) {
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= first; --i) {
    if (t.size(i) > 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}
inline bool gather_args(int32_t device_type, const TensorView& src, const TensorView& dst, const TensorView& table,
                        const TensorView& cu, const std::optional<TensorView>& starts) {
  if (src.device().device_type != device_type || !byte_dtype(src) || !same_dtype(dst.dtype(), src.dtype())) return false;
  for (const TensorView* x : {&dst, &table, &cu})
    if (!same_device(*x, src)) return false;
  if (!is_dtype(table, kDLInt, 32) || !is_dtype(cu, kDLInt, 32)) return false;
  if (starts && (!is_dtype(*starts, kDLInt, 32) || !same_device(*starts, src))) return false;
  const int nd = src.ndim();
  if (nd < 3 || src.size(1) < 1 || dst.ndim() != nd - 1) return false;
  for (int i = 2; i < nd; ++i)
    if (dst.size(i - 1) != src.size(i)) return false;
  if (!c_dense(src, 2) || !no_negative_stride(src) || !c_dense(dst, 1) || !no_negative_stride(dst)) return false;
  if (table.ndim() != 2 || (table.size(1) > 1 && table.stride(1) != 1) || !no_negative_stride(table)) return false;
  const int64_t b = table.size(0);
  if (!vector(cu, b + 1) || (starts && !vector(*starts, b))) return false;
  return distinct(dst) && may_share(dst, src, false) && may_share(dst, table, false) && may_share(dst, cu, false) &&
         (!starts || may_share(dst, *starts, false));
}
// gather_values: cu_seq_lens non-decreasing from 0 and within dst's rows, seq_starts >= 0, each
// sequence's block-table entries within the table and in [0, num_blocks).
inline bool gather_values_ok(const TensorView& src, const TensorView& dst, const TensorView& table,
                             const TensorView& cu_t, const std::optional<TensorView>& starts_t) {
  const int64_t batch = cu_t.size(0) - 1;
  if (batch < 1) return true;
  const int64_t nb = src.size(0), bs = src.size(1), rows = dst.size(0), width = table.size(1);
  const int64_t row = table.size(0) > 1 ? table.stride(0) : 0;
  const int32_t* cu = data_ptr<const int32_t>(cu_t);
  const int32_t* starts = starts_t ? data_ptr<const int32_t>(*starts_t) : nullptr;
  const int32_t* tab = data_ptr<const int32_t>(table);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lo = cu[b], hi = cu[b + 1], first = starts ? starts[b] : 0;
    if (lo < 0 || hi < lo || hi > rows || first < 0) return false;
    const int64_t col0 = first / bs, need = col0 + (hi - lo + bs - 1) / bs;
    if (need > width) return false;
    for (int64_t c = col0; c < need; ++c) {
      const int32_t blk = tab[b * row + c];
      if (blk < 0 || blk >= nb) return false;
    }
  }
  return true;
}

}  // namespace lane
}  // namespace opmux
