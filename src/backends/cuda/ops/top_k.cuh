// Warp top-k over at most kCudaMaxExperts values, shared by the TopK kernel (moe_route.cu)
// and the fused router (fused.cu): k rounds of "largest not yet taken, lowest index on
// ties", as the CPU reference; warp_top_k_ranked gives the same ids without the k serial
// rounds (the router's tail, where they were ~1 us of a ~12 us launch).
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

// warp_top_k's ids (the k largest in order, lowest index on ties; -1 past E) when no value is
// NaN: with no NaN those rounds take the first k of the order "value descending, then index
// ascending", so each value's place in it is the ids' slot. Only values at or above a lower
// bound t of the k-th largest are ranked: t is the k-th largest of the 32 lanes' maxima (k
// distinct values, each at least t); every value ahead of a top-k value is one of them, so
// their ranks among themselves are their ranks in the row. A NaN (no such order): warp_top_k.
// All 32 lanes call it; out (shared) is written by several lanes: __syncwarp() before reading.
__device__ __forceinline__ void warp_top_k_ranked(const float *src, int E, int k, int32_t *out) {
  constexpr int kSlots = kCudaMaxExperts / 32;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  if (k <= 0) return;
  float v[kSlots];
  float mx = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    const int e = lane + 32 * q;
    v[q] = e < E ? src[e] : -INFINITY;
    nan = nan || v[q] != v[q];
    mx = fmaxf(mx, v[q]);
  }
  if (__ballot_sync(all, nan)) {
    warp_top_k(src, E, k, out);
    return;
  }
  // The bound: the lane whose maximum is k-th in (value descending, lane ascending).
  int r = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float o = __shfl_sync(all, mx, j);
    r += o > mx || (o == mx && j < lane);
  }
  const int k32 = k < 32 ? k : 32;
  const float t = __shfl_sync(all, mx, __ffs(__ballot_sync(all, r == k32 - 1)) - 1);
  unsigned cand[kSlots];
  int rank[kSlots];
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    cand[q] = __ballot_sync(all, lane + 32 * q < E && v[q] >= t);
    rank[q] = 0;
  }
  // Each candidate against every candidate, one broadcast at a time (warp-uniform loops).
#pragma unroll
  for (int q2 = 0; q2 < kSlots; ++q2)
    for (unsigned m = cand[q2]; m; m &= m - 1) {
      const int l2 = __ffs(m) - 1, e2 = l2 + 32 * q2;
      const float o = __shfl_sync(all, v[q2], l2);
#pragma unroll
      for (int q = 0; q < kSlots; ++q)
        if (32 * q < E) rank[q] += o > v[q] || (o == v[q] && e2 < lane + 32 * q);  // warp-uniform
    }
  for (int j = lane; j < k; j += 32) out[j] = -1;
  __syncwarp();
#pragma unroll
  for (int q = 0; q < kSlots; ++q)
    if ((cand[q] >> lane & 1u) && rank[q] < k) out[rank[q]] = lane + 32 * q;
}

}  // namespace moe
