// Device helpers of both mat-vec families: the one-token kernels (matvec.cu) and the
// multi-column ones (matvec_cols.cu). Plain weights (F32 / F16 / BF16) meet f32 activations
// rounded elementwise to the weight's type, as act_round_kernel rounds them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "quant/dtype.h"

namespace moe {

// One warp prefetches [p, p + n) into L2 (weights only: allowed before pdl_wait). At most
// 64 KB: enough to cover the first DRAM round trip.
__device__ __forceinline__ void prefetch_l2(const uint8_t *p, int64_t n) {
#ifdef __CUDA_ARCH__  // (host emulation: tools/cuda_emu)
  n = n < 65536 ? n : 65536;
  for (int64_t o = (threadIdx.x & 31) * 128; o < n; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Activation rounding of plain weight types, elementwise (as act_round_kernel).
template <DType T> __device__ __forceinline__ float round_plain(float v) {
  if constexpr (T == DType::F16) return __half2float(__float2half_rn(v));
  else if constexpr (T == DType::BF16) return __bfloat162float(__float2bfloat16_rn(v));
  else return v;
}

// 8 consecutive weights of a plain row from 16-byte aligned memory.
template <DType T> __device__ __forceinline__ void load8(const uint8_t *row, int i, float (&w)[8]) {
  if constexpr (T == DType::F32) {
    const float4 p = __ldg(reinterpret_cast<const float4 *>(row) + i / 4), q = __ldg(reinterpret_cast<const float4 *>(row) + i / 4 + 1);
    w[0] = p.x; w[1] = p.y; w[2] = p.z; w[3] = p.w; w[4] = q.x; w[5] = q.y; w[6] = q.z; w[7] = q.w;
  } else {
    const uint4 p = __ldg(reinterpret_cast<const uint4 *>(row) + i / 8);
    const uint32_t u[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      if constexpr (T == DType::F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u[h]));
        w[2 * h] = f.x;
        w[2 * h + 1] = f.y;
      } else {
        w[2 * h] = __uint_as_float(u[h] << 16);
        w[2 * h + 1] = __uint_as_float(u[h] & 0xFFFF0000u);
      }
    }
  }
}

}  // namespace moe
