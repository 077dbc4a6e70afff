// F16 x F16 dot product in the order of the conformance reference's one-token F16 kernel
// (ggml_vec_dot_f16 built with AVX512-FP16): for n >= 128 it accumulates in HALF precision,
// 4 accumulators x 32 FP16 lanes, one fused multiply-add (one rounding to FP16) per element
// of each 128-element step; then lane-wise FP16 adds acc0+acc2, acc1+acc3, acc0+acc1 and the
// reduce-add tree 16/8/4/2/1 in FP16; the n % 128 tail is added in double as float products.
// Below 128 elements everything is that double tail. The reference uses it for products
// with a single activation column and for MoE expert products; the generated-token records
// of the gpt-oss conformance file (attn_output, k = 256) depend on these roundings.
// Portable: the FP16 roundings are emulated exactly in float (TwoSum + tie fix-up).
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

// One weight row w (n halves) against one activation row x already rounded to F16.
float f16_halfsum_dot(int n, const uint16_t *w, const uint16_t *x);

// nrows weight rows (stride w_row_stride bytes) against one F16 activation row.
void f16_halfsum_dot_rows(int n, int nrows, float *out, const void *w, size_t w_row_stride, const void *x);

}  // namespace moe
