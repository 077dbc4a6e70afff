// Weight staging of the exact-product tensor-core GEMM (matmul_mmq.cu): one 32-weight
// sub-block of a GGUF row as f16 integer mma operands plus the f32 scales that turn their
// exact products back into weights (see stage_subblock). Integers reach f16 without int->float
// conversions, through the exponent byte 0x64 (1024 + v is exact for v < 1024). Q4_0, Q8_0,
// MXFP4, Q4_K, Q5_K, Q6_K take the int8 path instead (mmq_i8_weights.cuh).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/quant.cuh"

namespace moe {
namespace mmq {

using mma_tile::pack2;

// f16 bits of two integers in [-128, 127]: 0x6400 | v is the f16 1024 + v for v < 1024, so
// (0x6400 | (q + 128)) - 1152 is q exactly; one subtraction for the pair.
__device__ __forceinline__ uint32_t int_pair_f16(int lo, int hi) {
  const uint32_t u = static_cast<uint32_t>(lo + 128) | (static_cast<uint32_t>(hi + 128) << 16) | 0x64006400u;
  const uint32_t bias = 0x64806480u;  // 1152, 1152
  __half2 h, b;
  memcpy(&h, &u, 4);
  memcpy(&b, &bias, 4);
  h = __hsub2(h, b);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

// Sub-block s of a weight row as staged for the mma: w the f16 pairs of its integers (times
// the integer group scale for Q2_K / Q3_K), ws[k] = (a, or d for Q2_K / Q3_K; dmin) of its
// k16 groups, m the min integers of the groups (f16 pair; types with a min term), so weight
// l is ws.x * w_l - ws.y * m (checked against dequant32 through cuda_unpack32_check_launch).
template <DType T>
__device__ __forceinline__ void stage_subblock(const uint8_t *wrow, int s, uint32_t (&w)[16], float2 (&ws)[2], uint32_t &m) {
  int q[32];
  float a[2], b[2];
  unpack32<T>(wrow, s, q, a, b);
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i] = int_pair_f16(q[2 * i], q[2 * i + 1]);
  if constexpr (has_int_group_scale<T>) {
    // a = d * sc exactly with |sc| <= 63, so a rounded fast quotient recovers sc; q * sc is
    // exact in f16.
    const float d = superblock_d<T>(wrow, s);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float scf = d != 0.0f ? rintf(__fdividef(a[k], d)) : 0.0f;
      const __half2 sc = __float2half2_rn(scf);
#pragma unroll
      for (int i = 8 * k; i < 8 * k + 8; ++i) {
        __half2 h;
        memcpy(&h, &w[i], 4);
        h = __hmul2(h, sc);
        memcpy(&w[i], &h, 4);
      }
      a[k] = d;
    }
  }
  m = 0;
  if constexpr (has_min<T>) {
    // b = -(dmin * m) exactly with m <= 63: recovered like sc; the pair (b) becomes dmin.
    const float dmin = superblock_dmin<T>(wrow, s);
    float mi[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      mi[k] = dmin != 0.0f ? rintf(__fdividef(-b[k], dmin)) : 0.0f;
      b[k] = dmin;
    }
    m = pack2<false>(mi[0], mi[1]);
  }
  ws[0] = make_float2(a[0], b[0]);
  ws[1] = make_float2(a[1], b[1]);
}

}  // namespace mmq
}  // namespace moe
