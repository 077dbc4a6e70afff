// MoE pieces beyond plain top-k: grouped expert selection (DeepSeek-V3 style), per-expert
// biases (gpt-oss), and gpt-oss's clamped SwiGLU.
#include <algorithm>
#include <cmath>

#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

size_t cpu_grouped_top_k_work(const Node &n, int n_threads) {
  // per thread: group scores + kept-group flags
  return static_cast<size_t>(n_threads) * (static_cast<size_t>(n.ip[1]) * 8 + 64);
}

void cpu_grouped_top_k(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t E = x.ne[0], k = a.n.ip[0], G = a.n.ip[1], G_used = a.n.ip[2], per = E / G, T = a.n.ne[1];
  float *gscore = reinterpret_cast<float *>(a.work + static_cast<size_t>(a.ith) * (static_cast<size_t>(G) * 8 + 64));
  int32_t *kept = reinterpret_cast<int32_t *>(gscore + G);
  int64_t r0, r1;
  split_rows(T, a.ith, a.nth, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float *s = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
    int32_t *dst = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(a.n.data) + t * a.n.nb[1]);
    // Group score: sum of the group's two best scores (its only score if it has one).
    for (int64_t g = 0; g < G; ++g) {
      const float *p = s + g * per;
      int64_t b1 = 0;
      for (int64_t i = 1; i < per; ++i) if (p[i] > p[b1]) b1 = i;
      int64_t b2 = -1;
      for (int64_t i = 0; i < per; ++i) if (i != b1 && (b2 < 0 || p[i] > p[b2])) b2 = i;
      gscore[g] = b2 < 0 ? p[b1] : p[b1] + p[b2];
      kept[g] = 0;
    }
    for (int64_t j = 0; j < G_used; ++j) {
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g)
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      kept[best] = 1;
    }
    // k passes of "largest not yet taken among kept groups, lowest index on ties".
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (!kept[e / per]) continue;
        bool taken = false;
        for (int64_t q = 0; q < j; ++q) taken |= dst[q] == e;
        if (taken) continue;
        if (best < 0 || s[e] > s[best]) best = static_cast<int32_t>(e);
      }
      dst[j] = best;
    }
  }
}

void cpu_add_id(const CpuKernelArgs &a) {
  const Node &x = a.src(0), &b = a.src(1), &ids = a.src(2);
  const int64_t M = a.n.ne[0], k = a.n.ne[1], T = a.n.ne[2], E = b.ne[1];
  int64_t r0, r1;
  split_rows(k * T, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t j = r % k, t = r / k;
    const int32_t e = *reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(ids.data) + j * ids.nb[0] + t * ids.nb[1]);
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + j * x.nb[1] + t * x.nb[2]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + j * a.n.nb[1] + t * a.n.nb[2]);
    if (e < 0 || e >= E) {
      a.error->store(kErrBadExpertId);
      for (int64_t i = 0; i < M; ++i) dst[i] = src[i];
      continue;
    }
    const float *bias = reinterpret_cast<const float *>(static_cast<const uint8_t *>(b.data) + e * b.nb[1]);
    for (int64_t i = 0; i < M; ++i) dst[i] = src[i] + bias[i];
  }
}

void cpu_swiglu_oai(const CpuKernelArgs &a) {
  const Node &g = a.src(0), &u = a.src(1);
  const float alpha = a.n.fp[0], limit = a.n.fp[1];
  const int64_t n = a.n.ne[0], nrows = a.n.ne[1] * a.n.ne[2] * a.n.ne[3];
  int64_t r0, r1;
  split_rows(nrows, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i1 = r % a.n.ne[1], i2 = (r / a.n.ne[1]) % a.n.ne[2], i3 = r / (a.n.ne[1] * a.n.ne[2]);
    const float *pg = reinterpret_cast<const float *>(static_cast<const uint8_t *>(g.data) + i1 * g.nb[1] + i2 * g.nb[2] + i3 * g.nb[3]);
    const float *pu = reinterpret_cast<const float *>(static_cast<const uint8_t *>(u.data) + i1 * u.nb[1] + i2 * u.nb[2] + i3 * u.nb[3]);
    float *d = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + i1 * a.n.nb[1] + i2 * a.n.nb[2] + i3 * a.n.nb[3]);
    for (int64_t i = 0; i < n; ++i) {
      const float x = std::min(pg[i], limit);
      const float y = std::min(std::max(pu[i], -limit), limit);
      d[i] = x / (1.0f + std::exp(alpha * (-x))) * (y + 1.0f);
    }
  }
}

}  // namespace moe
