// RoPE with GGML semantics (NeoX / normal pairing, YaRN), the same angle recurrence as
// src/backends/cpu/ops/rope_math.h: theta is multiplied by theta_scale pair after pair
// (not recomputed with pow), so both backends round the same way.
#include <cmath>

#include "backends/cpu/ops/rope_math.h"
#include "backends/cuda/cuda_ops.h"

namespace moe {

namespace {

struct RopeArgs {
  int n_rot;
  int neox;
  float freq_scale, ext_factor, attn_factor, theta_scale;
  float corr0, corr1;
};

__device__ float yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// One block per token: the angle table is built once in shared memory, then every head.
__global__ void rope_kernel(TView x, TView d, const int32_t *pos, RopeArgs p) {
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  const int64_t t = blockIdx.x;
  const int half_pairs = p.n_rot / 2;
  if (threadIdx.x == 0) {
    float theta = static_cast<float>(pos[t]);
    for (int k = 0; k < half_pairs; ++k) { s_theta[k] = theta; theta *= p.theta_scale; }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < half_pairs; k += blockDim.x) {
    const int i0 = 2 * k;
    const float theta_extrap = s_theta[k];
    const float theta_interp = p.freq_scale * theta_extrap;
    float th = theta_interp, mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = yarn_ramp(p.corr0, p.corr1, i0) * p.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * logf(1.0f / p.freq_scale);
    }
    s_cs[i0] = cosf(th) * mscale;
    s_cs[i0 + 1] = sinf(th) * mscale;
  }
  __syncthreads();
  const int64_t hd = d.ne[0], n_head = d.ne[1];
  // A thread owns a whole pair (both reads before both writes), so in-place is safe.
  for (int64_t idx = threadIdx.x; idx < n_head * half_pairs; idx += blockDim.x) {
    const int64_t h = idx / half_pairs;
    const int k = static_cast<int>(idx % half_pairs);
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + h * x.nb[1] + t * x.nb[2]);
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(d.data) + h * d.nb[1] + t * d.nb[2]);
    const float c = s_cs[2 * k], s = s_cs[2 * k + 1];
    const int a = p.neox ? k : 2 * k, b = p.neox ? k + half_pairs : 2 * k + 1;
    const float x0 = src[a], x1 = src[b];
    dst[a] = x0 * c - x1 * s;
    dst[b] = x0 * s + x1 * c;
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

void cuda_op_rope(const CudaOpCtx &c) {
  const Node &x = c.src(0), &pos = c.src(1);
  const RopeParams &rp = c.n.rope;
  const int64_t T = c.n.ne[2];
  if (T == 0) return;
  float corr[2];
  rope_yarn_corr_dims(rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow, corr);
  RopeArgs a;
  a.n_rot = rp.n_rot;
  a.neox = rp.neox ? 1 : 0;
  a.freq_scale = rp.freq_scale;
  a.ext_factor = rp.ext_factor;
  a.attn_factor = rp.attn_factor;
  a.theta_scale = std::pow(rp.freq_base, -2.0f / static_cast<float>(rp.n_rot));
  a.corr0 = corr[0];
  a.corr1 = corr[1];
  rope_kernel<<<static_cast<unsigned>(T), 256, 0, c.stream>>>(tview(x), tview(c.n), static_cast<const int32_t *>(pos.data), a);
  MOE_CUDA_LAUNCH_CHECK("rope_kernel");
}

}  // namespace moe
