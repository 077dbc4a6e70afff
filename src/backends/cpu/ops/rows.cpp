// Row slicing and joining (MLA splits q/kv rows into latent and rope parts and joins them).
#include <cstring>

#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

static inline const float *crow(const Node &n, int64_t r) {
  const int64_t i1 = r % n.ne[1], i2 = (r / n.ne[1]) % n.ne[2], i3 = r / (n.ne[1] * n.ne[2]);
  return reinterpret_cast<const float *>(static_cast<const uint8_t *>(n.data) + i1 * n.nb[1] + i2 * n.nb[2] + i3 * n.nb[3]);
}

void cpu_slice(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t start = a.n.ip[0], len = a.n.ne[0];
  int64_t r0, r1;
  split_rows(a.n.ne[1] * a.n.ne[2] * a.n.ne[3], a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r)
    std::memcpy(const_cast<float *>(crow(a.n, r)), crow(x, r) + start, static_cast<size_t>(len) * 4);
}

void cpu_concat(const CpuKernelArgs &a) {
  const Node &x = a.src(0), &y = a.src(1);
  const int64_t na = x.ne[0], nb = y.ne[0];
  int64_t r0, r1;
  split_rows(a.n.ne[1] * a.n.ne[2] * a.n.ne[3], a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    float *d = const_cast<float *>(crow(a.n, r));
    std::memcpy(d, crow(x, r), static_cast<size_t>(na) * 4);
    std::memcpy(d + na, crow(y, r), static_cast<size_t>(nb) * 4);
  }
}

}  // namespace moe
