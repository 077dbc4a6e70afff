// Per-head matrix products (MLA's k_b / v_b absorption): out[:, h, t] = W_h x[:, h, t].
// Activations go through the weight type's vec_dot_type like every other matmul, so F16
// weights see F16-rounded activations, as in the reference engine.
#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

size_t cpu_matmul_heads_work(const Graph &g, const Node &n) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  const CpuTypeKernels &k = cpu_type_kernels(w.type);
  if (k.vec_dot_type == DType::F32) return 0;
  return row_size(k.vec_dot_type, w.ne[0]) * static_cast<size_t>(x.ne[1] * x.ne[2]);
}

void cpu_matmul_heads(const CpuKernelArgs &a) {
  const Node &w = a.src(0), &x = a.src(1);
  const int64_t K = w.ne[0], M = w.ne[1], H = x.ne[1], T = x.ne[2];
  const CpuTypeKernels &k = cpu_type_kernels(w.type);
  const bool convert = k.vec_dot_type != DType::F32;
  const size_t rs = convert ? row_size(k.vec_dot_type, K) : 0;
  auto xrow = [&](int64_t h, int64_t t) {
    return reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
  };
  int64_t r0, r1;
  if (convert) {
    split_rows(H * T, a.ith, a.nth, r0, r1);
    for (int64_t r = r0; r < r1; ++r) k.from_float(xrow(r % H, r / H), a.work + r * rs, K);
    a.pool.barrier();
  }
  split_rows(H * T, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t h = r % H, t = r / H;
    const void *xq = convert ? static_cast<const void *>(a.work + r * rs) : static_cast<const void *>(xrow(h, t));
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + h * a.n.nb[1] + t * a.n.nb[2]);
    cpu_vec_dot_rows(w.type, static_cast<int>(K), static_cast<int>(M), dst, static_cast<const uint8_t *>(w.data) + h * w.nb[2], w.nb[1], xq);
  }
}

}  // namespace moe
