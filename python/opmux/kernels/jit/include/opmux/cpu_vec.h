// AVX-512 building blocks for the CPU units, F16C float16 chunk conversions and AVX2 building
// blocks for CPUs without AVX-512, and the thread count of a call.
//
// The portable kernels (plain loops the compiler vectorizes, multiversioned by OPMUX_CPU_CLONES)
// run everywhere. Where GCC targets x86-64 Linux, each unit also carries explicit AVX-512 row
// kernels, compiled for AVX-512 F/BW/VL/DQ inside `#pragma GCC target` regions (no -march flag:
// the library stays loadable on any x86-64) and picked at run time by vec_level():
//   0  the portable kernels (no AVX-512, another compiler or architecture, OPMUX_CPU_NO_CLONES);
//      on an AVX2 CPU their x86-64-v3 / AVX2 clones, with float16 rows converted by F16C in
//      chunks (half_chunk_to_float below), and where it has AVX2 + FMA + F16C the few explicit
//      AVX2 rows of namespace v256 (has_v256())
//   1  AVX-512: float16 <-> float32 by vcvtph2ps / vcvtps2ph, bfloat16 stores rounded in integer
//      registers (round to nearest even, NaN kept quiet)
//   2  level 1 + AVX512_BF16: a bfloat16 store is one vcvtneps2bf16 (a lane whose input is an fp32
//      subnormal, which that instruction flushes to zero, takes the integer rounding instead, so
//      both levels store the same bits)
// -DOPMUX_CPU_VEC_MAX=n caps the level at build time (tests build level 1 on a BF16 machine).
// AVX512_FP16 arithmetic would not pay here: every kernel computes in fp32 (the references do),
// and the fp16 conversions are AVX-512F instructions already.
#pragma once

#include <cstdint>

#include "opmux/cpu_types.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10 && defined(__x86_64__) && \
    defined(__linux__) && !defined(OPMUX_CPU_NO_CLONES)
#define OPMUX_CPU_VEC512 1
// GCC 12 warns (-Wuninitialized) inside its own AVX-512 intrinsics where they start from
// _mm512_undefined_*() (GCC bug 105593, fixed in 13); the warning points into the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define OPMUX_CPU_VEC512 0
#endif

#ifndef OPMUX_CPU_VEC_MAX
#define OPMUX_CPU_VEC_MAX 2
#endif

namespace opmux {
namespace cpu {

// The vector level of this CPU (see above); detected once.
inline int vec_level() {
#if OPMUX_CPU_VEC512
  static const int level = [] {
    __builtin_cpu_init();
    int l = 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      l = __builtin_cpu_supports("avx512bf16") ? 2 : 1;
    return l < OPMUX_CPU_VEC_MAX ? l : OPMUX_CPU_VEC_MAX;
  }();
  return level;
#else
  return 0;
#endif
}

// Threads for one call that touches `bytes` bytes: one below `min_bytes` (the measured cut-over
// of that kernel: below it a parallel region's fork / join costs more than it saves), else the
// OpenMP runtime's thread count. In a torch process that is torch's intra-op pool size:
// libopmux and libtorch resolve the same libgomp.so.1, and torch.set_num_threads(n) sets it
// (omp_set_num_threads). Never more threads than `items` (rows, tokens) to share out.
inline int threads_for(int64_t bytes, int64_t min_bytes, int64_t items) {
#ifdef _OPENMP
  if (bytes < min_bytes || items < 2) return 1;
  const int n = omp_get_max_threads();
  return static_cast<int64_t>(n) < items ? n : static_cast<int>(items);
#else
  (void)bytes, (void)min_bytes, (void)items;
  return 1;
#endif
}

// A new output of this many bytes or more gets the transparent-huge-page hint below.
constexpr int64_t kHugePageMinBytes = 8 << 20;

// Hint that the 2 MiB-aligned pages inside [p, p + bytes), about to be written in full, be backed
// by transparent huge pages (MADV_HUGEPAGE). A large new output is fresh memory: torch's CPU
// allocator gets it from glibc, which maps allocations above its mmap threshold (at most 32 MiB)
// anew each time, so writing it page-faults once per 4 KiB page, and where the kernel's THP mode
// is "madvise" (the usual default) it stays 4 KiB pages unless asked. With the hint it faults once
// per 2 MiB: a fresh 128 MiB buffer is written in about half the time on the benchmark machine
// (docs/benchmarks/cpu.md). Only a hint: memory that is already mapped keeps its contents, and a
// failure (no THP, not Linux) changes nothing. One syscall, so only for outputs of at least
// kHugePageMinBytes (a millisecond or more of writing).
inline void advise_huge_pages(const void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugePageMinBytes) return;
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

// -- float16 rows on a CPU without AVX-512 (vec_level() 0) ------------------------------------
// The portable conversions (cpu_types.h) vectorize but cost ~10 integer operations a value; where
// the CPU has F16C (every AVX2 x86-64) the portable kernels convert their float16 rows in chunks
// through a float buffer with vcvtph2ps / vcvtps2ph instead: the same values (both round to
// nearest even; a NaN stays a NaN, its payload aside). Not under OPMUX_CPU_NO_CLONES (the
// baseline build the tests force), nor on other compilers or architectures, nor before GCC 11
// (whose __builtin_cpu_supports knows no "f16c"): there the portable loops run.
#if OPMUX_CPU_VEC512 && __GNUC__ >= 11
#define OPMUX_CPU_F16C 1
#else
#define OPMUX_CPU_F16C 0
#endif
#if OPMUX_CPU_F16C
__attribute__((target("avx,f16c"))) inline void f16c_to_float(float* o, const half_t* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) o[i] = _cvtsh_ss(x[i].bits);
}
__attribute__((target("avx,f16c"))) inline void f16c_from_float(half_t* o, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) o[i].bits = static_cast<uint16_t>(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}
#endif

// Whether the float16 chunk conversions below use F16C; detected once.
inline bool has_f16c() {
#if OPMUX_CPU_F16C
  static const bool yes = [] {
    __builtin_cpu_init();  // "avx" too: it checks that the OS saves the YMM registers
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return yes;
#else
  return false;
#endif
}

// o[0, n) = x[0, n) as float / rounded to float16 (F16C where has_f16c(), else the portable loop).
inline void half_chunk_to_float(float* o, const half_t* x, int64_t n) {
#if OPMUX_CPU_F16C
  if (has_f16c()) return f16c_to_float(o, x, n);
#endif
  for (int64_t i = 0; i < n; ++i) o[i] = half_to_float(x[i].bits);
}
inline void half_chunk_from_float(half_t* o, const float* x, int64_t n) {
#if OPMUX_CPU_F16C
  if (has_f16c()) return f16c_from_float(o, x, n);
#endif
  for (int64_t i = 0; i < n; ++i) o[i].bits = float_to_half(x[i]);
}

// Whether this CPU runs the AVX2 row kernels below (AVX2 + FMA + F16C: every x86-64-v3 CPU);
// detected once. Only where the portable loops measured short of torch.compile have one: gelu
// (bound by the latency of its chain: the portable loop keeps one vector in flight, the AVX2 row
// interleaves four), rope's 16-bit NeoX heads and the short norm rows' bfloat16 store (per-call
// conversions through float buffers).
inline bool has_v256() {
#if OPMUX_CPU_F16C
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace cpu
}  // namespace opmux

#if OPMUX_CPU_F16C
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace opmux {
namespace cpu {
namespace v256 {

#define OPMUX_V256_INLINE inline __attribute__((always_inline))

constexpr int kW = 8;  // fp32 lanes

// 8 elements <-> fp32 lanes (whole vectors only: the callers finish a row's tail portably).
OPMUX_V256_INLINE __m256 load(const float* p) { return _mm256_loadu_ps(p); }
OPMUX_V256_INLINE __m256 load(const half_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
OPMUX_V256_INLINE __m256 load(const bf16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
OPMUX_V256_INLINE void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
OPMUX_V256_INLINE void store(half_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
// bfloat16: cpu::float_to_bf16 on 8 lanes (round to nearest even, NaN -> quiet NaN), the same bits.
OPMUX_V256_INLINE void store(bf16_t* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i b = _mm256_blendv_epi8(r, q, nan);  // 8 x 32-bit lanes, each < 2^16
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// 2^y for finite y >= -200 or NaN: cpu::exp2_f on 8 lanes (the same reduction, Estrin order and
// two-factor scaling, so subnormal results and 0 come out as there).
OPMUX_V256_INLINE __m256 exp2_8(__m256 y) {
  const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(y, n);
  const __m256 f2 = _mm256_mul_ps(f, f);
  const __m256 e01 = _mm256_fmadd_ps(_mm256_set1_ps(6.931472028550421e-1f), f, _mm256_set1_ps(1.0f));
  const __m256 e23 = _mm256_fmadd_ps(_mm256_set1_ps(5.550332471162809e-2f), f, _mm256_set1_ps(2.402264791363012e-1f));
  const __m256 e45 = _mm256_fmadd_ps(_mm256_set1_ps(1.339887440266574e-3f), f, _mm256_set1_ps(9.618437357674640e-3f));
  const __m256 e46 = _mm256_fmadd_ps(_mm256_set1_ps(1.535336188319500e-4f), f2, e45);
  const __m256 q = _mm256_fmadd_ps(_mm256_fmadd_ps(e46, f2, e23), f2, e01);
  const __m256i ni = _mm256_cvtps_epi32(n);  // (a NaN lane: garbage exponent, q is NaN anyway)
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(q, s1), s2);
}

// o[0, n) = x[0, n) rounded to bfloat16 (cpu::float_to_bf16's bits), 8 lanes at a time.
inline void bf16_chunk_from_float(bf16_t* o, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) store(o + i, _mm256_loadu_ps(x + i));
  for (; i < n; ++i) o[i].bits = float_to_bf16(x[i]);
}

}  // namespace v256
}  // namespace cpu
}  // namespace opmux

#pragma GCC pop_options
#endif  // OPMUX_CPU_F16C

#if OPMUX_CPU_VEC512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace opmux {
namespace cpu {
namespace v512 {

#define OPMUX_V512_INLINE inline __attribute__((always_inline))

constexpr int kW = 16;  // fp32 lanes

OPMUX_V512_INLINE __mmask16 tail_mask(int64_t n) {
  return n >= kW ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// 16 elements -> fp32 lanes (masked: lanes outside m read as 0, nothing outside is touched).
OPMUX_V512_INLINE __m512 load(const float* p) { return _mm512_loadu_ps(p); }
OPMUX_V512_INLINE __m512 load(const half_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
OPMUX_V512_INLINE __m512 load(const bf16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
OPMUX_V512_INLINE __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
OPMUX_V512_INLINE __m512 load(const half_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
OPMUX_V512_INLINE __m512 load(const bf16_t* p, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// fp32 -> bfloat16 bits, round to nearest even, NaN -> quiet NaN (cpu::float_to_bf16, 16 lanes).
OPMUX_V512_INLINE __m256i bf16_round(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
}

// The same bits by vcvtneps2bf16 (AVX512_BF16; encoded here by inline asm, so this function
// needs no avx512bf16 target and is only reached at vec_level() 2). The instruction flushes fp32
// subnormal inputs to zero; such a vector takes bf16_round.
OPMUX_V512_INLINE __m256i bf16_native(__m512 v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) != 0, 0)) return bf16_round(v);  // 0x20: denormal
  __m256i r;
  __asm__("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
  return r;
}

// fp32 lanes -> 16 elements (masked: only lanes in m are written). NB: bfloat16 by vcvtneps2bf16.
template <bool NB>
OPMUX_V512_INLINE void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
template <bool NB>
OPMUX_V512_INLINE void store(half_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
template <bool NB>
OPMUX_V512_INLINE void store(bf16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), NB ? bf16_native(v) : bf16_round(v));
}
template <bool NB>
OPMUX_V512_INLINE void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
template <bool NB>
OPMUX_V512_INLINE void store(half_t* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
template <bool NB>
OPMUX_V512_INLINE void store(bf16_t* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, NB ? bf16_native(v) : bf16_round(v));
}

// Stores v rounded to T and returns the value stored (as a load of it would give).
template <bool NB>
OPMUX_V512_INLINE __m512 store_rounded(float* p, __m512 v, __mmask16 m = 0xFFFF) {
  _mm512_mask_storeu_ps(p, m, v);
  return v;
}
template <bool NB>
OPMUX_V512_INLINE __m512 store_rounded(half_t* p, __m512 v, __mmask16 m = 0xFFFF) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  _mm256_mask_storeu_epi16(p, m, h);
  return _mm512_cvtph_ps(h);
}
template <bool NB>
OPMUX_V512_INLINE __m512 store_rounded(bf16_t* p, __m512 v, __mmask16 m = 0xFFFF) {
  const __m256i h = NB ? bf16_native(v) : bf16_round(v);
  _mm256_mask_storeu_epi16(p, m, h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e^x: exp_f of cpu_math.h (Cephes reduction, degree-6 polynomial) with 2^n by vscalefps, which
// handles overflow (inf), underflow (subnormals, then 0) and NaN without the exponent split.
OPMUX_V512_INLINE __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);  // NaN passes (the second operand is returned)
  x = _mm512_min_ps(_mm512_set1_ps(150.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 2^y for finite y or NaN (an infinite y gives NaN: callers clamp where it can occur). y = n + f,
// n = round(y), f in [-0.5, 0.5] exact (no Cody-Waite split: y is already in log2 units, so the
// reduction is one subtraction), 2^f by Cephes' exp2f polynomial (relative error ~1.5e-7), 2^n by
// vscalefps (overflow -> inf, underflow -> subnormals, then 0). With y = x log2(e) this is e^x
// with the relative error of rounding y, ~|x| 6e-8: below 1e-6 wherever e^x is a normal float
// above 1e-7 (inside every fp32 tolerance) and ~12 vector operations against exp16's 15 plus two
// clamps, for the gated activations, where the exponential is most of the work.
OPMUX_V512_INLINE __m512 exp2_16(__m512 y) {
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 q = _mm512_set1_ps(1.535336188319500e-4f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.339887440266574e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.618437357674640e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.550332471162809e-2f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.402264791363012e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.931472028550421e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(q, n);
}

// 1 / d for d >= 1 (or +inf, or NaN): vrcp14ps and one Newton step (~2^-27 relative); 1/inf = 0.
OPMUX_V512_INLINE __m512 recip_ge1(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  const __m512 e = _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f));
  const __m512 s = _mm512_fmadd_ps(r, e, r);
  const __mmask16 inf = _mm512_cmp_ps_mask(d, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(s, inf, _mm512_setzero_ps());
}

// Sum of the 16 lanes.
OPMUX_V512_INLINE float hsum(__m512 v) {
  // (not _mm512_reduce_add_ps: GCC 12 warns inside it, -Wuninitialized on _mm256_undefined_pd)
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

// cpu::float_to_e4m3fn_branchless (opmux/fp8_cpu.h) on 16 lanes (bit-identical), the codes in the
// low bytes.
OPMUX_V512_INLINE __m128i to_e4m3fn(__m512 f) {
  const __m512i w = _mm512_castps_si512(f);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(w, 24), _mm512_set1_epi32(0x80));
  const __m512i u = _mm512_and_si512(w, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i k141 = _mm512_set1_epi32(141 << 23);
  const __m512i sub = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(u), _mm512_castsi512_ps(k141))), k141);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
  const __m512i nrm = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(static_cast<int32_t>((7u - 127u) << 23) + 0x7FFFF)), odd), 20);
  __m512i v = _mm512_mask_mov_epi32(nrm, _mm512_cmplt_epu32_mask(u, _mm512_set1_epi32(121 << 23)), sub);
  v = _mm512_mask_mov_epi32(v, _mm512_cmpge_epu32_mask(u, _mm512_set1_epi32(0x43E00000)), _mm512_set1_epi32(0x7E));
  v = _mm512_mask_mov_epi32(v, _mm512_cmpgt_epu32_mask(u, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7F));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(sign, _mm512_and_si512(v, _mm512_set1_epi32(0xFF))));
}

// v rounded to T and back to fp32 lanes: the value a store of v and a load would give.
template <bool NB>
OPMUX_V512_INLINE __m512 round_to(const float*, __m512 v) { return v; }
template <bool NB>
OPMUX_V512_INLINE __m512 round_to(const half_t*, __m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
template <bool NB>
OPMUX_V512_INLINE __m512 round_to(const bf16_t*, __m512 v) {
  const __m256i h = NB ? bf16_native(v) : bf16_round(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace v512
}  // namespace cpu
}  // namespace opmux

#pragma GCC pop_options
#endif  // OPMUX_CPU_VEC512
