// RoPE math shared by the Rope kernel (rope.cu) and the fused head-norm chains (fused.cu),
// so both round exactly alike: GGML semantics (NeoX / normal pairing, YaRN) with the angle
// recurrence of src/backends/cpu/ops/rope_math.h (theta multiplied by theta_scale pair after
// pair, not recomputed with pow).
#pragma once
#include <cmath>

#include "backends/cpu/ops/rope_math.h"
#include "graph/ir.h"

namespace moe {

struct RopeArgs {
  int n_rot;
  int neox;
  float freq_scale, ext_factor, attn_factor, theta_scale;
  float corr0, corr1;
};

inline RopeArgs make_rope_args(const RopeParams &rp) {
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
  return a;
}

__device__ __forceinline__ float rope_ramp_device(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// Fills s_cs[2k], s_cs[2k+1] = cos, sin (times mscale) of every pair k < n_rot/2 for one
// position; s_theta is scratch of n_rot/2 floats. Block-wide: every thread must call it.
__device__ __forceinline__ void rope_angle_table(int32_t pos, const RopeArgs &p, float *s_theta, float *s_cs) {
  const int half_pairs = p.n_rot / 2;
  if (threadIdx.x == 0) {
    float theta = static_cast<float>(pos);
    for (int k = 0; k < half_pairs; ++k) { s_theta[k] = theta; theta *= p.theta_scale; }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < half_pairs; k += blockDim.x) {
    const int i0 = 2 * k;
    const float theta_extrap = s_theta[k];
    const float theta_interp = p.freq_scale * theta_extrap;
    float th = theta_interp, mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = rope_ramp_device(p.corr0, p.corr1, i0) * p.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * logf(1.0f / p.freq_scale);
    }
    s_cs[i0] = cosf(th) * mscale;
    s_cs[i0 + 1] = sinf(th) * mscale;
  }
  __syncthreads();
}

// Rotates pair k of one head row (src and dst may be the same row: both reads come first).
__device__ __forceinline__ void rope_rotate_pair(const float *src, float *dst, int k, const RopeArgs &p, const float *s_cs) {
  const int half_pairs = p.n_rot / 2;
  const float c = s_cs[2 * k], s = s_cs[2 * k + 1];
  const int a = p.neox ? k : 2 * k, b = p.neox ? k + half_pairs : 2 * k + 1;
  const float x0 = src[a], x1 = src[b];
  dst[a] = x0 * c - x1 * s;
  dst[b] = x0 * s + x1 * c;
}

}  // namespace moe
