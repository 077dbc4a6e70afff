// F32-weight GEMM for many columns (routers at T > 1); see matmul_f32.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace moe {

// K splits for an M x N output on n_sm multiprocessors (1 = no partial sums).
int sgemm_f32_splits(int64_t K, int64_t M, int64_t N, int n_sm);
// Y[n M + m] = sum_k W[m][k] X[n K + k], K split `splits` ways where part (room for splits
// partial results of N x M) is given, added in split order: by the last split block of each
// output tile with a counter per tile from sync (DevUbatch::sync, at most kCudaSyncSlots
// tiles), else (sync null, more tiles) by launch_sum_k_splits.
void launch_sgemm_f32(const uint8_t *W, int64_t row_bytes, int K, int M, const float *X, int N, float *Y, float *part, int splits,
                      unsigned *sync, cudaStream_t s);

}  // namespace moe
