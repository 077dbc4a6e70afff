// Device mirrors of the CPU's reference-exact float helpers (src/backends/cpu/kernels/
// ref_math.h), bit for bit: the reference engine's vectorised expf and silu, which the CPU's
// SwiGLU and Softmax use on every 16-element chunk of a row, and its 16-lane sum tree. Every step is an explicit fmaf / __f*_rn
// (no contraction choices for the compiler); ldexpf is exact.
#pragma once
#include <cuda_runtime.h>

namespace moe {

__device__ __forceinline__ float ref_expf_v(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r);
  const float n = __fsub_rn(z, r);
  if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __int_as_float(0x7f800000);  // NaN falls through, as there
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  const float u = __fmul_rn(b, b);
  const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                       fmaf(0x1.ffffecp-1f, b, 1.0f));
  return ldexpf(j, static_cast<int>(n));
}

// The reference's 16-lane reduce-add tree (halves of 8, then 4, then (u0 + u2) + (u1 + u3)).
__device__ __forceinline__ float ref_hsum16(const float *x) {
  float t[8], u[4];
#pragma unroll
  for (int k = 0; k < 8; ++k) t[k] = __fadd_rn(x[k + 8], x[k]);
#pragma unroll
  for (int k = 0; k < 4; ++k) u[k] = __fadd_rn(t[k + 4], t[k]);
  return __fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3]));
}

// The CPU's SwiGLU value of element i of a row of n: the vector silu on the 16-element
// chunks, libm's expf on the tail (CUDA's expf there: equal to within an ulp, not always bit
// for bit).
__device__ __forceinline__ float ref_swiglu(float g, float u, int64_t i, int64_t n) {
  if (i < (n & ~int64_t{15})) return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, ref_expf_v(__fsub_rn(0.0f, g)))), u);
  return g / (1.0f + expf(-g)) * u;
}

// F32 at one token: the reference's vec_dot_f32 (refmath::dot_f32_vec): 4 x 16 float lanes
// over steps of 64 (warp lane l holds lanes l and 32 + l: elements i + l and i + 32 + l),
// then (s0 + s2) + (s1 + s3), the 16-lane tree, and a serial fma tail of n % 64. w: a weight
// row in global memory; x: shared or global. Every lane of the warp must call it; all get the
// result.
// The weights of U steps are loaded before their first fma (2U loads in flight per lane: a
// 2048-long row in one round trip since 2026-11-30, was two at U = 16), the fold order is unchanged.
__device__ __forceinline__ float ref_dot_f32_row(const float *w, const float *x, int n) {
  constexpr int U = 32;
  const int lane = threadIdx.x & 31, np = n & ~63;
  float a0 = 0.0f, a1 = 0.0f;
  int i = 0;
  for (; i + 64 * U <= np; i += 64 * U) {
    float w0[U], w1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w0[u] = __ldg(w + i + 64 * u + lane);
      w1[u] = __ldg(w + i + 64 * u + 32 + lane);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      a0 = fmaf(w0[u], x[i + 64 * u + lane], a0);
      a1 = fmaf(w1[u], x[i + 64 * u + 32 + lane], a1);
    }
  }
  for (; i < np; i += 64) {
    a0 = fmaf(__ldg(w + i + lane), x[i + lane], a0);
    a1 = fmaf(__ldg(w + i + 32 + lane), x[i + 32 + lane], a1);
  }
  float v = __fadd_rn(a0, a1);                                // lanes < 16: s0 + s2; else s1 + s3
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16));     // (s0 + s2) + (s1 + s3)
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));  // the 16-lane tree
  for (int e = np; e < n; ++e) v = fmaf(__ldg(w + e), x[e], v);
  return v;
}

// F32 in the reference's batched GEMM (refmath::dot_f32_gemm, taken for k % 16 == 0 and rows
// % 4 == 0): 16 float lanes, lane e % 16 folding element e, then the 16-lane tree. Lanes 16..31
// repeat lanes 0..15. n % 16 == 0. Every lane of the warp must call it; all get the result.
__device__ __forceinline__ float ref_dot_f32_gemm_row(const float *w, const float *x, int n) {
  const int k = threadIdx.x & 15;
  float a = 0.0f;
#pragma unroll 4
  for (int i = 0; i < n; i += 16) a = fmaf(__ldg(w + i + k), x[i + k], a);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

}  // namespace moe
