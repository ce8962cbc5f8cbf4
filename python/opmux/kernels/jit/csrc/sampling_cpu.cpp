// The sampling ops for CPU tensors (the rules: ops/sampling/op.py's docstring). Rows in parallel
// (OpenMP), one scratch row per thread, no sort: per row
//   * the top-k threshold: the k-th largest value by std::nth_element (expected O(V)) over the
//     ordered int keys of the values (opmux/sampling_philox.h: a total order, so NaN bits from a
//     direct caller cannot break the selection);
//   * the top-p threshold: a quickselect over the pool with a three-way partition per step that
//     sums the partition above the pivot (double), descending into the side that holds the value at
//     which the descending cumulative mass first reaches p times the pool's mass (expected O(V); a
//     segment still unresolved after kMaxSelectSteps steps is sorted, so the worst case is
//     O(V log V));
//   * masks compare the values (x >= t keeps every value tied with the threshold);
//   * the draw: u from Philox (the Triton backend's stream: seed, counter (offset lo, hi, row, 0)),
//     then one pass with a double running sum: the first kept positive entry whose cumulative mass
//     exceeds u * kept mass, else the last kept positive one (else 0).
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then the
// argument checks and the tvm-ffi entry points.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"
#include "opmux/sampling_philox.h"

namespace opmux {
namespace sampling_cpu {

using cpu::to_float;
using sampling::ordered_key;

// Below this many bytes read, one thread (a parallel region's fork / join costs more).
constexpr int64_t kParallelMinBytes = 64 << 10;
// Quickselect steps before the remaining segment is sorted instead (a bound on bad pivots).
constexpr int kMaxSelectSteps = 64;

struct KeyGreater {
  bool operator()(float a, float b) const { return ordered_key(a) > ordered_key(b); }
};

// The k-th largest of x[0, n) (1 <= k <= n); scratch holds n floats.
inline float kth_largest(const float* x, int64_t n, int64_t k, float* scratch) {
  std::copy(x, x + n, scratch);
  std::nth_element(scratch, scratch + (k - 1), scratch + n, KeyGreater());
  return scratch[k - 1];
}

inline float median3(float a, float b, float c) {
  const int32_t ka = ordered_key(a), kb = ordered_key(b), kc = ordered_key(c);
  if ((ka <= kb) == (kb <= kc)) return b;
  if ((kb <= ka) == (ka <= kc)) return a;
  return c;
}

// The largest value t of pool[0, m) (m >= 1) whose mass of values >= t reaches `need`: the value at
// which the descending cumulative sum first reaches need; the smallest value when none does
// (rounding). Reorders pool.
inline float top_p_value(float* pool, int64_t m, double need) {
  int64_t lo = 0, hi = m;
  double above = 0.0;  // the mass of the values ranked above [lo, hi)
  for (int step = 0; hi > lo; ++step) {
    if (step == kMaxSelectSteps) {  // bad pivots: sort what is left, then scan it
      std::sort(pool + lo, pool + hi, KeyGreater());
      for (int64_t i = lo; i < hi; ++i) {
        int64_t j = i;  // the run of values tied with pool[i]
        double run = 0.0;
        while (j < hi && ordered_key(pool[j]) == ordered_key(pool[i])) run += pool[j++];
        if (above + run >= need) return pool[i];
        above += run;
        i = j - 1;
      }
      return pool[hi - 1];
    }
    const float pv = median3(pool[lo], pool[lo + (hi - lo) / 2], pool[hi - 1]);
    const int32_t kp = ordered_key(pv);
    // three-way partition: [lo, g) above the pivot, [g, l) tied with it, [l, hi) below
    int64_t i = lo, g = lo, l = hi;
    double sg = 0.0, se = 0.0;
    while (i < l) {
      const float v = pool[i];
      const int32_t kv = ordered_key(v);
      if (kv > kp) {
        sg += v;
        std::swap(pool[i++], pool[g++]);
      } else if (kv < kp) {
        std::swap(pool[i], pool[--l]);
      } else {
        se += v;
        ++i;
      }
    }
    if (g > lo && above + sg >= need) {
      hi = g;  // the threshold is above the pivot
    } else if (above + sg + se >= need || l == hi) {
      return pv;  // the pivot (or, nothing below it being left, the smallest value)
    } else {
      above += sg + se;
      lo = l;
    }
  }
  return pool[m - 1];  // unreachable: each step returns or shrinks a non-empty segment
}

inline double mass_from(const float* x, int64_t n, float t) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i] >= t ? static_cast<double>(x[i]) : 0.0;
  return s;
}

// The top-p threshold over the values of x >= base (the whole row: base = -inf).
inline float top_p_threshold(const float* x, int64_t n, float base, float p, float* scratch) {
  int64_t m = 0;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] >= base) {
      scratch[m++] = x[i];
      total += x[i];
    }
  }
  if (m == 0) return base;
  return top_p_value(scratch, m, static_cast<double>(p) * total);
}

// Inverse CDF over the entries >= t (see the file's comment).
inline int32_t draw(const float* x, int64_t n, float t, float u) {
  const double target = static_cast<double>(u) * mass_from(x, n, t);
  double c = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] >= t && x[i] > 0.0f) {
      c += x[i];
      last = i;
      if (c > target) return static_cast<int32_t>(i);
    }
  }
  return static_cast<int32_t>(last < 0 ? 0 : last);
}

// A per-row parameter: from its [B] tensor (int32 / int64 / float32) or the scalar.
struct PerRow {
  const void* arr = nullptr;  // nullptr: the scalar
  bool i64 = false;
  double value = 0.0;
  double at(int64_t r) const {
    if (arr == nullptr) return value;
    if (i64) return static_cast<double>(static_cast<const int64_t*>(arr)[r]);
    return static_cast<double>(static_cast<const int32_t*>(arr)[r]);
  }
  float at_f(int64_t r) const { return arr == nullptr ? static_cast<float>(value) : static_cast<const float*>(arr)[r]; }
};

inline bool k_on(double k, int64_t n) { return k > 0 && k < static_cast<double>(n); }

// Runs row(r, scratch) over the rows, on threads when the call is large enough.
template <typename F>
void for_rows(int64_t rows, int64_t vocab, int64_t elem_bytes, F row) {
  const int nt = cpu::threads_for(rows * vocab * elem_bytes, kParallelMinBytes, rows);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    std::vector<float> scratch(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row(r, scratch.data());
  }
}

void top_k_renorm_impl(float* out, int64_t so, const float* x, int64_t sx, int64_t rows, int64_t n, PerRow k) {
  for_rows(rows, n, 4, [&](int64_t r, float* scratch) {
    const float* xr = x + r * sx;
    float* o = out + r * so;
    const double kr = k.at(r);
    if (!k_on(kr, n)) {
      if (o != xr) std::copy(xr, xr + n, o);
      return;
    }
    const float t = kth_largest(xr, n, static_cast<int64_t>(kr), scratch);
    const double mass = mass_from(xr, n, t);
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] >= t ? static_cast<float>(xr[i] / mass) : 0.0f;
  });
}

void top_p_renorm_impl(float* out, int64_t so, const float* x, int64_t sx, int64_t rows, int64_t n, PerRow p) {
  for_rows(rows, n, 4, [&](int64_t r, float* scratch) {
    const float* xr = x + r * sx;
    float* o = out + r * so;
    const float pr = p.at_f(r);
    if (!(pr < 1.0f)) {
      if (o != xr) std::copy(xr, xr + n, o);
      return;
    }
    const float t = top_p_threshold(xr, n, -INFINITY, pr, scratch);
    const double mass = mass_from(xr, n, t);
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] >= t ? static_cast<float>(xr[i] / mass) : 0.0f;
  });
}

template <typename T>
void top_k_mask_impl(T* out, int64_t so, const T* x, int64_t sx, int64_t rows, int64_t n, PerRow k) {
  for_rows(rows, n, static_cast<int64_t>(sizeof(T)), [&](int64_t r, float* scratch) {
    const T* xr = x + r * sx;
    T* o = out + r * so;
    const double kr = k.at(r);
    if (!k_on(kr, n)) {
      if (o != xr) std::copy(xr, xr + n, o);
      return;
    }
    for (int64_t i = 0; i < n; ++i) scratch[i] = to_float(xr[i]);
    const int64_t kk = static_cast<int64_t>(kr);
    std::nth_element(scratch, scratch + (kk - 1), scratch + n, KeyGreater());
    const float t = scratch[kk - 1];
    const T ninf = cpu::from_float<T>(-INFINITY);
    for (int64_t i = 0; i < n; ++i) o[i] = to_float(xr[i]) >= t ? xr[i] : ninf;
  });
}

// argmax, ties (and an all -inf row) to the lowest index.
template <typename T>
void greedy_impl(int32_t* out, const T* x, int64_t sx, int64_t rows, int64_t n) {
  for_rows(rows, 1, static_cast<int64_t>(sizeof(T)) * n, [&](int64_t r, float*) {
    const T* xr = x + r * sx;
    float best = to_float(xr[0]);
    int64_t idx = 0;
    for (int64_t i = 1; i < n; ++i) {
      const float v = to_float(xr[i]);
      if (v > best) {
        best = v;
        idx = i;
      }
    }
    out[r] = static_cast<int32_t>(idx);
  });
}

struct Philox {
  uint64_t seed, offset;
};

void top_k_top_p_sample_impl(int32_t* out, const float* x, int64_t sx, int64_t rows, int64_t n, PerRow k, PerRow p,
                             Philox rng, bool joint) {
  for_rows(rows, n, 4, [&](int64_t r, float* scratch) {
    const float* xr = x + r * sx;
    const double kr = k.at(r);
    const float pr = p.at_f(r);
    float t = -INFINITY;
    if (k_on(kr, n)) t = kth_largest(xr, n, static_cast<int64_t>(kr), scratch);
    if (pr < 1.0f) {
      if (joint) {
        t = std::max(t, top_p_threshold(xr, n, -INFINITY, pr, scratch));
      } else {
        t = top_p_threshold(xr, n, t, pr, scratch);
      }
    }
    out[r] = draw(xr, n, t, sampling::uniform(rng.seed, rng.offset, r));
  });
}

void min_p_sample_impl(int32_t* out, const float* x, int64_t sx, int64_t rows, int64_t n, PerRow m, Philox rng) {
  for_rows(rows, n, 4, [&](int64_t r, float*) {
    const float* xr = x + r * sx;
    float top = xr[0];
    for (int64_t i = 1; i < n; ++i) top = xr[i] > top ? xr[i] : top;
    const float t = std::max(m.at_f(r) * top, 0.0f);
    out[r] = draw(xr, n, t, sampling::uniform(rng.seed, rng.offset, r));
  });
}

}  // namespace sampling_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include <string>

#include "opmux/contracts/sampling.h"
#include "opmux/sampling_checks.h"

namespace opmux {
namespace sampling_cpu {

PerRow per_row_k(const TensorView& k_arr, bool has_k, int64_t top_k, bool i64) {
  PerRow k;
  k.value = static_cast<double>(top_k);
  if (has_k) {
    k.arr = data_ptr<const void>(k_arr);
    k.i64 = i64;
  }
  return k;
}

PerRow per_row_f(const TensorView& arr, bool has, double value) {
  PerRow p;
  p.value = value;
  if (has) p.arr = data_ptr<const void>(arr);
  return p;
}

Philox philox_of(const TensorView& seed_t, bool has_seed, int64_t seed, const TensorView& offset_t, bool has_offset,
                 int64_t offset) {
  Philox rng;
  rng.seed = static_cast<uint64_t>(has_seed ? data_ptr<const int64_t>(seed_t)[0] : seed);
  rng.offset = static_cast<uint64_t>(has_offset ? data_ptr<const int64_t>(offset_t)[0] : offset);
  return rng;
}

void top_k_renorm_probs_cpu(TensorView out, TensorView probs, TensorView k_arr, bool has_k, int64_t top_k) {
  const char* op = "opmux.top_k_renorm_probs";
  const SampleRows r = check_sample_rows(op, kDLCPU, "probs", probs, true);
  const int64_t so = check_sample_out_rows(op, kDLCPU, out, probs, r);
  const bool i64 = check_sample_k_arr(op, kDLCPU, k_arr, has_k, probs, r);
  if (r.rows == 0) return;
  top_k_renorm_impl(data_ptr<float>(out), so, data_ptr<const float>(probs), r.stride, r.rows, r.vocab,
                    per_row_k(k_arr, has_k, top_k, i64));
}

void top_p_renorm_probs_cpu(TensorView out, TensorView probs, TensorView p_arr, bool has_p, double top_p) {
  const char* op = "opmux.top_p_renorm_probs";
  const SampleRows r = check_sample_rows(op, kDLCPU, "probs", probs, true);
  const int64_t so = check_sample_out_rows(op, kDLCPU, out, probs, r);
  check_sample_f32_arr(op, kDLCPU, "top_p_arr", p_arr, has_p, probs, r);
  if (r.rows == 0) return;
  top_p_renorm_impl(data_ptr<float>(out), so, data_ptr<const float>(probs), r.stride, r.rows, r.vocab,
                    per_row_f(p_arr, has_p, top_p));
}

void top_k_mask_logits_cpu(TensorView out, TensorView logits, TensorView k_arr, bool has_k, int64_t top_k) {
  const char* op = "opmux.top_k_mask_logits";
  const SampleRows r = check_sample_rows(op, kDLCPU, "logits", logits, false);
  const int64_t so = check_sample_out_rows(op, kDLCPU, out, logits, r);
  const bool i64 = check_sample_k_arr(op, kDLCPU, k_arr, has_k, logits, r);
  if (r.rows == 0) return;
  const PerRow k = per_row_k(k_arr, has_k, top_k, i64);
  OPMUX_DISPATCH_DTYPE(r.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    top_k_mask_impl(data_ptr<scalar_t>(out), so, data_ptr<const scalar_t>(logits), r.stride, r.rows, r.vocab, k);
  });
}

void greedy_cpu(TensorView out, TensorView logits) {
  const char* op = "opmux.greedy";
  const SampleRows r = check_sample_rows(op, kDLCPU, "logits", logits, false);
  check_sample_ids(op, kDLCPU, out, logits, r);
  if (r.rows == 0) return;
  OPMUX_DISPATCH_DTYPE(r.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    greedy_impl(data_ptr<int32_t>(out), data_ptr<const scalar_t>(logits), r.stride, r.rows, r.vocab);
  });
}

void top_k_top_p_sampling_from_probs_cpu(TensorView out, TensorView probs, TensorView k_arr, bool has_k,
                                         int64_t top_k, TensorView p_arr, bool has_p, double top_p,
                                         TensorView seed_t, bool has_seed, int64_t seed, TensorView offset_t,
                                         bool has_offset, int64_t offset, tvm::ffi::String order) {
  const char* op = "opmux.top_k_top_p_sampling_from_probs";
  const SampleRows r = check_sample_rows(op, kDLCPU, "probs", probs, true);
  check_sample_ids(op, kDLCPU, out, probs, r);
  const bool i64 = check_sample_k_arr(op, kDLCPU, k_arr, has_k, probs, r);
  check_sample_f32_arr(op, kDLCPU, "top_p_arr", p_arr, has_p, probs, r);
  check_sample_word(op, kDLCPU, "seed_tensor", seed_t, has_seed, probs);
  check_sample_word(op, kDLCPU, "offset_tensor", offset_t, has_offset, probs);
  const std::string o(order);
  if (o != "top_k_first" && o != "joint") {
    TVM_FFI_THROW(ValueError) << op << ": filter_apply_order must be 'top_k_first' or 'joint', got '" << o << "'";
  }
  if (r.rows == 0) return;
  top_k_top_p_sample_impl(data_ptr<int32_t>(out), data_ptr<const float>(probs), r.stride, r.rows, r.vocab,
                          per_row_k(k_arr, has_k, top_k, i64), per_row_f(p_arr, has_p, top_p),
                          philox_of(seed_t, has_seed, seed, offset_t, has_offset, offset), o == "joint");
}

void min_p_sampling_from_probs_cpu(TensorView out, TensorView probs, TensorView m_arr, bool has_m, double min_p,
                                   TensorView seed_t, bool has_seed, int64_t seed, TensorView offset_t,
                                   bool has_offset, int64_t offset) {
  const char* op = "opmux.min_p_sampling_from_probs";
  const SampleRows r = check_sample_rows(op, kDLCPU, "probs", probs, true);
  check_sample_ids(op, kDLCPU, out, probs, r);
  check_sample_f32_arr(op, kDLCPU, "min_p_arr", m_arr, has_m, probs, r);
  check_sample_word(op, kDLCPU, "seed_tensor", seed_t, has_seed, probs);
  check_sample_word(op, kDLCPU, "offset_tensor", offset_t, has_offset, probs);
  if (r.rows == 0) return;
  min_p_sample_impl(data_ptr<int32_t>(out), data_ptr<const float>(probs), r.stride, r.rows, r.vocab,
                    per_row_f(m_arr, has_m, min_p), philox_of(seed_t, has_seed, seed, offset_t, has_offset, offset));
}

}  // namespace sampling_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_renorm_probs_cpu, opmux::sampling_cpu::top_k_renorm_probs_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_p_renorm_probs_cpu, opmux::sampling_cpu::top_p_renorm_probs_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_mask_logits_cpu, opmux::sampling_cpu::top_k_mask_logits_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(greedy_cpu, opmux::sampling_cpu::greedy_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_top_p_sampling_from_probs_cpu,
                              opmux::sampling_cpu::top_k_top_p_sampling_from_probs_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(min_p_sampling_from_probs_cpu, opmux::sampling_cpu::min_p_sampling_from_probs_cpu);

// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/sampling_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
