// RMSNorm, fused add + RMSNorm, their Gemma variants (weight applied as 1 + w, in float), the
// per-head qk_norm and RMSNorm / fused add + RMSNorm with static fp8 quantization for CPU
// tensors (float32 / float16 / bfloat16).
// One OpenMP task per row range; float accumulation; no temporaries beyond registers.
// The kernels come first and need no tvm-ffi; with OPMUX_CPU_KERNELS_ONLY defined only they are
// compiled (tests/native/aarch64/kernel_check.cpp calls them directly, e.g. on aarch64 under
// qemu). The argument checks and the tvm-ffi entry points follow.
#include <cmath>
#include <cstdint>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"
#include "opmux/fp8_cpu.h"

namespace opmux {
namespace layernorm_cpu {

using cpu::from_float;
using cpu::to_float;

// Measured cut-over (benchmarks/bench_cpu.py, docs/benchmarks/cpu.md): calls that move fewer
// bytes than this run on one thread (a parallel region's fork / join costs more than it saves).
constexpr int64_t kParallelMinBytes = 64 << 10;
// Rows per task of the row loops (the threads' share and the portable kernels' call).
constexpr int64_t kRowBlock = 32;
// Independent partial sums: lets the compiler vectorize the reduction without -ffast-math.
constexpr int kLanes = 16;

template <typename T>
OPMUX_CPU_INLINE float sum_squares(const T* v, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float f = to_float(v[i + l]);
      acc[l] += f * f;
    }
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (; i < n; ++i) {
    const float f = to_float(v[i]);
    sum += f * f;
  }
  return sum;
}

// The weight factor: w, or 1 + w (Gemma) computed in float.
template <bool GEMMA>
OPMUX_CPU_INLINE float weight_factor(float w) {
  return GEMMA ? 1.0f + w : w;
}

// out[i] = (x[i] * rstd) * w[i], same operation order as the torch reference. In place (out ==
// x: qk_norm) the loop names one row pointer: GCC's run-time overlap check between out and x
// would otherwise find them overlapping and run its scalar copy of the loop.
template <bool GEMMA, typename T>
OPMUX_CPU_INLINE void scale_row(T* out, const T* x, const T* w, int64_t n, float rstd) {
  if (out == x) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = from_float<T>((to_float(out[i]) * rstd) * weight_factor<GEMMA>(to_float(w[i])));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] = from_float<T>((to_float(x[i]) * rstd) * weight_factor<GEMMA>(to_float(w[i])));
}

// float16 rows through float chunks (cpu::half_chunk_to_float: F16C where the CPU has it), with
// the templates' operation order (chunks are whole multiples of kLanes), so the same bits (a NaN
// stored by F16C keeps part of its payload, as at vector level 1; still a NaN).
OPMUX_CPU_INLINE int64_t chunk_at(int64_t i0, int64_t end) {
  return end - i0 < cpu::kChunk ? end - i0 : cpu::kChunk;
}
OPMUX_CPU_INLINE float sum_squares(const cpu::half_t* v, int64_t n) {
  float acc[kLanes] = {};
  float buf[cpu::kChunk];
  const int64_t full = n - n % kLanes;
  for (int64_t i0 = 0; i0 < full; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, full);
    cpu::half_chunk_to_float(buf, v + i0, c);
    for (int64_t j = 0; j < c; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += buf[j + l] * buf[j + l];
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (int64_t i = full; i < n; ++i) {
    const float f = to_float(v[i]);
    sum += f * f;
  }
  return sum;
}
template <bool GEMMA>
OPMUX_CPU_INLINE void scale_row(cpu::half_t* out, const cpu::half_t* x, const cpu::half_t* w, int64_t n,
                                float rstd) {
  float fx[cpu::kChunk], fw[cpu::kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, n);
    cpu::half_chunk_to_float(fx, x + i0, c);
    cpu::half_chunk_to_float(fw, w + i0, c);
    for (int64_t j = 0; j < c; ++j) fx[j] = (fx[j] * rstd) * weight_factor<GEMMA>(fw[j]);
    cpu::half_chunk_from_float(out + i0, fx, c);
  }
}

OPMUX_CPU_INLINE float inv_rms(float sum, int64_t n, float eps) {
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
}

// A row's 1 / rms. Multiversioned (OPMUX_CPU_CLONES in opmux/cpu_math.h) for the fused
// quantization; rmsnorm_rows inlines the same reduction into its clone of the same target. The
// x86-64-v3 copy contracts the squares into FMAs, so the reduction must never run in a copy
// compiled for another target than rmsnorm's (the last bit could differ).
template <typename T>
OPMUX_CPU_CLONES float rstd_row(const T* x, int64_t hidden, float eps) {
  return inv_rms(sum_squares(x, hidden), hidden, eps);
}

// 16-bit rows (float16, bfloat16) of at most kChunk elements: each row is converted to float once
// for both passes (sum_squares of the float chunk sums in the order of sum_squares' 16-bit forms
// above: the same bits), the weight factors once per block of rows. float16 converts by F16C where
// the CPU has it (cpu::half_chunk_to_float), bfloat16 by its shift.
OPMUX_CPU_INLINE void chunk_to_float(float* o, const cpu::half_t* x, int64_t n) { cpu::half_chunk_to_float(o, x, n); }
OPMUX_CPU_INLINE void chunk_to_float(float* o, const cpu::bf16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = to_float(x[i]);
}
OPMUX_CPU_INLINE void chunk_from_float(cpu::half_t* o, const float* x, int64_t n) { cpu::half_chunk_from_float(o, x, n); }
OPMUX_CPU_INLINE void chunk_from_float(cpu::bf16_t* o, const float* x, int64_t n) {
#if OPMUX_CPU_F16C
  if (cpu::has_v256()) return cpu::v256::bf16_chunk_from_float(o, x, n);
#endif
  for (int64_t i = 0; i < n; ++i) o[i] = from_float<cpu::bf16_t>(x[i]);
}
template <bool GEMMA, typename T>
OPMUX_CPU_INLINE void rmsnorm_short_rows(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                                         int64_t r0, int64_t r1, int64_t hidden, float eps) {
  float fw[cpu::kChunk], fx[cpu::kChunk];
  chunk_to_float(fw, w, hidden);
  for (int64_t j = 0; j < hidden; ++j) fw[j] = weight_factor<GEMMA>(fw[j]);
  for (int64_t r = r0; r < r1; ++r) {
    chunk_to_float(fx, x + r * x_stride, hidden);
    const float rstd = inv_rms(sum_squares(static_cast<const float*>(fx), hidden), hidden, eps);
    for (int64_t j = 0; j < hidden; ++j) fx[j] = (fx[j] * rstd) * fw[j];
    chunk_from_float(out + r * out_stride, fx, hidden);
  }
}

// Rows [r0, r1) of rmsnorm; one multiversioned call per block of rows, not per row: an ifunc call
// per row (two, with the reduction's) cost more than qk_norm's 128-element rows themselves.
template <bool GEMMA, typename T>
OPMUX_CPU_CLONES void rmsnorm_rows(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                                   int64_t r0, int64_t r1, int64_t hidden, float eps) {
  if constexpr (sizeof(T) == 2) {
    if (hidden <= cpu::kChunk) return rmsnorm_short_rows<GEMMA>(out, out_stride, x, x_stride, w, r0, r1, hidden, eps);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * x_stride;
    scale_row<GEMMA>(out + r * out_stride, xr, w, hidden, inv_rms(sum_squares(xr, hidden), hidden, eps));
  }
}

// The static fp8 epilogue: q[i] = e4m3(float(round_T((x[i] * rstd) * w[i])) * inv), i.e. the
// rmsnorm output as scale_row stores it, then static_quant_fp8's q = e4m3(y * (1 / scale)).
// (x * rstd) * w is two separate multiplies in both this loop and the 16-lane scale_row, so
// the rounded value is the same bits whichever computed the row's rstd.
template <typename T>
OPMUX_CPU_CLONES void quant_row(uint8_t* q, const T* x, const T* w, int64_t n, float rstd, float inv) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = to_float(from_float<T>((to_float(x[i]) * rstd) * to_float(w[i])));
    q[i] = cpu::float_to_e4m3fn_branchless(y * inv);
  }
}

OPMUX_CPU_CLONES void quant_row(uint8_t* q, const cpu::half_t* x, const cpu::half_t* w, int64_t n, float rstd,
                               float inv) {
  float fx[cpu::kChunk], fw[cpu::kChunk];
  cpu::half_t h[cpu::kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, n);
    cpu::half_chunk_to_float(fx, x + i0, c);
    cpu::half_chunk_to_float(fw, w + i0, c);
    for (int64_t j = 0; j < c; ++j) fx[j] = (fx[j] * rstd) * fw[j];
    cpu::half_chunk_from_float(h, fx, c);  // the rmsnorm output as stored, then read back
    cpu::half_chunk_to_float(fx, h, c);
    for (int64_t j = 0; j < c; ++j) q[i0 + j] = cpu::float_to_e4m3fn_branchless(fx[j] * inv);
  }
}

#if OPMUX_CPU_VEC512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace v512 {
using namespace cpu::v512;

template <bool GEMMA>
OPMUX_V512_INLINE __m512 weight_factor(__m512 w) {
  return GEMMA ? _mm512_add_ps(_mm512_set1_ps(1.0f), w) : w;
}

// out = (x * rstd) * w over n elements (the scalar scale_row, 16 lanes at a time).
template <bool NB, bool GEMMA, typename T>
OPMUX_V512_INLINE void scale_row(T* out, const T* x, const T* w, int64_t n, float rstd) {
  const __m512 r = _mm512_set1_ps(rstd);
  int64_t i = 0;
  for (; i + kW <= n; i += kW)
    store<NB>(out + i, _mm512_mul_ps(_mm512_mul_ps(load(x + i), r), weight_factor<GEMMA>(load(w + i))));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    store<NB>(out + i, _mm512_mul_ps(_mm512_mul_ps(load(x + i, m), r), weight_factor<GEMMA>(load(w + i, m))), m);
  }
}

// The row's 1 / rms, with rmsnorm_row's reduction order (so the fused quantization below sees
// the same rstd as rmsnorm).
template <typename T>
float rstd_row(const T* x, int64_t n, float eps) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    const __m512 v0 = load(x + i), v1 = load(x + i + kW), v2 = load(x + i + 2 * kW), v3 = load(x + i + 3 * kW);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
    a2 = _mm512_fmadd_ps(v2, v2, a2);
    a3 = _mm512_fmadd_ps(v3, v3, a3);
  }
  for (; i < n; i += kW) {
    const __m512 v = load(x + i, tail_mask(n - i));
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  const float sum = hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return inv_rms(sum, n, eps);
}

template <bool NB, bool GEMMA, typename T>
void rmsnorm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  scale_row<NB, GEMMA>(out, x, w, n, rstd_row(x, n, eps));
}

// residual = round(x + residual); returns 1 / rms of the residual as stored.
template <bool NB, typename T>
float add_rstd_row(const T* x, T* res, int64_t n, float eps) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const __m512 s0 = store_rounded<NB>(res + i, _mm512_add_ps(load(x + i), load(res + i)));
    const __m512 s1 = store_rounded<NB>(res + i + kW, _mm512_add_ps(load(x + i + kW), load(res + i + kW)));
    a0 = _mm512_fmadd_ps(s0, s0, a0);
    a1 = _mm512_fmadd_ps(s1, s1, a1);
  }
  for (; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 s = store_rounded<NB>(res + i, _mm512_add_ps(load(x + i, m), load(res + i, m)), m);
    a0 = _mm512_fmadd_ps(s, s, a0);
  }
  return inv_rms(hsum(_mm512_add_ps(a0, a1)), n, eps);
}

// residual = round(x + residual), then x = rmsnorm(residual as stored).
template <bool NB, bool GEMMA, typename T>
void fused_add_row(T* x, T* res, const T* w, int64_t n, float eps) {
  scale_row<NB, GEMMA>(x, res, w, n, add_rstd_row<NB>(x, res, n, eps));
}

// The static fp8 epilogue (the scalar quant_row, 16 lanes at a time, the same bits): y =
// round_T((x * rstd) * w), q = e4m3(y * inv). The portable loop does not vectorize for float16
// (its bit-manipulated rounding), where it was 8x slower than torch.compile at T = 4096.
template <bool NB, typename T>
void quant_row(uint8_t* q, const T* x, const T* w, int64_t n, float rstd, float inv) {
  const __m512 r = _mm512_set1_ps(rstd), s = _mm512_set1_ps(inv);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m512 y = round_to<NB>(x, _mm512_mul_ps(_mm512_mul_ps(load(x + i), r), load(w + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), to_e4m3fn(_mm512_mul_ps(y, s)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 y = round_to<NB>(x, _mm512_mul_ps(_mm512_mul_ps(load(x + i, m), r), load(w + i, m)));
    _mm_mask_storeu_epi8(q + i, m, to_e4m3fn(_mm512_mul_ps(y, s)));
  }
}

}  // namespace v512
#pragma GCC pop_options
#endif  // OPMUX_CPU_VEC512

template <bool GEMMA, typename T>
void rmsnorm_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                  int64_t rows, int64_t hidden, float eps) {
  const int nt = cpu::threads_for(rows * hidden * 2 * static_cast<int64_t>(sizeof(T)), kParallelMinBytes, rows);
  const int level = cpu::vec_level();
  (void)nt, (void)level;
  if (out != x && out_stride == hidden)  // a new output (not qk_norm's in-place rows)
    cpu::advise_huge_pages(out, rows * hidden * static_cast<int64_t>(sizeof(T)));
  // blocks of at most kRowBlock rows, and at least one block per thread (32 rows on 2 threads: 16 each)
  const int64_t share = (rows + nt - 1) / nt, blk = share < kRowBlock ? (share > 0 ? share : 1) : kRowBlock;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t b = 0; b < rows; b += blk) {
    const int64_t e = rows - b < blk ? rows : b + blk;
#if OPMUX_CPU_VEC512
    if (level >= 1) {
      for (int64_t r = b; r < e; ++r) {
        T* o = out + r * out_stride;
        const T* xr = x + r * x_stride;
        if (level == 2) {
          v512::rmsnorm_row<true, GEMMA, T>(o, xr, w, hidden, eps);
        } else {
          v512::rmsnorm_row<false, GEMMA, T>(o, xr, w, hidden, eps);
        }
      }
      continue;
    }
#endif
    rmsnorm_rows<GEMMA>(out, out_stride, x, x_stride, w, b, e, hidden, eps);
  }
}

// residual = round(x + residual) over one row; returns 1 / rms of the residual as stored.
// Portable (multiversioned).
template <typename T>
OPMUX_CPU_CLONES float add_rstd_row(const T* xr, T* rr, int64_t hidden, float eps) {
  // Pass 1: residual = round(x + residual); the sum of squares uses the rounded value, so
  // x below is exactly rmsnorm(residual as stored).
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= hidden; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float f = cpu::store_rounded(rr + i + l, to_float(xr[i + l]) + to_float(rr[i + l]));
      acc[l] += f * f;
    }
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (; i < hidden; ++i) {
    const float f = cpu::store_rounded(rr + i, to_float(xr[i]) + to_float(rr[i]));
    sum += f * f;
  }
  return inv_rms(sum, hidden, eps);
}

OPMUX_CPU_CLONES float add_rstd_row(const cpu::half_t* xr, cpu::half_t* rr, int64_t hidden, float eps) {
  float acc[kLanes] = {};
  float fx[cpu::kChunk], fr[cpu::kChunk];
  const int64_t full = hidden - hidden % kLanes;
  for (int64_t i0 = 0; i0 < full; i0 += cpu::kChunk) {
    const int64_t c = chunk_at(i0, full);
    cpu::half_chunk_to_float(fx, xr + i0, c);
    cpu::half_chunk_to_float(fr, rr + i0, c);
    for (int64_t j = 0; j < c; ++j) fr[j] = fx[j] + fr[j];
    cpu::half_chunk_from_float(rr + i0, fr, c);
    cpu::half_chunk_to_float(fr, rr + i0, c);  // the residual as stored
    for (int64_t j = 0; j < c; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += fr[j + l] * fr[j + l];
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (int64_t i = full; i < hidden; ++i) {
    const float f = cpu::store_rounded(rr + i, to_float(xr[i]) + to_float(rr[i]));
    sum += f * f;
  }
  return inv_rms(sum, hidden, eps);
}

// One row of fused add + RMSNorm, portable: pass 2 re-reads the row, hot in L1/L2. Multiversioned
// too (scale_row is inlined here: a plain function would run it as baseline SSE2).
template <bool GEMMA, typename T>
OPMUX_CPU_CLONES void fused_add_row(T* xr, T* rr, const T* w, int64_t hidden, float eps) {
  scale_row<GEMMA>(xr, rr, w, hidden, add_rstd_row(xr, rr, hidden, eps));
}

template <bool GEMMA, typename T>
void fused_add_rmsnorm_impl(T* x, int64_t x_stride, T* res, int64_t res_stride, const T* w,
                            int64_t rows, int64_t hidden, float eps) {
  const int nt = cpu::threads_for(rows * hidden * 4 * static_cast<int64_t>(sizeof(T)), kParallelMinBytes, rows);
  const int level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * x_stride;
    T* rr = res + r * res_stride;
#if OPMUX_CPU_VEC512
    if (level == 2) {
      v512::fused_add_row<true, GEMMA, T>(xr, rr, w, hidden, eps);
      continue;
    }
    if (level == 1) {
      v512::fused_add_row<false, GEMMA, T>(xr, rr, w, hidden, eps);
      continue;
    }
#endif
    fused_add_row<GEMMA, T>(xr, rr, w, hidden, eps);
  }
}

// q [rows, hidden] fp8 bytes = e4m3(rmsnorm(x) * inv), rmsnorm as rmsnorm_impl rounds it to T.
// With `res` (the fused add): res = round(x + res) first, then the rmsnorm of res as stored
// (x is only read). Each row's rstd comes from the same reduction as rmsnorm_impl's /
// fused_add_rmsnorm_impl's at this vector level, so q is bit-equal to the unfused pair.
template <typename T>
void rmsnorm_quant_impl(uint8_t* q, int64_t q_stride, const T* x, int64_t x_stride, T* res,
                        int64_t res_stride, const T* w, int64_t rows, int64_t hidden, float eps,
                        float inv) {
  const int64_t per_row = (res ? 3 : 1) * static_cast<int64_t>(sizeof(T)) + 1;
  const int nt = cpu::threads_for(rows * hidden * per_row, kParallelMinBytes, rows);
  const int level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    T* rr = res ? res + r * res_stride : nullptr;
    float rstd;
#if OPMUX_CPU_VEC512
    if (level >= 1) {
      if (rr == nullptr) {
        rstd = v512::rstd_row(xr, hidden, eps);
      } else {
        rstd = level == 2 ? v512::add_rstd_row<true>(xr, rr, hidden, eps)
                          : v512::add_rstd_row<false>(xr, rr, hidden, eps);
      }
      if (level == 2) {
        v512::quant_row<true>(q + r * q_stride, rr ? rr : xr, w, hidden, rstd, inv);
      } else {
        v512::quant_row<false>(q + r * q_stride, rr ? rr : xr, w, hidden, rstd, inv);
      }
      continue;
    }
#endif
    {
      rstd = rr == nullptr ? rstd_row(xr, hidden, eps) : add_rstd_row(xr, rr, hidden, eps);
    }
    quant_row(q + r * q_stride, rr ? rr : xr, w, hidden, rstd, inv);
  }
}

// q [Tq, Hq, D] and k [Tk, Hk, D] in place. Heads of a token are D apart in the usual layout,
// which makes each tensor plain rows of stride D, and so are one token's heads whatever the
// token stride (a decode step: one pass, not one per head); otherwise one pass per head over the
// tokens.
template <typename T>
void qk_norm_heads(T* x, const cpu::HeadLayout& h, const T* w, int64_t d, float eps) {
  if (h.tokens == 0 || h.heads == 0) return;
  if (h.heads == 1 || h.tokens == 1 || h.token_stride == h.heads * h.head_stride) {
    const int64_t stride = h.heads == 1 ? h.token_stride : h.head_stride;
    rmsnorm_impl<false, T>(x, stride, x, stride, w, h.tokens * h.heads, d, eps);
    return;
  }
  for (int64_t head = 0; head < h.heads; ++head) {
    T* xh = x + head * h.head_stride;
    rmsnorm_impl<false, T>(xh, h.token_stride, xh, h.token_stride, w, h.tokens, d, eps);
  }
}

}  // namespace layernorm_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/checks.h"
#include "opmux/head_checks.h"
#include "opmux/contracts/layernorm.h"
#include "opmux/quant_checks.h"

namespace opmux {
namespace layernorm_cpu {

template <bool GEMMA>
void run_rmsnorm(const char* op, TensorView out, TensorView x, TensorView weight, double eps) {
  RowsArgs a = check_norm_args(op, kDLCPU, "out", out, "x", x, weight, eps);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t out_stride = row_stride(op, "out", out), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    rmsnorm_impl<GEMMA, scalar_t>(data_ptr<scalar_t>(out), out_stride,
                                  data_ptr<const scalar_t>(x), x_stride,
                                  data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                                  static_cast<float>(eps));
  });
}

template <bool GEMMA>
void run_fused_add(const char* op, TensorView x, TensorView residual, TensorView weight,
                   double eps) {
  RowsArgs a = check_norm_args(op, kDLCPU, "x", x, "residual", residual, weight, eps);
  if (a.rows == 0 || a.hidden == 0) return;
  if (data_ptr<char>(x) == data_ptr<char>(residual)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (both are "
                              << "updated in place)";
  }
  const int64_t x_stride = row_stride(op, "x", x), r_stride = row_stride(op, "residual", residual);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    fused_add_rmsnorm_impl<GEMMA, scalar_t>(data_ptr<scalar_t>(x), x_stride,
                                            data_ptr<scalar_t>(residual), r_stride,
                                            data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                                            static_cast<float>(eps));
  });
}

void rmsnorm_cpu(TensorView out, TensorView x, TensorView weight, double eps) {
  run_rmsnorm<false>("opmux.rmsnorm", out, x, weight, eps);
}
void fused_add_rmsnorm_cpu(TensorView x, TensorView residual, TensorView weight, double eps) {
  run_fused_add<false>("opmux.fused_add_rmsnorm", x, residual, weight, eps);
}
void gemma_rmsnorm_cpu(TensorView out, TensorView x, TensorView weight, double eps) {
  run_rmsnorm<true>("opmux.gemma_rmsnorm", out, x, weight, eps);
}
void gemma_fused_add_rmsnorm_cpu(TensorView x, TensorView residual, TensorView weight,
                                 double eps) {
  run_fused_add<true>("opmux.gemma_fused_add_rmsnorm", x, residual, weight, eps);
}

// q [rows, hidden] fp8 bytes, x [rows, hidden], (residual like x,) weight [hidden], scale: one
// float32. Returns 1 / scale (IEEE, as static_quant_fp8).
float check_quant(const char* op, TensorView q, TensorView x, TensorView scale) {
  QuantArgs qa = check_quant_args(op, q, x);
  (void)qa;
  check_device(op, kDLCPU, {{"q", &q}, {"x", &x}, {"scale", &scale}});
  check_float32(op, "scale", scale);
  check_ndim(op, "scale", scale, 1);
  check_size(op, "scale", scale, 0, 1, "one element (a per-tensor scale)");
  return 1.0f / *data_ptr<const float>(scale);
}

void rmsnorm_static_quant_fp8_cpu(TensorView q, TensorView x, TensorView weight, TensorView scale,
                                  double eps) {
  const char* op = "opmux.rmsnorm_static_quant_fp8";
  RowsArgs a = check_norm_args(op, kDLCPU, "x", x, "x", x, weight, eps);
  const float inv = check_quant(op, q, x, scale);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t q_stride = row_stride(op, "q", q), x_stride = row_stride(op, "x", x);
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    rmsnorm_quant_impl<scalar_t>(data_ptr<uint8_t>(q), q_stride, data_ptr<const scalar_t>(x), x_stride,
                                 nullptr, 0, data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                                 static_cast<float>(eps), inv);
  });
}

void fused_add_rmsnorm_static_quant_fp8_cpu(TensorView q, TensorView x, TensorView residual,
                                            TensorView weight, TensorView scale, double eps) {
  const char* op = "opmux.fused_add_rmsnorm_static_quant_fp8";
  RowsArgs a = check_norm_args(op, kDLCPU, "residual", residual, "x", x, weight, eps);
  const float inv = check_quant(op, q, x, scale);
  if (a.rows == 0 || a.hidden == 0) return;
  const int64_t q_stride = row_stride(op, "q", q), x_stride = row_stride(op, "x", x),
                r_stride = row_stride(op, "residual", residual);
  if (data_ptr<char>(x) == data_ptr<char>(residual)) {
    TVM_FFI_THROW(ValueError) << op << ": x and residual must be different tensors (residual is "
                              << "updated in place, x is read)";
  }
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    rmsnorm_quant_impl<scalar_t>(data_ptr<uint8_t>(q), q_stride, data_ptr<const scalar_t>(x), x_stride,
                                 data_ptr<scalar_t>(residual), r_stride,
                                 data_ptr<const scalar_t>(weight), a.rows, a.hidden,
                                 static_cast<float>(eps), inv);
  });
}

inline cpu::HeadLayout layout(const Heads& h) {
  return {h.tokens, h.heads, h.token_stride, h.head_stride};
}

void qk_norm_cpu(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight,
                 double eps) {
  QkNormArgs a = check_qk_norm_args("opmux.qk_norm", kDLCPU, q, k, q_weight, k_weight, eps);
  if (a.head_dim == 0) return;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    const float e = static_cast<float>(eps);
    qk_norm_heads(data_ptr<scalar_t>(q), layout(a.q), data_ptr<const scalar_t>(q_weight),
                  a.head_dim, e);
    qk_norm_heads(data_ptr<scalar_t>(k), layout(a.k), data_ptr<const scalar_t>(k_weight),
                  a.head_dim, e);
  });
}

}  // namespace layernorm_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_cpu, opmux::layernorm_cpu::rmsnorm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm_cpu, opmux::layernorm_cpu::fused_add_rmsnorm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_rmsnorm_cpu, opmux::layernorm_cpu::gemma_rmsnorm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_fused_add_rmsnorm_cpu,
                              opmux::layernorm_cpu::gemma_fused_add_rmsnorm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_norm_cpu, opmux::layernorm_cpu::qk_norm_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm_static_quant_fp8_cpu,
                              opmux::layernorm_cpu::rmsnorm_static_quant_fp8_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm_static_quant_fp8_cpu,
                              opmux::layernorm_cpu::fused_add_rmsnorm_static_quant_fp8_cpu);
// the serving lanes generated from the contracts (tools/gen_contracts.py)
#include "opmux/contracts/layernorm_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
