// Scalar mirrors of the reference engine's AVX-512 float helpers, bit for bit (see
// ref_order_dot.h for why the K-quant conformance files need bit-level agreement).
// Every float step is an explicit operation or std::fma, so any compiler flags give the
// same bits (no contraction opportunities: no a * b + c written as such).
#pragma once
#include <cmath>
#include <cstdint>

namespace moe::refmath {

// One lane of the reference's vectorised expf (a degree-5 polynomial after a 2^n split,
// max error ~1.5 ulp): not libm's expf, so results differ in the last bits.
inline float expf_v(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;  // NaN falls through, as there
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  return std::ldexp(j, static_cast<int>(n));
}

// Vector-path silu: x / (1 + expf_v(0 - x)).
inline float silu_v(float x) { return x / (1.0f + expf_v(0.0f - x)); }
// Scalar-tail silu (libm expf).
inline float silu_s(float x) { return x / (1.0f + std::exp(-x)); }

// hsum of 8 lanes as the reference's AVX2 helper: (x_k + x_{k+4}), then (r0 + r2) + (r1 + r3).
inline float hsum8(const float *x) {
  const float r0 = x[4] + x[0], r1 = x[5] + x[1], r2 = x[6] + x[2], r3 = x[7] + x[3];
  return (r0 + r2) + (r1 + r3);
}

// The 16-lane reduce-add tree (halves of 8, then 4, then (u0 + u2) + (u1 + u3)).
inline float hsum16(const float *x) {
  float t[8], u[4];
  for (int k = 0; k < 8; ++k) t[k] = x[k + 8] + x[k];
  for (int k = 0; k < 4; ++k) u[k] = t[k + 4] + t[k];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// One-token F32 dot (the reference's vec_dot_f32 on AVX-512): 4 x 16 lanes over steps of
// 64, folded (s0 + s2) + (s1 + s3), the 16-lane tree, then a scalar tail. sx/sy: strides.
inline float dot_f32_vec(int n, const float *x, int sx, const float *y, int sy) {
  float acc[4][16] = {};
  const int np = n & ~63;
  for (int i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 16; ++k) {
        const int e = i + 16 * j + k;
        acc[j][k] = std::fma(x[e * sx], y[e * sy], acc[j][k]);
      }
  float v[16];
  for (int k = 0; k < 16; ++k) v[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
  float s = hsum16(v);
  for (int e = np; e < n; ++e) s = std::fma(x[e * sx], y[e * sy], s);
  return s;
}

// Batched F32 GEMM (the reference's tinyBLAS on AVX-512): 16 lanes of fma over k, then the
// tree. The reference takes this path only when k % 16 == 0; zeros past n are no-ops.
inline float dot_f32_gemm(int n, const float *x, int sx, const float *y, int sy) {
  float acc[16] = {};
  for (int e = 0; e < n; ++e) acc[e & 15] = std::fma(x[e * sx], y[e * sy], acc[e & 15]);
  return hsum16(acc);
}

}  // namespace moe::refmath
