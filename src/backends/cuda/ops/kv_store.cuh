// Writing F32 values into a KV cache row (F32 / F16 / Q8_0 cells), shared by the KvStore
// kernel (attention.cu) and the fused head-norm chains (fused.cu) so both store alike.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/ops/kernel_error.cuh"
#include "quant/dtype.h"

namespace moe {

// One Q8_0 block of 32 values, one per lane of the calling warp (all 32 lanes call it).
__device__ __forceinline__ void kv_store_q8_0_block(float v, uint8_t *blk) {
  const int lane = threadIdx.x & 31;
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (lane == 0) *reinterpret_cast<__half *>(blk) = __float2half_rn(d);
  blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(v * id)));
}

// Whether a batch token's cell lies in the cache (n_cells cells). When not, the thread
// `reporter` reports it and the caller stores nothing; every thread that stores the row sees
// the same cell, so they all skip together (kv_store_values may shuffle within a warp).
__device__ __forceinline__ bool kv_cell_in_cache(int32_t cell, int n_cells, unsigned *err, bool reporter) {
  if (cell >= 0 && cell < n_cells) return true;
  if (reporter) report_bad_index(err, kKernelErrKvCell, cell, n_cells);
  return false;
}

// Values [0, n) of a cache row starting at element e0 of the row (e0 a multiple of 32 for
// Q8_0, n too), by threads tid = 0 .. nthr-1 (whole warps: tid % 32 is the lane): the whole
// block by default, or one warp (tid = lane, nthr = 32). Every one of them calls it.
__device__ __forceinline__ void kv_store_values(const float *src, int n, uint8_t *row, int e0, int kt, int tid = threadIdx.x,
                                                int nthr = blockDim.x) {
  if (kt == static_cast<int>(DType::F32)) {
    for (int i = tid; i < n; i += nthr) reinterpret_cast<float *>(row)[e0 + i] = src[i];
  } else if (kt == static_cast<int>(DType::F16)) {
    for (int i = tid; i < n; i += nthr) reinterpret_cast<__half *>(row)[e0 + i] = __float2half_rn(src[i]);
  } else {
    const int lane = tid & 31, warp = tid >> 5, nw = nthr >> 5;
    for (int b = warp; b < n / 32; b += nw) kv_store_q8_0_block(src[b * 32 + lane], row + (e0 / 32 + b) * 34);
  }
}

}  // namespace moe
