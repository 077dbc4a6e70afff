// Direct f16 decoders for the tensor-core GEMM: dequant32_f16<T>(row, s, p) writes the 32
// weights of sub-block s as 16 f16 pairs (p[i] = weights 2i, 2i+1; the lower index in the
// low half), for the types that dominate prefill. Hopper converts int->float and
// f32->f16 at 1/8 of the FMA rate, and dequant32 + packing spends one of each per weight;
// here integers q < 256 become exact f16 values through the bit pattern 0x6400 | q
// (= 1024 + q, one byte permute per pair), then packed f16 arithmetic: an exact
// subtraction of the offset, and q * d (- m) rounded once. Q4_0 / Q8_0 give exactly the f16
// rounding of the reference weight (their f16 scale times a small integer is exact in
// f32); the K-quants round their sub-block scale and min to f16 first (~2^-12 relative,
// the same order as rounding each weight). Other types: has_dequant32_f16<T> is false and
// the GEMM rounds dequant32's f32 weights.
#pragma once
#include <cstring>

#include "backends/cuda/ops/quant.cuh"

namespace moe {

template <DType T> constexpr bool has_dequant32_f16 =
    T == DType::Q4_0 || T == DType::Q8_0 || T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K;

__device__ __forceinline__ __half2 bits_to_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}
__device__ __forceinline__ uint32_t h2_to_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// Bytes (0, 1) of v as the f16 pair (1024 + b0, 1024 + b1); bytes (2, 3) likewise.
__device__ __forceinline__ __half2 magic_lo(uint32_t v) { return bits_to_h2(__byte_perm(v, 0x64646464u, 0x4140u)); }
__device__ __forceinline__ __half2 magic_hi(uint32_t v) { return bits_to_h2(__byte_perm(v, 0x64646464u, 0x4342u)); }

// Four bytes as two pairs: p[0] = (b0, b1) * d + c, p[1] = (b2, b3) * d + c, where the bytes
// hold q + off (so 1024 + off is subtracted first, exactly).
__device__ __forceinline__ void scale4(uint32_t v, __half2 off, __half2 d, __half2 c, uint32_t *p) {
  p[0] = h2_to_bits(__hfma2(__hsub2(magic_lo(v), off), d, c));
  p[1] = h2_to_bits(__hfma2(__hsub2(magic_hi(v), off), d, c));
}

// 32-bit little-endian word from a 2-byte aligned address (blocks of 18, 34 and 210 bytes).
__device__ __forceinline__ uint32_t word16(const uint8_t *p) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

template <DType T> __device__ __forceinline__ void dequant32_f16(const uint8_t *row, int s, uint32_t *p);

template <> __device__ __forceinline__ void dequant32_f16<DType::Q4_0>(const uint8_t *row, int s, uint32_t *p) {
  const uint8_t *b = row + s * 18;
  const __half2 d = __half2half2(bits_to_h2(word16(b)).x), off = __float2half2_rn(1032.0f), z = __float2half2_rn(0.0f);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t u = word16(b + 2 + 4 * k);  // quant bytes 4k..4k+3: weights 4k.. (low), 16 + 4k.. (high)
    scale4(u & 0x0F0F0F0Fu, off, d, z, p + 2 * k);
    scale4((u >> 4) & 0x0F0F0F0Fu, off, d, z, p + 8 + 2 * k);
  }
}

template <> __device__ __forceinline__ void dequant32_f16<DType::Q8_0>(const uint8_t *row, int s, uint32_t *p) {
  const uint8_t *b = row + s * 34;
  const __half2 d = __half2half2(bits_to_h2(word16(b)).x), off = __float2half2_rn(1152.0f), z = __float2half2_rn(0.0f);
#pragma unroll
  for (int k = 0; k < 8; ++k) scale4(word16(b + 2 + 4 * k) ^ 0x80808080u, off, d, z, p + 2 * k);  // int8 q -> q + 128
}

template <> __device__ __forceinline__ void dequant32_f16<DType::Q4_K>(const uint8_t *row, int s, uint32_t *p) {
  const uint8_t *b = row + (s >> 3) * 144;
  const int j = s & 7;
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  const __half2 d1 = __float2half2_rn(h2f(b) * sc), nm1 = __float2half2_rn(-(h2f(b + 2) * m)), off = __float2half2_rn(1024.0f);
  // Rows of Q4_K are multiples of 144 = 9*16 bytes: the 32 quant bytes are 16-byte aligned.
  const uint4 *q4 = reinterpret_cast<const uint4 *>(b + 16 + 32 * (j >> 1));
  const uint4 v0 = q4[0], v1 = q4[1];
  const uint32_t u[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  const int sh = (j & 1) * 4;
#pragma unroll
  for (int k = 0; k < 8; ++k) scale4((u[k] >> sh) & 0x0F0F0F0Fu, off, d1, nm1, p + 2 * k);
}

template <> __device__ __forceinline__ void dequant32_f16<DType::Q5_K>(const uint8_t *row, int s, uint32_t *p) {
  const uint8_t *b = row + (s >> 3) * 176;
  const int j = s & 7, pp = j >> 1, hi = j & 1;
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  const __half2 d1 = __float2half2_rn(h2f(b) * sc), nm1 = __float2half2_rn(-(h2f(b + 2) * m)), off = __float2half2_rn(1024.0f);
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(b + 16);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(b + 48 + 32 * pp);
  const uint4 h0 = qh4[0], h1 = qh4[1], l0 = ql4[0], l1 = ql4[1];
  const uint32_t uh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
  const uint32_t ul[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
  const int sh = hi * 4, bit = 2 * pp + hi;
#pragma unroll
  for (int k = 0; k < 8; ++k) scale4(((ul[k] >> sh) & 0x0F0F0F0Fu) | (((uh[k] >> bit) & 0x01010101u) << 4), off, d1, nm1, p + 2 * k);
}

template <> __device__ __forceinline__ void dequant32_f16<DType::Q6_K>(const uint8_t *row, int s, uint32_t *p) {
  const uint8_t *b = row + (s >> 3) * 210;
  const int j = s & 7, h = j >> 2, g = j & 3;
  const float d = h2f(b + 208);
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * g);
  // Weights 0-15 take scale sc[0], 16-31 sc[1]; q - 32 with the 6-bit q stored as q + 0.
  const __half2 d0 = __float2half2_rn(d * sc[0]), d1 = __float2half2_rn(d * sc[1]), off = __float2half2_rn(1056.0f),
                z = __float2half2_rn(0.0f);
  const uint8_t *ql = b + 64 * h + (g & 1) * 32, *qh = b + 128 + 32 * h;
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t q6 = ((word16(ql + 4 * k) >> shl) & 0x0F0F0F0Fu) | (((word16(qh + 4 * k) >> shh) & 0x03030303u) << 4);
    scale4(q6, off, k < 4 ? d0 : d1, z, p + 2 * k);
  }
}

}  // namespace moe
