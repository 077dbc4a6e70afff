// Multi-row x multi-column kernels (kernels/gemm.h) against a scalar statement of the float
// order they promise (the reference engine's repacked Q4_K gemv / gemm): equal bits on
// random rows, every tile shape and ragged row/column counts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/ref_order_dot.h"
#include "core/fp16.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "quant/dtype.h"
#include "quant/quant_util.h"

using namespace moe;

namespace {

// Scalar repacked-Q4_K order: per super-block the exact scaled-quant and mins sums of each
// 64-value pair of sub-blocks; gemv adds the four, gemm steps through them.
float q4k_ref(int n, const BlockQ4_K *x, const BlockQ8_K *y, bool gemm) {
  float acc = 0.f, accm = 0.f;
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    const float dm = fp16_to_fp32(x[i].dmin) * y[i].d;
    uint8_t sc[8], mn[8];
    unpack_q4k_scales(x[i].scales, sc, mn);
    int32_t q[4], m[4];
    for (int j = 0; j < 4; ++j) {
      int32_t lo = 0, hi = 0;
      for (int b = 0; b < 32; ++b) {
        lo += int32_t(x[i].qs[32 * j + b] & 0xF) * y[i].qs[64 * j + b];
        hi += int32_t(x[i].qs[32 * j + b] >> 4) * y[i].qs[64 * j + 32 + b];
      }
      q[j] = sc[2 * j] * lo + sc[2 * j + 1] * hi;
      m[j] = mn[2 * j] * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + mn[2 * j + 1] * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
    }
    if (gemm) {
      for (int j = 0; j < 4; ++j) {
        acc = std::fma(static_cast<float>(q[j]), d, acc);
        accm = std::fma(static_cast<float>(m[j]), dm, accm);
      }
    } else {
      acc = std::fma(static_cast<float>(q[0] + q[1] + q[2] + q[3]), d, acc);
      accm = std::fma(static_cast<float>(m[0] + m[1] + m[2] + m[3]), dm, accm);
    }
  }
  return acc - accm;
}

}  // namespace

TEST_CASE("Q4_K gemm tiles equal the scalar repacked-Q4_K order bit for bit", "[quant][cpu][gemm]") {
  if (!cpu_gemm_q4_K_supported()) SUCCEED("no fast Q4_K gemm kernel on this CPU");
  if (!cpu_gemm_q4_K_supported()) return;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  const int n = 1024;
  const size_t ws = row_size(DType::Q4_K, n), xsz = row_size(DType::Q8_K, n);
  for (int nrows : {1, 5, 16, 19, 40}) {
    for (int ncols : {1, 2, 3, 4, 6, 9, 23, 75}) {  // 23, 75: several 8-column groups per tile, and more than one tile
      for (bool gemm : {false, true}) {
        std::vector<uint8_t> w(ws * nrows), x(xsz * ncols);
        std::vector<float> f(n);
        for (int r = 0; r < nrows; ++r) {
          for (auto &v : f) v = nd(rng) + (r % 3 == 0 ? 0.4f : 0.f);  // offset rows exercise the mins
          quantize_row(DType::Q4_K, f.data(), w.data() + r * ws, n);
        }
        for (int c = 0; c < ncols; ++c) {
          for (auto &v : f) v = nd(rng) * (c % 2 ? 30.f : 1.f);
          quantize_row(DType::Q8_K, f.data(), x.data() + c * xsz, n);
        }
        std::vector<float> out(static_cast<size_t>(nrows) * ncols, -1.f);
        std::vector<float *> outs(ncols);
        std::vector<const void *> xs(ncols);
        for (int c = 0; c < ncols; ++c) { outs[c] = out.data() + c * nrows; xs[c] = x.data() + c * xsz; }
        cpu_gemm_q4_K(n, nrows, ncols, outs.data(), w.data(), ws, xs.data(), gemm ? Q4kOrder::Gemm : Q4kOrder::Gemv);
        for (int c = 0; c < ncols; ++c)
          for (int r = 0; r < nrows; ++r) {
            // gemm order covers the full groups of 4 columns; the rest run gemv order
            const bool g = gemm && c < ncols - ncols % 4;
            const float want = q4k_ref(n, reinterpret_cast<const BlockQ4_K *>(w.data() + r * ws),
                                       reinterpret_cast<const BlockQ8_K *>(x.data() + c * xsz), g);
            INFO("rows " << nrows << " cols " << ncols << " gemm " << gemm << " r " << r << " c " << c);
            uint32_t a, b;
            std::memcpy(&a, &out[c * nrows + r], 4);
            std::memcpy(&b, &want, 4);
            REQUIRE(a == b);
          }
      }
    }
  }
}

TEST_CASE("Q4_K gemm tiles equal ref_order_dot_rows on the repacked paths", "[quant][cpu][gemm]") {
  if (!cpu_gemm_q4_K_supported()) return;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  const int n = 768, nrows = 24, ncols = 7;
  const size_t ws = row_size(DType::Q4_K, n), xsz = row_size(DType::Q8_K, n);
  std::vector<uint8_t> w(ws * nrows), x(xsz * ncols);
  std::vector<float> f(n);
  for (int r = 0; r < nrows; ++r) {
    for (auto &v : f) v = nd(rng) + 0.2f * (r % 4);
    quantize_row(DType::Q4_K, f.data(), w.data() + r * ws, n);
  }
  for (int c = 0; c < ncols; ++c) {
    for (auto &v : f) v = nd(rng);
    quantize_row(DType::Q8_K, f.data(), x.data() + c * xsz, n);
  }
  for (bool gemm : {false, true}) {
    std::vector<float> out(static_cast<size_t>(nrows) * ncols), want(nrows);
    std::vector<float *> outs(ncols);
    std::vector<const void *> xs(ncols);
    for (int c = 0; c < ncols; ++c) { outs[c] = out.data() + c * nrows; xs[c] = x.data() + c * xsz; }
    cpu_gemm_q4_K(n, nrows, ncols, outs.data(), w.data(), ws, xs.data(), gemm ? Q4kOrder::Gemm : Q4kOrder::Gemv);
    for (int c = 0; c < ncols; ++c) {
      const RefPath p = gemm && c < ncols - ncols % 4 ? RefPath::RepackGemm : RefPath::RepackGemv;
      ref_order_dot_rows(DType::Q4_K, n, nrows, want.data(), w.data(), ws, xs[c], p);
      for (int r = 0; r < nrows; ++r) {
        INFO("gemm " << gemm << " r " << r << " c " << c);
        REQUIRE(std::memcmp(&out[c * nrows + r], &want[r], 4) == 0);
      }
    }
  }
}

TEST_CASE("which vec_dot kernels already follow the reference order", "[.][gemm-info]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  const int n = 1024, nrows = 16;
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const DType at = type_traits(t).vec_dot_type;
    const size_t ws = row_size(t, n);
    std::vector<uint8_t> w(ws * nrows), x(row_size(at, n));
    std::vector<float> f(n);
    for (int r = 0; r < nrows; ++r) {
      for (auto &v : f) v = nd(rng) + 0.3f;
      quantize_row(t, f.data(), w.data() + r * ws, n);
    }
    for (auto &v : f) v = nd(rng);
    quantize_row(at, f.data(), x.data(), n);
    std::vector<float> a(nrows), b(nrows);
    cpu_vec_dot_rows(t, n, nrows, a.data(), w.data(), ws, x.data());
    ref_order_dot_rows(t, n, nrows, b.data(), w.data(), ws, x.data(), RefPath::VecDot);
    WARN(dtype_name(t) << " vec_dot == ref VecDot: " << (std::memcmp(a.data(), b.data(), 4 * nrows) == 0));
  }
}

TEST_CASE("Q6_K gemm tiles equal ref_order_dot_rows (VecDot) bit for bit", "[quant][cpu][gemm]") {
  if (!cpu_gemm_q6_K_supported()) return;
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0, 1);
  const int n = 768;
  const size_t ws = row_size(DType::Q6_K, n), xsz = row_size(DType::Q8_K, n);
  for (int nrows : {1, 4, 9, 16}) {
    for (int ncols : {1, 2, 3, 4, 5, 8}) {
      std::vector<uint8_t> w(ws * nrows), x(xsz * ncols);
      std::vector<float> f(n);
      for (int r = 0; r < nrows; ++r) {
        for (auto &v : f) v = nd(rng) * (r % 2 ? 3.f : 1.f) + 0.1f * r;
        quantize_row(DType::Q6_K, f.data(), w.data() + r * ws, n);
      }
      for (int c = 0; c < ncols; ++c) {
        for (auto &v : f) v = nd(rng) * (c % 3 ? 1.f : 40.f);
        quantize_row(DType::Q8_K, f.data(), x.data() + c * xsz, n);
      }
      std::vector<float> out(static_cast<size_t>(nrows) * ncols), want(nrows);
      std::vector<float *> outs(ncols);
      std::vector<const void *> xs(ncols);
      for (int c = 0; c < ncols; ++c) { outs[c] = out.data() + c * nrows; xs[c] = x.data() + c * xsz; }
      cpu_gemm_q6_K(n, nrows, ncols, outs.data(), w.data(), ws, xs.data());
      for (int c = 0; c < ncols; ++c) {
        ref_order_dot_rows(DType::Q6_K, n, nrows, want.data(), w.data(), ws, xs[c], RefPath::VecDot);
        for (int r = 0; r < nrows; ++r) {
          INFO("rows " << nrows << " cols " << ncols << " r " << r << " c " << c);
          REQUIRE(std::memcmp(&out[c * nrows + r], &want[r], 4) == 0);
        }
      }
    }
  }
}
