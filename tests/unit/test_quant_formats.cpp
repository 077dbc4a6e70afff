// Reference quant formats: hand-built blocks decode to hand-computed values (layout checks
// independent of our quantizers), round-trip error bounds against float64, and stability.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "quant/dtype.h"

using namespace moe;

namespace {

std::vector<float> dequant(DType t, const void *src, int n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, src, y.data(), n);
  return y;
}

std::vector<uint8_t> quant(DType t, const std::vector<float> &x) {
  std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> gaussian(int n, uint32_t seed, double sigma = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0, sigma);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto &v : x) v = static_cast<float>(nd(rng));
  return x;
}

// sqrt(mean((x - y)^2)) / sqrt(mean(x^2)), in float64.
double rel_rmse(const std::vector<float> &x, const std::vector<float> &y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    s += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

const uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400;

}  // namespace

TEST_CASE("q4_0 and q8_0 known blocks decode to hand-computed values", "[quant]") {
  BlockQ4_0 b4{};
  b4.d = kHalfHalf;
  for (int j = 0; j < 16; ++j) b4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = dequant(DType::Q4_0, &b4, 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == 0.5f * (j - 8));
    CHECK(y[j + 16] == 0.5f * (7 - j));
  }
  BlockQ8_0 b8{};
  b8.d = kHalfQuarter;
  for (int j = 0; j < 32; ++j) b8.qs[j] = static_cast<int8_t>(j * 8 - 128);
  y = dequant(DType::Q8_0, &b8, 32);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == 0.25f * (j * 8 - 128));
}

TEST_CASE("q2_K known block", "[quant]") {
  BlockQ2_K b{};
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::memset(b.qs, 0xE4, sizeof b.qs);  // 2-bit fields 0,1,2,3 at shifts 0,2,4,6
  auto y = dequant(DType::Q2_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, s = (e % 128) / 32, k = (e % 32) / 16;
    const int j = half * 8 + s * 2 + k;  // sub-block of 16 -> scale index
    CHECK(y[e] == static_cast<float>(j * s - 0.5 * (15 - j)));
  }
}

TEST_CASE("q3_K known block", "[quant]") {
  BlockQ3_K b{};
  b.d = kHalfHalf;
  // low nibbles: scales 0..7 -> 1, 8..15 -> 2; high 2-bit fields all 2 -> +32; bias -32
  std::memset(b.scales, 0x21, 8);
  std::memset(b.scales + 8, 0xAA, 4);
  std::memset(b.qs, 0xE4, sizeof b.qs);
  std::memset(b.hmask, 0x0F, sizeof b.hmask);  // high bit set for the first 4 32-groups only
  auto y = dequant(DType::Q3_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, s = (e % 128) / 32;
    const float expect = half == 0 ? 0.5f * 1 * s : 0.5f * 2 * (s - 4);
    CHECK(y[e] == expect);
  }
}

TEST_CASE("q4_K known block with packed 6-bit scales", "[quant]") {
  BlockQ4_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  const uint8_t sc[12] = {0x41, 0x02, 0x03, 0x04, 0x80, 0x01, 0x02, 0x03, 0x35, 0x00, 0x00, 0x00};
  // decoded by hand: scales {1,2,3,4,21,0,0,0}, mins {0,1,2,3,35,0,0,0}
  std::memcpy(b.scales, sc, 12);
  for (int l = 0; l < 32; ++l) b.qs[l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  for (int l = 0; l < 32; ++l) b.qs[64 + l] = 0x0F;
  auto y = dequant(DType::Q4_K, &b, 256);
  for (int l = 0; l < 32; ++l) {
    CHECK(y[l] == 0.5f * 1 * (l % 16) - 0.25f * 0);
    CHECK(y[32 + l] == 0.5f * 2 * (15 - l % 16) - 0.25f * 1);
    CHECK(y[64 + l] == -0.25f * 2);
    CHECK(y[96 + l] == -0.25f * 3);
    CHECK(y[128 + l] == 0.5f * 21 * 15 - 0.25f * 35);
    CHECK(y[160 + l] == 0.0f);
    CHECK(y[192 + l] == 0.0f);
    CHECK(y[224 + l] == 0.0f);
  }
}

TEST_CASE("q5_K known block: fifth bit from qh", "[quant]") {
  BlockQ5_K b{};
  b.d = kHalfOne;
  b.dmin = 0;
  const uint8_t sc[12] = {1, 1, 1, 1, 0, 0, 0, 0, 0x01, 0x01, 0x01, 0x01};  // all scales 1, mins 0
  std::memcpy(b.scales, sc, 12);
  std::memset(b.qs, 0x21, sizeof b.qs);
  std::memset(b.qh, 0x55, sizeof b.qh);  // even bits: first 32 of each 64-chunk get +16
  auto y = dequant(DType::Q5_K, &b, 256);
  for (int e = 0; e < 256; ++e) CHECK(y[e] == ((e % 64) < 32 ? 17.0f : 2.0f));
}

TEST_CASE("q6_K known block", "[quant]") {
  BlockQ6_K b{};
  b.d = kHalfQuarter;
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i - 8);
  std::memset(b.ql, 0x5A, sizeof b.ql);
  std::memset(b.qh, 0xE4, sizeof b.qh);
  auto y = dequant(DType::Q6_K, &b, 256);
  // codes per quarter of a 128-half: 10|0<<4, 10|1<<4, 5|2<<4, 5|3<<4, minus 32
  const int q[4] = {10 - 32, 26 - 32, 37 - 32, 53 - 32};
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128;
    CHECK(y[e] == 0.25f * (8 * h + r / 16 - 8) * q[r / 32]);
  }
}

TEST_CASE("mxfp4 known block: E2M1 values and E8M0 scale", "[quant]") {
  const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int e : {0, 1, 120, 127, 128, 140}) {
    BlockMXFP4 b{};
    b.e = static_cast<uint8_t>(e);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = dequant(DType::MXFP4, &b, 32);
    for (int j = 0; j < 16; ++j) {
      const auto val = [&](int code) {
        return (code & 8 ? -1.0 : 1.0) * std::ldexp(e2m1[code & 7], e - 127);
      };
      CHECK(static_cast<double>(y[j]) == val(j));
      CHECK(static_cast<double>(y[j + 16]) == val(15 - j));
    }
  }
}

TEST_CASE("q8_K quantizes activations like the reference engine", "[quant]") {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(std::sin(i * 0.37) * 1.5);
  x[77] = -2.0f;  // the largest magnitude, negative: d takes its sign
  BlockQ8_K b;
  quantize_row(DType::Q8_K, x.data(), &b, 256);
  CHECK(b.d == 1.0f / (-127.f / -2.0f));
  CHECK(b.qs[77] == -127);
  for (int i = 0; i < 256; ++i) {
    const double v = static_cast<double>(-127.f / -2.0f * x[i]);
    const double r = std::nearbyint(v);  // ties to even in the default rounding mode
    CHECK(b.qs[i] == static_cast<int>(r));
  }
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += b.qs[16 * g + i];
    CHECK(b.bsums[g] == s);
  }
  std::vector<float> z(256, 0.0f);
  quantize_row(DType::Q8_K, z.data(), &b, 256);
  CHECK(b.d == 0.0f);
  for (int i = 0; i < 16; ++i) CHECK(b.bsums[i] == 0);
}

TEST_CASE("q8_0 quantization rounds half away from zero with d = amax/127", "[quant]") {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;
  x[31] = 12.7f;
  BlockQ8_0 b;
  quantize_row(DType::Q8_0, x.data(), &b, 32);
  const float d = 12.7f / 127.0f;
  CHECK(b.d == fp32_to_fp16(d));
  for (int i = 0; i < 32; ++i) CHECK(b.qs[i] == static_cast<int>(std::round(static_cast<double>(x[i] * (1.0f / d)))));
}

TEST_CASE("round trip error bounds against float64", "[quant]") {
  struct Case { DType t; double bound; };
  // Bounds are ~1.25x the relative RMSE these formats give on N(0,1) data (for the absmax
  // formats that is step/sqrt(12), e.g. Q8_K: (3.0/127)/sqrt(12) ~ 0.0068).
  const Case cases[] = {{DType::Q8_0, 0.007}, {DType::Q8_K, 0.009}, {DType::Q6_K, 0.023},
                        {DType::Q5_K, 0.045}, {DType::Q4_K, 0.09},  {DType::Q4_0, 0.11},
                        {DType::Q3_K, 0.2},   {DType::Q2_K, 0.37},  {DType::MXFP4, 0.15}};
  for (const auto &c : cases) {
    for (int n : {256, 768, 4096}) {
      auto x = gaussian(n, 7u + static_cast<uint32_t>(n));
      auto q = quant(c.t, x);
      auto y = dequant(c.t, q.data(), n);
      INFO(dtype_name(c.t) << " n=" << n);
      const double err = rel_rmse(x, y);
      CHECK(err < c.bound);
      CHECK(err > 0.0);
    }
  }
}

TEST_CASE("all-zero and extreme rows", "[quant]") {
  const DType types[] = {DType::Q4_0, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                         DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::MXFP4};
  for (DType t : types) {
    INFO(dtype_name(t));
    std::vector<float> z(512, 0.0f);
    auto y = dequant(t, quant(t, z).data(), 512);
    for (float v : y) CHECK(v == 0.0f);
    // Large magnitudes (f16 scales up to ~65504/levels) and tiny ones stay finite and close.
    for (double scale : {1e-3, 1e3}) {
      auto x = gaussian(512, 99, scale);
      auto yy = dequant(t, quant(t, x).data(), 512);
      for (float v : yy) CHECK(std::isfinite(v));
      CHECK(rel_rmse(x, yy) < 0.5);
    }
  }
}

TEST_CASE("re-quantizing a dequantized row reproduces it", "[quant]") {
  // For the symmetric absmax formats the decoded grid maps onto itself exactly.
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q8_K, DType::MXFP4}) {
    INFO(dtype_name(t));
    auto x = gaussian(1024, 5);
    auto y1 = dequant(t, quant(t, x).data(), 1024);
    auto y2 = dequant(t, quant(t, y1).data(), 1024);
    CHECK(rel_rmse(y1, y2) < 1e-3);
  }
  // The K-quant searches may land on another scale, but never drift far from the first pass.
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    INFO(dtype_name(t));
    auto x = gaussian(1024, 6);
    auto y1 = dequant(t, quant(t, x).data(), 1024);
    auto y2 = dequant(t, quant(t, y1).data(), 1024);
    CHECK(rel_rmse(y1, y2) <= rel_rmse(x, y1));
  }
}

TEST_CASE("word-wise K-quant scale unpacking equals the byte-wise definition", "[quant]") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t q[12];
    for (auto &b : q) b = static_cast<uint8_t>(rng());
    BlockQ4_K b4{};
    std::memcpy(b4.scales, q, 12);
    b4.d = kHalfOne;
    b4.dmin = kHalfOne;
    for (auto &v : b4.qs) v = 0x10;  // low code 0, high code 1
    // Byte-wise spec: j<4: sc=q[j]&63, m=q[j+4]&63; j>=4: from q[j+4] nibbles + top bits.
    auto y = dequant(DType::Q4_K, &b4, 256);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      if (j < 4) { sc = q[j] & 63; m = q[j + 4] & 63; }
      else { sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
      const int e = 64 * (j / 2) + 32 * (j % 2);  // first element of sub-block j
      CHECK(y[e] == static_cast<float>((j % 2) * sc - m));
    }
    BlockQ3_K b3{};
    std::memcpy(b3.scales, q, 12);
    b3.d = kHalfOne;
    std::memset(b3.hmask, 0xFF, sizeof b3.hmask);
    std::memset(b3.qs, 0x55, sizeof b3.qs);  // every code 1
    y = dequant(DType::Q3_K, &b3, 256);
    for (int j = 0; j < 16; ++j) {
      const int lo = j < 8 ? (q[j] & 0xF) : (q[j - 8] >> 4);
      const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
      CHECK(y[16 * j] == static_cast<float>((lo | (hi << 4)) - 32));
    }
  }
}
