// Block-wide reductions (any block size that is a multiple of 32, at most 1024).
#pragma once
#include <cuda_runtime.h>

namespace moe {

template <typename V> __device__ __forceinline__ V blk_sum(V v, V *sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  V t = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += sh[w];
  return t;
}

__device__ __forceinline__ float blk_max(float v, float *sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t = fmaxf(t, sh[w]);
  return t;
}

}  // namespace moe
