// Device decoding of the weight types that have no MMQ / mat-vec path of their own (Q4_1,
// Q5_0, Q5_1, IQ4_NL, IQ4_XS and the grid i-quants IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS,
// IQ1_S, IQ1_M): one 32-weight sub-block at a time into signed 8-bit codes and scales,
//
//   weight l = value_scale(b, l / 16) * q[l] (+ b.m)           the CPU dequantizer's floats
//   dot      = (b.d * xd) * (ls0 * isum(q[0..15]) + ls1 * isum(q[16..31])) (+ b.m * xs)
//
// so GetRows / f16 dequantization, the integer dot products (quant_extra.cu) and the int8 MMQ
// staging (mmq_i8_extra.cuh) start from one
// decoder per type, which follows the CPU's quant/iq_decode.cpp, quant/iq4.cpp and
// quant/q4_1_q5.cpp. The grid and sign tables are quant/iq_grids.inc, the CPU's own numbers,
// compiled here as static __device__ arrays: each translation unit that includes this header
// (quant_extra.cu, matmul_mmq_i8.cu through mmq_i8_extra.cuh) holds its own copy (~40 KB).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "quant/dtype.h"
#include "quant/quant_util.h"

namespace moe {

namespace iq_dev {
#define MOE_IQ_TABLE static __device__
#include "quant/iq_grids.inc"
#undef MOE_IQ_TABLE
}  // namespace iq_dev

// IQ4 value table as four words of four int8 values (for __byte_perm), from the CPU's table.
constexpr uint32_t iq4_word(int i) {
  return static_cast<uint32_t>(static_cast<uint8_t>(kIq4nlValues[4 * i])) |
         (static_cast<uint32_t>(static_cast<uint8_t>(kIq4nlValues[4 * i + 1])) << 8) |
         (static_cast<uint32_t>(static_cast<uint8_t>(kIq4nlValues[4 * i + 2])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(kIq4nlValues[4 * i + 3])) << 24);
}
constexpr uint32_t kIq4W0 = iq4_word(0), kIq4W1 = iq4_word(1), kIq4W2 = iq4_word(2), kIq4W3 = iq4_word(3);

constexpr bool is_extra_type(DType t) {
  switch (t) {
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: case DType::IQ4_XS: case DType::IQ3_S:
    case DType::IQ3_XXS: case DType::IQ2_S: case DType::IQ2_XS: case DType::IQ2_XXS: case DType::IQ1_S: case DType::IQ1_M: return true;
    default: return false;
  }
}
template <DType T> constexpr bool extra_has_min = T == DType::Q4_1 || T == DType::Q5_1;
template <DType T> constexpr int extra_qk = T == DType::Q4_1 || T == DType::Q5_0 || T == DType::Q5_1 || T == DType::IQ4_NL ? 32 : 256;
// Bytes per block (BlockQ4_1 ... in quant/dtype.h).
template <DType T> constexpr int extra_bytes() {
  switch (T) {
    case DType::Q4_1: return sizeof(BlockQ4_1);
    case DType::Q5_0: return sizeof(BlockQ5_0);
    case DType::Q5_1: return sizeof(BlockQ5_1);
    case DType::IQ4_NL: return sizeof(BlockIQ4_NL);
    case DType::IQ4_XS: return sizeof(BlockIQ4_XS);
    case DType::IQ3_S: return sizeof(BlockIQ3_S);
    case DType::IQ3_XXS: return sizeof(BlockIQ3_XXS);
    case DType::IQ2_S: return sizeof(BlockIQ2_S);
    case DType::IQ2_XS: return sizeof(BlockIQ2_XS);
    case DType::IQ2_XXS: return sizeof(BlockIQ2_XXS);
    case DType::IQ1_S: return sizeof(BlockIQ1_S);
    default: return sizeof(BlockIQ1_M);
  }
}
// The grid i-quants' constant k (quant/iq_decode.h): the dot's scale is d * k.
template <DType T> constexpr float extra_k() {
  return T == DType::IQ3_XXS ? 0.25f
         : T == DType::IQ3_S || !(T == DType::IQ2_XXS || T == DType::IQ2_XS || T == DType::IQ2_S || T == DType::IQ1_S || T == DType::IQ1_M)
             ? 1.0f
             : 0.125f;
}

// One decoded sub-block: element l is byte l % 4 of v[l / 4] (int8).
struct SubBlock {
  uint32_t v[8];
  float d;       // the block's f16 scale (IQ4_XS, grid types: of the 256-block)
  float m;       // the min (Q4_1, Q5_1), else 0
  int ls0, ls1;  // integer scale of elements 0..15 and 16..31 (1 where there is none)
};

// Blocks of these types are 2-byte aligned at least (every block size is even and tensors
// start 256-byte aligned): 16-bit loads.
__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return ld16(p) | (ld16(p + 2) << 16); }
__device__ __forceinline__ float f16_at(const uint8_t *p) { return __half2float(__ushort_as_half(static_cast<unsigned short>(ld16(p)))); }

// Bit b (0..3) of n as bit 4 of byte b: the fifth bits of Q5_0 / Q5_1.
__device__ __forceinline__ uint32_t fifth_bits(uint32_t n) { return ((n & 1u) << 4) | ((n & 2u) << 11) | ((n & 4u) << 18) | ((n & 8u) << 25); }
// Bytes of g negated where bit b (0..3) of s is set.
__device__ __forceinline__ uint32_t signed4(uint32_t g, uint32_t s) {
  const uint32_t m = ((s & 1u) | ((s & 2u) << 7) | ((s & 4u) << 14) | ((s & 8u) << 21)) * 0xFFu;
  return __vsub4(g ^ m, m);
}
// Four IQ4 codes (one per byte, 0..15) to their int8 values.
__device__ __forceinline__ uint32_t iq4_values(uint32_t idx) {
  const uint32_t sel = (idx & 7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(kIq4W0, kIq4W1, sel), hi = __byte_perm(kIq4W2, kIq4W3, sel);
  const uint32_t m = ((idx >> 3) & 0x01010101u) * 0xFFu;
  return (lo & ~m) | (hi & m);
}
__device__ __forceinline__ uint2 grid64(const uint64_t *grid, int i) { return __ldg(reinterpret_cast<const uint2 *>(grid + i)); }
// IQ1: 8 * (grid byte in {-1, 0, 1}) + delta (+1, or -1 where neg), per byte.
__device__ __forceinline__ uint32_t iq1_values(uint32_t g, bool neg) { return __vadd4((g << 3) & 0xF8F8F8F8u, neg ? 0xFFFFFFFFu : 0x01010101u); }

// The 32-value block types: block s of a row.
template <DType T> __device__ __forceinline__ void decode_block32(const uint8_t *row, int s, SubBlock &b) {
  const uint8_t *blk = row + s * extra_bytes<T>();
  b.d = f16_at(blk);
  const int qs_at = T == DType::Q4_1 ? 4 : T == DType::Q5_0 ? 6 : T == DType::Q5_1 ? 8 : 2;
  uint32_t qh = 0;
  if constexpr (extra_has_min<T>) b.m = f16_at(blk + 2);
  if constexpr (T == DType::Q5_0 || T == DType::Q5_1) qh = ld32(blk + qs_at - 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = ld32(blk + qs_at + 4 * i);
    uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
      lo |= fifth_bits(qh >> (4 * i));
      hi |= fifth_bits(qh >> (16 + 4 * i));
    }
    if constexpr (T == DType::Q5_0) {
      lo = __vsub4(lo, 0x10101010u);
      hi = __vsub4(hi, 0x10101010u);
    }
    if constexpr (T == DType::IQ4_NL) {
      lo = iq4_values(lo);
      hi = iq4_values(hi);
    }
    b.v[i] = lo;
    b.v[4 + i] = hi;
  }
}

// The 256-value block types, sub-block ib (0..7) of a block, from pointers to the fields it
// reads (named after the BlockIQ* members; "_ib": already at sub-block ib's bytes), so that
// the same decoders serve a block in global memory (decode_block256) and the copies of its
// bytes in the int8 MMQ's shared memory (mmq_i8_extra.cuh). The pointers need the block's
// 2-byte alignment, nothing more.
// IQ4_XS: hdr = the block (d, scales_h, scales_l: 8 bytes), qs_ib = its 16 bytes of qs.
__device__ __forceinline__ void iq4xs_sub(const uint8_t *hdr, const uint8_t *qs_ib, int ib, SubBlock &b) {
  b.d = f16_at(hdr);
  const uint32_t sh = ld16(hdr + 2), sl = hdr[4 + ib / 2];
  b.ls0 = b.ls1 = static_cast<int>(((sl >> (4 * (ib % 2))) & 0xFu) | (((sh >> (2 * ib)) & 3u) << 4)) - 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = ld32(qs_ib + 4 * i);
    b.v[i] = iq4_values(q & 0x0F0F0F0Fu);
    b.v[4 + i] = iq4_values((q >> 4) & 0x0F0F0F0Fu);
  }
}
// IQ2_XXS: qs_ib = its 8 bytes (4 grid indices, then signs and scale).
__device__ __forceinline__ void iq2xxs_sub(const uint8_t *d, const uint8_t *qs_ib, SubBlock &b) {
  b.d = f16_at(d);
  const uint32_t a0 = ld32(qs_ib), a1 = ld32(qs_ib + 4);
  b.ls0 = b.ls1 = 2 * static_cast<int>(a1 >> 28) + 1;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint2 g = grid64(iq_dev::kIq2xxsGrid, (a0 >> (8 * l)) & 0xFF);
    const uint32_t sg = __ldg(iq_dev::kIq2SignBytes + ((a1 >> (7 * l)) & 127));
    b.v[2 * l] = signed4(g.x, sg & 0xF);
    b.v[2 * l + 1] = signed4(g.y, sg >> 4);
  }
}
// IQ2_XS: qs_ib = its 8 bytes (4 x 16 bits: grid index, sign index), sc = its scale byte.
__device__ __forceinline__ void iq2xs_sub(const uint8_t *d, const uint8_t *qs_ib, const uint8_t *sc, SubBlock &b) {
  b.d = f16_at(d);
  b.ls0 = 2 * static_cast<int>(*sc & 0xF) + 1;
  b.ls1 = 2 * static_cast<int>(*sc >> 4) + 1;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t q = ld16(qs_ib + 2 * l);
    const uint2 g = grid64(iq_dev::kIq2xsGrid, q & 511);
    const uint32_t sg = __ldg(iq_dev::kIq2SignBytes + (q >> 9));
    b.v[2 * l] = signed4(g.x, sg & 0xF);
    b.v[2 * l + 1] = signed4(g.y, sg >> 4);
  }
}
// IQ2_S: qs_ib / signs_ib = its 4 index / sign bytes, qh / sc = its high-bit / scale byte.
__device__ __forceinline__ void iq2s_sub(const uint8_t *d, const uint8_t *qs_ib, const uint8_t *signs_ib, const uint8_t *qh, const uint8_t *sc,
                                         SubBlock &b) {
  b.d = f16_at(d);
  b.ls0 = 2 * static_cast<int>(*sc & 0xF) + 1;
  b.ls1 = 2 * static_cast<int>(*sc >> 4) + 1;
  const uint32_t h = *qh;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const int idx = qs_ib[l] | static_cast<int>((h << (8 - 2 * l)) & 0x300);
    const uint2 g = grid64(iq_dev::kIq2sGrid, idx);
    const uint32_t sg = signs_ib[l];
    b.v[2 * l] = signed4(g.x, sg & 0xF);
    b.v[2 * l + 1] = signed4(g.y, sg >> 4);
  }
}
// IQ3_XXS: qs_ib = its 8 grid indices, aux_ib = its 4 bytes of signs and scale.
__device__ __forceinline__ void iq3xxs_sub(const uint8_t *d, const uint8_t *qs_ib, const uint8_t *aux_ib, SubBlock &b) {
  b.d = f16_at(d);
  const uint32_t aux = ld32(aux_ib);
  b.ls0 = b.ls1 = 2 * static_cast<int>(aux >> 28) + 1;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t sg = __ldg(iq_dev::kIq2SignBytes + ((aux >> (7 * l)) & 127));
    b.v[2 * l] = signed4(__ldg(iq_dev::kIq3xxsGrid + qs_ib[2 * l]), sg & 0xF);
    b.v[2 * l + 1] = signed4(__ldg(iq_dev::kIq3xxsGrid + qs_ib[2 * l + 1]), sg >> 4);
  }
}
// IQ3_S: qs_ib = its 8 grid indices, qh = its high-bit byte, signs_ib = its 4 sign bytes,
// sc = the scale byte of sub-blocks ib & ~1, ib | 1.
__device__ __forceinline__ void iq3s_sub(const uint8_t *d, const uint8_t *qs_ib, const uint8_t *qh, const uint8_t *signs_ib, const uint8_t *sc,
                                         int ib, SubBlock &b) {
  b.d = f16_at(d);
  b.ls0 = b.ls1 = 1 + 2 * static_cast<int>((*sc >> (4 * (ib % 2))) & 0xF);
  const uint32_t h = *qh;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const int i1 = qs_ib[2 * l] | static_cast<int>((h << (8 - 2 * l)) & 256);
    const int i2 = qs_ib[2 * l + 1] | static_cast<int>((h << (7 - 2 * l)) & 256);
    const uint32_t sg = signs_ib[l];
    b.v[2 * l] = signed4(__ldg(iq_dev::kIq3sGrid + i1), sg & 0xF);
    b.v[2 * l + 1] = signed4(__ldg(iq_dev::kIq3sGrid + i2), sg >> 4);
  }
}
// IQ1_S: qs_ib = its 4 index bytes, qh_ib = its 16-bit word (high index bits, scale, sign).
__device__ __forceinline__ void iq1s_sub(const uint8_t *d, const uint8_t *qs_ib, const uint8_t *qh_ib, SubBlock &b) {
  b.d = f16_at(d);
  const uint32_t qh = ld16(qh_ib);
  b.ls0 = b.ls1 = 2 * static_cast<int>((qh >> 12) & 7) + 1;
  const bool neg = (qh & 0x8000u) != 0;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const int idx = qs_ib[l] | static_cast<int>(((qh >> (3 * l)) & 7) << 8);
    const uint2 g = grid64(iq_dev::kIq1sGrid, idx);
    b.v[2 * l] = iq1_values(g.x, neg);
    b.v[2 * l + 1] = iq1_values(g.y, neg);
  }
}
// IQ1_M: qs_ib = its 4 index bytes, qh_ib = its 2 bytes (per nibble: 3 index bits, then the
// delta sign), scales = the block's 8 scale bytes (the f16 scale in the words' top nibbles).
__device__ __forceinline__ void iq1m_sub(const uint8_t *qs_ib, const uint8_t *qh_ib, const uint8_t *scales, int ib, SubBlock &b) {
  const uint32_t s0 = ld16(scales), s1 = ld16(scales + 2), s2 = ld16(scales + 4), s3 = ld16(scales + 6);
  const uint32_t h = (s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u);
  b.d = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  const uint32_t sc = ld16(scales + 2 * (ib / 2)) >> (6 * (ib % 2));
  b.ls0 = 2 * static_cast<int>(sc & 7) + 1;
  b.ls1 = 2 * static_cast<int>((sc >> 3) & 7) + 1;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t hb = qh_ib[l / 2] >> (4 * (l % 2));
    const int idx = qs_ib[l] | static_cast<int>((hb & 7) << 8);
    const uint2 g = grid64(iq_dev::kIq1sGrid, idx);
    b.v[2 * l] = iq1_values(g.x, (hb & 8) != 0);
    b.v[2 * l + 1] = iq1_values(g.y, (hb & 8) != 0);
  }
}

// The 256-value block types: sub-block s & 7 of block s >> 3 (offsets: quant/dtype.h's BlockIQ*).
template <DType T> __device__ __forceinline__ void decode_block256(const uint8_t *row, int s, SubBlock &b) {
  const uint8_t *blk = row + (s >> 3) * extra_bytes<T>();
  const int ib = s & 7;
  if constexpr (T == DType::IQ4_XS) {
    iq4xs_sub(blk, blk + 8 + 16 * ib, ib, b);
  } else if constexpr (T == DType::IQ2_XXS) {
    iq2xxs_sub(blk, blk + 2 + 8 * ib, b);
  } else if constexpr (T == DType::IQ2_XS) {
    iq2xs_sub(blk, blk + 2 + 8 * ib, blk + 66 + ib, b);
  } else if constexpr (T == DType::IQ2_S) {
    iq2s_sub(blk, blk + 2 + 4 * ib, blk + 34 + 4 * ib, blk + 66 + ib, blk + 74 + ib, b);
  } else if constexpr (T == DType::IQ3_XXS) {
    iq3xxs_sub(blk, blk + 2 + 8 * ib, blk + 66 + 4 * ib, b);
  } else if constexpr (T == DType::IQ3_S) {
    iq3s_sub(blk, blk + 2 + 8 * ib, blk + 66 + ib, blk + 74 + 4 * ib, blk + 106 + ib / 2, ib, b);
  } else if constexpr (T == DType::IQ1_S) {
    iq1s_sub(blk, blk + 2 + 4 * ib, blk + 34 + 2 * ib, b);
  } else {
    static_assert(T == DType::IQ1_M, "not one of the extra types");
    iq1m_sub(blk + 4 * ib, blk + 32 + 2 * ib, blk + 48, ib, b);
  }
}

// Sub-block s (elements 32s .. 32s + 31) of a row.
template <DType T> __device__ __forceinline__ void decode_sub(const uint8_t *row, int s, SubBlock &b) {
  b.m = 0.0f;
  b.ls0 = b.ls1 = 1;
  if constexpr (extra_qk<T> == 32)
    decode_block32<T>(row, s, b);
  else
    decode_block256<T>(row, s, b);
}

// The CPU dequantizer's scale of half h (elements 16h .. 16h + 15), its float steps in its
// order (products of a scale and a small integer are exact or rounded once, as there).
template <DType T> __device__ __forceinline__ float value_scale(const SubBlock &b, int h) {
  const int ls = h ? b.ls1 : b.ls0;
  if constexpr (T == DType::IQ2_XXS || T == DType::IQ2_XS || T == DType::IQ2_S)
    return __fmul_rn(__fmul_rn(b.d, 0.5f * static_cast<float>(ls)), 0.25f);  // d * (0.5 + s) * 0.25, ls = 2s + 1
  else if constexpr (T == DType::IQ3_XXS)
    return __fmul_rn(__fmul_rn(b.d, 0.5f * static_cast<float>(ls)), 0.5f);
  else
    return __fmul_rn(b.d, static_cast<float>(ls));  // IQ4_XS: d * (ls - 32); the 32-blocks: d * 1
}

// The 32 weights of sub-block s as the CPU's dequantize_row gives them.
template <DType T> __device__ __forceinline__ void dequant_sub(const uint8_t *row, int s, float *w) {
  SubBlock b;
  decode_sub<T>(row, s, b);
  const float a[2] = {value_scale<T>(b, 0), value_scale<T>(b, 1)};
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const float q = static_cast<float>(static_cast<int8_t>(b.v[l >> 2] >> (8 * (l & 3))));
    if constexpr (extra_has_min<T>)
      w[l] = __fadd_rn(__fmul_rn(q, b.d), b.m);  // code * d + m, no fused multiply-add (nor the CPU)
    else if constexpr (T == DType::IQ1_S || T == DType::IQ1_M)
      w[l] = __fmul_rn(a[l >> 4], q * 0.125f);  // db * (q / 8): the codes are in eighths
    else
      w[l] = __fmul_rn(a[l >> 4], q);
  }
}

// Dot of the decoded sub-block with 32 int8 activations (xq: 8 words) scaled by xd (and, for
// the types with a min, xs = the activation block's d * sum of its integers, Q8_1's s).
template <DType T> __device__ __forceinline__ float dot_sub(const SubBlock &b, const int (&xq)[8], float xd, float xs) {
  int i0 = 0, i1 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    i0 = __dp4a(static_cast<int>(b.v[i]), xq[i], i0);
    i1 = __dp4a(static_cast<int>(b.v[4 + i]), xq[4 + i], i1);
  }
  const float r = (b.d * extra_k<T>() * xd) * static_cast<float>(b.ls0 * i0 + b.ls1 * i1);
  if constexpr (extra_has_min<T>) return r + b.m * xs;
  return r;
}

}  // namespace moe
