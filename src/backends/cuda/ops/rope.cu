// RoPE with GGML semantics (NeoX / normal pairing, YaRN); the math is in rope.cuh (shared
// with the fused head-norm chains of fused.cu). Launched with PDL (ops/pdl.cuh).
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/rope.cuh"

namespace moe {

namespace {

// One block per token: the angle table is built once in shared memory, then every head.
__global__ void rope_kernel(TView x, TView d, const int32_t *pos, RopeArgs p) {
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  const int64_t t = blockIdx.x;
  pdl_wait();
  pdl_trigger();
  const int half_pairs = p.n_rot / 2;
  rope_angle_table(pos, t, p, s_theta, s_cs);
  const int64_t hd = d.ne[0], n_head = d.ne[1];
  // A thread owns a whole pair (both reads before both writes), so in-place is safe.
  for (int64_t idx = threadIdx.x; idx < n_head * half_pairs; idx += blockDim.x) {
    const int64_t h = idx / half_pairs;
    const int k = static_cast<int>(idx % half_pairs);
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + h * d.nb[1] + t * d.nb[2]);
    rope_rotate_pair(src, dst, k, p, s_cs);
  }
  const int64_t tail = hd - p.n_rot;
  for (int64_t idx = threadIdx.x; idx < n_head * tail; idx += blockDim.x) {
    const int64_t h = idx / tail, i = p.n_rot + idx % tail;
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + h * d.nb[1] + t * d.nb[2]);
    dst[i] = src[i];
  }
}

}  // namespace

bool rope_params_equal(const RopeParams &a, const RopeParams &b) {
  return a.n_rot == b.n_rot && a.neox == b.neox && a.freq_base == b.freq_base && a.freq_scale == b.freq_scale &&
         a.ext_factor == b.ext_factor && a.attn_factor == b.attn_factor && a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow &&
         a.n_ctx_orig == b.n_ctx_orig;
}

const float *cuda_rope_table(const DevUbatch &ub, const RopeParams &p, int64_t T) {
  if (!ub.rope || ub.rope->n_tokens != T) return nullptr;
  for (const auto &e : ub.rope->tables)
    if (rope_params_equal(e.first, p)) return e.second;
  return nullptr;
}

void cuda_op_rope(const CudaOpCtx &c) {
  const Node &x = c.src(0), &pos = c.src(1);
  const RopeParams &rp = c.n.rope;
  const int64_t T = c.n.ne[2];
  if (T == 0) return;
  const RopeArgs a = make_rope_args(rp, c.ub, T);
  launch_pdl(rope_kernel, dim3(static_cast<unsigned>(T)), dim3(256), 0, c.stream, tview(x), tview(c.n), static_cast<const int32_t *>(pos.data), a);
}

}  // namespace moe
