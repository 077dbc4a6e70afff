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

}  // namespace moe
