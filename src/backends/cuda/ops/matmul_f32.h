// F32-weight GEMM for many columns (routers at T > 1); see matmul_f32.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace moe {

// K splits for an M x N output on n_sm multiprocessors (1 = no partial sums).
int sgemm_f32_splits(int64_t K, int64_t M, int64_t N, int n_sm);
// Y[n M + m] = sum_k W[m][k] X[n K + k]. Returns how many partial results of N x M it wrote
// to out (<= splits; 1: out is Y), to be added in split order.
int launch_sgemm_f32(const uint8_t *W, int64_t row_bytes, int K, int M, const float *X, int N, float *out, int splits,
                      cudaStream_t s);

}  // namespace moe
