// Tensor-core paths of MatMul / MatMulId for batches of many columns (prefill), used by
// cuda_op_matmul (matmul.cu) after the activations were rounded into scratch: F16 / BF16
// weights in matmul_mma.cu (f32 activations rounded to the weight type), quantized weights
// in matmul_mmq.cu (activations as Q8 integers and per-16 scales: exact products).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_paths.h"
#include "quant/dtype.h"

namespace moe {

constexpr int kMmaCols = 64;         // activation columns (tokens) per block = MatMulId routing tile
constexpr int kMmaMinCols = 16;      // dense MatMul: fewer columns stay on the f32 tile kernel
constexpr int kMmaMinEntries = 64;   // MatMulId: fewer routed (token, slot) entries stay on it too
constexpr int kMaxKSplits = 8;       // dense int8 MMQ with few blocks: K split at most this many ways

// F16 / BF16 (launch_mma_matmul); F32 weights stay on the exact f32 kernel (routers).
bool cuda_mma_type_supported(DType t);
// Q4_0, Q8_0, MXFP4, Q2_K .. Q6_K (launch_mmq_matmul).
bool cuda_mmq_type_supported(DType t);
// Whether a device taking `paths` runs the GEMMs of this file for weights of type t: sm_80
// code (cuda_paths.h) and, for the int8 MMQ types, room for one of their kernels in the
// shared memory a block may have (sm_86 / sm_89 / sm_120 grant 99 KB, sm_80 / sm_87 163 KB,
// sm_90 227 KB). Elsewhere the callers take the f32 tile kernels.
bool cuda_tensor_core_gemm(DType t, const CudaPaths &paths);

// Y[col] = W X[col] for the columns of each tile. Dense (tiles == nullptr): column c reads
// X row c and writes Y row c, n_col_tiles = ceil(ncols / kMmaCols). MatMulId: tile i is
// (expert, first entry, count, 0) over `entries` (activation row, output row) as built by
// the routing kernel; n_col_tiles = its tile capacity (count-0 tiles exit at once).
void launch_mma_matmul(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const float *X, float *Y, int ncols, const int4 *tiles, const int2 *entries, int n_col_tiles);

// The same for quantized weights. Activation row r is given as Xq[r * K + k], the integer of
// element k (int8_t for cuda_mmq_int8_type(t), else f16 bits as uint16_t), and
// Xs[r * K / 16 + g] = (c, sum of the 16 integers of group g), c the scale of the Q8_0 / Q8_K
// block holding group g (K is a multiple of 32). part / k_splits: see launch_mmq_i8_matmul.
void launch_mmq_matmul(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const void *Xq, const float2 *Xs, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                       int n_col_tiles, float *part = nullptr, int k_splits = 1);

// Of the quantized types, those on int8 tensor cores (matmul_mmq_i8.cu: Q4_0, Q8_0, MXFP4,
// Q4_K, Q5_K, Q6_K); launch_mmq_matmul hands them to launch_mmq_i8_matmul (int8 activations).
// A dense product (tiles == nullptr) with K % 256 == 0 and k_splits > 1 splits K into
// k_splits ranges of whole 256-blocks (more blocks for grids that would leave SMs idle):
// their partial results go to part[z * ncols * M ..] (k_splits * ncols * M floats) and are
// summed in order into Y by a second kernel (deterministic).
bool cuda_mmq_int8_type(DType t);
void launch_mmq_i8_matmul(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                          const int8_t *Xq, const float2 *Xs, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                          int n_col_tiles, float *part, int k_splits);
// The extra weight types (quant_extra.h: Q4_1 ... IQ1_M) take launch_mmq_i8_matmul too
// (mmq_i8_extra.cuh; activations as quant_extra.cu rounds them for it) where this is true:
// sm_80 code and room for the type's kernel in a block's shared memory.
bool cuda_mmq_i8_extra_gemm(DType t, const CudaPaths &paths);
// The K splits for a dense K x M product on ncols columns and n_sm SMs: enough blocks for
// two per SM, at most kMaxKSplits and K / 256; 1 = none.
int mmq_i8_k_splits(int64_t K, int64_t M, int64_t ncols, int n_sm);
// Y[i] = the n_split partial results part[z n + i] added in the order of z (split-K GEMMs).
void launch_sum_k_splits(const float *part, int64_t n, int n_split, float *Y, const LaunchStream &s);

// Test hook: enqueues on s the decoding of sub-blocks 0 .. n_sub-1 of one device row of type
// t three ways: dequant32 into d_w[32 n_sub], unpack32 into d_q[32 n_sub] and d_ab[4 n_sub]
// (a0, a1, b0, b1 per sub-block), and the MMQ kernel's shared-memory staging decoded back to
// weights into d_staged[32 n_sub] (the int8 staging for cuda_mmq_int8_type(t), through
// cuda_i8_unpack_check_launch). The caller owns the buffers and the waiting.
void cuda_unpack32_check_launch(DType t, const uint8_t *d_row, int n_sub, float *d_w, int *d_q, float *d_ab, float *d_staged,
                                cudaStream_t s);
void cuda_i8_unpack_check_launch(DType t, const uint8_t *d_row, int n_sub, float *d_w, int *d_q, float *d_ab, float *d_staged,
                                 cudaStream_t s);

}  // namespace moe
