// The last-block pattern of kernels whose final block merges or finishes what the others
// wrote (router_mv_kernel, topk_router_kernel, the DeltaNet norm): each block counts itself on a counter of
// DevUbatch::sync, which is zero at rest; the block that arrives last sets it back to zero, so
// the next launch (or graph replay) starts from zero again.
#pragma once
#include <cuda_runtime.h>

namespace moe {

// Whether this block is the last of `blocks` to arrive at *counter. Block-wide: every thread
// calls it (the same result in all of them), after the block's global writes; a thread whose
// writes the last block reads calls __threadfence() after them first. When true, the other
// blocks' fenced writes are visible: read them through L2 (__ldcg), not L1.
__device__ __forceinline__ bool last_block_arrives(unsigned *counter, unsigned blocks) {
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // the block's writes are visible device-wide before the block is counted
    s_last = atomicAdd(counter, 1u) == blocks - 1;
    if (s_last) *counter = 0;  // every block has counted: ready for the next launch / replay
  }
  __syncthreads();
  const bool last = s_last;
  if (last) __threadfence();
  return last;
}

}  // namespace moe
