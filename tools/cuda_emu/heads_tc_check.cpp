// Checks MatMulHeads' tensor-core path (matmul_heads.cu) through emu.h: heads_tables_kernel's
// routing tables drive the F16 GEMM of matmul_mma.cu (its MatMulId mode, head h as expert h)
// on activations laid out as act_round_kernel writes them (row t H + h, F16-rounded); every
// out[:, h, t] must match a float64 product W_h x[:, h, t]. Partial row tiles (M 130), partial
// token tiles (T 70: 64 + 6 per head), odd K (a partial K step). Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>

#include "backends/cuda/ops/matmul_mma.h"
#include "quant/dtype.h"

namespace moe {  // heads_tables_emu.cpp
void emu_heads_tables(int H, int T, int tph, int2 *entries, int4 *tiles);
}
using namespace moe;

static float f16_round(float v) { return __half2float(__float2half_rn(v)); }

// RMS relative error of the written outputs against their float64 references; NaN = unwritten.
struct ErrSum {
  double num = 0, den = 0;
  int missing = 0;
  void add(float got, double ref) {
    if (std::isnan(got)) ++missing;
    else {
      num += (got - ref) * (got - ref);
      den += ref * ref;
    }
  }
  double rel() const { return std::sqrt(num / den); }
};

// Q4_K and Q6_K on the same kernel (cuda_set_mma_dequant): weights quantized by the CPU's
// reference quantizer, dequantized by each block to f16; activations f16-rounded. Reference:
// the CPU's dequantization, each weight rounded to f16, float64 products. Dense (partial row and
// column tiles) and MatMulId (two experts, one with two tiles, a skipped one); Q4_K 16-byte and
// 2-byte aligned (its byte-load path), Q6_K's 210-byte rows (odd rows 2 mod 4) and a 2-byte
// shifted base.
static int dequant_cases() {
  struct Case { DType t; int K, M, N; bool moe, misalign; };
  const Case cases[] = {{DType::Q4_K, 512, 130, 70, false, false}, {DType::Q4_K, 256, 37, 16, false, true},
                        {DType::Q4_K, 768, 200, 75, true, false},  {DType::Q4_K, 512, 64, 9, true, true},
                        {DType::Q6_K, 512, 130, 70, false, false}, {DType::Q6_K, 256, 37, 16, false, true},
                        {DType::Q6_K, 768, 200, 75, true, false},  {DType::Q6_K, 256, 65, 9, true, true}};
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0, 1);
  int fails = 0;
  for (const Case &c : cases) {
    const int K = c.K, M = c.M, N = c.N, E = c.moe ? 3 : 1;
    const int64_t rb = int64_t(K) / 256 * (c.t == DType::Q4_K ? 144 : 210), eb = rb * M;
    std::vector<uint8_t> wbuf(static_cast<size_t>(eb * E) + 16);
    uint8_t *W = wbuf.data() + (c.misalign ? 2 : 0);
    std::vector<float> wref(static_cast<size_t>(K) * M * E), row(static_cast<size_t>(K));
    for (int r = 0; r < M * E; ++r) {
      for (float &v : row) v = nd(rng) * 0.3f;
      quantize_row(c.t, row.data(), W + r * rb, K);
      dequantize_row(c.t, W + r * rb, wref.data() + static_cast<size_t>(r) * K, K);
    }
    for (float &v : wref) v = f16_round(v);
    std::vector<float> X(static_cast<size_t>(K) * N);
    for (float &v : X) v = f16_round(nd(rng));
    std::vector<float> Y(static_cast<size_t>(M) * N, NAN);
    std::vector<int> expert_of(static_cast<size_t>(N), 0), out_row(static_cast<size_t>(N));
    for (int n = 0; n < N; ++n) out_row[static_cast<size_t>(n)] = n;
    if (!c.moe) {
      launch_mma_matmul(c.t, nullptr, W, rb, 0, K, M, X.data(), Y.data(), N, nullptr, nullptr, (N + kMmaCols - 1) / kMmaCols);
    } else {
      // Entries in expert order: columns 0 .. N-6 to expert 0 (two tiles when > 64), the last 5
      // to expert 2 (expert 1: none), output rows reversed.
      std::vector<int2> entries;
      std::vector<int4> tiles;
      for (int e : {0, 2}) {
        const int first = static_cast<int>(entries.size());
        for (int n = 0; n < N; ++n)
          if ((n >= N - 5) == (e == 2)) {
            expert_of[static_cast<size_t>(n)] = e;
            out_row[static_cast<size_t>(n)] = N - 1 - n;
            entries.push_back(make_int2(n, N - 1 - n));
          }
        for (int t0 = first; t0 < static_cast<int>(entries.size()); t0 += kMmaCols)
          tiles.push_back(make_int4(e, t0, std::min(kMmaCols, static_cast<int>(entries.size()) - t0), 0));
      }
      tiles.push_back(make_int4(1, 0, 0, 0));  // an empty tile exits
      launch_mma_matmul(c.t, nullptr, W, rb, eb, K, M, X.data(), Y.data(), 0, tiles.data(), entries.data(),
                        static_cast<int>(tiles.size()));
    }
    ErrSum err;
    for (int n = 0; n < N; ++n)
      for (int m = 0; m < M; ++m) {
        double s = 0;
        const float *w = wref.data() + (static_cast<size_t>(expert_of[static_cast<size_t>(n)]) * M + m) * K;
        for (int k = 0; k < K; ++k) s += double(w[k]) * X[static_cast<size_t>(n) * K + k];
        err.add(Y[static_cast<size_t>(out_row[static_cast<size_t>(n)]) * M + m], s);
      }
    const bool ok = err.missing == 0 && err.rel() < 1e-4;
    std::printf("%s K=%-3d M=%-3d N=%-3d %s%s  rel %.2e  unwritten %d  %s\n", dtype_name(c.t), K, M, N, c.moe ? "matmul_id" : "dense",
                c.misalign ? " (2-byte aligned base)" : "", err.rel(), err.missing, ok ? "ok" : "FAIL");
    fails += ok ? 0 : 1;
  }
  std::printf("Q4_K / Q6_K: %d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  return fails;
}

int main() {
  struct Case { int K, M, H, T; };
  const Case cases[] = {{40, 130, 3, 70}, {64, 37, 2, 16}, {37, 64, 1, 129}};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0, 1);
  int fails = 0;
  for (const Case &c : cases) {
    const int K = c.K, M = c.M, H = c.H, T = c.T, tph = (T + kMmaCols - 1) / kMmaCols;
    std::vector<__half> W(static_cast<size_t>(K) * M * H);
    for (auto &w : W) w = __float2half_rn(nd(rng) * 0.5f);
    std::vector<float> x(static_cast<size_t>(K) * H * T), X(x.size());
    for (float &v : x) v = nd(rng);
    for (int t = 0; t < T; ++t)  // x[:, h, t] is element (h, t) of [K, H, T]: act_round's row t H + h
      for (int h = 0; h < H; ++h)
        for (int k = 0; k < K; ++k) X[(static_cast<size_t>(t) * H + h) * K + k] = f16_round(x[(static_cast<size_t>(t) * H + h) * K + k]);
    std::vector<int2> entries(static_cast<size_t>(H) * T, make_int2(-7, -7));
    std::vector<int4> tiles(static_cast<size_t>(H) * tph, make_int4(-7, -7, -7, -7));
    emu_heads_tables(H, T, tph, entries.data(), tiles.data());
    std::vector<float> Y(static_cast<size_t>(M) * H * T, NAN);
    launch_mma_matmul(DType::F16, nullptr, reinterpret_cast<const uint8_t *>(W.data()), int64_t(K) * 2, int64_t(K) * M * 2, K, M, X.data(),
                      Y.data(), 0, tiles.data(), entries.data(), H * tph);
    ErrSum err;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int m = 0; m < M; ++m) {
          double s = 0;
          for (int k = 0; k < K; ++k)
            s += double(__half2float(W[(static_cast<size_t>(h) * M + m) * K + k])) * X[(static_cast<size_t>(t) * H + h) * K + k];
          err.add(Y[(static_cast<size_t>(t) * H + h) * M + m], s);  // out[:, h, t]
        }
    const bool ok = err.missing == 0 && err.rel() < 1e-5;
    std::printf("K=%-3d M=%-3d H=%d T=%-3d  rel %.2e  unwritten %d  %s\n", K, M, H, T, err.rel(), err.missing, ok ? "ok" : "FAIL");
    fails += ok ? 0 : 1;
  }
  std::printf("%d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  fails += dequant_cases();
  return fails ? 1 : 0;
}
