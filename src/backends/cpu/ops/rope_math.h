// RoPE / YaRN angle math shared by the CPU kernel and host-side precomputation.
#pragma once
#include <cmath>

#include "graph/ir.h"

namespace moe {

inline float rope_yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

inline void rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]) {
  if (n_ctx_orig <= 0) { dims[0] = 0; dims[1] = static_cast<float>(n_dims - 1); return; }
  const float start = std::floor(rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base));
  const float end = std::ceil(rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base));
  dims[0] = std::fmax(0.0f, start);
  dims[1] = std::fmin(static_cast<float>(n_dims - 1), end);
}

inline float rope_yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::fmax(0.001f, high - low);
  return 1.0f - std::fmin(1.0f, std::fmax(0.0f, y));
}

// cos/sin for each rotated pair at position pos: cache[2k] = cos, cache[2k+1] = sin.
inline void rope_cache_init(float pos, const RopeParams &p, const float corr[2], float theta_scale, int n_rot, float *cache) {
  float theta = pos;
  for (int i0 = 0; i0 < n_rot; i0 += 2) {
    const float theta_extrap = theta;
    const float theta_interp = p.freq_scale * theta_extrap;
    float th = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = rope_yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cache[i0] = std::cos(th) * mscale;
    cache[i0 + 1] = std::sin(th) * mscale;
    theta *= theta_scale;
  }
}

// The reference's rotation as its compiler contracts it (first product fused, second
// rounded): the K-quant conformance files need these bits (see kernels/ref_math.h).
inline float rope_rot0(float x0, float x1, float c, float s) { return std::fma(x0, c, -(x1 * s)); }
inline float rope_rot1(float x0, float x1, float c, float s) { return std::fma(x0, s, x1 * c); }

inline void rope_apply_row(const float *src, float *dst, const float *cache, int n_rot, bool neox) {
  if (neox) {
    const int half = n_rot / 2;
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
      const int ic = i0 / 2;
      const float c = cache[i0], s = cache[i0 + 1];
      const float x0 = src[ic], x1 = src[ic + half];
      dst[ic] = rope_rot0(x0, x1, c, s);
      dst[ic + half] = rope_rot1(x0, x1, c, s);
    }
  } else {
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
      const float c = cache[i0], s = cache[i0 + 1];
      const float x0 = src[i0], x1 = src[i0 + 1];
      dst[i0] = rope_rot0(x0, x1, c, s);
      dst[i0 + 1] = rope_rot1(x0, x1, c, s);
    }
  }
}

}  // namespace moe
