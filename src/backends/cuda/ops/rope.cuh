// RoPE math shared by the Rope kernel (rope.cu) and the fused head-norm chains (fused.cu),
// so both round exactly alike: GGML semantics (NeoX / normal pairing, YaRN). cos/sin come
// from the ubatch's host-computed table (CudaRopeTables: the CPU's rope_cache_init, bit for
// bit) where it covers the op's positions, else from the angle recurrence of
// src/backends/cpu/ops/rope_math.h with CUDA's cosf/sinf (within an ulp). The rotation is
// the CPU's rope_rot0 / rope_rot1 with explicit roundings.
#pragma once
#include <cmath>

#include "backends/cpu/ops/rope_math.h"
#include "backends/cuda/cuda_ops.h"
#include "graph/ir.h"

namespace moe {

struct RopeArgs {
  int n_rot;
  int neox;
  float freq_scale, ext_factor, attn_factor, theta_scale;
  float corr0, corr1;
  const float *table;      // the ubatch's cos/sin rows [T][table_stride], or null
  const int32_t *table_pos;  // the position each table row was built for (DevUbatch::pos)
  int table_stride;
};

// ub / T: the ubatch and the op's token count, for its host-computed table (if any).
inline RopeArgs make_rope_args(const RopeParams &rp, const DevUbatch &ub, int64_t T) {
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
  a.table = cuda_rope_table(ub, rp, T);
  a.table_pos = ub.pos;
  a.table_stride = cuda_rope_table_stride(rp);
  return a;
}

__device__ __forceinline__ float rope_ramp_device(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// Fills s_cs[2k], s_cs[2k+1] = cos, sin (times mscale) of every pair k < n_rot/2 for the
// position pos[t] of token t: the host table's row t when it was built for that position
// (block-uniform test), else computed here; s_theta is scratch of n_rot/2 floats.
// Block-wide: every thread must call it.
__device__ __forceinline__ void rope_angle_table(const int32_t *pos_arr, int64_t t, const RopeArgs &p, float *s_theta, float *s_cs) {
  const int32_t pos = pos_arr[t];
  if (p.table && p.table_pos[t] == pos) {
    const float *row = p.table + t * p.table_stride;
    for (int k = threadIdx.x; k < p.n_rot; k += blockDim.x) s_cs[k] = row[k];
    __syncthreads();
    return;
  }
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

// Rotates pair k of one head row (src and dst may be the same row: both reads come first),
// rounded as the CPU's rope_rot0 / rope_rot1: first product fused, second rounded.
__device__ __forceinline__ void rope_rotate_pair(const float *src, float *dst, int k, const RopeArgs &p, const float *s_cs) {
  const int half_pairs = p.n_rot / 2;
  const float c = s_cs[2 * k], s = s_cs[2 * k + 1];
  const int a = p.neox ? k : 2 * k, b = p.neox ? k + half_pairs : 2 * k + 1;
  const float x0 = src[a], x1 = src[b];
  dst[a] = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  dst[b] = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

}  // namespace moe
