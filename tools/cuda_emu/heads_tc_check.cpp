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

#include "backends/cuda/ops/matmul_mma.h"

namespace moe {  // heads_tables_emu.cpp
void emu_heads_tables(int H, int T, int tph, int2 *entries, int4 *tiles);
}
using namespace moe;

static float f16_round(float v) { return __half2float(__float2half_rn(v)); }

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
    double num = 0, den = 0;
    int missing = 0;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int m = 0; m < M; ++m) {
          double s = 0;
          for (int k = 0; k < K; ++k)
            s += double(__half2float(W[(static_cast<size_t>(h) * M + m) * K + k])) * X[(static_cast<size_t>(t) * H + h) * K + k];
          const float got = Y[(static_cast<size_t>(t) * H + h) * M + m];  // out[:, h, t]
          if (std::isnan(got)) ++missing;
          else {
            num += (got - s) * (got - s);
            den += s * s;
          }
        }
    const double rel = std::sqrt(num / den);
    const bool ok = missing == 0 && rel < 1e-5;
    std::printf("K=%-3d M=%-3d H=%d T=%-3d  rel %.2e  unwritten %d  %s\n", K, M, H, T, rel, missing, ok ? "ok" : "FAIL");
    fails += ok ? 0 : 1;
  }
  std::printf("%d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  return fails ? 1 : 0;
}
