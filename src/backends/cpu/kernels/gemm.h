// Multi-row x multi-column quantized products (prefill GEMM, and decode mat-vec in tiles
// of 16 rows). Each weight super-block is unpacked once and reused for every activation
// column of the tile; the per-block integer sums are exact in any order and the float
// steps follow the same per-output order as the single-product kernels they replace, so
// results are bit-identical to them (tests/unit/test_gemm.cpp checks it).
//
//   const void *xs[3] = {x0, x1, x2};       // Q8_K activation rows (any addresses)
//   float *outs[3] = {y0 + m0, y1 + m0, y2 + m0};
//   if (cpu_gemm_q4_K_supported(M))
//     cpu_gemm_q4_K(K, 16, 3, outs, w + m0 * ws, ws, xs, Q4kOrder::Gemv);  // outs[c][r]
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

// Float order of a Q4_K row x Q8_K column, as the reference engine's repacked Q4_K (used
// on x86 whenever the row count is a multiple of 8):
//   Gemv: per super-block acc = fma(float(sum of scaled quant products), d, acc), likewise
//         accm for the mins; result acc - accm (single rows and all MoE experts);
//   Gemm: the same with one step per 64-value pair of sub-blocks (dense products, tokens
//         in full groups of 4).
enum class Q4kOrder { Gemv, Gemm };

// True when this CPU/build has the fast kernel (x86 AVX-512 VNNI/BW for now).
bool cpu_gemm_q4_K_supported();

// out[c][r] = (weight row r) . x[c] for r < nrows, c < ncols. w: nrows Q4_K rows of n
// values, w_stride bytes apart; x[c]: Q8_K rows of n values. n % 256 == 0. Only call when
// cpu_gemm_q4_K_supported().
void cpu_gemm_q4_K(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                   const void *const *x, Q4kOrder order);

// Q6_K x Q8_K in the AVX2 vec_dot order, which is also the reference's (8 float lanes per
// product, one FMA per super-block, the 8-lane tree at the end). Same contract as above.
bool cpu_gemm_q6_K_supported();
void cpu_gemm_q6_K(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                   const void *const *x);

}  // namespace moe
