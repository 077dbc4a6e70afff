// Pins the reference-order numerics of multi-token (batched) products: which of the
// reference's code paths a product takes, the float grouping of each path, its activation
// quantizer and its vector expf. Independent computations here: the test packs its own
// Q4_K blocks and spells out each path's float steps; expf against values computed with the
// AVX-512 instruction sequence the reference uses.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/ref_order_dot.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "core/fp16.h"
#include "quant/dtype.h"

using namespace moe;

namespace moe::refdot_generic {
void rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path);
}

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A Q4_K super-block from explicit 6-bit scales/mins and 4-bit quants, packed per the format
// (scales 0-3 / mins 0-3 in the low 6 bits of bytes 0-3 / 4-7; 4-7 split over bytes 8-11
// and the top 2 bits of bytes 0-7).
BlockQ4_K pack_q4_k(const int sc[8], const int mn[8], const uint8_t q[QK_K], float d, float dmin) {
  BlockQ4_K b{};
  b.d = fp32_to_fp16(d);
  b.dmin = fp32_to_fp16(dmin);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 32; ++i)
      b.qs[32 * j + i] = static_cast<uint8_t>(q[64 * j + i] | (q[64 * j + 32 + i] << 4));
  return b;
}

}  // namespace

TEST_CASE("batched matmul: the reference's path rule per weight type and token", "[ops][cpu][refnum]") {
  // Q4_K with a row count % 8 == 0 is repacked: 4-token groups of a dense product take the
  // GEMM grouping, the remainder and every MoE row the GEMV one.
  for (int64_t col = 0; col < 28; ++col) CHECK(ref_order_path(DType::Q4_K, 256, 256, 30, col, false) == RefPath::RepackGemm);
  CHECK(ref_order_path(DType::Q4_K, 256, 256, 30, 28, false) == RefPath::RepackGemv);
  CHECK(ref_order_path(DType::Q4_K, 256, 256, 30, 29, false) == RefPath::RepackGemv);
  for (int64_t col = 0; col < 3; ++col) CHECK(ref_order_path(DType::Q4_K, 256, 256, 3, col, false) == RefPath::RepackGemv);
  CHECK(ref_order_path(DType::Q4_K, 256, 256, 30, 0, true) == RefPath::RepackGemv);
  CHECK(ref_order_path(DType::Q4_K, 256, 12, 30, 0, false) == RefPath::VecDot);  // not repacked
  // F32: multi-token products go to the reference's GEMM when k % 16 == 0 and rows % 4 == 0.
  CHECK(ref_order_path(DType::F32, 256, 8, 1, 0, false) == RefPath::VecDot);
  CHECK(ref_order_path(DType::F32, 256, 8, 2, 1, false) == RefPath::F32Gemm);
  CHECK(ref_order_path(DType::F32, 250, 8, 2, 1, false) == RefPath::VecDot);
  CHECK(ref_order_path(DType::F32, 256, 6, 2, 1, false) == RefPath::VecDot);
  // The other types keep one grouping for every token.
  for (DType t : {DType::Q8_0, DType::Q5_K, DType::Q6_K}) CHECK(ref_order_path(t, 256, 256, 30, 5, false) == RefPath::VecDot);
}

TEST_CASE("batched matmul: Q4_K repacked GEMV/GEMM grouping against an independent computation", "[ops][cpu][refnum]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> six(0, 63), four(0, 15);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int nsb = 3, n = nsb * QK_K;
  std::vector<BlockQ4_K> w(nsb);
  std::vector<int> sc(8 * nsb), mn(8 * nsb);
  std::vector<uint8_t> q(n);
  for (int i = 0; i < nsb; ++i) {
    for (int j = 0; j < 8; ++j) { sc[8 * i + j] = six(rng); mn[8 * i + j] = six(rng); }
    for (int e = 0; e < QK_K; ++e) q[QK_K * i + e] = static_cast<uint8_t>(four(rng));
    w[i] = pack_q4_k(&sc[8 * i], &mn[8 * i], &q[QK_K * i], 0.01f + 0.003f * i, 0.02f - 0.004f * i);
  }
  // The packing agrees with the library's decoder: w = d * sc * q - dmin * mn.
  std::vector<float> deq(n);
  dequantize_row(DType::Q4_K, w.data(), deq.data(), n);
  for (int e = 0; e < n; ++e) {
    const int i = e / QK_K, g = (e % QK_K) / 32;
    const float want = fp16_to_fp32(w[i].d) * sc[8 * i + g] * q[e] - fp16_to_fp32(w[i].dmin) * mn[8 * i + g];
    REQUIRE(deq[e] == Approx(want).margin(1e-6));
  }
  std::vector<float> x(n);
  for (auto &v : x) v = nd(rng);
  std::vector<BlockQ8_K> y(nsb);
  quantize_row(DType::Q8_K, x.data(), y.data(), n);

  // Per 64-element pair of sub-blocks: the scaled int sum and the mins term.
  float gemv = 0, gemv_m = 0, gemm = 0, gemm_m = 0;
  double exact = 0;
  for (int i = 0; i < nsb; ++i) {
    const float d = fp16_to_fp32(w[i].d) * y[i].d, dm = fp16_to_fp32(w[i].dmin) * y[i].d;
    int32_t tot_q = 0, tot_m = 0;
    for (int j = 0; j < 4; ++j) {
      int32_t sq = 0, sm = 0;
      for (int h = 0; h < 2; ++h) {
        const int g = 2 * j + h;
        int32_t dot = 0, bsum = 0;
        for (int e = 32 * g; e < 32 * g + 32; ++e) {
          dot += q[QK_K * i + e] * y[i].qs[e];
          bsum += y[i].qs[e];
        }
        sq += sc[8 * i + g] * dot;
        sm += mn[8 * i + g] * bsum;
      }
      gemm = std::fma(static_cast<float>(sq), d, gemm);
      gemm_m = std::fma(static_cast<float>(sm), dm, gemm_m);
      tot_q += sq;
      tot_m += sm;
      exact += static_cast<double>(sq) * d - static_cast<double>(sm) * dm;
    }
    gemv = std::fma(static_cast<float>(tot_q), d, gemv);
    gemv_m = std::fma(static_cast<float>(tot_m), dm, gemv_m);
  }
  float got_gemv, got_gemm;
  ref_order_dot_rows(DType::Q4_K, n, 1, &got_gemv, w.data(), 0, y.data(), RefPath::RepackGemv);
  ref_order_dot_rows(DType::Q4_K, n, 1, &got_gemm, w.data(), 0, y.data(), RefPath::RepackGemm);
  CHECK(bits(got_gemv) == bits(gemv - gemv_m));
  CHECK(bits(got_gemm) == bits(gemm - gemm_m));
  CHECK(got_gemv == Approx(exact).epsilon(1e-5));
  CHECK(got_gemm == Approx(exact).epsilon(1e-5));
}

TEST_CASE("batched matmul: Q8_0 and F32 groupings spelled out", "[ops][cpu][refnum]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 256;
  std::vector<float> a(n), b(n);
  for (auto &v : a) v = nd(rng);
  for (auto &v : b) v = nd(rng);
  // Q8_0: 8 float lanes, lane k fed by bytes 4k..4k+3 of each block; the 8-lane tree.
  std::vector<BlockQ8_0> qa(n / 32), qb(n / 32);
  quantize_row(DType::Q8_0, a.data(), qa.data(), n);
  quantize_row(DType::Q8_0, b.data(), qb.data(), n);
  float lane[8] = {};
  for (int ib = 0; ib < n / 32; ++ib) {
    const float d = fp16_to_fp32(qa[ib].d) * fp16_to_fp32(qb[ib].d);
    for (int k = 0; k < 8; ++k) {
      int32_t s = 0;
      for (int e = 4 * k; e < 4 * k + 4; ++e) s += qa[ib].qs[e] * qb[ib].qs[e];
      lane[k] = std::fma(d, static_cast<float>(s), lane[k]);
    }
  }
  const float want_q8 = ((lane[4] + lane[0]) + (lane[6] + lane[2])) + ((lane[5] + lane[1]) + (lane[7] + lane[3]));
  CHECK(bits(ref_order_dot(DType::Q8_0, n, qa.data(), qb.data())) == bits(want_q8));
  // F32 multi-token GEMM: 16 lanes over k, then halves 8 / 4 / 2.
  float l16[16] = {};
  for (int e = 0; e < n; ++e) l16[e % 16] = std::fma(a[e], b[e], l16[e % 16]);
  float t8[8], t4[4];
  for (int k = 0; k < 8; ++k) t8[k] = l16[k] + l16[k + 8];
  for (int k = 0; k < 4; ++k) t4[k] = t8[k] + t8[k + 4];
  const float want_gemm = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  float got;
  ref_order_dot_rows(DType::F32, n, 1, &got, a.data(), 0, b.data(), RefPath::F32Gemm);
  CHECK(bits(got) == bits(want_gemm));
  // F32 one token: 4 accumulators of 16 lanes over steps of 64, folded (0+2)+(1+3) first.
  float acc[4][16] = {};
  for (int e = 0; e < n; ++e) acc[(e % 64) / 16][e % 16] = std::fma(a[e], b[e], acc[(e % 64) / 16][e % 16]);
  for (int k = 0; k < 16; ++k) l16[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
  for (int k = 0; k < 8; ++k) t8[k] = l16[k] + l16[k + 8];
  for (int k = 0; k < 4; ++k) t4[k] = t8[k] + t8[k + 4];
  CHECK(bits(ref_order_dot(DType::F32, n, a.data(), b.data())) == bits((t4[0] + t4[2]) + (t4[1] + t4[3])));
}

TEST_CASE("batched matmul: the SIMD build of the reference-order kernels equals the portable one bit for bit", "[ops][cpu][refnum]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int K = 512, M = 24;
  for (int trial = 0; trial < 3; ++trial)
    for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F32}) {
      std::vector<float> w(static_cast<size_t>(K) * M), x(K);
      for (auto &v : w) v = nd(rng) * static_cast<float>(trial + 1);
      for (auto &v : x) v = nd(rng);
      const CpuTypeKernels &k = cpu_type_kernels(t);
      const size_t rs = row_size(t, K);
      std::vector<uint8_t> wq(rs * M), xq(row_size(k.vec_dot_type, K));
      for (int r = 0; r < M; ++r) quantize_row(t, w.data() + static_cast<size_t>(r) * K, wq.data() + r * rs, K);
      quantize_row(k.vec_dot_type, x.data(), xq.data(), K);
      for (RefPath p : {RefPath::VecDot, RefPath::F32Gemm, RefPath::RepackGemv, RefPath::RepackGemm}) {
        if (p == RefPath::F32Gemm && t != DType::F32) continue;
        for (int n : {K, K - 7}) {  // F32 also with a ragged tail
          if (n != K && t != DType::F32) continue;
          std::vector<float> fast(M), port(M);
          ref_order_dot_rows(t, n, M, fast.data(), wq.data(), rs, xq.data(), p);
          refdot_generic::rows(t, n, M, port.data(), wq.data(), rs, xq.data(), p);
          for (int r = 0; r < M; ++r) CHECK(bits(fast[r]) == bits(port[r]));
        }
      }
    }
}

TEST_CASE("batched matmul: activation rows quantize to Q8_K as the reference's 4-row quantizer does", "[ops][cpu][refnum]") {
  // The reference's interleaved 4-row quantizer yields the per-row reference values:
  // iscale = -127 / (signed value of largest magnitude), d = 1 / iscale, q = round-half-even.
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(4 * QK_K);
  for (auto &v : x) v = nd(rng);
  x[17] = 9.5f;         // positive maximum in super-block 0
  x[QK_K + 3] = -9.5f;  // negative maximum in super-block 1
  std::vector<BlockQ8_K> y(4);
  quantize_row(DType::Q8_K, x.data(), y.data(), 4 * QK_K);
  for (int i = 0; i < 4; ++i) {
    float amax = 0, mx = 0;
    for (int e = 0; e < QK_K; ++e)
      if (std::fabs(x[QK_K * i + e]) > amax) { amax = std::fabs(x[QK_K * i + e]); mx = x[QK_K * i + e]; }
    const float iscale = -127.f / mx;
    CHECK(bits(y[i].d) == bits(1 / iscale));
    for (int e = 0; e < QK_K; ++e) {
      const int want = static_cast<int>(std::nearbyint(iscale * x[QK_K * i + e]));
      CHECK(y[i].qs[e] == (want > 127 ? 127 : want));
    }
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) s += y[i].qs[e];
      CHECK(y[i].bsums[g] == s);
    }
  }
}

TEST_CASE("reference vector expf: bits of the reference's AVX-512 sequence, not libm's", "[ops][cpu][refnum]") {
  // Inputs and outputs of the reference's 16-lane expf evaluated with AVX-512 instructions.
  const struct { float x; uint32_t want; } cases[] = {
      {0x0p+0f, 0x3f800000u},        {-0x1p-1f, 0x3f1b4597u},   {0x1p+0f, 0x402df855u},       {-0x1p+0f, 0x3ebc5ab3u},
      {0x1.f9adbcp-4f, 0x3f90d1beu}, {-0x1.ep+1f, 0x3cc0a84bu}, {0x1.5p+3f, 0x470ddb80u},     {-0x1.44p+4f, 0x30dc9eefu},
      {0x1.0624dep-9f, 0x3f80419au}, {-0x1.5cp+6f, 0x00b33686u}, {0x1.6p+6f, 0x7ef882b7u},    {-0x1.9p+6f, 0x0000001bu},
      {0x1.62e43p-1f, 0x40000000u},  {-0x1.c8p+2f, 0x3a52f4b7u}, {0x1.5p+5f, 0x5dc1192cu},     {-0x1.2cp+7f, 0x00000000u},
  };
  for (const auto &c : cases) CHECK(bits(refmath::expf_v(c.x)) == c.want);
  CHECK(refmath::expf_v(-INFINITY) == 0.0f);
  CHECK(std::isinf(refmath::expf_v(200.0f)));
}
