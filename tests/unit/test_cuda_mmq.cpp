// The exact-product tensor-core GEMM (ops/matmul_mmq.cu) rests on unpack32<T>: every
// quantized sub-block as weight = a * q + b per 16 weights, q a small integer. This checks
// that decomposition on the device against dequant32 (and both against the CPU's reference
// dequantizer) on random blocks of every type the kernels take, and the kernels' own staging
// of a sub-block decoded back to weights: int8 integers with integer group scales, (d, dmin)
// and min integers for Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K (matmul_mmq_i8.cu; Q6_K rows of
// 210-byte blocks read through aligned words on both alignments), f16 integers with folded
// group scales for MXFP4 / Q2_K / Q3_K (matmul_mmq.cu). The GEMM itself is compared with the CPU in test_cuda_ops.cpp
// ([mma]). WARNs and returns without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "quant/dtype.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/ops/matmul_mma.h"
#endif

using namespace moe;

TEST_CASE("cuda mmq: unpack32 integers and scales reproduce dequant32 and the CPU, every quantized type", "[ops][cuda][mma]") {
  BackendRegistry reg;
  if (!reg.find("cuda")) {
    WARN("no CUDA device (or a build without CUDA): CUDA test skipped");
    return;
  }
#ifdef MOEINFER_WITH_CUDA
  const DType types[] = {DType::Q4_0, DType::Q8_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  const int64_t K = 2048;
  const int n_sub = static_cast<int>(K / 32);
  uint32_t seed = 900;
  for (DType t : types) {
    const bool with_min = t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K;
    const bool per32 = !(t == DType::Q2_K || t == DType::Q3_K || t == DType::Q6_K);
    // Varied magnitudes per 256 values so the block scales differ widely.
    std::vector<float> x = moe_test::randn(static_cast<size_t>(K), seed++);
    for (int64_t i = 0; i < K; ++i) x[static_cast<size_t>(i)] *= std::ldexp(1.0f, static_cast<int>((i / 256) % 7) - 3);
    std::vector<uint8_t> row(row_size(t, K));
    quantize_row(t, x.data(), row.data(), K);
    std::vector<float> ref(static_cast<size_t>(K)), w(static_cast<size_t>(K)), staged(static_cast<size_t>(K)),
        ab(static_cast<size_t>(4 * n_sub));
    std::vector<int> q(static_cast<size_t>(K));
    dequantize_row(t, row.data(), ref.data(), K);
    {  // device copies, one launch, results back (cudaMemcpy on the default stream waits for it)
      uint8_t *d_row = nullptr;
      float *d_w = nullptr, *d_ab = nullptr, *d_st = nullptr;
      int *d_q = nullptr;
      const size_t nw = static_cast<size_t>(32 * n_sub);
      REQUIRE(cudaMalloc(&d_row, row.size()) == cudaSuccess);
      REQUIRE(cudaMalloc(&d_w, nw * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMalloc(&d_q, nw * sizeof(int)) == cudaSuccess);
      REQUIRE(cudaMalloc(&d_ab, ab.size() * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMalloc(&d_st, nw * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMemcpy(d_row, row.data(), row.size(), cudaMemcpyHostToDevice) == cudaSuccess);
      cuda_unpack32_check_launch(t, d_row, n_sub, d_w, d_q, d_ab, d_st, nullptr);
      REQUIRE(cudaMemcpy(w.data(), d_w, nw * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      REQUIRE(cudaMemcpy(q.data(), d_q, nw * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
      REQUIRE(cudaMemcpy(ab.data(), d_ab, ab.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      REQUIRE(cudaMemcpy(staged.data(), d_st, nw * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      for (void *p : {static_cast<void *>(d_row), static_cast<void *>(d_w), static_cast<void *>(d_q), static_cast<void *>(d_ab),
                      static_cast<void *>(d_st)})
        cudaFree(p);
    }
    int bad_ref = 0, bad_affine = 0, bad_q = 0, bad_scale = 0, bad_staged = 0;
    for (int s = 0; s < n_sub; ++s) {
      const float *abs = ab.data() + 4 * s;
      const float a[2] = {abs[0], abs[1]}, b[2] = {abs[2], abs[3]};
      if (!with_min && (b[0] != 0.0f || b[1] != 0.0f)) ++bad_scale;
      if (per32 && (a[0] != a[1] || b[0] != b[1])) ++bad_scale;
      double scale = 0;  // the sub-block's magnitude, for the tolerances
      for (int l = 0; l < 32; ++l) scale = std::max(scale, std::fabs(double(ref[static_cast<size_t>(32 * s + l)])));
      const double tol = 1e-6 * scale + 1e-30;
      for (int l = 0; l < 32; ++l) {
        const size_t i = static_cast<size_t>(32 * s + l);
        if (q[i] < -128 || q[i] > 127) ++bad_q;
        if (std::fabs(double(w[i]) - ref[i]) > tol) ++bad_ref;
        const double affine = double(a[l / 16]) * q[i] + double(b[l / 16]);
        if (std::fabs(affine - w[i]) > tol) ++bad_affine;
        if (!(std::fabs(double(staged[i]) - w[i]) <= tol)) ++bad_staged;
      }
    }
    INFO("type " << dtype_name(t));
    CHECK(bad_ref == 0);     // dequant32 (now defined through unpack32) vs the CPU dequantizer
    CHECK(bad_affine == 0);  // a * q + b vs dequant32
    CHECK(bad_q == 0);       // integers fit the f16 packing of the kernel
    CHECK(bad_scale == 0);   // b only with a min term; one (a, b) per 32 where the kernel folds per 32
    CHECK(bad_staged == 0);  // the MMQ kernel's shared-memory staging (int8 or f16) decodes to the same weights
  }
#endif
}
