// Activation rounding with a warp per 256 consecutive elements, a lane holding 8 of them
// (element lane * 8 + l): the one-token mat-vec rounds into shared memory this way
// (matvec.cu round_slots) and the prompt products' act_round_q8k_kernel (matmul.cu) into
// global scratch. Same values as the CPU's Q8_0 / Q8_K quantizers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moe {

// v[0..7] = src[i0 .. i0 + 7] when in (else zeros); one 16-byte pair of loads where aligned.
__device__ __forceinline__ void load8_floats(const float *src, int i0, bool in, float (&v)[8]) {
  if (in && (reinterpret_cast<uintptr_t>(src + i0) & 15) == 0) {
    const float4 p = reinterpret_cast<const float4 *>(src + i0)[0], q = reinterpret_cast<const float4 *>(src + i0)[1];
    v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w; v[4] = q.x; v[5] = q.y; v[6] = q.z; v[7] = q.w;
  } else {
#pragma unroll
    for (int l = 0; l < 8; ++l) v[l] = in ? src[i0 + l] : 0.0f;
  }
}

// Q8_K over the warp's 256 values: the largest magnitude (NaN never wins, as with the
// reference's '>' scan), its signed value at the first index that reaches it (the lowest lane
// with a match, its first match), iscale = -127 / that value, q = round-to-nearest(iscale v)
// capped at 127. Returns the scale 1 / iscale (0 for an all-zero block, q all 0). All lanes.
__device__ __forceinline__ float q8k_round_warp(const float (&v)[8], int (&q)[8]) {
  float am = 0.0f;
#pragma unroll
  for (int l = 0; l < 8; ++l) am = fmaxf(am, fabsf(v[l]));
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
  float mine = 0.0f;
  bool hit = false;
#pragma unroll
  for (int l = 7; l >= 0; --l)
    if (fabsf(v[l]) == am) { mine = v[l]; hit = true; }
  const unsigned hits = __ballot_sync(0xffffffffu, hit);
  const float mv = __shfl_sync(0xffffffffu, mine, hits ? __ffs(hits) - 1 : 0);
  if (am == 0.0f) {
#pragma unroll
    for (int l = 0; l < 8; ++l) q[l] = 0;
    return 0.0f;
  }
  const float iscale = -127.0f / mv;
#pragma unroll
  for (int l = 0; l < 8; ++l) q[l] = min(__float2int_rn(iscale * v[l]), 127);
  return 1.0f / iscale;
}

// The lane's 8 integers (each in -128..127) as int8 bytes, element order, in one 8-byte word.
__device__ __forceinline__ uint2 pack_int8x8(const int (&q)[8]) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    lo |= (static_cast<uint32_t>(q[l]) & 0xFFu) << (8 * l);
    hi |= (static_cast<uint32_t>(q[l + 4]) & 0xFFu) << (8 * l);
  }
  return make_uint2(lo, hi);
}

// The sum of the 16 integers of this lane's half block (lanes 2k and 2k + 1 hold one).
__device__ __forceinline__ int half_block_sum(const int (&q)[8]) {
  const int part = q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
  return part + __shfl_xor_sync(0xffffffffu, part, 1);
}

}  // namespace moe
