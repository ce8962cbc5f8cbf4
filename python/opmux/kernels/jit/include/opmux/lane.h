// Serving lanes: `<name>_<device>_lane(<the op's public arguments>[, bool enable_pdl])`.
//
// The Python argument contract (ops/<group>/op.py's contracts, checked by the generated
// ops/<group>/_contracts.py, and the generic guard of the entry points that ops/_entry_codegen.py
// writes) is the op's one contract; it costs microseconds of Python per call. A lane is the
// native kernel's own check of that contract for the op's serving form (the layouts and argument
// kinds a serving engine passes), in C++: when every rule holds it runs the kernel and
// returns a result; otherwise it returns None having done nothing, and the caller runs the
// Python contract, which accepts the call (a form the lane does not cover) or raises the
// op's error. So a lane may refuse anything, but must never accept a call the Python
// contract refuses (tests/parity/test_lanes.py checks both on every parity and contract case).
//
// An op declared with a contract (ops/_contract.py) that states its serving form exactly gets its
// lane generated from that contract by tools/gen_contracts.py: opmux/contracts/<group>.h (the
// checks) and opmux/contracts/<group>_<device>_lanes.inc (the entries, included by the unit).
// The helpers below are what those checks are made of.
//
// What only Python can see stays there (ops/_entry_codegen.py _lane_lines): grad mode, and that
// every tensor argument is a torch tensor, and that every float / int scalar is exactly a Python
// float / int (tvm-ffi passes any numbers.Real / Integral, numpy scalars included, as one).
// Scalars arrive as AnyView so that a lane can tell a bool, an int and a float apart (an int eps
// is not a float).
#pragma once

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "opmux/common.h"

namespace opmux {
namespace lane {

using tvm::ffi::Any;
using tvm::ffi::AnyView;
using tvm::ffi::Tensor;
using tvm::ffi::TypeIndex;

// The call is not in this lane's form: nothing was done, the Python contract decides.
inline Any refused() { return Any(); }
// The kernel ran on the caller's tensors (the public function returns them / None).
inline Any ran() { return Any(true); }
// The kernel ran; an op with several results called without some of its output buffers (as the
// torch library op's C++ kernel calls it, torch_bridge.cpp; the Python path passes them all, from
// its `outputs` hook) returns its results in order: the ones allocated here, None for the caller's.
inline Any ran_all(std::initializer_list<const Tensor*> fresh) {
  bool any = false;
  for (const Tensor* t : fresh) any = any || t->defined();
  if (!any) return ran();
  tvm::ffi::Array<Any> out;
  for (const Tensor* t : fresh) out.push_back(t->defined() ? Any(*t) : Any());
  return Any(out);
}

inline bool is_float(DLDataType d) {
  return d.lanes == 1 && ((d.code == kDLFloat && (d.bits == 32 || d.bits == 16)) ||
                          (d.code == kDLBfloat && d.bits == 16));
}
inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool is_dtype(const TensorView& t, DLDataTypeCode code, int bits) {
  DLDataType d = t.dtype();
  return d.lanes == 1 && d.code == code && d.bits == bits;
}
inline bool same_device(const TensorView& a, const TensorView& b) {
  return a.device().device_type == b.device().device_type &&
         a.device().device_id == b.device().device_id;
}

// Scalars: exactly the Python type the serving form takes (a Python bool is not an int here).
inline bool float_arg(const AnyView& v, double* out) {
  if (v.type_index() != TypeIndex::kTVMFFIFloat) return false;
  *out = v.cast<double>();
  return true;
}
inline bool finite_float(const AnyView& v, double* out) {
  return float_arg(v, out) && std::isfinite(*out);
}
inline bool positive_float(const AnyView& v, double* out) {  // 0 < v < inf (NaN fails)
  return float_arg(v, out) && *out > 0.0 && *out < HUGE_VAL;
}
inline bool bool_arg(const AnyView& v, bool* out) {
  if (v.type_index() != TypeIndex::kTVMFFIBool) return false;
  *out = v.cast<bool>();
  return true;
}
inline bool int_arg(const AnyView& v, int64_t* out) {
  if (v.type_index() != TypeIndex::kTVMFFIInt) return false;
  *out = v.cast<int64_t>();
  return true;
}
// An optional tensor argument: None, or a tensor (anything else: not this lane's form).
inline bool opt_tensor(const AnyView& v, std::optional<TensorView>* out) {
  if (v.type_index() == TypeIndex::kTVMFFINone) {
    out->reset();
    return true;
  }
  *out = v.try_cast<TensorView>();  // (as<> takes only a raw DLTensor*; a torch tensor arrives as a Tensor)
  return out->has_value();
}

// [rows, n] addressed as rows with a unit last stride (any row stride; n <= 1: any strides).
inline bool rows_view(const TensorView& t, int64_t rows, int64_t n) {
  return t.ndim() == 2 && t.size(0) == rows && t.size(1) == n && (n <= 1 || t.stride(1) == 1);
}
// A dense [n] vector.
inline bool vector(const TensorView& t, int64_t n) {
  return t.ndim() == 1 && t.size(0) == n && (n <= 1 || t.stride(0) == 1);
}

// No two elements at one address (_checks._distinct_addresses): with the dims of size > 1 by
// increasing |stride|, each stride clears the span of the smaller ones.
inline bool distinct(const TensorView& t) {
  const int nd = t.ndim();
  int64_t st[8], n[8];
  int k = 0;
  if (nd > 8) return false;
  for (int i = 0; i < nd; ++i) {
    if (t.size(i) == 0) return true;
    if (t.size(i) > 1) {
      st[k] = std::llabs(t.stride(i));
      n[k] = t.size(i);
      ++k;
    }
  }
  for (int i = 1; i < k; ++i)  // insertion sort by stride (k <= 8)
    for (int j = i; j > 0 && st[j] < st[j - 1]; --j) std::swap(st[j], st[j - 1]), std::swap(n[j], n[j - 1]);
  int64_t span = 1;
  for (int i = 0; i < k; ++i) {
    if (st[i] < span) return false;
    span = st[i] * (n[i] - 1) + span;
  }
  return true;
}

// [lo, hi) byte range a view can touch (numel > 0).
inline void extent(const TensorView& t, uintptr_t* lo, uintptr_t* hi) {
  int64_t neg = 0, pos = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    const int64_t reach = t.stride(i) * (t.size(i) - 1);
    (reach < 0 ? neg : pos) += reach;
  }
  const int64_t item = (t.dtype().bits * t.dtype().lanes + 7) / 8;
  const uintptr_t base = reinterpret_cast<uintptr_t>(data_ptr<char>(t));
  *lo = base + neg * item;
  *hi = base + (pos + 1) * item;
}

// The very same view: one address, dtype and shape, and the same stride in every dim of size > 1
// (_checks.alias's rule; a stride of a size-1 dim addresses nothing).
inline bool same_view(const TensorView& a, const TensorView& b) {
  if (data_ptr<char>(a) != data_ptr<char>(b) || !same_dtype(a.dtype(), b.dtype()) ||
      a.ndim() != b.ndim())
    return false;
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.size(i) != b.size(i)) return false;
    if (a.size(i) > 1 && a.stride(i) != b.stride(i)) return false;
  }
  return true;
}

// a and b start at one address, a not empty (_checks.same_address: "another tensor than").
inline bool same_address(const TensorView& a, const TensorView& b) {
  return a.numel() > 0 && data_ptr<char>(a) == data_ptr<char>(b);
}

inline int64_t floor_div(int64_t a, int64_t b) {  // Python's //, b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// Is delta = sum(k_i * s_i) with -(nb_i - 1) <= k_i <= na_i - 1? (_checks._reachable)
inline bool reachable(int64_t delta, const int64_t* s, const int64_t* na, const int64_t* nb, int k) {
  if (k == 0) return delta == 0;
  int64_t reach = 0;
  for (int i = 1; i < k; ++i) reach += (std::max(na[i], nb[i]) - 1) * s[i];
  const int64_t lo = std::max(-(nb[0] - 1), -floor_div(reach - delta, s[0]));
  const int64_t hi = std::min(na[0] - 1, floor_div(delta + reach, s[0]));
  if (hi - lo > 64) return true;  // strides that do not nest: assume the worst
  for (int64_t j = lo; j <= hi; ++j)
    if (reachable(delta - j * s[0], s + 1, na + 1, nb + 1, k - 1)) return true;
  return false;
}

// Two views with the same strides that touch no common element (_checks._disjoint: q and k views
// of one qkv buffer); false when unsure.
inline bool disjoint_views(const TensorView& a, const TensorView& b) {
  const int64_t size = (a.dtype().bits * a.dtype().lanes + 7) / 8;
  if (size != (b.dtype().bits * b.dtype().lanes + 7) / 8 || a.ndim() != b.ndim() || a.ndim() > 8)
    return false;
  int64_t s[8], na[8], nb[8];
  int k = 0;
  for (int i = 0; i < a.ndim(); ++i) {
    const int64_t sa = a.stride(i), sb = b.stride(i), xa = a.size(i), xb = b.size(i);
    if (xa > 1 && xb > 1 && sa != sb) return false;
    const int64_t st = xa > 1 ? sa : sb;
    if (st == 0) continue;
    if (st < 0) return false;  // (torch views have none)
    s[k] = st, na[k] = xa, nb[k] = xb, ++k;
  }
  // by stride descending, then sizes descending (Python's sorted(..., reverse=True))
  for (int i = 1; i < k; ++i)
    for (int j = i; j > 0; --j) {
      const bool before = s[j] > s[j - 1] || (s[j] == s[j - 1] && (na[j] > na[j - 1] ||
                                                                 (na[j] == na[j - 1] && nb[j] > nb[j - 1])));
      if (!before) break;
      std::swap(s[j], s[j - 1]), std::swap(na[j], na[j - 1]), std::swap(nb[j], nb[j - 1]);
    }
  const int64_t bytes = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data_ptr<char>(b)) -
                                             reinterpret_cast<uintptr_t>(data_ptr<char>(a)));
  if (bytes % size != 0) return false;
  return !reachable(bytes / size, s, na, nb, k);
}

// The generic guard's rule for a written tensor `w` and another argument `o`: no common byte;
// or (a read `o`) the very same view, i.e. in place; or interleaved views that provably share no
// element (_checks.alias). Anything else: the Python guard decides.
inline bool may_share(const TensorView& w, const TensorView& o, bool o_written) {
  if (w.numel() == 0 || o.numel() == 0) return true;
  uintptr_t wl, wh, ol, oh;
  extent(w, &wl, &wh);
  extent(o, &ol, &oh);
  if (wh <= ol || oh <= wl) return true;
  if (same_view(w, o)) return !o_written;
  return disjoint_views(w, o);
}

// n elements (any shape) addressable as one dense [n] vector: every dim of size > 1 has the
// stride of the dims after it (_checks.flat_vector's view(n) with unit stride).
inline bool flat_dense(const TensorView& t, int64_t n) {
  if (t.numel() != n) return false;
  int64_t want = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (t.stride(i) != want) return false;
    want *= t.size(i);
  }
  return true;
}

// A view on the stack (the kernel argument a contract names for what the caller's tensor is not
// as such): an empty tensor for an absent optional input, the dense [n] vector of a flat output,
// the [1, 1] block of one element. It must outlive the kernel call.
struct View {
  DLTensor dl;
  int64_t shape[2];
  int64_t strides[2];
  View(const View&) = delete;
  View(void* data, uint64_t offset, DLDevice dev, DLDataType dtype, int ndim, int64_t n) {
    shape[0] = n;
    shape[1] = 1;
    strides[0] = strides[1] = 1;
    dl.data = data;
    dl.device = dev;
    dl.ndim = ndim;
    dl.dtype = dtype;
    dl.shape = shape;
    dl.strides = strides;
    dl.byte_offset = offset;
  }
  static View empty(DLDevice dev, DLDataType dtype) { return View(nullptr, 0, dev, dtype, 1, 0); }
  static View flat(const TensorView& t, int64_t n) { return View(t.data_ptr(), t.byte_offset(), t.device(), t.dtype(), 1, n); }
  static View block(const TensorView& t) { return View(t.data_ptr(), t.byte_offset(), t.device(), t.dtype(), 2, 1); }
  TensorView view() {  // (shape / strides re-pointed: a view of this object's arrays)
    dl.shape = shape;
    dl.strides = strides;
    return TensorView(&dl);
  }
};

// -- the cache layouts of contracts (ops/_contract.py; _checks.dense_last, dense_from, dense_blocks) --
inline bool is_none(const AnyView& v) { return v.type_index() == TypeIndex::kTVMFFINone; }
inline bool no_negative_stride(const TensorView& t) {
  for (int i = 0; i < t.ndim(); ++i)
    if (t.stride(i) < 0) return false;
  return true;
}
// Elements of whole bytes (a cache of any dtype, copied as bytes).
inline bool byte_dtype(const TensorView& t) {
  const DLDataType d = t.dtype();
  return d.lanes == 1 && d.bits >= 8 && d.bits % 8 == 0;
}
// A unit last stride (or at most one element there), no stride negative.
inline bool dense_last(const TensorView& t) {
  const int n = t.ndim();
  return (n == 0 || t.size(n - 1) <= 1 || t.stride(n - 1) == 1) && no_negative_stride(t);
}
// Dims first.. C-contiguous (size-1 dims aside), no stride negative.
inline bool dense_from(const TensorView& t, int first) {
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= first; --i) {
    if (t.size(i) > 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return no_negative_stride(t);
}
// C-contiguous, or empty.
inline bool contiguous(const TensorView& t) { return t.numel() == 0 || dense_from(t, 0); }
// Each block t[b] one dense region (its inner strides a permutation of a contiguous layout),
// blocks apart, no stride negative.
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
// a's dims from i on are b's from j on (a shape's trailing E... dims).
inline bool same_tail(const TensorView& a, int i, const TensorView& b, int j) {
  if (a.ndim() - i != b.ndim() - j) return false;
  for (; i < a.ndim(); ++i, ++j)
    if (a.size(i) != b.size(j)) return false;
  return true;
}

// -- the moe ops' contracts (ops/_contract.py: cdiv in sizes, the rows_apart layout) ----------------
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }  // ceil(a / b), a >= 0, b > 0
// A [T, k] matrix with a unit last stride whose rows do not overlap (_checks.rows_apart).
inline bool rows_apart(const TensorView& t) {
  return t.ndim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) && (t.size(0) <= 1 || t.stride(0) >= t.size(1));
}

// A [T, H, D] view of a [T, H * D] or [T, H, D] tensor with a unit last stride and no negative
// stride (a 3-D one as it is): the C++ counterpart of an escape hatch's heads view (rope's query
// and key, ops/rope/_views.py), false when unsure. v.view() points into v: keep v alive.
struct HeadsView {
  DLTensor dl;
  int64_t shape[3], strides[3];
  TensorView view() const { return TensorView(&dl); }
};
inline bool heads_view(const TensorView& t, int64_t tokens, int64_t d, HeadsView* v) {
  if (t.ndim() < 2 || t.size(0) != tokens || t.stride(t.ndim() - 1) != 1) return false;
  v->dl.data = t.data_ptr();
  v->dl.device = t.device();
  v->dl.dtype = t.dtype();
  v->dl.byte_offset = t.byte_offset();
  if (t.ndim() == 3 && t.size(2) == d) {
    for (int i = 0; i < 3; ++i) v->shape[i] = t.size(i), v->strides[i] = t.stride(i);
  } else if (t.ndim() == 2 && t.size(1) % d == 0) {
    v->shape[0] = tokens, v->shape[1] = t.size(1) / d, v->shape[2] = d;
    v->strides[0] = t.stride(0), v->strides[1] = d, v->strides[2] = 1;
  } else {
    return false;
  }
  v->dl.ndim = 3;
  v->dl.shape = v->shape;
  v->dl.strides = v->strides;
  return (v->shape[0] <= 1 || v->strides[0] >= 0) && (v->shape[1] <= 1 || v->strides[1] >= 0);
}

// -- the values hooks' C++ counterparts (opmux/<group>_values.h, a contract's values_cpp) --------
// Every element of a dense integer tensor in [lo, hi): index ranges a values hook states in
// Python. Read only on the CPU (device_type): CUDA tensors are not read, as the hooks read none.
template <typename I>
inline bool all_in(const TensorView& t, int64_t lo, int64_t hi) {
  const I* p = data_ptr<const I>(t);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] < lo || p[i] >= hi) return false;
  return true;
}
template <typename I>
inline bool all_in_on_cpu(int32_t device_type, const TensorView& t, int64_t lo, int64_t hi) {
  return device_type != kDLCPU || all_in<I>(t, lo, hi);
}

// A fresh dense tensor from the caller's framework (torch's allocator, on `like`'s device).
inline Tensor empty(std::initializer_list<int64_t> shape, DLDataType dtype, DLDevice device) {
  int64_t dims[8];
  int n = 0;
  for (int64_t s : shape) dims[n++] = s;
  return Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(dims, n), dtype, device);
}

}  // namespace lane
}  // namespace opmux
