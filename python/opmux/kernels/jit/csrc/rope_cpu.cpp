// Rotary position embedding (vLLM style) for CPU tensors, in place, float math.
// query [T, Hq, head_size] and key [T, Hk, head_size] are rotated over the first rotary_dim
// elements of every head (the tail is untouched) by cos_sin_cache[positions[t]] = [cos | sin].
// NeoX style pairs element i with i + rotary_dim / 2; GPT-J style pairs 2i with 2i + 1.
// Positions are validated before anything is written: a bad one is a ValueError naming it.
// Kernels first (no tvm-ffi; alone under OPMUX_CPU_KERNELS_ONLY, see layernorm_cpu.cpp), then
// the argument checks and the tvm-ffi entry point.
#include <cstdint>
#include <vector>

#include "opmux/cpu_math.h"
#include "opmux/cpu_types.h"
#include "opmux/cpu_vec.h"

namespace opmux {
namespace rope_cpu {

using cpu::from_float;
using cpu::to_float;

// Measured cut-over (benchmarks/bench_cpu.py, docs/benchmarks/cpu.md): calls that move fewer
// bytes (query and key read and written) than this run on one thread.
constexpr int64_t kParallelMinBytes = 64 << 10;

// The neox halves of one head as two restrict pointers (they are `half` apart and never
// overlap), so the loop vectorizes without a runtime alias check.
template <typename T>
OPMUX_CPU_INLINE void rotate_halves(T* __restrict lo, T* __restrict hi, const float* __restrict cos,
                                    const float* __restrict sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = to_float(lo[i]), b = to_float(hi[i]);
    lo[i] = from_float<T>(a * cos[i] - b * sin[i]);
    hi[i] = from_float<T>(b * cos[i] + a * sin[i]);
  }
}

// One token's heads; multiversioned (OPMUX_CPU_CLONES).
// float16 halves through float chunks (cpu::half_chunk_to_float: F16C where the CPU has it), the
// same expressions.
OPMUX_CPU_INLINE void rotate_halves(cpu::half_t* lo, cpu::half_t* hi, const float* cos, const float* sin,
                                    int64_t half) {
  float a[cpu::kChunk], b[cpu::kChunk];
  for (int64_t i0 = 0; i0 < half; i0 += cpu::kChunk) {
    const int64_t c = half - i0 < cpu::kChunk ? half - i0 : cpu::kChunk;
    cpu::half_chunk_to_float(a, lo + i0, c);
    cpu::half_chunk_to_float(b, hi + i0, c);
    for (int64_t j = 0; j < c; ++j) {
      const float x = a[j], y = b[j];
      a[j] = x * cos[i0 + j] - y * sin[i0 + j];
      b[j] = y * cos[i0 + j] + x * sin[i0 + j];
    }
    cpu::half_chunk_from_float(lo + i0, a, c);
    cpu::half_chunk_from_float(hi + i0, b, c);
  }
}

#if OPMUX_CPU_F16C
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace v256 {
using namespace cpu::v256;

// One token's NeoX heads of a 16-bit T, 8 lanes of each half at a time with no float buffers
// (rotate_halves' chunks cost a call and a pass through memory per half and head; the memory-
// bound T = 4096 case is then short of the copy bandwidth). The same expressions, with the
// AVX-512 rows' rounding: the second product rounded, the first fused into the sum (explicit FMAs,
// so GCC's contraction of the operators cannot pick another; the portable clones may contract
// either: a last-bit difference, inside every tolerance).
template <typename T>
void rotate_heads_neox(T* x, const cpu::HeadLayout& h, int64_t t, const float* cos, const float* sin,
                       int64_t half) {
  const int64_t vec = half - half % kW;
  for (int64_t head = 0; head < h.heads; ++head) {
    T* lo = x + t * h.token_stride + head * h.head_stride;
    T* hi = lo + half;
    for (int64_t i = 0; i < vec; i += kW) {
      const __m256 a = load(lo + i), b = load(hi + i);
      const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
      store(lo + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
      store(hi + i, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
    }
    for (int64_t i = vec; i < half; ++i) {
      const float a = to_float(lo[i]), b = to_float(hi[i]);
      lo[i] = from_float<T>(a * cos[i] - b * sin[i]);
      hi[i] = from_float<T>(b * cos[i] + a * sin[i]);
    }
  }
}

}  // namespace v256
#pragma GCC pop_options
#endif  // OPMUX_CPU_F16C

template <bool NEOX, typename T>
OPMUX_CPU_CLONES void rotate_heads(T* x, const cpu::HeadLayout& h, int64_t t, const float* cos,
                                   const float* sin, int64_t half) {
  for (int64_t head = 0; head < h.heads; ++head) {
    T* v = x + t * h.token_stride + head * h.head_stride;
    if constexpr (NEOX) {
      rotate_halves(v, v + half, cos, sin, half);
      continue;
    }
    for (int64_t i = 0; i < half; ++i) {
      const float a = to_float(v[2 * i]), b = to_float(v[2 * i + 1]);
      v[2 * i] = from_float<T>(a * cos[i] - b * sin[i]);
      v[2 * i + 1] = from_float<T>(b * cos[i] + a * sin[i]);
    }
  }
}

// vLLM's rounding (the kernel mode its compat entry selects): cos / sin rounded to T, then each
// product and the sum or difference rounded to T, as vLLM's kernel computes in T (float32:
// nothing to round). Scalar: one rounding per operation.
template <typename T>
inline float rt(float v) {
  return to_float(from_float<T>(v));
}
template <bool NEOX, typename T>
void rotate_heads_vllm(T* x, const cpu::HeadLayout& h, int64_t t, const float* cos, const float* sin,
                       int64_t half) {
  for (int64_t head = 0; head < h.heads; ++head) {
    T* v = x + t * h.token_stride + head * h.head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;
      const float a = to_float(v[i1]), b = to_float(v[i2]), c = rt<T>(cos[i]), s = rt<T>(sin[i]);
      v[i1] = from_float<T>(rt<T>(a * c) - rt<T>(b * s));
      v[i2] = from_float<T>(rt<T>(b * c) + rt<T>(a * s));
    }
  }
}

// query / key layouts (the same tokens), cos_sin_cache rows [cos | sin] of rot_dim elements,
// cache_stride apart.
struct RopeLayout {
  cpu::HeadLayout q, k;
  int64_t rot_dim, cache_stride;
};

// The first t whose position is outside [0, max_pos), or -1 when all are valid.
inline int64_t first_bad_position(const int64_t* pos, int64_t tokens, int64_t max_pos) {
  for (int64_t t = 0; t < tokens; ++t)
    if (pos[t] < 0 || pos[t] >= max_pos) return t;
  return -1;
}

#if OPMUX_CPU_VEC512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace v512 {
using namespace cpu::v512;

// NeoX: c = cos[0, half), s = sin[0, half). GPT-J: c = cos per element (cos[i] at 2i and 2i + 1),
// s = the sine per element with the pair's sign (-sin[i] at 2i, sin[i] at 2i + 1), so
// out = v * c + swap_pairs(v) * s.
template <bool NB, bool NEOX, typename T>
void rotate_heads(T* x, const cpu::HeadLayout& h, int64_t t, const float* c, const float* s,
                  int64_t rot_dim) {
  const int64_t half = rot_dim / 2;
  for (int64_t head = 0; head < h.heads; ++head) {
    T* v = x + t * h.token_stride + head * h.head_stride;
    if (NEOX) {
      for (int64_t i = 0; i < half; i += kW) {
        const __mmask16 m = tail_mask(half - i);
        const __m512 a = load(v + i, m), b = load(v + half + i, m);
        const __m512 co = _mm512_maskz_loadu_ps(m, c + i), si = _mm512_maskz_loadu_ps(m, s + i);
        store<NB>(v + i, _mm512_fmsub_ps(a, co, _mm512_mul_ps(b, si)), m);
        store<NB>(v + half + i, _mm512_fmadd_ps(b, co, _mm512_mul_ps(a, si)), m);
      }
    } else {
      for (int64_t i = 0; i < rot_dim; i += kW) {
        const __mmask16 m = tail_mask(rot_dim - i);
        const __m512 a = load(v + i, m);
        const __m512 sw = _mm512_permute_ps(a, 0xB1);  // (v[2i + 1], v[2i]) per pair
        const __m512 co = _mm512_maskz_loadu_ps(m, c + i), si = _mm512_maskz_loadu_ps(m, s + i);
        store<NB>(v + i, _mm512_fmadd_ps(a, co, _mm512_mul_ps(sw, si)), m);
      }
    }
  }
}

}  // namespace v512
#pragma GCC pop_options
#endif  // OPMUX_CPU_VEC512

// Positions already validated.
template <bool NEOX, typename T, typename C>
void rope_impl(const int64_t* pos, T* q, T* k, const C* cache, const RopeLayout& a, bool vllm = false) {
  const int64_t tokens = a.q.tokens, half = a.rot_dim / 2;
  const int64_t bytes = tokens * (a.q.heads + a.k.heads) * a.rot_dim * 2 * static_cast<int64_t>(sizeof(T));
  const int nt = cpu::threads_for(bytes, kParallelMinBytes, tokens);
  const int level = cpu::vec_level();
  (void)nt, (void)level;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
  {
    std::vector<float> cs(2 * a.rot_dim);  // this token's cos | sin, converted once for all heads
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < tokens; ++t) {
      const C* row = cache + pos[t] * a.cache_stride;
      if (vllm) {
        for (int64_t i = 0; i < a.rot_dim; ++i) cs[i] = to_float(row[i]);
        rotate_heads_vllm<NEOX>(q, a.q, t, cs.data(), cs.data() + half, half);
        rotate_heads_vllm<NEOX>(k, a.k, t, cs.data(), cs.data() + half, half);
        continue;
      }
#if OPMUX_CPU_VEC512
      if (level >= 1) {
        float* c = cs.data();
        float* s = cs.data() + a.rot_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float co = to_float(row[i]), si = to_float(row[half + i]);
          if (NEOX) {
            c[i] = co;
            s[i] = si;
          } else {
            c[2 * i] = c[2 * i + 1] = co;
            s[2 * i] = -si;
            s[2 * i + 1] = si;
          }
        }
        if (level == 2) {
          v512::rotate_heads<true, NEOX>(q, a.q, t, c, s, a.rot_dim);
          v512::rotate_heads<true, NEOX>(k, a.k, t, c, s, a.rot_dim);
        } else {
          v512::rotate_heads<false, NEOX>(q, a.q, t, c, s, a.rot_dim);
          v512::rotate_heads<false, NEOX>(k, a.k, t, c, s, a.rot_dim);
        }
        continue;
      }
#endif
      for (int64_t i = 0; i < a.rot_dim; ++i) cs[i] = to_float(row[i]);
#if OPMUX_CPU_F16C
      if constexpr (NEOX && sizeof(T) == 2) {
        if (cpu::has_v256()) {
          v256::rotate_heads_neox(q, a.q, t, cs.data(), cs.data() + half, half);
          v256::rotate_heads_neox(k, a.k, t, cs.data(), cs.data() + half, half);
          continue;
        }
      }
#endif
      rotate_heads<NEOX>(q, a.q, t, cs.data(), cs.data() + half, half);
      rotate_heads<NEOX>(k, a.k, t, cs.data(), cs.data() + half, half);
    }
  }
}

template <typename T, typename C>
void dispatch_style(const int64_t* pos, T* q, T* k, const C* cache, const RopeLayout& a,
                    bool is_neox, bool vllm = false) {
  if (is_neox) {
    rope_impl<true>(pos, q, k, cache, a, vllm);
  } else {
    rope_impl<false>(pos, q, k, cache, a, vllm);
  }
}

}  // namespace rope_cpu
}  // namespace opmux

#ifndef OPMUX_CPU_KERNELS_ONLY
#include <tvm/ffi/function.h>

#include "opmux/head_checks.h"
#include "opmux/contracts/rope.h"

namespace opmux {
namespace rope_cpu {

inline cpu::HeadLayout layout(const Heads& h) {
  return {h.tokens, h.heads, h.token_stride, h.head_stride};
}

void rotary_embedding_cpu(TensorView positions, TensorView query, TensorView key,
                          TensorView cos_sin_cache, bool is_neox, bool vllm_rounding) {
  const char* op = "opmux.rotary_embedding";
  RopeArgs a = check_rope_args(op, kDLCPU, positions, query, key, cos_sin_cache);
  const int64_t* pos = data_ptr<const int64_t>(positions);
  const int64_t t = first_bad_position(pos, a.q.tokens, a.max_pos);
  if (t >= 0) {
    TVM_FFI_THROW(ValueError) << op << ": positions[" << t << "] = " << pos[t]
                              << " is out of range for cos_sin_cache with " << a.max_pos
                              << " positions (valid: 0.." << a.max_pos - 1 << ")";
  }
  if (a.q.tokens == 0) return;
  const RopeLayout l{layout(a.q), layout(a.k), a.rot_dim, a.cache_stride};
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    scalar_t* q = data_ptr<scalar_t>(query);
    scalar_t* k = data_ptr<scalar_t>(key);
    if (a.cache_dtype == DType::kFloat32) {
      dispatch_style(pos, q, k, data_ptr<const float>(cos_sin_cache), l, is_neox, vllm_rounding);
    } else {
      dispatch_style(pos, q, k, data_ptr<const scalar_t>(cos_sin_cache), l, is_neox, vllm_rounding);
    }
  });
}

}  // namespace rope_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rotary_embedding_cpu, opmux::rope_cpu::rotary_embedding_cpu);

#include "opmux/contracts/rope_cpu_lanes.inc"
#endif  // OPMUX_CPU_KERNELS_ONLY
