// MoE routing helpers: top-k selection, gathering the selected probabilities, and the
// weighted sum of expert outputs.
#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

void cpu_top_k(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t E = x.ne[0], k = a.n.ne[0], T = a.n.ne[1];
  int64_t r0, r1;
  split_rows(T, a.ith, a.nth, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
    int32_t *dst = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(a.n.data) + t * a.n.nb[1]);
    // k passes of "largest not yet taken, lowest index on ties": O(k*E), k and E are small,
    // and the result does not depend on a sort's stability or on NaN/inf handling.
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t q = 0; q < j; ++q) taken |= dst[q] == e;
        if (taken) continue;
        if (best < 0 || src[e] > src[best]) best = static_cast<int32_t>(e);
      }
      dst[j] = best;
    }
  }
}

void cpu_gather_cols(const CpuKernelArgs &a) {
  const Node &x = a.src(0), &ids = a.src(1);
  const int64_t k = a.n.ne[0], T = a.n.ne[1];
  int64_t r0, r1;
  split_rows(T, a.ith, a.nth, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[1]);
    const int32_t *id = reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(ids.data) + t * ids.nb[1]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + t * a.n.nb[1]);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = id[j];
      dst[j] = (e >= 0 && e < x.ne[0]) ? src[e] : 0.0f;
    }
  }
}

void cpu_moe_combine(const CpuKernelArgs &a) {
  const Node &ex = a.src(0), &w = a.src(1);
  const int64_t M = a.n.ne[0], k = ex.ne[1], T = a.n.ne[1];
  int64_t r0, r1;
  split_rows(T, a.ith, a.nth, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float *wt = reinterpret_cast<const float *>(static_cast<const uint8_t *>(w.data) + t * w.nb[1]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + t * a.n.nb[1]);
    // Same order as the reference: ((e0*w0 + e1*w1) + e2*w2) + ...
    for (int64_t j = 0; j < k; ++j) {
      const float *e = reinterpret_cast<const float *>(static_cast<const uint8_t *>(ex.data) + j * ex.nb[1] + t * ex.nb[2]);
      if (j == 0) for (int64_t i = 0; i < M; ++i) dst[i] = e[i] * wt[0];
      else for (int64_t i = 0; i < M; ++i) dst[i] += e[i] * wt[j];
    }
  }
}

}  // namespace moe
