// The array expf / silu helpers (kernels/ref_math_vec.h) give the scalar mirrors' bits on
// every ISA this machine has, including the special lanes (|n| > 192, NaN, inf, results
// that are subnormal).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/ref_math_vec.h"
#include "backends/cpu/kernels/vec_dot.h"

using namespace moe;

namespace {

std::vector<float> test_inputs() {
  std::mt19937 rng(7);
  std::vector<float> v;
  std::uniform_real_distribution<float> wide(-200.0f, 200.0f), mid(-20.0f, 20.0f);
  for (int i = 0; i < 4000; ++i) v.push_back(i % 2 ? wide(rng) : mid(rng));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {0.0f, -0.0f, inf, -inf, nan, 88.7f, 89.0f, -87.3f, -103.0f, -126.5f, -149.0f, -150.0f, 133.0f, -133.0f,
                  1e-30f, -1e-30f, 0.5f, -0.5f})
    v.push_back(x);
  while (v.size() % 16) v.push_back(1.0f);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)); }

}  // namespace

TEST_CASE("array expf / silu match the scalar reference mirrors bit for bit", "[cpu][refmath]") {
  const std::vector<float> x = test_inputs(), u = [&] {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.25f + static_cast<float>(i % 7) * 0.5f;
    return r;
  }();
  const int64_t n = static_cast<int64_t>(x.size());
  const CpuIsa saved = active_cpu_isa();
  for (CpuIsa isa : {CpuIsa::Scalar, detect_cpu_isa()}) {
    set_cpu_isa(isa);
    std::vector<float> e(x.size()), s(x.size()), si(x.size());
    ref_expf_shift(n, x.data(), 1.5f, e.data());
    ref_silu_mul(n, x.data(), u.data(), s.data());
    ref_silu(n - 5, x.data(), si.data());  // a length with a scalar tail
    int bad_e = 0, bad_s = 0, bad_si = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      bad_e += !same_bits(e[i], refmath::expf_v(x[i] - 1.5f));
      bad_s += !same_bits(s[i], refmath::silu_v(x[i]) * u[i]);
      bad_si += !same_bits(si[i], i + 5 < x.size() ? refmath::silu_v(x[i]) : 0.0f);
    }
    INFO("isa " << cpu_isa_name(isa));
    CHECK(bad_e == 0);
    CHECK(bad_s == 0);
    CHECK(bad_si == 0);
  }
  set_cpu_isa(saved);
}
