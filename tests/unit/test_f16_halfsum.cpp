// The half-precision-accumulating F16 dot (kernels/f16_halfsum_dot.h) against an
// independent transcription of the reference kernel's schedule (4 x 32 FP16 accumulators,
// x0+x2, x1+x3, x0+x1, then the 256/128/.../16-bit reduce-add halves) whose FP16 roundings
// are done on exact integers (units of 2^-48, where every product of two halves lives).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/kernels/f16_halfsum_dot.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "core/fp16.h"

using namespace moe;

namespace {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

// A half as an exact integer multiple of 2^-48.
i128 half_units(uint16_t h) {
  const float f = fp16_to_fp32(h);
  return static_cast<i128>(std::ldexp(static_cast<double>(f), 48));  // |f| * 2^48 < 2^64, exact
}

// Round an exact value (units of 2^-48) to the nearest half, ties to even.
uint16_t round_units(i128 v) {
  const bool neg = v < 0;
  u128 m = neg ? static_cast<u128>(-v) : static_cast<u128>(v);
  if (m == 0) return neg ? 0x8000 : 0;
  int msb = 127;
  while (!((m >> msb) & 1)) --msb;
  // quantum: 2^(e-10) for a normal half with exponent e = msb - 48; 2^-24 for subnormals
  const int q = msb - 10 > 24 ? msb - 10 : 24;
  u128 quot = m >> q;
  const u128 rem = m & ((static_cast<u128>(1) << q) - 1);
  const u128 halfq = static_cast<u128>(1) << (q - 1);
  if (rem > halfq || (rem == halfq && (quot & 1))) ++quot;
  const double val = std::ldexp(static_cast<double>(quot), q - 48);
  return fp32_to_fp16(static_cast<float>(neg ? -val : val));  // exactly representable
}

uint16_t fma_h(uint16_t a, uint16_t b, uint16_t c) {
  const i128 pa = half_units(a), pb = half_units(b);
  // (pa * 2^-48)(pb * 2^-48) = pa*pb * 2^-96; in units of 2^-48 that is pa*pb >> 48 (exact:
  // halves are multiples of 2^-24, so pa and pb are multiples of 2^24)
  const i128 prod = (pa >> 24) * (pb >> 24);
  return round_units(prod + half_units(c));
}
uint16_t add_h(uint16_t a, uint16_t b) { return round_units(half_units(a) + half_units(b)); }

float reference_dot(int n, const std::vector<uint16_t> &x, const std::vector<uint16_t> &y) {
  const int np = n - n % 128;
  double sumf = 0.0;
  if (np > 0) {
    uint16_t sum[4][32] = {};
    for (int i = 0; i < np; i += 128)
      for (int j = 0; j < 4; ++j)
        for (int lane = 0; lane < 32; ++lane)
          sum[j][lane] = fma_h(x[i + 32 * j + lane], y[i + 32 * j + lane], sum[j][lane]);
    for (int lane = 0; lane < 32; ++lane) {
      sum[0][lane] = add_h(sum[0][lane], sum[2][lane]);
      sum[1][lane] = add_h(sum[1][lane], sum[3][lane]);
    }
    for (int lane = 0; lane < 32; ++lane) sum[0][lane] = add_h(sum[0][lane], sum[1][lane]);
    uint16_t t3[16], t6[8], t8[4], t10[2];
    for (int i = 0; i < 16; ++i) t3[i] = add_h(sum[0][i], sum[0][i + 16]);
    for (int i = 0; i < 8; ++i) t6[i] = add_h(t3[i], t3[i + 8]);
    for (int i = 0; i < 4; ++i) t8[i] = add_h(t6[i], t6[i + 4]);
    for (int i = 0; i < 2; ++i) t10[i] = add_h(t8[i], t8[i + 2]);
    sumf = static_cast<double>(fp16_to_fp32(add_h(t10[0], t10[1])));
  }
  for (int i = np; i < n; ++i) sumf += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return static_cast<float>(sumf);
}

std::vector<uint16_t> random_halves(int n, std::mt19937 &rng, int kind) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-64, 64), expo(-14, 6), pick(0, 5);
  const int mant[6] = {0, 1, 2, 1021, 1022, 1023};
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto &h : v) {
    float f;
    if (kind == 0) f = nd(rng);
    else if (kind == 1) f = nd(rng) * 1e-3f;
    else if (kind == 2) f = static_cast<float>(small(rng)) / 8.0f;  // exact sums, many exact ties
    else  // wide exponents, mantissas next to 1 and 2: sums that land on a midpoint only in float
      f = (pick(rng) & 1 ? -1.0f : 1.0f) * std::ldexp(1.0f + mant[pick(rng)] / 1024.0f, expo(rng));
    h = fp32_to_fp16(f);
  }
  return v;
}

}  // namespace

TEST_CASE("f16 halfsum dot matches the reference FP16 lane/reduction schedule", "[f16_halfsum]") {
  const CpuIsa saved = active_cpu_isa();
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, detect_cpu_isa()}) {  // portable and SIMD kernels (clamped to the CPU)
  set_cpu_isa(isa);
  std::mt19937 rng(1234);
  int checked = 0, differs_from_double = 0;
  for (int n : {64, 128, 200, 256, 384}) {
    for (int kind = 0; kind < 4; ++kind) {
      for (int rep = 0; rep < 40; ++rep) {
        const auto w = random_halves(n, rng, kind), x = random_halves(n, rng, kind);
        const float got = f16_halfsum_dot(n, w.data(), x.data());
        const float want = reference_dot(n, w, x);
        INFO("isa=" << cpu_isa_name(isa) << " n=" << n << " kind=" << kind << " rep=" << rep);
        REQUIRE(fp32_to_bits(got) == fp32_to_bits(want));
        double exact = 0;
        for (int i = 0; i < n; ++i) exact += static_cast<double>(fp16_to_fp32(w[i])) * fp16_to_fp32(x[i]);
        if (static_cast<float>(exact) != got) ++differs_from_double;
        ++checked;
      }
    }
  }
  // the FP16 accumulation must actually show (else the test checks nothing of interest)
  CHECK(differs_from_double > checked / 4);
  }
  set_cpu_isa(saved);
}

TEST_CASE("f16 halfsum dot rows", "[f16_halfsum]") {
  std::mt19937 rng(7);
  const int n = 256, rows = 5;
  std::vector<uint16_t> w;
  for (int r = 0; r < rows; ++r) {
    auto row = random_halves(n, rng, 0);
    w.insert(w.end(), row.begin(), row.end());
  }
  const auto x = random_halves(n, rng, 0);
  float out[rows];
  f16_halfsum_dot_rows(n, rows, out, w.data(), n * sizeof(uint16_t), x.data());
  for (int r = 0; r < rows; ++r) {
    std::vector<uint16_t> row(w.begin() + r * n, w.begin() + (r + 1) * n);
    CHECK(fp32_to_bits(out[r]) == fp32_to_bits(reference_dot(n, row, x)));
  }
}

// An FMA whose float sum lands exactly on an FP16 midpoint although the exact sum does not:
// lane 0 holds 1025 after step 0, step 1 adds (1 + 2^-10)(0.5 - 2^-11) = 0.5 - 2^-21.
// One FP16 rounding gives 1025; rounding the float sum 1025.5 (a tie) would give 1026.
TEST_CASE("f16 halfsum dot rounds each fma once", "[f16_halfsum]") {
  const int n = 256;
  std::vector<uint16_t> w(n, 0), x(n, 0);
  w[0] = fp32_to_fp16(1025.0f);
  x[0] = fp32_to_fp16(1.0f);
  w[128] = fp32_to_fp16(1.0f + 1.0f / 1024);
  x[128] = fp32_to_fp16(0.5f - 1.0f / 2048);
  REQUIRE(fp16_to_fp32(x[128]) == 0.5f - 1.0f / 2048);
  const CpuIsa saved = active_cpu_isa();
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, detect_cpu_isa()}) {
    set_cpu_isa(isa);
    CHECK(f16_halfsum_dot(n, w.data(), x.data()) == 1025.0f);
  }
  set_cpu_isa(saved);
  CHECK(reference_dot(n, w, x) == 1025.0f);
}
