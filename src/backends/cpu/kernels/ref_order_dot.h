// Dot products that reproduce the reference engine's x86 (AVX2/AVX-512 build) float
// accumulation order bit for bit. The K-quant conformance files are chaotic: a ULP-level
// difference in any activation can flip one Q8_K rounding (values sit at k+0.5 ± 1e-6
// often enough), which moves the final logits by 0.5-2. Integer partial sums are exact in
// any order; only the grouping of the float steps matters, and that is what these mirror:
//   Q8_0        8 float lanes, lane k = fma(dA*dB, int(bytes 4k..4k+3), lane k) per block
//   Q4_K        always repacked by the reference on x86 (see RefPath)
//   Q4_K/Q5_K/  8 int32 lanes per super-block (lane = (e % 32) / 4, scaled by the sub-block
//   Q6_K        scale), then fma(d, float(lane), acc); mins/offsets as the reference does
//   F32         one token: 4x16 lanes over steps of 64; batched GEMM: 16 lanes; then the
//               AVX-512 reduce-add tree
// Portable code (a second build with FMA/AVX2 flags gives the same bits, only faster).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace moe {

// Which of the reference's code paths a product takes, where they differ in float order.
enum class RefPath {
  VecDot,      // its per-row vec_dot
  F32Gemm,     // F32 weights in a multi-token product (its batched GEMM)
  RepackGemv,  // Q4_K repacked: single rows, MoE experts, the remainder of 4-row groups
  RepackGemm,  // Q4_K repacked: rows in 4-row groups of a multi-token product
};

// True when the reference-order kernels implement wtype.
bool ref_order_dot_supported(DType wtype);

// The path of output column col (0-based token) of an n x m weight times n_cols columns;
// moe: an expert product (the reference runs those one row at a time).
RefPath ref_order_path(DType wtype, int64_t n, int64_t m, int64_t n_cols, int64_t col, bool moe);

// One weight row (type wtype, n elements) against one activation row already converted to
// the type's vec_dot_type (Q8_0 for Q8_0, Q8_K for K-quants, F32 for F32), VecDot path.
float ref_order_dot(DType wtype, int n, const void *w, const void *x);

// nrows weight rows (stride w_row_stride bytes) against one converted activation row.
void ref_order_dot_rows(DType wtype, int n, int nrows, float *out, const void *w, size_t w_row_stride,
                        const void *x, RefPath path);

}  // namespace moe
