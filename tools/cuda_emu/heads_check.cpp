// Checks the few-token MatMulHeads kernel of matmul.cu (mmv_heads_kernel: a row on 8 / 16 / 32
// lanes, 4 / 2 / 1 rows per warp, the activation rounded on the fly; run through emu.h) against
// a float64 product of the CPU's dequantized weights and its Q8_0 / Q8_K / F16 rounding of
// the activations, for every quantized type and F16, rows past M in the last warp, GLM's
// k_b / v_b shapes. Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "quant/dtype.h"

namespace moe {  // heads_emu.cpp (generated from matmul.cu)
void emu_heads(DType t, const uint8_t *W, int64_t rb, int64_t hb, int K, int M, int H, int T, float *x, float *y);
}
using namespace moe;

int main() {
  struct Case { DType t; int K, M, H, T; };
  const Case cases[] = {{DType::Q8_0, 192, 37, 3, 2},  {DType::Q8_0, 64, 9, 2, 1},   {DType::Q4_0, 96, 13, 3, 1}, {DType::MXFP4, 1056, 5, 2, 1},
                        {DType::Q4_K, 512, 21, 3, 2},  {DType::Q4_K, 256, 17, 2, 1}, {DType::Q5_K, 768, 11, 2, 1}, {DType::Q6_K, 512, 9, 2, 2},
                        {DType::Q2_K, 256, 6, 2, 1},   {DType::Q3_K, 1280, 7, 2, 1}, {DType::F16, 100, 7, 2, 1},  {DType::Q8_0, 192, 512, 2, 1},
                        {DType::Q4_K, 512, 256, 2, 1}};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  int fails = 0;
  for (const Case &c : cases) {
    const int64_t rb = static_cast<int64_t>(row_size(c.t, c.K)), hb = rb * c.M;
    std::vector<float> wf(static_cast<size_t>(c.K) * c.M * c.H), x(static_cast<size_t>(c.K) * c.H * c.T);
    for (float &v : wf) v = nd(rng) * 0.5f;
    for (float &v : x) v = nd(rng);
    std::vector<uint8_t> W(static_cast<size_t>(hb * c.H));
    for (int64_t r = 0; r < int64_t(c.M) * c.H; ++r) quantize_row(c.t, wf.data() + r * c.K, W.data() + r * rb, c.K);
    std::vector<float> y(static_cast<size_t>(c.M) * c.H * c.T, NAN);
    emu_heads(c.t, W.data(), rb, hb, c.K, c.M, c.H, c.T, x.data(), y.data());
    // Reference: the CPU's rounding of each activation row, dequantized weights, float64 sums.
    const DType vdt = type_traits(c.t).vec_dot_type;
    std::vector<float> wd(static_cast<size_t>(c.K)), xr(static_cast<size_t>(c.K));
    std::vector<uint8_t> xq(row_size(vdt, c.K));
    double num = 0, den = 0;
    for (int t = 0; t < c.T; ++t)
      for (int h = 0; h < c.H; ++h) {
        const float *xs = x.data() + (static_cast<size_t>(t) * c.H + h) * c.K;
        quantize_row(vdt, xs, xq.data(), c.K);
        dequantize_row(vdt, xq.data(), xr.data(), c.K);
        for (int m = 0; m < c.M; ++m) {
          dequantize_row(c.t, W.data() + h * hb + m * rb, wd.data(), c.K);
          double s = 0;
          for (int k = 0; k < c.K; ++k) s += double(wd[k]) * xr[k];
          const double got = y[(static_cast<size_t>(t) * c.H + h) * c.M + m];
          num += (got - s) * (got - s);
          den += s * s;
        }
      }
    const double rel = std::sqrt(num / den);
    const bool ok = rel < 1e-5;
    std::printf("%-6s K=%-5d M=%-4d H=%d T=%d  rel %.2e  %s\n", dtype_name(c.t), c.K, c.M, c.H, c.T, rel, ok ? "ok" : "FAIL");
    fails += ok ? 0 : 1;
  }
  std::printf("%d of %zu cases failed\n", fails, sizeof(cases) / sizeof(cases[0]));
  return fails ? 1 : 0;
}
