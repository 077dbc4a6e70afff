// Direct f16 decoders for the tensor-core GEMM, for the types that dominate prefill:
// RawF16<T>::load(row, s) brings the bytes of sub-block s (32 weights) into registers with
// loads only, decode(p) then writes the 32 weights as 16 f16 pairs (p[i] = weights 2i,
// 2i+1; the lower index in the low half) with arithmetic only, so the GEMM can run its mma
// between the two while the loads are in flight. Hopper converts int->float and
// f32->f16 at 1/8 of the FMA rate, and dequant32 + packing spends one of each per weight;
// here integers q < 256 become exact f16 values through the bit pattern 0x6400 | q
// (= 1024 + q, one byte permute per pair), then packed f16 arithmetic: an exact
// subtraction of the offset, and q * d (- m) rounded once. Q4_0 / Q8_0 give exactly the f16
// rounding of the reference weight (their f16 scale times a small integer is exact in
// f32); the K-quants round their sub-block scale and min to f16 first (~2^-12 relative,
// the same order as rounding each weight). Other types: has_raw_f16<T> is false and
// the GEMM rounds dequant32's f32 weights. Block addresses and fields as in quant.cuh.
#pragma once
#include <cstring>

#include "backends/cuda/ops/quant.cuh"

namespace moe {

template <DType T> constexpr bool has_raw_f16 =
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

// Four bytes holding q + o as two pairs: p[0] = (q0, q1) * d + c, p[1] = (q2, q3) * d + c,
// with off = 1024 + o (subtracted exactly before the rounded multiply-add).
__device__ __forceinline__ void scale4(uint32_t v, __half2 off, __half2 d, __half2 c, uint32_t *p) {
  p[0] = h2_to_bits(__hfma2(__hsub2(magic_lo(v), off), d, c));
  p[1] = h2_to_bits(__hfma2(__hsub2(magic_hi(v), off), d, c));
}

// 32-bit little-endian word from a 2-byte aligned address (blocks of 18, 34 and 210 bytes).
__device__ __forceinline__ uint32_t word16(const uint8_t *p) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

// scale_min_k4 on the 12 scale bytes held as three words (bytes 0-3, 4-7, 8-11).
__device__ __forceinline__ void scale_min_k4_words(int j, uint32_t lo, uint32_t mid, uint32_t hi, int &d, int &m) {
  const int sh = (j & 3) * 8;
  const int bl = (lo >> sh) & 0xFF, bm = (mid >> sh) & 0xFF, bh = (hi >> sh) & 0xFF;
  if (j < 4) {
    d = bl & 63;
    m = bm & 63;
  } else {
    d = (bh & 0xF) | ((bl >> 6) << 4);
    m = (bh >> 4) | ((bm >> 6) << 4);
  }
}

// Q4_K / Q5_K: (f16 d, f16 dmin, 12 scale bytes) -> the pair constants d * sc, -dmin * m.
__device__ __forceinline__ void k4_scale_min(const uint4 &hdr, int j, __half2 &d1, __half2 &nm1) {
  int sc, m;
  scale_min_k4_words(j, hdr.y, hdr.z, hdr.w, sc, m);
  const __half2 dd = bits_to_h2(hdr.x);  // (d, dmin)
  d1 = __float2half2_rn(__low2float(dd) * sc);
  nm1 = __float2half2_rn(-(__high2float(dd) * m));
}

template <DType T> struct RawF16;

template <> struct RawF16<DType::Q4_0> {
  uint32_t d, u[4];  // f16 scale bits; quant bytes 4k..4k+3: weights 4k.. (low), 16 + 4k.. (high)
  __device__ __forceinline__ void load(const uint8_t *row, int s) {
    const uint8_t *b = row + s * 18;
    d = *reinterpret_cast<const uint16_t *>(b);
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = word16(b + 2 + 4 * k);
  }
  __device__ __forceinline__ void decode(uint32_t *p) const {
    const __half2 dh = bits_to_h2(d * 0x10001u), off = __float2half2_rn(1032.0f), z = __float2half2_rn(0.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      scale4(u[k] & 0x0F0F0F0Fu, off, dh, z, p + 2 * k);
      scale4((u[k] >> 4) & 0x0F0F0F0Fu, off, dh, z, p + 8 + 2 * k);
    }
  }
};

template <> struct RawF16<DType::Q8_0> {
  uint32_t d, u[8];
  __device__ __forceinline__ void load(const uint8_t *row, int s) {
    const uint8_t *b = row + s * 34;
    d = *reinterpret_cast<const uint16_t *>(b);
#pragma unroll
    for (int k = 0; k < 8; ++k) u[k] = word16(b + 2 + 4 * k);
  }
  __device__ __forceinline__ void decode(uint32_t *p) const {
    const __half2 dh = bits_to_h2(d * 0x10001u), off = __float2half2_rn(1152.0f), z = __float2half2_rn(0.0f);
#pragma unroll
    for (int k = 0; k < 8; ++k) scale4(u[k] ^ 0x80808080u, off, dh, z, p + 2 * k);  // int8 q -> byte q + 128
  }
};

// Rows of Q4_K / Q5_K are multiples of 144 / 176 bytes (multiples of 16): 16-byte loads.
template <> struct RawF16<DType::Q4_K> {
  uint4 hdr, q0, q1;
  int j;
  __device__ __forceinline__ void load(const uint8_t *row, int s) {
    const uint8_t *b = row + (s >> 3) * 144;
    j = s & 7;
    hdr = *reinterpret_cast<const uint4 *>(b);
    const uint4 *q4 = reinterpret_cast<const uint4 *>(b + 16 + 32 * (j >> 1));
    q0 = q4[0];
    q1 = q4[1];
  }
  __device__ __forceinline__ void decode(uint32_t *p) const {
    __half2 d1, nm1;
    k4_scale_min(hdr, j, d1, nm1);
    const __half2 off = __float2half2_rn(1024.0f);
    const uint32_t u[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const int sh = (j & 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; ++k) scale4((u[k] >> sh) & 0x0F0F0F0Fu, off, d1, nm1, p + 2 * k);
  }
};

template <> struct RawF16<DType::Q5_K> {
  uint4 hdr, h0, h1, l0, l1;
  int j;
  __device__ __forceinline__ void load(const uint8_t *row, int s) {
    const uint8_t *b = row + (s >> 3) * 176;
    j = s & 7;
    hdr = *reinterpret_cast<const uint4 *>(b);
    const uint4 *qh4 = reinterpret_cast<const uint4 *>(b + 16);
    const uint4 *ql4 = reinterpret_cast<const uint4 *>(b + 48 + 32 * (j >> 1));
    h0 = qh4[0];
    h1 = qh4[1];
    l0 = ql4[0];
    l1 = ql4[1];
  }
  __device__ __forceinline__ void decode(uint32_t *p) const {
    __half2 d1, nm1;
    k4_scale_min(hdr, j, d1, nm1);
    const __half2 off = __float2half2_rn(1024.0f);
    const uint32_t uh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    const uint32_t ul[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const int sh = (j & 1) * 4, bit = j;  // high bit of weight l: bit 2 (j / 2) + j % 2 = j of qh[l]
#pragma unroll
    for (int k = 0; k < 8; ++k) scale4(((ul[k] >> sh) & 0x0F0F0F0Fu) | (((uh[k] >> bit) & 0x01010101u) << 4), off, d1, nm1, p + 2 * k);
  }
};

// 210-byte blocks are only 2-byte aligned: 16-bit loads.
template <> struct RawF16<DType::Q6_K> {
  uint32_t ql[8], qh[8], d, sc;  // sc: the two int8 scales of this sub-block (weights 0-15, 16-31)
  int j;
  __device__ __forceinline__ void load(const uint8_t *row, int s) {
    const uint8_t *b = row + (s >> 3) * 210;
    j = s & 7;
    const int h = j >> 2, g = j & 3;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      ql[k] = word16(b + 64 * h + (g & 1) * 32 + 4 * k);
      qh[k] = word16(b + 128 + 32 * h + 4 * k);
    }
    d = *reinterpret_cast<const uint16_t *>(b + 208);
    sc = *reinterpret_cast<const uint16_t *>(b + 192 + 8 * h + 2 * g);
  }
  __device__ __forceinline__ void decode(uint32_t *p) const {
    const float df = __low2float(bits_to_h2(d));
    const int sc0 = static_cast<int8_t>(sc & 0xFF), sc1 = static_cast<int8_t>(sc >> 8);
    // 6-bit q stored as is, weight (q - 32) * d * sc: subtract 1024 + 32.
    const __half2 d0 = __float2half2_rn(df * sc0), d1 = __float2half2_rn(df * sc1), off = __float2half2_rn(1056.0f),
                  z = __float2half2_rn(0.0f);
    const int g = j & 3, shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t q6 = ((ql[k] >> shl) & 0x0F0F0F0Fu) | (((qh[k] >> shh) & 0x03030303u) << 4);
      scale4(q6, off, k < 4 ? d0 : d1, z, p + 2 * k);
    }
  }
};

}  // namespace moe
