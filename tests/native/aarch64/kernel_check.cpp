// Standalone check of the opmux CPU kernels: no Python, no torch, no tvm-ffi. It includes every
// CPU unit of python/opmux/kernels/jit/csrc with OPMUX_CPU_KERNELS_ONLY (the kernels without
// their argument checks and tvm-ffi entry points), runs each op group on fixed-seed inputs and
// compares with a plain scalar reference written here (double math, independent fp16 / bf16 /
// fp8 encoders), with tolerances. Exit status 0 when every case passes, 1 otherwise; a failure
// prints the op, the case and the first mismatching elements.
//
// Built by tests/native/test_aarch64_cross.py for aarch64 (aarch64-linux-gnu-g++ -static, run
// under qemu-aarch64-static) and natively for x86-64 with the multiversioned clones disabled
// (-DOPMUX_CPU_NO_CLONES), so the portable code path is checked on both.
//
//   kernel_check [substring]   runs only the groups whose name contains the substring
#define OPMUX_CPU_KERNELS_ONLY 1

#include "activation_cpu.cpp"
#include "kvcache_cpu.cpp"
#include "layernorm_cpu.cpp"
#include "moe_cpu.cpp"
#include "quantization_cpu.cpp"
#include "rope_cpu.cpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using opmux::cpu::bf16_t;
using opmux::cpu::half_t;

namespace {

// ---------------------------------------------------------------------------------------------
// Reporting.

int g_cases = 0;
int g_failed_cases = 0;

// One case: counts mismatches, prints the first few.
class Case {
 public:
  Case(std::string group, std::string name) : group_(std::move(group)), name_(std::move(name)) {}
  ~Case() {
    ++g_cases;
    if (fails_ == 0) {
      std::printf("ok   %s %s\n", group_.c_str(), name_.c_str());
    } else {
      ++g_failed_cases;
      std::printf("FAIL %s %s: %lld mismatching values\n", group_.c_str(), name_.c_str(),
                  static_cast<long long>(fails_));
    }
  }
  // got ~ want within atol + rtol * |want| (NaN in got where want is finite fails).
  void close(const char* what, int64_t i, double got, double want, double atol, double rtol) {
    const bool ok = (std::isnan(got) && std::isnan(want)) ||
                    (got == want) || std::fabs(got - want) <= atol + rtol * std::fabs(want);
    if (!ok) fail_msg(what, i, "got %.9g, expected %.9g (atol %g, rtol %g)", got, want, atol, rtol);
  }
  void equal(const char* what, int64_t i, long long got, long long want) {
    if (got != want) fail_msg(what, i, "got %lld, expected %lld", got, want);
  }
  // The same bits (a value that must be copied or left alone, or an exactly rounded result).
  template <typename T>
  void same(const char* what, int64_t i, const T& got, const T& want) {
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got, sizeof(T));
    std::memcpy(&w, &want, sizeof(T));
    if (g != w) fail_msg(what, i, "got bits 0x%x, expected 0x%x", g, w);
  }
  template <typename... A>
  void fail_msg(const char* what, int64_t i, const char* fmt, A... args) {
    if (fails_++ < 8) {
      std::printf("  mismatch %s %s: %s[%lld]: ", group_.c_str(), name_.c_str(), what,
                  static_cast<long long>(i));
      std::printf(fmt, args...);
      std::printf("\n");
    }
  }
  bool ok() const { return fails_ == 0; }

 private:
  std::string group_, name_;
  int64_t fails_ = 0;
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Fixed-seed inputs (splitmix64: the same numbers on every platform).

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  double normal() {  // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

// ---------------------------------------------------------------------------------------------
// Reference number formats, written independently of opmux/cpu_types.h and opmux/fp8_cpu.h:
// round a double to `mant` fraction bits with minimum normal exponent `emin`, ties to even
// (nearbyint in the default rounding mode), then assemble the bits arithmetically.

double round_to_format(double a, int mant, int emin) {
  if (a == 0 || !std::isfinite(a)) return a;
  int e;
  std::frexp(a, &e);  // |a| = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, emin);
  const double ulp = std::ldexp(1.0, exp - mant);
  return std::nearbyint(a / ulp) * ulp;
}

// IEEE-style binary format with `mant` fraction bits, `ebits` exponent bits and inf / NaN.
uint32_t encode_ieee(double v, int mant, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
  const uint32_t sign = std::signbit(v) ? 1u << (mant + ebits) : 0u;
  const uint32_t exp_all = (1u << ebits) - 1;
  if (std::isnan(v)) return sign | (exp_all << mant) | (1u << (mant - 1));
  const double r = round_to_format(std::fabs(v), mant, emin);
  if (r >= std::ldexp(1.0, bias + 1)) return sign | (exp_all << mant);  // inf
  if (r < std::ldexp(1.0, emin))  // subnormal (or a carry into the smallest normal)
    return sign | static_cast<uint32_t>(r / std::ldexp(1.0, emin - mant));
  int e;
  std::frexp(r, &e);
  const int exp = e - 1;
  const uint32_t frac = static_cast<uint32_t>(r / std::ldexp(1.0, exp - mant)) - (1u << mant);
  return sign | (static_cast<uint32_t>(exp + bias) << mant) | frac;
}

double decode_ieee(uint32_t b, int mant, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const uint32_t exp_all = (1u << ebits) - 1;
  const uint32_t e = (b >> mant) & exp_all, f = b & ((1u << mant) - 1);
  const double s = (b >> (mant + ebits)) & 1 ? -1.0 : 1.0;
  if (e == exp_all) return f ? std::nan("") : s * INFINITY;
  if (e == 0) return s * std::ldexp(static_cast<double>(f), 1 - bias - mant);
  return s * std::ldexp(static_cast<double>(f + (1u << mant)), static_cast<int>(e) - bias - mant);
}

uint16_t ref_half(double v) { return static_cast<uint16_t>(encode_ieee(v, 10, 5)); }
uint16_t ref_bf16(double v) { return static_cast<uint16_t>(encode_ieee(v, 7, 8)); }
double dec_half(uint16_t b) { return decode_ieee(b, 10, 5); }
double dec_bf16(uint16_t b) { return decode_ieee(b, 7, 8); }

// fp8 e4m3fn as the kernels produce it: no inf; |x| >= 448 saturates to 448; NaN -> S.1111.111.
uint8_t ref_e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7F;
  const double r = round_to_format(std::fabs(static_cast<double>(f)), 3, -6);
  if (r >= 448.0) return sign | 0x7E;
  if (r < 0x1p-6) return sign | static_cast<uint8_t>(r / 0x1p-9);
  int e;
  std::frexp(r, &e);
  const int exp = e - 1;
  const int frac = static_cast<int>(r / std::ldexp(1.0, exp - 3)) - 8;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | frac);
}

// Per storage type: name, tolerances (those of tests/native/test_native_cpu.py), encode a
// double (one rounding), decode.
template <typename T> struct Ty;
template <> struct Ty<float> {
  static constexpr const char* name = "float32";
  static constexpr double atol = 1e-5, rtol = 1e-5;
  static float enc(double v) { return static_cast<float>(v); }
  static double dec(float v) { return v; }
};
template <> struct Ty<half_t> {
  static constexpr const char* name = "float16";
  static constexpr double atol = 2e-3, rtol = 2e-3;
  static half_t enc(double v) { return half_t{ref_half(v)}; }
  static double dec(half_t v) { return dec_half(v.bits); }
};
template <> struct Ty<bf16_t> {
  static constexpr const char* name = "bfloat16";
  static constexpr double atol = 1.6e-2, rtol = 1.6e-2;
  static bf16_t enc(double v) { return bf16_t{ref_bf16(v)}; }
  static double dec(bf16_t v) { return dec_bf16(v.bits); }
};

template <typename T>
std::vector<T> random_vec(Rng& g, size_t n, double scale = 1.0, double shift = 0.0) {
  std::vector<T> v(n);
  for (auto& x : v) x = Ty<T>::enc(shift + scale * g.normal());
  return v;
}

// A recognizable pattern for memory the kernels must not touch.
template <typename T> T sentinel() { return Ty<T>::enc(-12345.0); }

// ---------------------------------------------------------------------------------------------
// Scalar conversions (opmux/cpu_types.h, opmux/fp8_cpu.h) against the reference encoders.

void check_conversions() {
  using namespace opmux::cpu;
  Rng g(1);
  std::vector<float> fs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f,
                           0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 448.0f, 447.9f,
                           464.0f, 480.0f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f, 1e-45f,
                           0x1.fffffep127f, INFINITY, -INFINITY, NAN, -NAN};
  for (int i = 0; i < 100000; ++i) fs.push_back(bits_to_f32(static_cast<uint32_t>(g.next())));
  for (int i = 0; i < 100000; ++i)  // every binade from 2^-20 to 2^20
    fs.push_back(static_cast<float>(g.normal() * std::ldexp(1.0, static_cast<int>(g.below(40)) - 20)));
  {
    Case c("conversions", "float -> float16 / bfloat16 / fp8 e4m3fn");
    for (size_t i = 0; i < fs.size(); ++i) {
      const float f = fs[i];
      if (std::isnan(f)) {  // any NaN of the same sign
        const uint16_t h = float_to_half(f), b = float_to_bf16(f);
        if (!std::isnan(dec_half(h)) || (h >> 15) != (f32_to_bits(f) >> 31))
          c.fail_msg("float_to_half(nan)", i, "got 0x%04x", h);
        if (!std::isnan(dec_bf16(b)) || (b >> 15) != (f32_to_bits(f) >> 31))
          c.fail_msg("float_to_bf16(nan)", i, "got 0x%04x", b);
      } else {
        c.equal("float_to_half", i, float_to_half(f), ref_half(f));
        c.equal("float_to_bf16", i, float_to_bf16(f), ref_bf16(f));
      }
      c.equal("float_to_e4m3fn", i, float_to_e4m3fn(f), ref_e4m3(f));
      c.equal("float_to_e4m3fn_branchless", i, float_to_e4m3fn_branchless(f), ref_e4m3(f));
    }
  }
  {
    Case c("conversions", "float16 / bfloat16 -> float, all 65536 patterns");
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t u = static_cast<uint16_t>(b);
      const double h = dec_half(u), x = dec_bf16(u);
      const float hk = half_to_float(u), xk = bf16_to_float(u);
      // Equal with the same sign (so -0 != +0), or both NaN.
      auto same = [](double got, double want) {
        return std::isnan(got) ? std::isnan(want) : got == want && std::signbit(got) == std::signbit(want);
      };
      if (!same(hk, h)) c.fail_msg("half_to_float", b, "got %.9g, expected %.9g", hk, h);
      if (!same(xk, x)) c.fail_msg("bf16_to_float", b, "got %.9g, expected %.9g", xk, x);
    }
  }
#if OPMUX_CPU_F16C
  if (has_v256()) {  // the AVX2 rows' bfloat16 store (opmux/cpu_vec.h): float_to_bf16's bits, NaN too
    Case c("conversions", "float -> bfloat16, AVX2 chunks (v256::bf16_chunk_from_float)");
    std::vector<bf16_t> got(fs.size());
    v256::bf16_chunk_from_float(got.data(), fs.data(), static_cast<int64_t>(fs.size()));
    for (size_t i = 0; i < fs.size(); ++i) c.equal("bf16_chunk_from_float", i, got[i].bits, float_to_bf16(fs[i]));
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// layernorm: rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm, qk_norm.

template <typename T>
void ref_rmsnorm_row(std::vector<double>& out, const double* x, const T* w, int64_t n, double eps,
                     bool gemma) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  out.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const double wf = Ty<T>::dec(w[i]);
    out[i] = x[i] * rstd * (gemma ? 1.0 + wf : wf);
  }
}

template <typename T, bool GEMMA>
void check_rmsnorm(int64_t rows, int64_t hidden, int64_t pad) {
  Rng g(rows * 7919 + hidden + GEMMA);
  const int64_t xs = hidden + pad;
  const double eps = 1e-6;
  auto x = random_vec<T>(g, rows * xs);
  auto w = GEMMA ? random_vec<T>(g, hidden, 0.1) : random_vec<T>(g, hidden, 0.1, 1.0);
  std::vector<T> out(rows * hidden, sentinel<T>());
  opmux::layernorm_cpu::rmsnorm_impl<GEMMA, T>(out.data(), hidden, x.data(), xs, w.data(), rows,
                                               hidden, static_cast<float>(eps));
  Case c(GEMMA ? "gemma_rmsnorm" : "rmsnorm", fmt("%s rows=%lld hidden=%lld x_stride=%lld", Ty<T>::name,
                                                  (long long)rows, (long long)hidden, (long long)xs));
  std::vector<double> xd(hidden), ref;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < hidden; ++i) xd[i] = Ty<T>::dec(x[r * xs + i]);
    ref_rmsnorm_row(ref, xd.data(), w.data(), hidden, eps, GEMMA);
    for (int64_t i = 0; i < hidden; ++i)
      c.close("out", r * hidden + i, Ty<T>::dec(out[r * hidden + i]), ref[i], Ty<T>::atol, Ty<T>::rtol);
  }
}

template <typename T, bool GEMMA>
void check_fused_add_rmsnorm(int64_t rows, int64_t hidden, int64_t pad) {
  Rng g(rows * 31 + hidden + 2 * GEMMA);
  const int64_t xs = hidden + pad, rs = hidden + 2 * pad;
  const double eps = 1e-5;
  auto x = random_vec<T>(g, rows * xs);
  auto res = random_vec<T>(g, rows * rs);
  auto w = random_vec<T>(g, hidden);
  const auto x0 = x, res0 = res;
  opmux::layernorm_cpu::fused_add_rmsnorm_impl<GEMMA, T>(x.data(), xs, res.data(), rs, w.data(),
                                                         rows, hidden, static_cast<float>(eps));
  Case c(GEMMA ? "gemma_fused_add_rmsnorm" : "fused_add_rmsnorm",
         fmt("%s rows=%lld hidden=%lld", Ty<T>::name, (long long)rows, (long long)hidden));
  std::vector<double> sum(hidden), ref;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < hidden; ++i) {
      // residual = x + residual added in float, rounded once to T: exact.
      const float s = static_cast<float>(Ty<T>::dec(x0[r * xs + i])) +
                      static_cast<float>(Ty<T>::dec(res0[r * rs + i]));
      const T want = Ty<T>::enc(s);
      c.same("residual bits", r * rs + i, res[r * rs + i], want);
      sum[i] = Ty<T>::dec(want);
    }
    ref_rmsnorm_row(ref, sum.data(), w.data(), hidden, eps, GEMMA);
    for (int64_t i = 0; i < hidden; ++i)
      c.close("x", r * xs + i, Ty<T>::dec(x[r * xs + i]), ref[i], Ty<T>::atol, Ty<T>::rtol);
    for (int64_t i = hidden; i < xs; ++i)  // row padding untouched
      c.same("x padding", r * xs + i, x[r * xs + i], x0[r * xs + i]);
  }
}

// q [T, Hq, D] and k [T, Hk, D] either dense or as slices of one fused qkv [T, Hq + 2 Hk, D].
template <typename T>
void check_qk_norm(int64_t tokens, int64_t hq, int64_t hk, int64_t d, bool fused) {
  using opmux::cpu::HeadLayout;
  Rng g(tokens * 131 + hq * 17 + hk * 5 + d + fused);
  const double eps = 1e-6;
  const int64_t width = fused ? (hq + 2 * hk) * d : 0;
  std::vector<T> qkv = random_vec<T>(g, fused ? tokens * width : 0);
  std::vector<T> qd = random_vec<T>(g, fused ? 0 : tokens * hq * d);
  std::vector<T> kd = random_vec<T>(g, fused ? 0 : tokens * hk * d);
  T* q = fused ? qkv.data() : qd.data();
  T* k = fused ? qkv.data() + hq * d : kd.data();
  const HeadLayout ql{tokens, hq, fused ? width : hq * d, d}, kl{tokens, hk, fused ? width : hk * d, d};
  auto qw = random_vec<T>(g, d, 0.1, 1.0), kw = random_vec<T>(g, d, 0.1, 1.0);
  const auto qkv0 = qkv, qd0 = qd, kd0 = kd;
  opmux::layernorm_cpu::qk_norm_heads(q, ql, qw.data(), d, static_cast<float>(eps));
  opmux::layernorm_cpu::qk_norm_heads(k, kl, kw.data(), d, static_cast<float>(eps));
  Case c("qk_norm", fmt("%s T=%lld Hq=%lld Hk=%lld D=%lld %s", Ty<T>::name, (long long)tokens,
                        (long long)hq, (long long)hk, (long long)d, fused ? "qkv-slices" : "dense"));
  const T* q0 = fused ? qkv0.data() : qd0.data();
  const T* k0 = fused ? qkv0.data() + hq * d : kd0.data();
  std::vector<double> xd(d), ref;
  auto check = [&](const char* what, const T* now, const T* before, const HeadLayout& l,
                   const std::vector<T>& w) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < l.heads; ++h) {
        const int64_t o = t * l.token_stride + h * l.head_stride;
        for (int64_t i = 0; i < d; ++i) xd[i] = Ty<T>::dec(before[o + i]);
        ref_rmsnorm_row(ref, xd.data(), w.data(), d, eps, false);
        for (int64_t i = 0; i < d; ++i)
          c.close(what, o + i, Ty<T>::dec(now[o + i]), ref[i], Ty<T>::atol, Ty<T>::rtol);
      }
  };
  check("q", q, q0, ql, qw);
  check("k", k, k0, kl, kw);
  if (fused)  // the v heads are untouched
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = (hq + hk) * d; i < width; ++i)
        c.same("v", t * width + i, qkv[t * width + i], qkv0[t * width + i]);
}

// rmsnorm_static_quant_fp8 / fused_add_rmsnorm_static_quant_fp8: q must be the bytes of the
// unfused pair at this vector level (rmsnorm_impl or fused_add_rmsnorm_impl, then e4m3 of
// y * (1 / scale) by the branchy encoder), the residual the fused add's bits, x untouched.
template <typename T>
void check_rmsnorm_quant(int64_t rows, int64_t hidden, int64_t pad, bool fused, float scale) {
  Rng g(rows * 53 + hidden + fused);
  const int64_t xs = hidden + pad, rs = hidden + 2 * pad, qs = hidden + pad;
  const float eps = 1e-6f, inv = 1.0f / scale;
  auto x = random_vec<T>(g, rows * xs);
  auto res = random_vec<T>(g, rows * rs);
  auto w = random_vec<T>(g, hidden, 0.1, 1.0);
  const auto x0 = x;
  auto x_ref = x, res_ref = res;
  std::vector<T> y(rows * hidden);
  std::vector<uint8_t> q(rows * qs, 0xAB);
  if (fused) {
    opmux::layernorm_cpu::fused_add_rmsnorm_impl<false, T>(x_ref.data(), xs, res_ref.data(), rs, w.data(),
                                                           rows, hidden, eps);
    opmux::layernorm_cpu::rmsnorm_quant_impl<T>(q.data(), qs, x.data(), xs, res.data(), rs, w.data(), rows,
                                                hidden, eps, inv);
  } else {
    opmux::layernorm_cpu::rmsnorm_impl<false, T>(y.data(), hidden, x.data(), xs, w.data(), rows, hidden, eps);
    opmux::layernorm_cpu::rmsnorm_quant_impl<T>(q.data(), qs, x.data(), xs, nullptr, 0, w.data(), rows,
                                                hidden, eps, inv);
  }
  Case c(fused ? "fused_add_rmsnorm_static_quant_fp8" : "rmsnorm_static_quant_fp8",
         fmt("%s rows=%lld hidden=%lld scale=%g", Ty<T>::name, (long long)rows, (long long)hidden, scale));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < hidden; ++i) {
      const T yt = fused ? x_ref[r * xs + i] : y[r * hidden + i];
      const uint8_t want = opmux::cpu::float_to_e4m3fn(static_cast<float>(Ty<T>::dec(yt)) * inv);
      c.same("q bits", r * qs + i, q[r * qs + i], want);
      if (fused) c.same("residual bits", r * rs + i, res[r * rs + i], res_ref[r * rs + i]);
    }
    for (int64_t i = hidden; i < qs; ++i) c.same("q padding", r * qs + i, q[r * qs + i], uint8_t{0xAB});
    for (int64_t i = 0; i < xs; ++i) c.same("x untouched", r * xs + i, x[r * xs + i], x0[r * xs + i]);
  }
}

template <typename T>
void layernorm_group() {
  const int64_t shapes[][3] = {{1, 1, 0}, {3, 7, 1}, {1, 129, 0}, {5, 4099, 3}, {0, 64, 0}, {64, 1024, 0}};
  for (auto& s : shapes) {
    check_rmsnorm<T, false>(s[0], s[1], s[2]);
    check_rmsnorm<T, true>(s[0], s[1], s[2]);
    check_fused_add_rmsnorm<T, false>(s[0], s[1], s[2]);
    check_fused_add_rmsnorm<T, true>(s[0], s[1], s[2]);
    check_rmsnorm_quant<T>(s[0], s[1], s[2], false, 0.02f);
    check_rmsnorm_quant<T>(s[0], s[1], s[2], true, 0.02f);
  }
  check_rmsnorm_quant<T>(4, 96, 1, false, 1e-3f);  // saturates at 448
  check_rmsnorm_quant<T>(4, 96, 1, true, 1e3f);    // subnormals and zeros
  check_qk_norm<T>(5, 4, 2, 64, false);
  check_qk_norm<T>(5, 4, 2, 64, true);
  check_qk_norm<T>(3, 1, 1, 128, true);
  check_qk_norm<T>(70, 8, 2, 128, true);  // large enough for the OpenMP path
}

// ---------------------------------------------------------------------------------------------
// activation: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

double ref_silu(double g) { return g / (1.0 + std::exp(-g)); }
double ref_gelu(double g) { return 0.5 * g * std::erfc(-g / std::sqrt(2.0)); }
double ref_gelu_tanh(double g) {
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
}

template <typename T, typename Act>
void check_gated(const char* name, double (*ref)(double), int64_t rows, int64_t d, int64_t pad) {
  Rng g(rows * 131 + d);
  const int64_t xs = 2 * d + pad;
  auto x = random_vec<T>(g, rows * xs, 3.0);
  if (rows > 0 && d > 3) {  // the tails: large |g|, exact zero
    x[0] = Ty<T>::enc(-30.0);
    x[1] = Ty<T>::enc(25.0);
    x[2] = Ty<T>::enc(0.0);
  }
  std::vector<T> out(rows * d, sentinel<T>());
  opmux::activation_cpu::gated_impl<T, Act>(out.data(), d, x.data(), xs, rows, d);
  Case c(name, fmt("%s rows=%lld d=%lld", Ty<T>::name, (long long)rows, (long long)d));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) {
      const double want = ref(Ty<T>::dec(x[r * xs + i])) * Ty<T>::dec(x[r * xs + d + i]);
      c.close("out", r * d + i, Ty<T>::dec(out[r * d + i]), want, Ty<T>::atol, Ty<T>::rtol);
    }
}

template <typename T>
void activation_group() {
  using namespace opmux::activation_cpu;
  const int64_t shapes[][3] = {{1, 1, 0}, {3, 7, 2}, {2, 129, 0}, {3, 4099, 1}, {0, 16, 0}, {40, 1000, 0}};
  for (auto& s : shapes) {
    check_gated<T, Silu>("silu_and_mul", ref_silu, s[0], s[1], s[2]);
    check_gated<T, Gelu>("gelu_and_mul", ref_gelu, s[0], s[1], s[2]);
    check_gated<T, GeluTanh>("gelu_tanh_and_mul", ref_gelu_tanh, s[0], s[1], s[2]);
  }
}

// ---------------------------------------------------------------------------------------------
// rope: rotary_embedding, NeoX and GPT-J, partial rotary, float32 or query-dtype cache.

template <typename T, typename C>
void check_rope(int64_t tokens, int64_t hq, int64_t hk, int64_t head, int64_t rot, bool neox,
                bool fused) {
  using opmux::cpu::HeadLayout;
  Rng g(tokens * 97 + hq * 13 + head + rot + neox + 3 * fused);
  const int64_t max_pos = 64, half = rot / 2;
  std::vector<C> cache(max_pos * rot);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double th = p * std::pow(10000.0, -2.0 * i / rot);
      cache[p * rot + i] = Ty<C>::enc(std::cos(th));
      cache[p * rot + half + i] = Ty<C>::enc(std::sin(th));
    }
  std::vector<int64_t> pos(tokens);
  for (auto& p : pos) p = g.below(max_pos);
  const int64_t width = (hq + 2 * hk) * head;
  std::vector<T> qkv = random_vec<T>(g, fused ? tokens * width : 0);
  std::vector<T> qd = random_vec<T>(g, fused ? 0 : tokens * hq * head);
  std::vector<T> kd = random_vec<T>(g, fused ? 0 : tokens * hk * head);
  T* q = fused ? qkv.data() : qd.data();
  T* k = fused ? qkv.data() + hq * head : kd.data();
  const HeadLayout ql{tokens, hq, fused ? width : hq * head, head};
  const HeadLayout kl{tokens, hk, fused ? width : hk * head, head};
  const auto qkv0 = qkv, qd0 = qd, kd0 = kd;
  Case c("rotary_embedding", fmt("%s cache=%s T=%lld Hq=%lld Hk=%lld head=%lld rot=%lld %s %s",
                                 Ty<T>::name, Ty<C>::name, (long long)tokens, (long long)hq,
                                 (long long)hk, (long long)head, (long long)rot,
                                 neox ? "neox" : "gptj", fused ? "qkv-slices" : "dense"));
  // Position validation: -1 / max_pos are found, valid positions pass.
  std::vector<int64_t> bad = {0, max_pos - 1, max_pos, -1};
  c.equal("first_bad_position", 0, opmux::rope_cpu::first_bad_position(bad.data(), 4, max_pos), 2);
  c.equal("first_bad_position", 1, opmux::rope_cpu::first_bad_position(bad.data() + 3, 1, max_pos), 0);
  c.equal("first_bad_position", 2, opmux::rope_cpu::first_bad_position(pos.data(), tokens, max_pos), -1);
  const opmux::rope_cpu::RopeLayout l{ql, kl, rot, rot};
  opmux::rope_cpu::dispatch_style(pos.data(), q, k, cache.data(), l, neox);
  const T* q0 = fused ? qkv0.data() : qd0.data();
  const T* k0 = fused ? qkv0.data() + hq * head : kd0.data();
  auto check = [&](const char* what, const T* now, const T* before, const HeadLayout& hl) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < hl.heads; ++h) {
        const int64_t o = t * hl.token_stride + h * hl.head_stride;
        const C* cs = cache.data() + pos[t] * rot;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = neox ? i : 2 * i, i2 = neox ? i + half : 2 * i + 1;
          const double a = Ty<T>::dec(before[o + i1]), b = Ty<T>::dec(before[o + i2]);
          const double co = Ty<C>::dec(cs[i]), si = Ty<C>::dec(cs[half + i]);
          c.close(what, o + i1, Ty<T>::dec(now[o + i1]), a * co - b * si, Ty<T>::atol, Ty<T>::rtol);
          c.close(what, o + i2, Ty<T>::dec(now[o + i2]), b * co + a * si, Ty<T>::atol, Ty<T>::rtol);
        }
        for (int64_t i = rot; i < head; ++i)  // the tail past rotary_dim is untouched
          c.same("tail", o + i, now[o + i], before[o + i]);
      }
  };
  check("query", q, q0, ql);
  check("key", k, k0, kl);
  if (fused)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = (hq + hk) * head; i < width; ++i)
        c.same("v", t * width + i, qkv[t * width + i], qkv0[t * width + i]);
}

template <typename T>
void rope_group() {
  for (bool neox : {true, false}) {
    check_rope<T, float>(7, 4, 2, 64, 64, neox, false);
    check_rope<T, float>(5, 3, 1, 128, 64, neox, true);  // partial rotary, qkv slices
    check_rope<T, T>(6, 2, 2, 80, 32, neox, false);      // cache in the query dtype
    check_rope<T, float>(40, 8, 4, 128, 128, neox, true);  // large enough for OpenMP
    check_rope<T, float>(0, 2, 1, 64, 64, neox, false);
    check_rope<T, float>(3, 2, 1, 80, 20, neox, true);  // half = 10: the 8-lane rows' scalar tail
  }
}

// ---------------------------------------------------------------------------------------------
// fp8: per_token_quant_fp8 (with and without scale_ub), per_token_group_quant_fp8.

constexpr float kFp8Max = 448.0f;

template <typename T>
float ref_amax(const T* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(static_cast<float>(Ty<T>::dec(x[i])));
    if (std::isnan(v)) return v;  // NaN propagates to the scale, as in the torch reference
    if (v > m) m = v;
  }
  return m;
}

template <typename T>
std::vector<T> quant_input(Rng& g, int64_t rows, int64_t xs, int64_t hidden) {
  auto x = random_vec<T>(g, rows * xs, 2.0);
  if (rows > 1)  // an all-zero row: the scale is the minimum scale
    for (int64_t i = 0; i < hidden; ++i) x[xs + i] = Ty<T>::enc(0.0);
  if (rows > 2 && hidden > 3) {  // outliers
    x[2 * xs] = Ty<T>::enc(300.0);
    x[2 * xs + 3] = Ty<T>::enc(-1e-3);
  }
  if (rows > 0 && hidden > 4 && std::is_same<T, float>::value) x[4] = Ty<T>::enc(NAN);  // a NaN row: NaN scale
  return x;
}

template <typename T>
void check_per_token_quant(int64_t rows, int64_t hidden, int64_t pad, bool with_ub) {
  Rng g(rows * 1009 + hidden + with_ub);
  const int64_t xs = hidden + pad, qs = hidden + 2 * pad;
  auto x = quant_input<T>(g, rows, xs, hidden);
  std::vector<uint8_t> q(rows * qs, 0xA5);
  std::vector<float> s(rows, -1.0f);
  const float ub = 1.5f;
  const opmux::quantization_cpu::QuantRows a{rows, hidden, xs, qs};
  opmux::quantization_cpu::per_token_impl<T>(q.data(), s.data(), x.data(), a, with_ub ? &ub : nullptr, false);
  Case c("per_token_quant_fp8", fmt("%s rows=%lld hidden=%lld%s", Ty<T>::name, (long long)rows,
                                    (long long)hidden, with_ub ? " scale_ub=1.5" : ""));
  const float min_scale = static_cast<float>(1.0 / (448.0 * 512.0));
  for (int64_t r = 0; r < rows; ++r) {
    float amax = ref_amax(x.data() + r * xs, hidden);
    if (with_ub) amax = std::min(amax, ub);
    const float scale = std::max(amax / kFp8Max, min_scale);
    c.close("scales", r, s[r], scale, 0, 0);  // bit-exact: the same fp32 operations
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < hidden; ++i)
      c.equal("q", r * qs + i, q[r * qs + i],
              ref_e4m3(static_cast<float>(Ty<T>::dec(x[r * xs + i])) * inv));
    for (int64_t i = hidden; i < qs; ++i) c.equal("q padding", r * qs + i, q[r * qs + i], 0xA5);
  }
}

template <typename T>
void check_per_group_quant(int64_t rows, int64_t hidden, int64_t gs, bool col_major) {
  Rng g(rows * 733 + hidden + gs + col_major);
  const int64_t groups = hidden / gs;
  const float eps = 1e-10f;
  auto x = quant_input<T>(g, rows, hidden, hidden);
  std::vector<uint8_t> q(rows * hidden, 0xA5);
  std::vector<float> s(rows * groups, -1.0f);
  // Scales [rows, groups] row-major, or column-major (DeepGEMM's transposed layout).
  const int64_t s_row = col_major ? 1 : groups, s_col = col_major ? rows : 1;
  const opmux::quantization_cpu::QuantRows a{rows, hidden, hidden, hidden};
  const opmux::quantization_cpu::ScaleOut so{s.data(), s_row, s_col, false};
  opmux::quantization_cpu::per_group_impl<T, uint8_t>(q.data(), so, x.data(), a, gs, eps, false, false);
  Case c("per_token_group_quant_fp8", fmt("%s rows=%lld hidden=%lld group=%lld%s", Ty<T>::name,
                                          (long long)rows, (long long)hidden, (long long)gs,
                                          col_major ? " column-major scales" : ""));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      const T* xg = x.data() + r * hidden + gi * gs;
      const float scale = std::max(ref_amax(xg, gs), eps) / kFp8Max;
      c.close("scales", r * s_row + gi * s_col, s[r * s_row + gi * s_col], scale, 0, 0);
      const float inv = 1.0f / scale;
      for (int64_t i = 0; i < gs; ++i)
        c.equal("q", r * hidden + gi * gs + i, q[r * hidden + gi * gs + i],
                ref_e4m3(static_cast<float>(Ty<T>::dec(xg[i])) * inv));
    }
}

template <typename T>
void quant_group() {
  for (bool ub : {false, true}) {
    check_per_token_quant<T>(1, 1, 0, ub);
    check_per_token_quant<T>(4, 7, 1, ub);
    check_per_token_quant<T>(3, 4099, 2, ub);
    check_per_token_quant<T>(64, 1024, 0, ub);  // OpenMP path
    check_per_token_quant<T>(0, 16, 0, ub);
  }
  for (bool cm : {false, true}) {
    check_per_group_quant<T>(3, 256, 128, cm);
    check_per_group_quant<T>(5, 96, 32, cm);
    check_per_group_quant<T>(40, 1024, 128, cm);  // OpenMP path
  }
}

// ---------------------------------------------------------------------------------------------
// moe: topk_softmax, topk_sigmoid, moe_align_block_size, batched_moe_align_block_size.

template <typename T>
void check_topk(int64_t tokens, int64_t experts, int64_t k, bool renorm, int64_t pad, bool sigmoid = false) {
  Rng g(tokens * 41 + experts * 3 + k + renorm);
  const int64_t gs = experts + pad;
  auto gate = random_vec<T>(g, tokens * gs, 2.0);
  if (tokens > 1)  // ties: equal logits rank by lower expert index
    for (int64_t e = 0; e < experts; ++e) gate[gs + e] = Ty<T>::enc(static_cast<double>((e * 7) % 3));
  if (tokens > 2 && experts > 3) {  // -inf logits (probability 0), picked when k needs them
    for (int64_t e = 0; e < experts; e += 2) gate[2 * gs + e] = Ty<T>::enc(-INFINITY);
  }
  std::vector<float> w(tokens * k, -1.0f);
  std::vector<int32_t> ids(tokens * k, -7);
  const opmux::moe_cpu::TopkRows a{tokens, experts, k, gs, k, k, k};
  const opmux::moe_cpu::TopkMode mode{renorm, 0.0f, nullptr, false};
  if (sigmoid) {
    opmux::moe_cpu::topk_impl<opmux::moe_cpu::kSigmoid, T, int32_t>(w.data(), ids.data(), nullptr, gate.data(), a,
                                                                    mode);
  } else {
    opmux::moe_cpu::topk_impl<opmux::moe_cpu::kSoftmax, T, int32_t>(w.data(), ids.data(), nullptr, gate.data(), a,
                                                                    mode);
  }
  Case c(sigmoid ? "topk_sigmoid" : "topk_softmax", fmt("%s tokens=%lld experts=%lld k=%lld%s", Ty<T>::name, (long long)tokens,
                             (long long)experts, (long long)k, renorm ? " renormalize" : ""));
  std::vector<double> x(experts);
  std::vector<int64_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) x[e] = Ty<T>::dec(gate[t * gs + e]);
    const double m = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(x[e] - m);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return x[i] > x[j]; });
    double total = 0;
    // sigmoid: the same order (monotone; these logits do not saturate its fp32 value)
    auto score = [&](int64_t e) { return sigmoid ? 1.0 / (1.0 + std::exp(-x[e])) : std::exp(x[e] - m) / sum; };
    for (int64_t j = 0; j < k; ++j) total += score(order[j]);
    for (int64_t j = 0; j < k; ++j) {
      c.equal("topk_ids", t * k + j, ids[t * k + j], order[j]);
      double p = score(order[j]);
      if (renorm) p /= total;
      c.close("topk_weights", t * k + j, w[t * k + j], p, 1e-6, 1e-5);
    }
  }
}

void check_moe_align(int64_t tokens, int64_t k, int64_t experts, int64_t bs, int64_t bad_at) {
  Rng g(tokens * 7 + k + experts * 11 + bs);
  const int64_t numel = tokens * k;
  std::vector<int32_t> ids(numel);
  // Skewed: about half the experts get no token at all.
  for (auto& e : ids) e = static_cast<int32_t>(g.below(std::max<int64_t>(1, experts / 2)) * 2 % experts);
  if (bad_at >= 0) ids[bad_at] = bad_at % 2 ? static_cast<int32_t>(experts) : -1;
  const int64_t max_padded = numel + experts * (bs - 1), max_blocks = (max_padded + bs - 1) / bs;
  const int32_t kSent = 0x5A5A5A5A;
  std::vector<int32_t> sorted(max_padded, kSent), blocks(max_blocks, kSent);
  int32_t post = kSent;
  const int64_t ret = opmux::moe_cpu::moe_align_impl(sorted.data(), blocks.data(), &post, nullptr, ids.data(),
                                                     nullptr, numel, bs, experts, max_padded, max_blocks, true, -1);
  Case c("moe_align_block_size", fmt("tokens=%lld k=%lld experts=%lld block=%lld%s", (long long)tokens,
                                     (long long)k, (long long)experts, (long long)bs,
                                     bad_at >= 0 ? fmt(" bad id at %lld", (long long)bad_at).c_str() : ""));
  if (bad_at >= 0) {  // reported, and nothing written
    c.equal("returned bad index", 0, ret, bad_at);
    c.equal("num_tokens_post_padded untouched", 0, post, kSent);
    for (int64_t i = 0; i < max_padded; ++i) c.equal("sorted_token_ids untouched", i, sorted[i], kSent);
    for (int64_t i = 0; i < max_blocks; ++i) c.equal("expert_ids untouched", i, blocks[i], kSent);
    return;
  }
  c.equal("returned bad index", 0, ret, -1);
  std::vector<int32_t> rs(max_padded, static_cast<int32_t>(numel)), rb(max_blocks, -1);
  int64_t p = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t start = p;
    for (int64_t i = 0; i < numel; ++i)
      if (ids[i] == e) rs[p++] = static_cast<int32_t>(i);
    p = start + (p - start + bs - 1) / bs * bs;
    for (int64_t b = start / bs; b < p / bs; ++b) rb[b] = static_cast<int32_t>(e);
  }
  c.equal("num_tokens_post_padded", 0, post, p);
  for (int64_t i = 0; i < max_padded; ++i) c.equal("sorted_token_ids", i, sorted[i], rs[i]);
  for (int64_t i = 0; i < max_blocks; ++i) c.equal("expert_ids", i, blocks[i], rb[i]);
}

template <typename T>
void moe_group() {
  for (bool sigmoid : {false, true})
    for (bool renorm : {false, true}) {
      check_topk<T>(5, 8, 2, renorm, 0, sigmoid);
      check_topk<T>(9, 64, 6, renorm, 3, sigmoid);
      check_topk<T>(4, 600, 8, renorm, 0, sigmoid);   // more experts than the stack scratch
      check_topk<T>(300, 128, 4, renorm, 0, sigmoid);  // OpenMP path
      check_topk<T>(3, 5, 5, renorm, 0, sigmoid);     // k == experts
    }
}

void check_batched_align(int64_t experts, int64_t m, int64_t bs, int64_t bad_at) {
  Rng g(experts * 13 + m * 3 + bs);
  std::vector<int32_t> counts(experts);
  for (auto& c : counts) c = static_cast<int32_t>(g.below(m + 1));
  if (experts > 2) counts[1] = 0;  // an empty batch
  if (bad_at >= 0) counts[bad_at] = bad_at % 2 ? static_cast<int32_t>(m + 1) : -1;
  const int64_t n = experts * ((m + bs - 1) / bs * bs), nb = n / bs;
  const int32_t kSent = 0x5A5A5A5A;
  std::vector<int32_t> sorted(n + 3, kSent), blocks(nb + 2, kSent);  // longer buffers: written whole
  int32_t post = kSent;
  const int64_t ret = opmux::moe_cpu::batched_align_impl(sorted.data(), blocks.data(), &post, counts.data(), experts,
                                                         m, bs, n + 3, nb + 2);
  Case c("batched_moe_align_block_size", fmt("experts=%lld m=%lld block=%lld%s", (long long)experts, (long long)m,
                                             (long long)bs, bad_at >= 0 ? " bad count" : ""));
  if (bad_at >= 0) {  // reported, and nothing written
    c.equal("returned bad expert", 0, ret, bad_at);
    c.equal("num_tokens_post_padded untouched", 0, post, kSent);
    for (int64_t i = 0; i < n + 3; ++i) c.equal("sorted_ids untouched", i, sorted[i], kSent);
    return;
  }
  c.equal("returned bad expert", 0, ret, -1);
  std::vector<int32_t> rs(n + 3, static_cast<int32_t>(experts * m)), rb(nb + 2, -1);
  int64_t p = 0;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t j = 0; j < counts[e]; ++j) rs[p + j] = static_cast<int32_t>(e * m + j);
    const int64_t padded = (counts[e] + bs - 1) / bs * bs;
    for (int64_t b = p / bs; b < (p + padded) / bs; ++b) rb[b] = static_cast<int32_t>(e);
    p += padded;
  }
  c.equal("num_tokens_post_padded", 0, post, p);
  for (int64_t i = 0; i < n + 3; ++i) c.equal("sorted_ids", i, sorted[i], rs[i]);
  for (int64_t i = 0; i < nb + 2; ++i) c.equal("expert_ids", i, blocks[i], rb[i]);
}

void moe_align_group() {
  check_batched_align(1, 1, 1, -1);
  check_batched_align(8, 13, 8, -1);
  check_batched_align(64, 512, 64, -1);
  check_batched_align(16, 16, 16, 3);
  check_batched_align(16, 16, 16, 4);
  check_moe_align(1, 1, 1, 1, -1);
  check_moe_align(7, 2, 8, 4, -1);
  check_moe_align(33, 8, 64, 16, -1);
  check_moe_align(100, 6, 160, 64, -1);
  check_moe_align(7, 2, 8, 4, 5);
  check_moe_align(7, 2, 8, 4, 0);
}

// ---------------------------------------------------------------------------------------------
// kvcache: reshape_and_cache.

template <typename T>
void check_reshape_and_cache(int64_t tokens, int64_t heads, int64_t d, int64_t blocks, int64_t bsz,
                             bool strided) {
  Rng g(tokens * 3 + heads * 5 + d + blocks + bsz + strided);
  const int64_t hd = heads * d;
  // key / value as slices of a fused [T, 3, H, D] buffer, or dense [T, H, D]; caches with a
  // gap between blocks when strided (each block stays dense).
  const int64_t tok = strided ? 3 * hd : hd, kcb = bsz * hd + (strided ? 8 : 0);
  auto kv = random_vec<T>(g, tokens * tok + hd);
  auto vv = random_vec<T>(g, tokens * tok + hd);
  const T* key = kv.data();
  const T* value = strided ? kv.data() + hd : vv.data();
  std::vector<T> kc(blocks * kcb, sentinel<T>()), vc(blocks * kcb, sentinel<T>());
  std::vector<int64_t> slots(tokens);
  std::vector<int64_t> perm(blocks * bsz);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = static_cast<int64_t>(perm.size()) - 1; i > 0; --i)  // Fisher-Yates
    std::swap(perm[i], perm[g.below(i + 1)]);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = t % 5 == 3 ? -1 : perm[t];
  opmux::kvcache_cpu::CacheLayout l;
  l.tokens = tokens;
  l.heads = heads;
  l.head_dim = d;
  l.block_size = bsz;
  l.elt_bytes = sizeof(T);
  l.k_tok = l.v_tok = tok;
  l.k_head = l.v_head = d;
  l.kc_block = l.vc_block = kcb;
  l.kc_page = l.vc_page = hd;
  l.kc_head = l.vc_head = d;
  const int64_t num_slots = blocks * bsz;
  Case c("reshape_and_cache", fmt("%s tokens=%lld heads=%lld d=%lld blocks=%lld block_size=%lld%s",
                                  Ty<T>::name, (long long)tokens, (long long)heads, (long long)d,
                                  (long long)blocks, (long long)bsz, strided ? " strided" : ""));
  std::vector<int64_t> bad = {0, -1, num_slots - 1, num_slots, -2};
  c.equal("first_bad_slot", 0, opmux::kvcache_cpu::first_bad_slot(bad.data(), 5, num_slots), 3);
  c.equal("first_bad_slot", 1, opmux::kvcache_cpu::first_bad_slot(bad.data() + 4, 1, num_slots), 0);
  c.equal("first_bad_slot", 2, opmux::kvcache_cpu::first_bad_slot(slots.data(), tokens, num_slots), -1);
  opmux::kvcache_cpu::reshape_and_cache_impl(
      reinterpret_cast<const char*>(key), reinterpret_cast<const char*>(value),
      reinterpret_cast<char*>(kc.data()), reinterpret_cast<char*>(vc.data()), slots.data(), l);
  std::vector<T> rk(kc.size(), sentinel<T>()), rv(vc.size(), sentinel<T>());
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t base = slots[t] / bsz * kcb + slots[t] % bsz * hd;
    for (int64_t i = 0; i < hd; ++i) {
      rk[base + i] = key[t * tok + i];
      rv[base + i] = value[t * tok + i];
    }
  }
  for (size_t i = 0; i < kc.size(); ++i) {
    c.same("key_cache bits", i, kc[i], rk[i]);
    c.same("value_cache bits", i, vc[i], rv[i]);
  }
}

template <typename T>
void kvcache_group() {
  check_reshape_and_cache<T>(9, 2, 16, 4, 4, false);
  check_reshape_and_cache<T>(9, 2, 16, 4, 4, true);
  check_reshape_and_cache<T>(70, 8, 128, 8, 16, true);  // OpenMP path
  check_reshape_and_cache<T>(0, 2, 8, 1, 4, false);
}

// ---------------------------------------------------------------------------------------------

#define OPMUX_STR2(x) #x
#define OPMUX_STR(x) OPMUX_STR2(x)

}  // namespace

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
#if defined(__aarch64__)
  const char* arch = "aarch64";
#elif defined(__x86_64__)
  const char* arch = "x86_64";
#else
  const char* arch = "other";
#endif
#ifdef _OPENMP
  const char* omp = "on";
#else
  const char* omp = "off";
#endif
  const char* clones = OPMUX_STR(OPMUX_CPU_CLONES);
  // vec: the AVX-512 level taken (opmux/cpu_vec.h), 0 = portable; v256: the AVX2 rows taken at level 0
  std::printf("kernel_check: arch=%s openmp=%s clones=%s vec=%d v256=%d\n", arch, omp, *clones ? clones : "none",
              opmux::cpu::vec_level(), opmux::cpu::has_v256() ? 1 : 0);
  const std::vector<std::pair<const char*, std::function<void()>>> groups = {
      {"conversions", check_conversions},
      {"layernorm", [] { layernorm_group<float>(); layernorm_group<half_t>(); layernorm_group<bf16_t>(); }},
      {"activation", [] { activation_group<float>(); activation_group<half_t>(); activation_group<bf16_t>(); }},
      {"rope", [] { rope_group<float>(); rope_group<half_t>(); rope_group<bf16_t>(); }},
      {"quantization", [] { quant_group<float>(); quant_group<half_t>(); quant_group<bf16_t>(); }},
      {"moe", [] { moe_group<float>(); moe_group<half_t>(); moe_group<bf16_t>(); moe_align_group(); }},
      {"kvcache", [] { kvcache_group<float>(); kvcache_group<half_t>(); kvcache_group<bf16_t>(); }},
  };
  int ran = 0;
  for (const auto& [name, run] : groups) {
    if (std::strstr(name, only) == nullptr) continue;
    run();
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "kernel_check: no group matches '%s'\n", only);
    return 2;
  }
  if (g_failed_cases > 0) {
    std::printf("kernel_check: %d of %d cases FAILED (arch=%s)\n", g_failed_cases, g_cases, arch);
    return 1;
  }
  std::printf("kernel_check: all %d cases passed (arch=%s)\n", g_cases, arch);
  return 0;
}
