// Rotary position embedding (vLLM style) for CPU tensors, in place, float math.
// query [T, Hq, head_size] and key [T, Hk, head_size] are rotated over the first rotary_dim
// elements of every head (the tail is untouched) by cos_sin_cache[positions[t]] = [cos | sin].
// NeoX style pairs element i with i + rotary_dim / 2; GPT-J style pairs 2i with 2i + 1.
// Positions are validated before anything is written: a bad one is a ValueError naming it.
#include <tvm/ffi/function.h>

#include <vector>

#include "opmux/cpu_types.h"
#include "opmux/head_checks.h"

namespace opmux {
namespace rope_cpu {

using cpu::from_float;
using cpu::to_float;

constexpr int64_t kParallelMinElems = 1 << 15;

template <bool NEOX, typename T>
void rotate_heads(T* x, const Heads& h, int64_t t, const float* cos, const float* sin,
                  int64_t half) {
  for (int64_t head = 0; head < h.heads; ++head) {
    T* v = x + t * h.token_stride + head * h.head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;
      const float a = to_float(v[i1]), b = to_float(v[i2]);
      v[i1] = from_float<T>(a * cos[i] - b * sin[i]);
      v[i2] = from_float<T>(b * cos[i] + a * sin[i]);
    }
  }
}

template <bool NEOX, typename T, typename C>
void rope_impl(const int64_t* pos, T* q, T* k, const C* cache, const RopeArgs& a) {
  const int64_t tokens = a.q.tokens, half = a.rot_dim / 2;
  const bool parallel =
      tokens > 1 && tokens * (a.q.heads + a.k.heads) * a.rot_dim >= kParallelMinElems;
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel if (parallel)
#endif
  {
    std::vector<float> cs(a.rot_dim);  // this token's cos | sin, converted once for all heads
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < tokens; ++t) {
      const C* row = cache + pos[t] * a.cache_stride;
      for (int64_t i = 0; i < a.rot_dim; ++i) cs[i] = to_float(row[i]);
      rotate_heads<NEOX>(q, a.q, t, cs.data(), cs.data() + half, half);
      rotate_heads<NEOX>(k, a.k, t, cs.data(), cs.data() + half, half);
    }
  }
}

template <typename T, typename C>
void dispatch_style(const int64_t* pos, T* q, T* k, const C* cache, const RopeArgs& a,
                    bool is_neox) {
  if (is_neox) {
    rope_impl<true>(pos, q, k, cache, a);
  } else {
    rope_impl<false>(pos, q, k, cache, a);
  }
}

void rotary_embedding_cpu(TensorView positions, TensorView query, TensorView key,
                          TensorView cos_sin_cache, bool is_neox) {
  const char* op = "opmux.rotary_embedding";
  RopeArgs a = check_rope_args(op, kDLCPU, positions, query, key, cos_sin_cache);
  const int64_t* pos = data_ptr<const int64_t>(positions);
  for (int64_t t = 0; t < a.q.tokens; ++t) {
    if (pos[t] < 0 || pos[t] >= a.max_pos) {
      TVM_FFI_THROW(ValueError) << op << ": positions[" << t << "] = " << pos[t]
                                << " is out of range for cos_sin_cache with " << a.max_pos
                                << " positions (valid: 0.." << a.max_pos - 1 << ")";
    }
  }
  if (a.q.tokens == 0) return;
  OPMUX_DISPATCH_DTYPE(a.dtype, float, cpu::half_t, cpu::bf16_t, [&] {
    scalar_t* q = data_ptr<scalar_t>(query);
    scalar_t* k = data_ptr<scalar_t>(key);
    if (a.cache_dtype == DType::kFloat32) {
      dispatch_style(pos, q, k, data_ptr<const float>(cos_sin_cache), a, is_neox);
    } else {
      dispatch_style(pos, q, k, data_ptr<const scalar_t>(cos_sin_cache), a, is_neox);
    }
  });
}

}  // namespace rope_cpu
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rotary_embedding_cpu, opmux::rope_cpu::rotary_embedding_cpu);
