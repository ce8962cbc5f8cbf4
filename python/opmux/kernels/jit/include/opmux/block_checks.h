// Argument validation for the KV cache block ops (copy_blocks, concat_and_cache_mla,
// gather_cache), shared by the CPU and CUDA units: what keeps a direct caller of the native ABI
// in bounds (ndim, dtypes, shapes, strides, devices). Index values are checked by the kernels
// (CPU: before the first write; CUDA: bad pairs / tokens skipped).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {

// Bytes of one element of any dtype (blocks are copied as bytes).
inline int64_t elt_bytes(const char* op, const char* name, const TensorView& t) {
  const DLDataType d = t.dtype();
  if (d.lanes != 1 || d.bits == 0 || d.bits % 8 != 0) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has dtype " << dtype_name(d)
                              << " (bits=" << int(d.bits) << ", lanes=" << int(d.lanes)
                              << "); elements must be whole bytes";
  }
  return d.bits / 8;
}

inline bool same_dtype(const TensorView& a, const TensorView& b) {
  const DLDataType x = a.dtype(), y = b.dtype();
  return x.code == y.code && x.bits == y.bits && x.lanes == y.lanes;
}

// A cache [num_blocks, ...] whose blocks are each one dense region of `block_bytes` (the inner
// strides a permutation of a contiguous layout), `stride_bytes` apart (no overlap).
struct BlockCache {
  int64_t num_blocks, block_bytes, stride_bytes;
};

inline BlockCache check_block_cache(const char* op, const char* name, const TensorView& t) {
  if (t.ndim() < 2) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " must be at least 2-D ([num_blocks, ...]), got "
                              << t.ndim() << "-D";
  }
  const int64_t elt = elt_bytes(op, name, t);
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the inner dims of size > 1
  int64_t numel = 1;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.stride(d) < 0) {
      TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative stride in dim " << d;
    }
    if (d == 0) continue;
    numel *= t.size(d);
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  for (const auto& [s, n] : dims) {
    if (numel > 0 && s != expect) {
      TVM_FFI_THROW(ValueError) << op << ": each block of " << name
                                << " must be one dense region (its dims a permutation of a contiguous layout)";
    }
    expect *= n;
  }
  BlockCache b;
  b.num_blocks = t.size(0);
  b.block_bytes = numel * elt;
  b.stride_bytes = t.size(0) > 1 ? t.stride(0) * elt : b.block_bytes;
  if (numel > 0 && b.num_blocks > 1 && t.stride(0) < numel) {
    TVM_FFI_THROW(ValueError) << op << ": the blocks of " << name << " overlap (block stride " << t.stride(0)
                              << " < " << numel << " elements per block)";
  }
  return b;
}

// block_mapping: int64 [num_pairs, 2], contiguous; returns num_pairs.
inline int64_t check_block_mapping(const char* op, const TensorView& m) {
  check_int64(op, "block_mapping", m);
  check_ndim(op, "block_mapping", m, 2);
  check_size(op, "block_mapping", m, 1, 2, "(src, dst) pairs");
  if ((m.size(0) > 1 && m.stride(0) != 2) || m.stride(1) != 1) {
    TVM_FFI_THROW(ValueError) << op << ": block_mapping must be contiguous";
  }
  return m.size(0);
}

// concat_and_cache_mla: kv_c [T, R], k_pe [T, P] (last dims dense), kv_cache [nb, bs, R + P]
// (entry dense) of kv_c's dtype or fp8 bytes with a float32 one-element scale, slot_mapping
// int64 [T] dense.
struct MlaArgs {
  DType dtype;
  int32_t device_id;
  int64_t tokens, rank, pe, num_blocks, block_size;
  int64_t c_tok, pe_tok, cache_block, cache_page;  // strides in elements
};

inline MlaArgs check_mla_args(const char* op, int32_t device_type, const TensorView& kv_c, const TensorView& k_pe,
                              const TensorView& kv_cache, const TensorView& slots, const TensorView& scale,
                              bool fp8) {
  MlaArgs a;
  a.device_id = check_device(op, device_type, {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache},
                                               {"slot_mapping", &slots}});
  check_ndim(op, "kv_c", kv_c, 2);
  check_ndim(op, "k_pe", k_pe, 2);
  check_ndim(op, "kv_cache", kv_cache, 3);
  check_ndim(op, "slot_mapping", slots, 1);
  if (fp8) {
    a.dtype = check_same_dtype(op, {{"kv_c", &kv_c}, {"k_pe", &k_pe}});
    check_fp8_bytes(op, "kv_cache", kv_cache);
    check_device(op, device_type, {{"kv_c", &kv_c}, {"scale", &scale}});
    check_float32(op, "scale", scale);
    int64_t n = 1;
    for (int d = 0; d < scale.ndim(); ++d) n *= scale.size(d);
    if (n != 1) TVM_FFI_THROW(ValueError) << op << ": scale must have one element, got " << n;
  } else {
    a.dtype = check_same_dtype(op, {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache}});
  }
  check_int64(op, "slot_mapping", slots);
  a.tokens = kv_c.size(0);
  a.rank = kv_c.size(1);
  a.pe = k_pe.size(1);
  check_size(op, "k_pe", k_pe, 0, a.tokens, "tokens of kv_c");
  check_size(op, "kv_cache", kv_cache, 2, a.rank + a.pe, "kv_lora_rank + pe_dim");
  check_size(op, "slot_mapping", slots, 0, a.tokens, "tokens of kv_c");
  check_last_dim_contiguous(op, "kv_c", kv_c);
  check_last_dim_contiguous(op, "k_pe", k_pe);
  check_last_dim_contiguous(op, "kv_cache", kv_cache);
  check_last_dim_contiguous(op, "slot_mapping", slots);
  a.c_tok = row_stride(op, "kv_c", kv_c);
  a.pe_tok = row_stride(op, "k_pe", k_pe);
  a.num_blocks = kv_cache.size(0);
  a.block_size = kv_cache.size(1);
  a.cache_block = kv_cache.stride(0);
  a.cache_page = kv_cache.stride(1);
  if (a.cache_block < 0 || a.cache_page < 0) {
    TVM_FFI_THROW(ValueError) << op << ": kv_cache has a negative stride";
  }
  return a;
}

// gather_cache: src_cache [nb, bs >= 1, entry...] (entry C-contiguous), dst [N, entry...] of its
// dtype (entry C-contiguous), block_table int32 [B, W] (rows dense), cu_seq_lens int32 [B + 1]
// and seq_starts int32 [B] dense.
struct GatherArgs {
  int32_t device_id;
  int64_t elt, entry_bytes, num_blocks, block_size, rows, batch, width;
  int64_t cache_block, cache_page, dst_row, table_row;  // strides in bytes (cache, dst), elements (table)
};

inline bool c_dense_from(const TensorView& t, int first) {
  int64_t expect = 1;
  for (int d = t.ndim() - 1; d >= first; --d) {
    if (t.size(d) > 1 && t.stride(d) != expect) return false;
    expect *= t.size(d);
  }
  return true;
}

inline GatherArgs check_gather_args(const char* op, int32_t device_type, const TensorView& src,
                                    const TensorView& dst, const TensorView& table, const TensorView& cu,
                                    const TensorView& starts, bool has_starts) {
  GatherArgs a;
  a.device_id = check_device(op, device_type, {{"src_cache", &src}, {"dst", &dst}, {"block_table", &table},
                                               {"cu_seq_lens", &cu}});
  if (has_starts) check_device(op, device_type, {{"src_cache", &src}, {"seq_starts", &starts}});
  a.elt = elt_bytes(op, "src_cache", src);
  if (!same_dtype(src, dst)) {
    TVM_FFI_THROW(ValueError) << op << ": dst has dtype " << dtype_name(dst.dtype()) << ", expected "
                              << dtype_name(src.dtype()) << " like src_cache";
  }
  if (src.ndim() < 3) TVM_FFI_THROW(ValueError) << op << ": src_cache must be at least 3-D";
  check_ndim(op, "dst", dst, src.ndim() - 1);
  int64_t entry = 1;
  for (int d = 1; d < dst.ndim(); ++d) {
    check_size(op, "dst", dst, d, src.size(d + 1), "src_cache's entry shape");
    entry *= dst.size(d);
  }
  if (!c_dense_from(src, 2) || !c_dense_from(dst, 1)) {
    TVM_FFI_THROW(ValueError) << op << ": the entries of src_cache (dims 2..) and dst (dims 1..) must be contiguous";
  }
  if (src.stride(0) < 0 || src.stride(1) < 0 || dst.stride(0) < 0) {
    TVM_FFI_THROW(ValueError) << op << ": negative strides are not supported";
  }
  check_int32(op, "block_table", table);
  check_int32(op, "cu_seq_lens", cu);
  check_ndim(op, "block_table", table, 2);
  check_last_dim_contiguous(op, "block_table", table);
  a.batch = table.size(0);
  a.width = table.size(1);
  a.table_row = row_stride(op, "block_table", table);
  check_vector(op, "cu_seq_lens", cu, a.batch + 1, "block_table rows + 1");
  if (has_starts) {
    check_int32(op, "seq_starts", starts);
    check_vector(op, "seq_starts", starts, a.batch, "block_table rows");
  }
  a.entry_bytes = entry * a.elt;
  a.num_blocks = src.size(0);
  a.block_size = src.size(1);
  if (a.block_size < 1) TVM_FFI_THROW(ValueError) << op << ": src_cache's block_size (shape[1]) must be at least 1";
  a.rows = dst.size(0);
  a.cache_block = src.stride(0) * a.elt;
  a.cache_page = src.stride(1) * a.elt;
  a.dst_row = dst.stride(0) * a.elt;
  return a;
}

}  // namespace opmux
