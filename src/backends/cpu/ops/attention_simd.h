// Small SIMD helpers for the attention kernel (x86: AVX2+F16C+FMA chosen at run time;
// elsewhere the portable loops, which compilers vectorise for NEON).
#pragma once
#include <cstdint>

namespace moe {

// acc[i] += p * f16_to_f32(v[i])
void attn_axpy_f16(int n, float *acc, const uint16_t *v, float p);
// acc[i] += p * v[i]
void attn_axpy_f32(int n, float *acc, const float *v, float p);

// dst[i] = f16_to_f32(src[i])
void attn_f16_to_f32(int n, float *dst, const uint16_t *src);
// sum_i a[i] * b[i] in f32
float attn_dot_f32(int n, const float *a, const float *b);

}  // namespace moe
