// Random inputs and error measures shared by the op tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace moe_test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

inline double max_abs_diff(const std::vector<float> &a, const std::vector<double> &b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// T tokens, each routed to k distinct experts of E (MatMulId's ids, [k, T]).
inline std::vector<int32_t> random_ids(int64_t T, int64_t E, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T * k)), e(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < E; ++i) e[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(e.begin(), e.end(), rng);
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(t * k + j)] = e[static_cast<size_t>(j)];
  }
  return ids;
}

// Rows of n values scaled to unit L2 norm (as the models feed DeltaNet's q and k).
inline std::vector<float> unit_rows(std::vector<float> v, int64_t n) {
  const size_t w = static_cast<size_t>(n);
  for (size_t r = 0; r < v.size() / w; ++r) {
    double s = 0;
    for (size_t i = 0; i < w; ++i) s += static_cast<double>(v[r * w + i]) * v[r * w + i];
    for (size_t i = 0; i < w; ++i) v[r * w + i] /= static_cast<float>(std::sqrt(s));
  }
  return v;
}

// max |a - b| / max(1, max |b|); 1e30 when a holds a non-finite value.
template <typename B> double scaled_diff(const std::vector<float> &a, const std::vector<B> &b) {
  double m = 1, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return d / m;
}

}  // namespace moe_test
