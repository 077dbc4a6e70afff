// Warp top-k over at most kCudaMaxExperts values, shared by the TopK kernel (moe_route.cu)
// and the fused router (fused.cu): k rounds of "largest not yet taken, lowest index on
// ties", as the CPU reference.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace moe {

// All 32 lanes of the calling warp call it; lane 0 writes out[0..k).
__device__ __forceinline__ void warp_top_k(const float *src, int E, int k, int32_t *out) {
  constexpr int kSlots = kCudaMaxExperts / 32;
  const int lane = threadIdx.x & 31;
  float v[kSlots];
  unsigned taken = 0;
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    const int e = lane + 32 * q;
    v[q] = e < E ? src[e] : 0.0f;
    if (e >= E) taken |= 1u << q;
  }
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      if (32 * q >= E) break;  // warp-uniform: slots past the experts never hold a candidate
      if (taken & (1u << q)) continue;
      const int e = lane + 32 * q;
      if (bi < 0 || v[q] > bv) { bv = v[q]; bi = e; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      const bool better = oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi));
      if (better) { bv = ov; bi = oi; }
    }
    if (lane == 0) out[j] = bi;
    if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
  }
}

}  // namespace moe
