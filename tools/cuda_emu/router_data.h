// Test data and host references shared by the router checks (router_check.cpp: fused.cu's
// router_mv_kernel; router_topk_check.cpp: router_topk.cu's topk_router_kernel).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/kernels/ref_math.h"

// The CPU's Softmax of one row (backends/cpu/ops/elementwise.cpp, scalar form).
inline std::vector<float> cpu_softmax(const std::vector<float> &x) {
  const size_t n = x.size(), n16 = n & ~size_t{15};
  float mx = -INFINITY;
  for (float v : x) mx = std::fmax(mx, v);
  std::vector<float> d(n);
  double sum = 0.0;
  for (size_t i = 0; i < n16; ++i) d[i] = moe::refmath::expf_v(x[i] - mx);
  for (size_t i = 0; i < n16; i += 16) sum += static_cast<double>(moe::refmath::hsum16(d.data() + i));
  for (size_t i = n16; i < n; ++i) sum += d[i] = std::exp(x[i] - mx);
  const float inv = static_cast<float>(1.0 / sum);
  for (float &v : d) v *= inv;
  return d;
}

// A router's random inputs, drawn from rng in this order: the weight, E rows of K values at row
// stride rs (the padding after each row NAN); the activation row x [K]; the norm's row weight
// nw [K] (about 1).
struct RouterRows {
  std::vector<float> w, x, nw;
};
inline RouterRows router_rows(std::mt19937 &rng, std::normal_distribution<float> &nd, int K, int E, int64_t rs) {
  RouterRows r{std::vector<float>(static_cast<size_t>(rs) * E, NAN), std::vector<float>(K), std::vector<float>(K)};
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < K; ++i) r.w[static_cast<size_t>(e) * rs + i] = 0.05f * nd(rng);
  for (auto &v : r.x) v = nd(rng);
  for (auto &v : r.nw) v = 1.0f + 0.1f * nd(rng);
  return r;
}

// The float64 activation the router's MatMul sees: x, or RmsNorm(x) * nw with eps (norm).
inline std::vector<double> router_input(const RouterRows &r, bool norm, double eps) {
  const int K = static_cast<int>(r.x.size());
  double ss = 0;
  for (float v : r.x) ss += double(v) * v;
  const double scale = 1.0 / std::sqrt(ss / K + eps);
  std::vector<double> a(K);
  for (int i = 0; i < K; ++i) a[i] = norm ? r.x[i] * scale * r.nw[i] : r.x[i];
  return a;
}

// Rows 3 and 7 of the weight alike, ~3 sigma above the rest on the activation a: a tie for the
// top two (the lower index first).
inline void tie_rows_3_7(RouterRows &r, int64_t rs, const std::vector<double> &a) {
  const int K = static_cast<int>(a.size());
  for (int i = 0; i < K; ++i) r.w[3 * rs + i] = r.w[7 * rs + i] = static_cast<float>(0.15 * a[i] / std::sqrt(static_cast<double>(K)));
}
