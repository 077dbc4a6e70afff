// The sum of a K-split GEMM's partial results inside the GEMM (mmq_i8_kernel, the raw Q4_K /
// Q6_K kernels, sgemm_f32_kernel): split z of output tile (blockIdx.x, blockIdx.y) writes its
// partial result to part + z n; the last of the tile's gridDim.z blocks to finish (one
// DevUbatch::sync counter per tile, last_block.cuh) adds the tile's partials in the order of
// z into y: the bits of sum_k_splits_kernel, without its launch.
#pragma once
#include <cstdint>

#include "backends/cuda/ops/last_block.cuh"

namespace moe {

// y: where the sum goes; ctr: gridDim.x * gridDim.y counters, zero at rest (<= kCudaSyncSlots),
// null: the partials are left to a separate launch_sum_k_splits.
struct KSplitSum {
  float *y;
  unsigned *ctr;
};

// Block-wide (launch-uniform: s.ctr set), called by every thread after its writes of the
// block's partial result, after pdl_wait (the counters are free: every earlier kernel has
// finished, its last blocks having set theirs back to zero). The tile: outputs
// y[c M + r] of rows r in [row0, row0 + BM) below M and columns c in [col0, col0 + cnt);
// n = the outputs of one split. Thread -> row threadIdx.x % BM, every Threads / BM-th
// column: a warp's loads are 32 consecutive floats, its BN / (Threads / BM) columns' loads
// of one split in flight together.
template <int BM, int BN, int Threads>
__device__ __forceinline__ void k_split_sum_last(const KSplitSum &s, const float *part, int64_t n, int M, int row0, int col0, int cnt) {
  static_assert(Threads % BM == 0 && BN % (Threads / BM) == 0, "a row per thread, every (Threads / BM)-th column");
  constexpr int kStep = Threads / BM, kCols = BN / kStep;
  __threadfence();  // this thread's partials are visible device-wide before the block is counted
  if (!last_block_arrives(s.ctr + blockIdx.y * gridDim.x + blockIdx.x, gridDim.z)) return;
  const int r = row0 + static_cast<int>(threadIdx.x) % BM, c0 = col0 + static_cast<int>(threadIdx.x) / BM;
  const int nc = (col0 + cnt - c0 + kStep - 1) / kStep;  // this thread's columns c0 + j kStep, j < nc
  const int64_t step = static_cast<int64_t>(kStep) * M;
  if (r >= M) return;
  // Addresses by pointer steps (no per-column offsets kept across z: registers).
  float sum[kCols];
  for (int z = 0; z < static_cast<int>(gridDim.z); ++z) {
    const float *p = part + z * n + static_cast<int64_t>(c0) * M + r;
#pragma unroll
    for (int j = 0; j < kCols; ++j, p += step) {
      if (j >= nc) break;
      const float v = __ldcg(p);  // another block's write: through L2
      sum[j] = z == 0 ? v : sum[j] + v;
    }
  }
  float *y = s.y + static_cast<int64_t>(c0) * M + r;
#pragma unroll
  for (int j = 0; j < kCols; ++j, y += step) {
    if (j >= nc) break;
    *y = sum[j];
  }
}

}  // namespace moe
