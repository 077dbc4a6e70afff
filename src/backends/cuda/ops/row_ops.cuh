// Row reductions shared by the RmsNorm / Softmax kernels (elementwise.cu) and the fused
// kernels (fused.cu), so a fused chain computes exactly the bits of the unfused ops: the
// block size, the per-thread stride and the reduction order are part of the result.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/ops/reduce.cuh"

namespace moe {

// Threads per block of the row kernels for rows of n values.
inline int row_threads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 64; }

// 1 / rms of a row as the RmsNorm kernel computes it: threads [0, nthr) sum x*x (float
// product, double sum) with stride nthr; threads past nthr add zeros (same bits as a block
// of nthr). Block-wide: every thread calls it; sh holds 32 doubles.
__device__ __forceinline__ float rms_row_scale(const float *src, int64_t n, float eps, int nthr, double *sh) {
  double s = 0.0;
  if (static_cast<int>(threadIdx.x) < nthr)
    for (int64_t i = threadIdx.x; i < n; i += nthr) s += static_cast<double>(src[i] * src[i]);
  s = blk_sum(s, sh);
  return 1.0f / sqrtf(static_cast<float>(s / static_cast<double>(n)) + eps);
}

// Softmax of one row (max, exp, double sum, one float reciprocal) over threads [0, nthr)
// of the block (stride nthr; threads past nthr add nothing: the bits of a block of nthr);
// dst may be shared memory. Block-wide: every thread calls it. Each thread rescales only
// the values it wrote.
__device__ __forceinline__ void softmax_row(const float *src, float *dst, int64_t n, float *shf, double *shd, int nthr) {
  const int64_t i0 = static_cast<int>(threadIdx.x) < nthr ? threadIdx.x : n;
  float mx = -INFINITY;
  for (int64_t i = i0; i < n; i += nthr) mx = fmaxf(mx, src[i]);
  mx = blk_max(mx, shf);
  double s = 0.0;
  for (int64_t i = i0; i < n; i += nthr) {
    const float e = expf(src[i] - mx);
    dst[i] = e;
    s += e;
  }
  s = blk_sum(s, shd);
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t i = i0; i < n; i += nthr) dst[i] *= inv;
}

}  // namespace moe
