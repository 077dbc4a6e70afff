// Array forms of the reference-exact expf / silu helpers (ref_math.h). The scalar mirrors
// compiled for baseline x86-64 call libm's fmaf and scalbnf per step (6.5% of prefill);
// the AVX-512 build runs the same operations 16 lanes wide (fma, scalef = ldexp, IEEE
// division), so the bits are the same either way (tests/unit/test_ref_math_vec.cpp).
//
//   ref_expf_shift(n, src, mx, dst);      // dst[i] = expf_v(src[i] - mx), n % 16 == 0
//   ref_silu_mul(n, g, u, dst);           // dst[i] = silu_v(g[i]) * u[i],  n % 16 == 0
//   ref_silu(n, x, dst);                  // dst[i] = silu_v(x[i]), any n (dst may be x)
#pragma once
#include <cstdint>

namespace moe {

void ref_expf_shift(int64_t n, const float *src, float mx, float *dst);
void ref_silu_mul(int64_t n, const float *g, const float *u, float *dst);
void ref_silu(int64_t n, const float *x, float *dst);

}  // namespace moe
