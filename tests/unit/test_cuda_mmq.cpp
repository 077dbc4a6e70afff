// The exact-product tensor-core GEMM (ops/matmul_mmq.cu) rests on unpack32<T>: every
// quantized sub-block as weight = a * q + b per 16 weights, q a small integer. This checks
// that decomposition on the device against dequant32 (and both against the CPU's reference
// dequantizer) on random blocks of every type the kernels take, and the kernels' own staging
// of a sub-block decoded back to weights: int8 integers with integer group scales, (d, dmin)
// and min integers for Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K (matmul_mmq_i8.cu; Q6_K rows of
// 210-byte blocks read through aligned words on both alignments), f16 integers with folded
// group scales for MXFP4 / Q2_K / Q3_K (matmul_mmq.cu). The GEMM itself is compared with the CPU in test_cuda_ops.cpp
// ([mma]). Also the dense GEMMs with K split over blocks: the partials summed by each tile's
// last split block equal the separate sum launch bit for bit. WARNs and returns without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "quant/dtype.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include <cstring>
#include <random>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/matmul_f32.h"
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

#ifdef MOEINFER_WITH_CUDA
namespace {

// A device copy of v (freed with the object).
template <class V> struct DevBuf {
  V *p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { REQUIRE(cudaMalloc(&p, n * sizeof(V)) == cudaSuccess); }
  explicit DevBuf(const std::vector<V> &v) : DevBuf(v.size()) { REQUIRE(cudaMemcpy(p, v.data(), n * sizeof(V), cudaMemcpyHostToDevice) == cudaSuccess); }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  ~DevBuf() { cudaFree(p); }
  std::vector<V> get() const {
    std::vector<V> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(V), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
};

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace
#endif

TEST_CASE("cuda mmq: K splits summed by each tile's last block equal the separate sum launch bit for bit", "[ops][cuda][mma]") {
  BackendRegistry reg;
  if (!reg.find("cuda")) {
    WARN("no CUDA device (or a build without CUDA): CUDA test skipped");
    return;
  }
#ifdef MOEINFER_WITH_CUDA
  // The executor's counters (DevUbatch::sync): zero at rest, and again after every launch.
  DevBuf<unsigned> sync(std::vector<unsigned>(kCudaSyncSlots, 0u));
  auto counters_zero = [&] {
    const std::vector<unsigned> c = sync.get();
    return std::all_of(c.begin(), c.end(), [](unsigned v) { return v == 0; });
  };
  std::mt19937 rng(4242);
  // int8 MMQ (launch_mmq_i8_matmul): every type; K 8 ways at the k/v projections' shape,
  // narrow tiles, 3 uneven splits on partial tiles; weights 16-byte aligned (the raw Q4_K /
  // Q6_K kernels) and 2 bytes off (mmq_i8_kernel for Q4_K).
  struct Shape { int K, M, N, splits; };
  const Shape shapes[] = {{2048, 512, 512, 8}, {2048, 130, 40, 8}, {1280, 203, 77, 3}, {512, 64, 16, 2}};
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::MXFP4, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (const Shape &sh : shapes)
      for (int w_off : {0, 2}) {
        INFO("type " << dtype_name(t) << " K=" << sh.K << " M=" << sh.M << " N=" << sh.N << " splits=" << sh.splits << " W offset " << w_off);
        const size_t rb = row_size(t, sh.K);
        std::vector<uint8_t> w(static_cast<size_t>(w_off) + rb * sh.M);
        const std::vector<float> wf = moe_test::randn(static_cast<size_t>(sh.K) * sh.M, rng(), 0.5f);
        for (int m = 0; m < sh.M; ++m) quantize_row(t, wf.data() + static_cast<size_t>(m) * sh.K, w.data() + w_off + rb * m, sh.K);
        std::vector<int8_t> xq(static_cast<size_t>(sh.N) * sh.K);
        for (auto &q : xq) q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        std::vector<float2> xs(xq.size() / 16);
        for (size_t g = 0; g < xs.size(); ++g) {
          int sum = 0;
          for (int i = 0; i < 16; ++i) sum += xq[16 * g + i];
          xs[g] = make_float2(0.001f + static_cast<float>(rng() % 1000) * 1e-5f, static_cast<float>(sum));
        }
        DevBuf<uint8_t> d_w(w);
        DevBuf<int8_t> d_xq(xq);
        DevBuf<float2> d_xs(xs);
        DevBuf<float> part(static_cast<size_t>(sh.splits) * sh.N * sh.M), y_sep(static_cast<size_t>(sh.N) * sh.M),
            y_last(static_cast<size_t>(sh.N) * sh.M);
        const int n_col_tiles = (sh.N + kMmaCols - 1) / kMmaCols;
        auto run = [&](float *y, unsigned *counters) {
          launch_mmq_i8_matmul(t, nullptr, d_w.p + w_off, static_cast<int64_t>(rb), 0, sh.K, sh.M, d_xq.p, d_xs.p, y, sh.N, nullptr, nullptr,
                               n_col_tiles, part.p, sh.splits, counters);
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        };
        run(y_sep.p, nullptr);  // sum_k_splits_kernel
        const std::vector<float> ref = y_sep.get();
        for (int rep = 0; rep < 2; ++rep) {  // the second launch starts from the counters the first left
          run(y_last.p, sync.p);
          CHECK(same_bits(y_last.get(), ref));
          CHECK(counters_zero());
        }
      }
  // The F32 GEMM of the routers (launch_sgemm_f32): the splits it picks for an H200, and 16.
  const Shape f32_shapes[] = {{2048, 128, 512, sgemm_f32_splits(2048, 128, 512, 132)}, {2000, 100, 300, 16}, {4096, 64, 70, 5}};
  for (const Shape &sh : f32_shapes) {
    INFO("F32 K=" << sh.K << " M=" << sh.M << " N=" << sh.N << " splits=" << sh.splits);
    REQUIRE(sh.splits > 1);
    DevBuf<float> d_w(moe_test::randn(static_cast<size_t>(sh.K) * sh.M, rng())), d_x(moe_test::randn(static_cast<size_t>(sh.K) * sh.N, rng()));
    DevBuf<float> part(static_cast<size_t>(sh.splits) * sh.N * sh.M), y_sep(static_cast<size_t>(sh.N) * sh.M),
        y_last(static_cast<size_t>(sh.N) * sh.M);
    auto run = [&](float *y, unsigned *counters) {
      launch_sgemm_f32(reinterpret_cast<const uint8_t *>(d_w.p), static_cast<int64_t>(sh.K) * 4, sh.K, sh.M, d_x.p, sh.N, y, part.p, sh.splits,
                       counters, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    };
    run(y_sep.p, nullptr);
    const std::vector<float> ref = y_sep.get();
    for (int rep = 0; rep < 2; ++rep) {
      run(y_last.p, sync.p);
      CHECK(same_bits(y_last.get(), ref));
      CHECK(counters_zero());
    }
  }
#endif
}
