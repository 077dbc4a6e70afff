// Tensor-core path of MatMul / MatMulId for batches of many columns (prefill), used by
// cuda_op_matmul (matmul.cu) after the activations were rounded into f32 scratch. The
// kernel itself is in matmul_mma.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace moe {

constexpr int kMmaCols = 64;         // activation columns (tokens) per block = MatMulId routing tile
constexpr int kMmaMinCols = 16;      // dense MatMul: fewer columns stay on the f32 tile kernel
constexpr int kMmaMinEntries = 64;   // MatMulId: fewer routed (token, slot) entries stay on it too

// Every matmul weight type except F32: f16 would round those weights (routers stay exact).
bool cuda_mma_type_supported(DType t);

// Bytes of the scratch launch_mma_matmul needs for x_rows activation rows of K (their
// 16-bit copy, rows padded to the K step).
size_t mma_matmul_scratch_bytes(int64_t K, int64_t rows);

// Y[col] = W X[col] for the columns of each tile; X: x_rows rows of K rounded f32 values.
// Dense (tiles == nullptr): column c reads X row c and writes Y row c, n_col_tiles =
// ceil(ncols / kMmaCols). MatMulId: tile i is (expert, first entry, count, 0) over `entries`
// (activation row, output row) as built by the routing kernel; n_col_tiles = its tile
// capacity (count-0 tiles exit at once). scratch: 256-byte aligned, mma_matmul_scratch_bytes.
void launch_mma_matmul(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const float *X, int64_t x_rows, void *scratch, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                       int n_col_tiles);

}  // namespace moe
