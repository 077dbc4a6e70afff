// Weight staging of the exact-product tensor-core GEMM (matmul_mmq.cu): one 32-weight
// sub-block of a GGUF row as f16 integer mma operands plus the f32 scales that turn their
// exact products back into weights (see stage_subblock). No int->float conversions: integers
// reach f16 through the exponent byte 0x64 (1024 + v is exact for v < 1024).
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

// Fast path for the common types: the f16 operand pairs straight from the packed bytes, 4
// codes (unsigned, q + offset) per 32-bit word, one byte permute per pair onto the f16
// exponent byte 0x64 (1024 + code, exact); the weight integer is 1024 + code - bias, removed
// by one f16 subtraction (or fused into the group-scale multiply). bias 0: unpack32's ints.
template <DType T>
constexpr int code_bias = T == DType::Q4_K || T == DType::Q5_K ? 1024
                          : T == DType::Q6_K                    ? 1024 + 32
                          : T == DType::Q4_0                    ? 1024 + 8
                          : T == DType::Q8_0                    ? 1024 + 128
                                                                : 0;

// Four codes (one per byte of n, each < 1024) -> two f16 pairs 1024 + code, lower k low.
__device__ __forceinline__ void codes_to_pairs(uint32_t n, uint32_t *w) {
  w[0] = __byte_perm(n, 0x64646464u, 0x4140);
  w[1] = __byte_perm(n, 0x64646464u, 0x4342);
}

template <DType T> __device__ __forceinline__ void code_pairs(const uint8_t *row, int s, uint32_t *w);

// The 32 nibbles of sub-block s (layout as in unpack32<Q4_K>).
template <> __device__ __forceinline__ void code_pairs<DType::Q4_K>(const uint8_t *row, int s, uint32_t *w) {
  const uint8_t *blk = row + (s >> 3) * 144;
  const int j = s & 7, sh = (j & 1) * 4;
  const uint4 *q4 = reinterpret_cast<const uint4 *>(blk + 16 + 32 * (j >> 1));
  const uint4 v0 = q4[0], v1 = q4[1];
  const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) codes_to_pairs((words[k] >> sh) & 0x0F0F0F0Fu, w + 2 * k);
}

// 32-bit word k of bytes that are only 2-byte aligned.
__device__ __forceinline__ uint32_t word16(const uint8_t *p, int k) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return h[2 * k] | (static_cast<uint32_t>(h[2 * k + 1]) << 16);
}

// Q4_0: codes q + 8, elements 0-15 in the low nibbles of the 16 bytes, 16-31 in the high ones.
template <> __device__ __forceinline__ void code_pairs<DType::Q4_0>(const uint8_t *row, int s, uint32_t *w) {
  const uint8_t *qs = row + s * 18 + 2;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t v = word16(qs, k);
    codes_to_pairs(v & 0x0F0F0F0Fu, w + 2 * k);
    codes_to_pairs((v >> 4) & 0x0F0F0F0Fu, w + 8 + 2 * k);
  }
}

// Q8_0: codes q + 128 (the sign bit flipped).
template <> __device__ __forceinline__ void code_pairs<DType::Q8_0>(const uint8_t *row, int s, uint32_t *w) {
  const uint8_t *qs = row + s * 34 + 2;
#pragma unroll
  for (int k = 0; k < 8; ++k) codes_to_pairs(word16(qs, k) ^ 0x80808080u, w + 2 * k);
}

// Q5_K: codes q (layout as in unpack32<Q5_K>).
template <> __device__ __forceinline__ void code_pairs<DType::Q5_K>(const uint8_t *row, int s, uint32_t *w) {
  const uint8_t *blk = row + (s >> 3) * 176;
  const int j = s & 7, p = j >> 1, hi = j & 1;
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(blk + 16);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(blk + 48 + 32 * p);
  const uint4 h0 = qh4[0], h1 = qh4[1], l0 = ql4[0], l1 = ql4[1];
  const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
  const uint32_t lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
  const int sh = hi * 4, hb = 2 * p + hi;
#pragma unroll
  for (int k = 0; k < 8; ++k) codes_to_pairs(((lw[k] >> sh) & 0x0F0F0F0Fu) | (((hw[k] >> hb) & 0x01010101u) << 4), w + 2 * k);
}

// The 32 6-bit codes (q + 32) of sub-block s (layout as in unpack32<Q6_K>; 16-bit loads).
template <> __device__ __forceinline__ void code_pairs<DType::Q6_K>(const uint8_t *row, int s, uint32_t *w) {
  const uint8_t *blk = row + (s >> 3) * 210;
  const int j = s & 7, h = j >> 2, g = j & 3;
  const uint8_t *ql = blk + 64 * h + (g & 1) * 32, *qh = blk + 128 + 32 * h;
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    codes_to_pairs(((word16(ql, k) >> shl) & 0x0F0F0F0Fu) | (((word16(qh, k) >> shh) & 0x03030303u) << 4), w + 2 * k);
}

// Sub-block s of a weight row as staged for the mma: w the f16 pairs of its integers (times
// the integer group scale for Q2_K..Q5_K), ws[k] = (a, or d for Q2_K..Q5_K; dmin) of its
// k16 groups, m the min integers of the groups (f16 pair; types with a min term), so weight
// l is ws.x * w_l - ws.y * m (checked against dequant32 through cuda_unpack32_check_launch).
template <DType T>
__device__ __forceinline__ void stage_subblock(const uint8_t *wrow, int s, uint32_t (&w)[16], float2 (&ws)[2], uint32_t &m) {
  int q[32];
  float a[2], b[2];
  unpack32<T>(wrow, s, q, a, b);  // (q unused on the fast path: dead code)
  constexpr int bias = code_bias<T>;
  if constexpr (bias != 0) {
    code_pairs<T>(wrow, s, w);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = int_pair_f16(q[2 * i], q[2 * i + 1]);
  }
  if constexpr (has_int_group_scale<T>) {
    // a = d * sc exactly with |sc| <= 63, so a rounded fast quotient recovers sc; q * sc is
    // exact in f16 (fused with the bias removal: (q + bias) sc - bias sc rounds once, exact).
    const float d = superblock_d<T>(wrow, s);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float scf = d != 0.0f ? rintf(__fdividef(a[k], d)) : 0.0f;
      const __half2 sc = __float2half2_rn(scf), off = __float2half2_rn(-static_cast<float>(bias) * scf);
#pragma unroll
      for (int i = 8 * k; i < 8 * k + 8; ++i) {
        __half2 h;
        memcpy(&h, &w[i], 4);
        h = bias != 0 ? __hfma2(h, sc, off) : __hmul2(h, sc);
        memcpy(&w[i], &h, 4);
      }
      a[k] = d;
    }
  } else if constexpr (bias != 0) {
    const __half2 off = __float2half2_rn(static_cast<float>(bias));
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      __half2 h;
      memcpy(&h, &w[i], 4);
      h = __hsub2(h, off);
      memcpy(&w[i], &h, 4);
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
