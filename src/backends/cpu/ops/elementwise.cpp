// Row-local elementwise kernels. All tolerate dst == src0 (see op_can_run_in_place).
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/ref_math_vec.h"
#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

static inline float *row_f32(const Node &n, int64_t i1, int64_t i2, int64_t i3) {
  return reinterpret_cast<float *>(static_cast<uint8_t *>(n.data) + i1 * n.nb[1] + i2 * n.nb[2] + i3 * n.nb[3]);
}

// Iterate all rows of dst (flattened over dims 1..3) assigned to this thread.
template <typename F> static void for_rows(const CpuKernelArgs &a, F &&f) {
  const Node &d = a.n;
  const int64_t nrows = d.ne[1] * d.ne[2] * d.ne[3];
  int64_t r0, r1;
  split_rows(nrows, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
    f(i1, i2, i3);
  }
}

void cpu_rms_norm(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const float eps = a.n.fp[0];
  const int64_t n = a.n.ne[0];
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *src = row_f32(x, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    double sum = 0.0;  // the reference accumulates in double
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(src[i] * src[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
  });
}

template <typename F> static void binary_bcast(const CpuKernelArgs &a, F &&op) {
  const Node &x = a.src(0), &y = a.src(1);
  const int64_t n = a.n.ne[0];
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *s0 = row_f32(x, i1, i2, i3);
    const float *s1 = row_f32(y, y.ne[1] == 1 ? 0 : i1, y.ne[2] == 1 ? 0 : i2, y.ne[3] == 1 ? 0 : i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    for (int64_t i = 0; i < n; ++i) dst[i] = op(s0[i], s1[i]);
  });
}

void cpu_mul(const CpuKernelArgs &a) { binary_bcast(a, [](float p, float q) { return p * q; }); }
void cpu_add(const CpuKernelArgs &a) { binary_bcast(a, [](float p, float q) { return p + q; }); }

void cpu_scale(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const float s = a.n.fp[0], b = a.n.fp[1];
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *src = row_f32(x, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    for (int64_t i = 0; i < a.n.ne[0]; ++i) dst[i] = src[i] * s + b;
  });
}

void cpu_softmax(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t n = a.n.ne[0];
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *src = row_f32(x, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::fmax(mx, src[i]);
    // Reference order: 16-wide chunks use its vector expf and add their lanes by the
    // 16-lane tree, the tail uses libm expf; the running sum is double.
    double sum = 0.0;
    int64_t i = 0;
    ref_expf_shift(n & ~int64_t{15}, src, mx, dst);
    for (; i + 16 <= n; i += 16) sum += static_cast<double>(refmath::hsum16(dst + i));
    for (; i < n; ++i) {
      const float e = std::exp(src[i] - mx);
      dst[i] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) dst[i] *= inv;
  });
}

void cpu_sigmoid(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *src = row_f32(x, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    for (int64_t i = 0; i < a.n.ne[0]; ++i) dst[i] = 1.0f / (1.0f + std::exp(-src[i]));
  });
}

void cpu_norm_sum(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *src = row_f32(x, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    float sum = 0.0f;
    for (int64_t i = 0; i < a.n.ne[0]; ++i) sum += src[i];
    for (int64_t i = 0; i < a.n.ne[0]; ++i) dst[i] = src[i] / sum;
  });
}

void cpu_swiglu(const CpuKernelArgs &a) {
  const Node &g = a.src(0), &u = a.src(1);
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    const float *pg = row_f32(g, i1, i2, i3);
    const float *pu = row_f32(u, i1, i2, i3);
    float *dst = row_f32(a.n, i1, i2, i3);
    // Reference order: its vector silu on 16-wide chunks, libm expf on the tail.
    const int64_t n = a.n.ne[0];
    const int64_t nv = n & ~int64_t{15};
    ref_silu_mul(nv, pg, pu, dst);
    for (int64_t i = nv; i < n; ++i) dst[i] = refmath::silu_s(pg[i]) * pu[i];
  });
}

void cpu_copy(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  for_rows(a, [&](int64_t i1, int64_t i2, int64_t i3) {
    std::memcpy(row_f32(a.n, i1, i2, i3), row_f32(x, i1, i2, i3), static_cast<size_t>(a.n.ne[0]) * 4);
  });
}

// A value from another host-memory device (the test twin of the CPU): its bytes, split
// evenly over the threads.
void cpu_transfer(const CpuKernelArgs &a) {
  const size_t n = a.n.nbytes(), per = (n + static_cast<size_t>(a.nth) - 1) / static_cast<size_t>(a.nth);
  const size_t b = per * static_cast<size_t>(a.ith), e = b + per < n ? b + per : n;
  if (b < e) std::memcpy(static_cast<uint8_t *>(a.n.data) + b, static_cast<const uint8_t *>(a.src(0).data) + b, e - b);
}

}  // namespace moe
