// Block-scaled fp8 (e4m3fn) GEMM for CPU tensors: gemm.w8a8_block_fp8_matmul.
//   w8a8_block_fp8_matmul_cpu(out, a, b, a_scale, b_scale)
//     a [M, K] fp8, b [N, K] fp8 (last dims dense, any row strides), a_scale float32
//     [M, ceil(K / 128)] and b_scale float32 [ceil(N / 128), ceil(K / 128)] (any strides),
//     out [M, N] float32 / float16 / bfloat16 (last dim dense):
//     out[m, n] = sum_kb (dot_kb(a[m], b[n]) * a_scale[m, kb]) * b_scale[n / 128, kb]
//   with each 128-wide K block's dot product in fp32 and one rounding to out's dtype at the end
//   (round to nearest even; NaN propagates), as the op's float32 reference.
// Two kernels:
//   * the packed GEMM (any M): per item of (128 columns of b) x (up to kMc rows of a), b's 128 rows
//     are decoded to float once for the whole K ([kb][16-column panel][k][16] layout; AVX2: 8 x 8
//     bytes decoded in registers and transposed) and kept while the thread's next items share
//     them, a's rows decoded per K block; a 6 x 16 register tile (12 AVX2 FMA accumulators, b
//     loaded, a broadcast) per K block, scaled into a float tile of the item; 128 columns = one
//     b_scale block, so b's scale is one number per K block.
//   * the skinny GEMM (M <= 4, decode; AVX2 only): no packing; each b row is decoded 8 bytes at a
//     time in registers (bit operations, exact) and used by the M rows of a (decoded once), one
//     fp32 dot product per (row, column, K block).
// Items are shared out by OpenMP (columns for decode, columns x row tiles otherwise), so both
// cases use every thread. e4m3fn decodes exactly (a 256-entry table, or the bit operations of
// v256::e4m3x8; no subnormal fp32 arithmetic, so no DAZ dependence).
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then the
// argument checks and the tvm-ffi entry point.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"

namespace opmux {
namespace gemm_cpu {

using cpu::from_float;

constexpr int64_t kBlock = 128;  // the recipe's block: 1 x 128 activation, 128 x 128 weight scales
constexpr int kMr = 6;           // rows of a register tile
constexpr int kNr = 16;          // columns of a register tile (two 8-lane vectors)
constexpr int64_t kNc = kBlock;  // columns of an item: one b_scale block
constexpr int64_t kMc = 192;     // rows of an item (a multiple of kMr)
constexpr int kSkinnyRows = 4;   // M up to this runs the skinny kernel (where it exists)
constexpr int64_t kSkinnyCols = 32;  // columns of a skinny item
// Calls of fewer multiply-adds than this run on one thread (a parallel region's fork / join
// costs more than it saves below a few tens of microseconds of work).
constexpr int64_t kParallelMinMacs = 1 << 18;

// e4m3fn byte -> float, exact: S.EEEE.MMM, bias 7, subnormals m * 2^-9, S.1111.111 NaN (no inf).
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t mag = b & 0x7Fu, e = mag >> 3, m = mag & 7u, sign = (b & 0x80u) << 24;
      uint32_t bits;
      if (mag == 0x7Fu) {
        bits = 0x7FC00000u;
      } else if (e == 0) {
        bits = cpu::f32_to_bits(static_cast<float>(m) * 0x1.0p-9f);
      } else {
        bits = ((e + 120u) << 23) | (m << 20);
      }
      v[b] = cpu::bits_to_f32(bits | sign);
    }
  }
};
inline const float* e4m3_table() {
  static const E4m3Table t;
  return t.v;
}

// What the kernels read: row-major bytes with row strides (elements = bytes), scales by strides.
struct Problem {
  int64_t M, N, K, kt;  // kt = ceil(K / 128)
  const uint8_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const float* sa;
  int64_t sa_m, sa_k;
  const float* sb;
  int64_t sb_n, sb_k;
  int64_t ldo;
};

OPMUX_CPU_INLINE int64_t block_len(const Problem& p, int64_t kb) {
  return std::min(kBlock, p.K - kb * kBlock);
}

// -- store a float row to out ---------------------------------------------------------------------
inline void store_row(float* o, const float* c, int64_t n) { std::memcpy(o, c, n * sizeof(float)); }
inline void store_row(cpu::half_t* o, const float* c, int64_t n) { cpu::half_chunk_from_float(o, c, n); }
inline void store_row(cpu::bf16_t* o, const float* c, int64_t n) {
#if OPMUX_CPU_F16C
  if (cpu::has_v256()) return cpu::v256::bf16_chunk_from_float(o, c, n);
#endif
  for (int64_t i = 0; i < n; ++i) o[i].bits = cpu::float_to_bf16(c[i]);
}

// -- packing (portable) ---------------------------------------------------------------------------
// b's rows [n0, n0 + nc) for the whole K as float: for each K block kb, for each 16-column panel
// p, kc x 16 floats (k-major; columns past nc are 0) at bp + (kb * panels + p) * 128 * 16.
inline void pack_b(float* bp, const Problem& p, int64_t n0, int64_t nc) {
  const float* lut = e4m3_table();
  const int64_t panels = (nc + kNr - 1) / kNr;
  for (int64_t kb = 0; kb < p.kt; ++kb) {
    const int64_t k0 = kb * kBlock, kc = block_len(p, kb);
    for (int64_t pn = 0; pn < panels; ++pn) {
      float* dst = bp + (kb * panels + pn) * kBlock * kNr;
      for (int c = 0; c < kNr; ++c) {
        const int64_t n = pn * kNr + c;
        if (n >= nc) {
          for (int64_t k = 0; k < kc; ++k) dst[k * kNr + c] = 0.0f;
          continue;
        }
        const uint8_t* src = p.b + (n0 + n) * p.ldb + k0;
        for (int64_t k = 0; k < kc; ++k) dst[k * kNr + c] = lut[src[k]];
      }
    }
  }
}

// a's rows [m0, m0 + mr) (mr <= kMr), columns [k0, k0 + kc) as float, row-major with stride 128,
// rows past mr 0.
OPMUX_CPU_CLONES void decode_a_rows(float* ap, const uint8_t* a, int64_t lda, int64_t mr, int64_t kc) {
  const float* lut = e4m3_table();
  for (int64_t r = 0; r < kMr; ++r) {
    float* d = ap + r * kBlock;
    if (r >= mr) {
      for (int64_t k = 0; k < kc; ++k) d[k] = 0.0f;
      continue;
    }
    const uint8_t* s = a + r * lda;
    for (int64_t k = 0; k < kc; ++k) d[k] = lut[s[k]];
  }
}

// -- the register tile, portable ------------------------------------------------------------------
// c[i][0, 16) += (sum_k ap[i * 128 + k] * bp[k * 16 + j]) * sa[i] * sb for i < 6.
OPMUX_CPU_CLONES void tile_portable(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                                    const float* sa, float sb) {
  float acc[kMr][kNr] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = bp + k * kNr;
    for (int i = 0; i < kMr; ++i) {
      const float av = ap[i * kBlock + k];
      for (int j = 0; j < kNr; ++j) acc[i][j] += av * bk[j];
    }
  }
  for (int i = 0; i < kMr; ++i)
    for (int j = 0; j < kNr; ++j) c[i * ldc + j] += (acc[i][j] * sa[i]) * sb;
}

#if OPMUX_CPU_F16C
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace v256 {
using namespace cpu::v256;

// 8 e4m3fn bytes -> 8 floats, exact (cpu's table by bit operations): normals rebias the exponent
// (bits (mag << 20) + (120 << 23)), subnormals m * 2^-9 through an integer conversion, 0x7F NaN.
OPMUX_V256_INLINE __m256 e4m3x8(const uint8_t* p) {
  const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7F));
  const __m256i nrm = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1.0p-9f));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
  __m256i v = _mm256_blendv_epi8(nrm, _mm256_castps_si256(sub), is_sub);
  const __m256i is_nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
  v = _mm256_or_si256(v, _mm256_and_si256(is_nan, _mm256_set1_epi32(0x7FC00000)));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
  return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

// 8 bytes from a row of kc - k (< 8) remaining: the rest 0 (never reads past the row).
OPMUX_V256_INLINE __m256 e4m3x8_tail(const uint8_t* p, int64_t n) {
  uint8_t t[8] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return e4m3x8(t);
}

// a's rows as decode_a_rows, 8 bytes at a time.
inline void decode_a_rows(float* ap, const uint8_t* a, int64_t lda, int64_t mr, int64_t kc) {
  const float* lut = e4m3_table();
  for (int64_t r = 0; r < kMr; ++r) {
    float* d = ap + r * kBlock;
    if (r >= mr) {
      for (int64_t k = 0; k < kc; ++k) d[k] = 0.0f;
      continue;
    }
    const uint8_t* s = a + r * lda;
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(d + k, e4m3x8(s + k));
    for (; k < kc; ++k) d[k] = lut[s[k]];
  }
}

// pack_b, 8 x 8 bytes at a time: decoded by e4m3x8, transposed in registers (k-major panels).
inline void pack_b(float* bp, const Problem& p, int64_t n0, int64_t nc) {
  const int64_t panels = (nc + kNr - 1) / kNr;
  for (int64_t kb = 0; kb < p.kt; ++kb) {
    const int64_t k0 = kb * kBlock, kc = block_len(p, kb);
    for (int64_t pn = 0; pn < panels; ++pn) {
      float* dst = bp + (kb * panels + pn) * kBlock * kNr;
      for (int h = 0; h < kNr / 8; ++h) {
        const int64_t c0 = pn * kNr + h * 8;
        for (int64_t k = 0; k < kc; k += 8) {
          const int64_t len = std::min<int64_t>(8, kc - k);
          __m256 r[8];
          for (int i = 0; i < 8; ++i) {
            const int64_t n = c0 + i;
            const uint8_t* src = p.b + (n0 + n) * p.ldb + k0 + k;
            r[i] = n >= nc ? _mm256_setzero_ps() : len == 8 ? e4m3x8(src) : e4m3x8_tail(src, len);
          }
          const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
          const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
          const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
          const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
          const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
          const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
          const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
          const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
          __m256 o[8];
          o[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
          o[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
          o[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
          o[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
          o[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
          o[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
          o[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
          o[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
          for (int i = 0; i < len; ++i) _mm256_storeu_ps(dst + (k + i) * kNr + h * 8, o[i]);
        }
      }
    }
  }
}

// tile_portable with 12 accumulators in registers: per k, two loads of b and six broadcasts of a.
inline void tile(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc, const float* sa, float sb) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * kNr), b1 = _mm256_loadu_ps(bp + k * kNr + 8);
    __m256 a = _mm256_broadcast_ss(ap + k);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(ap + kBlock + k);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(ap + 2 * kBlock + k);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(ap + 3 * kBlock + k);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(ap + 4 * kBlock + k);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(ap + 5 * kBlock + k);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  const __m256 s = _mm256_set1_ps(sb);
  auto add = [&](int i, __m256 lo, __m256 hi) {
    const __m256 r = _mm256_set1_ps(sa[i]);
    float* ci = c + i * ldc;
    _mm256_storeu_ps(ci, _mm256_fmadd_ps(_mm256_mul_ps(lo, r), s, _mm256_loadu_ps(ci)));
    _mm256_storeu_ps(ci + 8, _mm256_fmadd_ps(_mm256_mul_ps(hi, r), s, _mm256_loadu_ps(ci + 8)));
  };
  add(0, c00, c01);
  add(1, c10, c11);
  add(2, c20, c21);
  add(3, c30, c31);
  add(4, c40, c41);
  add(5, c50, c51);
}

OPMUX_V256_INLINE float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

// The skinny kernel: R rows of a (decoded: af + r * ldf, zero past K to a multiple of 8) times NS
// rows of b (brow[j]), every K block; res[r * NS + j] = sum_kb (dot * sa[r, kb]) * sb[j, kb].
template <int R, int NS>
void skinny(const float* af, int64_t ldf, const uint8_t* const* brow, const Problem& p, const int64_t* sb_off,
            float* res) {
  float tot[R][NS] = {};
  for (int64_t kb = 0; kb < p.kt; ++kb) {
    const int64_t k0 = kb * kBlock, kc = block_len(p, kb);
    __m256 acc[R][NS];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NS; ++j) acc[r][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
      for (int j = 0; j < NS; ++j) {
        const __m256 bf = e4m3x8(brow[j] + k0 + k);
        for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(af + r * ldf + k0 + k), bf, acc[r][j]);
      }
    }
    if (k < kc) {
      for (int j = 0; j < NS; ++j) {
        const __m256 bf = e4m3x8_tail(brow[j] + k0 + k, kc - k);
        for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(af + r * ldf + k0 + k), bf, acc[r][j]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const float s = p.sa[r * p.sa_m + kb * p.sa_k];
      for (int j = 0; j < NS; ++j) tot[r][j] += (hsum(acc[r][j]) * s) * p.sb[sb_off[j] + kb * p.sb_k];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NS; ++j) res[r * NS + j] = tot[r][j];
}

// Columns [n0, n1) of every row (M <= kSkinnyRows); af: a decoded, rows ldf apart.
template <int R, typename T>
void skinny_cols(T* out, const float* af, int64_t ldf, const Problem& p, int64_t n0, int64_t n1) {
  constexpr int NS = R <= 3 ? 4 : 3;
  for (int64_t n = n0; n < n1; n += NS) {
    const uint8_t* brow[NS];
    int64_t sb_off[NS];
    for (int j = 0; j < NS; ++j) {
      const int64_t c = std::min(n + j, n1 - 1);  // past the end: the last column again, not stored
      brow[j] = p.b + c * p.ldb;
      sb_off[j] = (c / kBlock) * p.sb_n;
    }
    float res[R * NS];
    skinny<R, NS>(af, ldf, brow, p, sb_off, res);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NS && n + j < n1; ++j) out[r * p.ldo + n + j] = from_float<T>(res[r * NS + j]);
  }
}

template <typename T>
void skinny_impl(T* out, const Problem& p, int nt) {
  const float* lut = e4m3_table();
  const int64_t ldf = (p.K + 7) / 8 * 8;
  std::vector<float> af(static_cast<size_t>(p.M * ldf), 0.0f);
  for (int64_t r = 0; r < p.M; ++r)
    for (int64_t k = 0; k < p.K; ++k) af[r * ldf + k] = lut[p.a[r * p.lda + k]];
  const int64_t items = (p.N + kSkinnyCols - 1) / kSkinnyCols;
  (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
#endif
  for (int64_t it = 0; it < items; ++it) {
    const int64_t n0 = it * kSkinnyCols, n1 = std::min(p.N, n0 + kSkinnyCols);
    switch (p.M) {
      case 1: skinny_cols<1>(out, af.data(), ldf, p, n0, n1); break;
      case 2: skinny_cols<2>(out, af.data(), ldf, p, n0, n1); break;
      case 3: skinny_cols<3>(out, af.data(), ldf, p, n0, n1); break;
      default: skinny_cols<4>(out, af.data(), ldf, p, n0, n1); break;
    }
  }
}

}  // namespace v256
#pragma GCC pop_options
#endif  // OPMUX_CPU_F16C

// -- the packed GEMM ------------------------------------------------------------------------------
// One item: rows [m0, m0 + mc) x columns [n0, n0 + nc) (nc <= 128, n0 a multiple of 128), with b's
// columns packed in bp (pack_b). ap: kMc x 128 floats, c: kMc x 128 floats (the item's tile).
template <typename T>
void packed_item(T* out, const Problem& p, const float* bp, float* ap, float* c, int64_t m0, int64_t mc,
                 int64_t n0, int64_t nc, bool v256) {
  (void)v256;
  const int64_t panels = (nc + kNr - 1) / kNr, groups = (mc + kMr - 1) / kMr, ldc = kNc;
  std::fill(c, c + groups * kMr * ldc, 0.0f);
  for (int64_t kb = 0; kb < p.kt; ++kb) {
    const int64_t k0 = kb * kBlock, kc = block_len(p, kb);
    const float sb = p.sb[(n0 / kBlock) * p.sb_n + kb * p.sb_k];
    float sa[kMc + kMr];
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t mr = std::min<int64_t>(kMr, mc - g * kMr);
      const uint8_t* arow = p.a + (m0 + g * kMr) * p.lda + k0;
#if OPMUX_CPU_F16C
      if (v256) {
        v256::decode_a_rows(ap + g * kMr * kBlock, arow, p.lda, mr, kc);
      } else {
        decode_a_rows(ap + g * kMr * kBlock, arow, p.lda, mr, kc);
      }
#else
      decode_a_rows(ap + g * kMr * kBlock, arow, p.lda, mr, kc);
#endif
      for (int64_t i = 0; i < kMr; ++i)
        sa[g * kMr + i] = i < mr ? p.sa[(m0 + g * kMr + i) * p.sa_m + kb * p.sa_k] : 0.0f;
    }
    for (int64_t pn = 0; pn < panels; ++pn) {
      const float* b = bp + (kb * panels + pn) * kBlock * kNr;
      for (int64_t g = 0; g < groups; ++g) {
        const float* a = ap + g * kMr * kBlock;
        float* cg = c + g * kMr * ldc + pn * kNr;
#if OPMUX_CPU_F16C
        if (v256) {
          v256::tile(a, b, kc, cg, ldc, sa + g * kMr, sb);
          continue;
        }
#endif
        tile_portable(a, b, kc, cg, ldc, sa + g * kMr, sb);
      }
    }
  }
  for (int64_t i = 0; i < mc; ++i) store_row(out + (m0 + i) * p.ldo + n0, c + i * ldc, nc);
}

// mc: rows per item (M, or a multiple of kMr up to kMc).
template <typename T>
void packed_impl(T* out, const Problem& p, int64_t mc, int nt, bool v256) {
  const int64_t njc = (p.N + kNc - 1) / kNc, nic = (p.M + mc - 1) / mc;
  const int64_t items = njc * nic;
  const int64_t bp_size = p.kt * kBlock * kNc;
  (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
  {
    std::vector<float> bp(static_cast<size_t>(bp_size)), ap(static_cast<size_t>(kMc * kBlock)),
        c(static_cast<size_t>((kMc + kMr) * kNc));
    int64_t packed_jc = -1;
    // items jc-major, shared out in contiguous ranges: a thread's consecutive items mostly share jc,
    // whose packed b it keeps
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t it = 0; it < items; ++it) {
      const int64_t jc = it / nic, ic = it % nic;
      const int64_t n0 = jc * kNc, nc = std::min(kNc, p.N - n0);
      if (jc != packed_jc) {
#if OPMUX_CPU_F16C
        if (v256) {
          v256::pack_b(bp.data(), p, n0, nc);
        } else {
          pack_b(bp.data(), p, n0, nc);
        }
#else
        pack_b(bp.data(), p, n0, nc);
#endif
        packed_jc = jc;
      }
      const int64_t m0 = ic * mc, mcur = std::min(mc, p.M - m0);
      packed_item(out, p, bp.data(), ap.data(), c.data(), m0, mcur, n0, nc, v256);
    }
  }
}

template <typename T>
void matmul_impl(T* out, const Problem& p) {
  if (p.M == 0 || p.N == 0) return;
  const int64_t njc = (p.N + kNc - 1) / kNc;
  const bool v256 = cpu::has_v256();
  const int64_t macs = p.M * p.N * p.K;
#if OPMUX_CPU_F16C
  if (v256 && p.M <= kSkinnyRows) {
    const int nt = cpu::threads_for(macs, kParallelMinMacs, (p.N + kSkinnyCols - 1) / kSkinnyCols);
    return v256::skinny_impl(out, p, nt);
  }
#endif
  const int nt = cpu::threads_for(macs, kParallelMinMacs, njc * ((p.M + kMr - 1) / kMr));
  // rows per item: all of M up to kMc; fewer where the column tiles alone would leave a thread
  // without two items
  int64_t mc = std::min<int64_t>(kMc, p.M);
  const int64_t want = (2 * static_cast<int64_t>(nt) + njc - 1) / njc;  // row tiles per column tile
  if (nt > 1 && want > 1) mc = std::min(mc, ((p.M + want - 1) / want + kMr - 1) / kMr * kMr);
  packed_impl(out, p, mc, nt, v256);
}

}  // namespace gemm_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/checks.h"
#include "opmux/dtype_checks.h"

namespace opmux {
namespace gemm_cpu {

// A float32 scale tensor of exactly [rows, cols]; its element strides (0 along a size-1 dim).
inline void check_scales(const char* op, const char* name, const TensorView& s, int64_t rows, int64_t cols,
                         const char* rows_what, const char* cols_what, int64_t* s_row, int64_t* s_col) {
  check_float32(op, name, s);
  check_ndim(op, name, s, 2);
  check_size(op, name, s, 0, rows, rows_what);
  check_size(op, name, s, 1, cols, cols_what);
  *s_row = rows > 1 ? s.stride(0) : 0;
  *s_col = cols > 1 ? s.stride(1) : 0;
  if (*s_row < 0 || *s_col < 0) {
    TVM_FFI_THROW(ValueError) << op << ": " << name << " has a negative stride (" << s.stride(0) << ", "
                              << s.stride(1) << "); only non-negative strides are supported";
  }
}

void w8a8_block_fp8_matmul_cpu(TensorView out, TensorView a, TensorView b, TensorView a_scale,
                               TensorView b_scale) {
  const char* op = "opmux.w8a8_block_fp8_matmul";
  check_device(op, kDLCPU, {{"out", &out}, {"a", &a}, {"b", &b}, {"a_scale", &a_scale}, {"b_scale", &b_scale}});
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  check_ndim(op, "out", out, 2);
  check_fp8_bytes(op, "a", a);
  check_fp8_bytes(op, "b", b);
  const DType dtype = get_dtype(op, "out", out);
  Problem p;
  p.M = a.size(0);
  p.K = a.size(1);
  p.N = b.size(0);
  if (p.K < 1) TVM_FFI_THROW(ValueError) << op << ": a has shape [" << p.M << ", 0]; K must be at least 1";
  p.kt = (p.K + kBlock - 1) / kBlock;
  check_size(op, "b", b, 1, p.K, "K, a.shape[1]");
  check_size(op, "out", out, 0, p.M, "M, a.shape[0]");
  check_size(op, "out", out, 1, p.N, "N, b.shape[0]");
  check_last_dim_contiguous(op, "a", a);
  check_last_dim_contiguous(op, "b", b);
  check_last_dim_contiguous(op, "out", out);
  p.lda = row_stride(op, "a", a);
  p.ldb = row_stride(op, "b", b);
  p.ldo = row_stride(op, "out", out);
  if (p.M > 1 && p.N > 0 && p.ldo < p.N) {
    TVM_FFI_THROW(ValueError) << op << ": out's rows overlap (row stride " << p.ldo << " < N = " << p.N << ")";
  }
  check_scales(op, "a_scale", a_scale, p.M, p.kt, "M, a.shape[0]", "ceil(K / 128)", &p.sa_m, &p.sa_k);
  check_scales(op, "b_scale", b_scale, (p.N + kBlock - 1) / kBlock, p.kt, "ceil(N / 128)", "ceil(K / 128)", &p.sb_n,
               &p.sb_k);
  if (p.M == 0 || p.N == 0) return;
  p.a = data_ptr<const uint8_t>(a);
  p.b = data_ptr<const uint8_t>(b);
  p.sa = data_ptr<const float>(a_scale);
  p.sb = data_ptr<const float>(b_scale);
  OPMUX_DISPATCH_DTYPE(dtype, float, cpu::half_t, cpu::bf16_t,
                       [&] { matmul_impl<scalar_t>(data_ptr<scalar_t>(out), p); });
}

}  // namespace gemm_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(w8a8_block_fp8_matmul_cpu, opmux::gemm_cpu::w8a8_block_fp8_matmul_cpu);
#endif  // OPMUX_CPU_KERNELS_ONLY
