// The AVX-512 levels of opmux/cpu_vec.h against each other, single-threaded, no Python: the
// portable kernels (level 0: on this CPU their avx512f target_clones copy), level 1 (AVX-512,
// bfloat16 rounded in integer registers) and level 2 (+ AVX512_BF16's vcvtneps2bf16). Best of 41
// rounds, us per call. docs/benchmarks/cpu.md quotes it.
//
//   J=python/opmux/kernels/jit
//   for v in 0 1 2; do g++ -std=c++17 -O3 -fno-trapping-math -DOPMUX_CPU_VEC_MAX=$v -I$J/include -I$J/csrc \
//     benchmarks/cpu_vec_levels.cpp -o /tmp/vec$v && /tmp/vec$v; done
#define OPMUX_CPU_KERNELS_ONLY 1
#include "activation_cpu.cpp"
#include "layernorm_cpu.cpp"
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
using namespace opmux;
template <class F> double best(F f, int reps) {
  double b = 1e30;
  for (int r = 0; r < 41; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    b = std::min(b, us);
  }
  return b;
}
int main() {
  const int T = 32, H = 4096, I = 14336;
  std::vector<cpu::bf16_t> x(T * H), o(T * H), r(T * H), w(H), g(T * 2 * I), go(T * I);
  for (size_t i = 0; i < x.size(); ++i) x[i] = cpu::from_float<cpu::bf16_t>((i % 97) * 0.01f - 0.4f), r[i] = x[i];
  for (int i = 0; i < H; ++i) w[i] = cpu::from_float<cpu::bf16_t>(1.0f + (i % 13) * 0.01f);
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::from_float<cpu::bf16_t>((i % 101) * 0.05f - 2.5f);
  std::printf("vec=%d\n", cpu::vec_level());
  std::printf("rmsnorm T=32 H=4096 bf16: %.2f us\n", best([&] { layernorm_cpu::rmsnorm_impl<false>(o.data(), H, x.data(), H, w.data(), T, H, 1e-6f); }, 50));
  std::printf("fused_add T=32 bf16: %.2f us\n", best([&] { layernorm_cpu::fused_add_rmsnorm_impl<false>(o.data(), H, r.data(), H, w.data(), T, H, 1e-6f); }, 50));
  std::printf("silu T=32 I=14336 bf16: %.2f us\n", best([&] { activation_cpu::gated_impl<cpu::bf16_t, activation_cpu::Silu>(go.data(), I, g.data(), 2 * I, T, I); }, 5));
}
