// Weight staging of the int8 tensor-core GEMM (matmul_mmq_i8.cu): one 32-weight sub-block of
// a GGUF row as 32 int8 mma operands (byte i of w[k] is weight 4 k + i) plus the scales that
// turn their exact integer products back into weights:
//   Q4_K, Q5_K: weight l = d sc q_l - dmin m (sc, m per 32; d, dmin per 256-block)
//   Q6_K:       weight l = d sc[l / 16] q_l (int8 sc per 16; d per 256-block)
//   Q4_0, Q8_0: weight l = d q_l (d per 32; sc = 1)
//   MXFP4:      weight l = d q_l, q_l in {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12} (twice the
//               E2M1 value), d = 2^(e - 128) per 32 (sc = 1; d as f32: E8M0 exceeds f16)
// The integers are the codes of the GGUF layouts (Q4_K 0..15, Q5_K 0..31, Q6_K -32..31,
// Q4_0 -8..7, Q8_0 as stored; MXFP4 through a byte-permute table), four per 32-bit word
// without per-byte work. The twelve extra types (Q4_1 ... IQ1_M): mmq_i8_extra.cuh.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "backends/cuda/ops/mmq_i8_extra.cuh"
#include "backends/cuda/ops/quant.cuh"

namespace moe {
namespace mmq {

// The types matmul_mmq_i8.cu takes; of those, the K-quants and the extra 256-block types sum
// integers over a 256-block.
template <DType T>
constexpr bool i8_type =
    T == DType::Q4_0 || T == DType::Q8_0 || T == DType::MXFP4 || T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K || i8_extra<T>;
template <DType T>
constexpr bool i8_block_sum = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K || (i8_extra<T> && extra_qk<T> == 256);
// Two integer scales per sub-block (one per k16 half).
template <DType T> constexpr bool i8_per16 = T == DType::Q6_K || i8_extra_per16<T>;

// Packed to keep the kernel's register staging small.
struct I8Weights {
  uint32_t w[8];  // the 32 integers, int8
  uint32_t scm;   // bytes 0, 1: integer scale of k16 group 0, 1 (int8); byte 2: m (0 without a min)
  uint32_t dm;    // f16 pair (d, dmin) (dmin 0 without a min term); MXFP4: d as f32 bits;
                  // Q4_1 / Q5_1: (d, m), m the f16 min added to every weight
};

// (d, dmin) of a staged sub-block (the extra types: (d k, m), mmq_i8_extra.cuh).
template <DType T> __device__ __forceinline__ float2 i8_d_dmin(uint32_t dm) {
  if constexpr (T == DType::MXFP4) {
    return make_float2(__uint_as_float(dm), 0.0f);
  } else {
    __half2 h;
    memcpy(&h, &dm, 4);
    float2 f = __half22float2(h);
    if constexpr (i8_extra<T>) f.x *= extra_k<T>();  // a power of two: exact
    return f;
  }
}

// A decoded extra-type sub-block as the kernel's operands.
template <DType T> __device__ __forceinline__ void extra_to_i8(const SubBlock &b, I8Weights &o) {
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = b.v[k];
  o.scm = static_cast<uint32_t>(b.ls0 & 0xFF) | (static_cast<uint32_t>(b.ls1 & 0xFF) << 8);
  // d and m came from f16 fields: back to f16 exactly.
  o.dm = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(b.d))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(b.m))) << 16);
}

__device__ __forceinline__ int i8_byte(uint32_t v, int i) { return static_cast<int8_t>(static_cast<uint8_t>(v >> (8 * i))); }
__device__ __forceinline__ uint32_t u16_at(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }

// 32-bit word k of bytes that are only 2-byte aligned.
__device__ __forceinline__ uint32_t word16(const uint8_t *p, int k) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return h[2 * k] | (static_cast<uint32_t>(h[2 * k + 1]) << 16);
}

// The 8 words of 32 bytes at a 2-byte aligned p, from the 9 aligned words holding
// [p - 2, p + 34) (p aligned: [p, p + 36)); the caller keeps those inside the tensor.
__device__ __forceinline__ void words_at(const uint8_t *p, uint32_t (&w)[8]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *q = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t sh = static_cast<uint32_t>(a & 3) * 8;  // 0 or 16
  uint32_t v[9];
#pragma unroll
  for (int k = 0; k < 9; ++k) v[k] = q[k];
#pragma unroll
  for (int k = 0; k < 8; ++k) w[k] = __funnelshift_r(v[k], v[k + 1], sh);
}

// N words of the bytes at p, any alignment, from the aligned words holding [p, p + 4N)
// (N + 1 of them where p is unaligned, N where it is: no read outside those words).
template <int N> __device__ __forceinline__ void words_any(const uint8_t *p, uint32_t (&w)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *q = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t sh = static_cast<uint32_t>(a & 3) * 8;
  uint32_t v[N + 1];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = q[k];
  v[N] = sh ? q[N] : 0u;
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = __funnelshift_r(v[k], v[k + 1], sh);
}

// Four MXFP4 codes (one per byte, 0..15) -> the int8 bytes of twice their E2M1 values: the
// magnitude {0, 1, 2, 3, 4, 6, 8, 12}[c & 7] and its negation by byte permutes of two
// 8-byte tables (selector nibbles c & 7, sign-replicate bit clear), picked by bit 3.
__device__ __forceinline__ uint32_t mxfp4_bytes(uint32_t c) {
  const uint32_t x = c & 0x07070707u;
  const uint32_t sel = (x & 0x7u) | ((x >> 4) & 0x70u) | ((x >> 8) & 0x700u) | ((x >> 12) & 0x7000u);
  const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel);
  const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);  // 0, -1, -2, -3 | -4, -6, -8, -12
  const uint32_t m = ((c >> 3) & 0x01010101u) * 0xFFu;
  return (pos & ~m) | (neg & m);
}

// Four codes c in [0, 2B) (one per byte, B a power of two) -> the int8 bytes of c - B. Per
// byte: c >= B: c ^ B = c - B; c < B: c ^ B = c + B has bit B set, and or-ing 256 - 2B (a
// multiple of 2B above the bits of c + B, so an addition) gives c - B + 256. The per-byte
// product (b & B) (256 - 2B) / B is 0 or 256 - 2B < 256: no carry into the next byte.
template <uint32_t B> __device__ __forceinline__ uint32_t codes_minus(uint32_t c) {
  static_assert(B == 8 || B == 32 || B == 128, "a power of two code offset");
  constexpr uint32_t bb = B * 0x01010101u;
  const uint32_t b = c ^ bb;
  return b | ((b & bb) * ((256u - 2u * B) / B));
}

// Each type's staging from pointers to the bytes it reads (in global memory, or in the
// shared-memory copies of matmul_mmq_i8.cu's pipeline, which keep those bytes' positions
// modulo 16), and stage_i8: sub-block s of a row in global memory.

// Q4_K / Q5_K block header (4-byte aligned): d, dmin, the 6-bit scale and min of sub-block j.
__device__ __forceinline__ void k4_header(const uint8_t *hdr, int j, I8Weights &o) {
  o.dm = *reinterpret_cast<const uint32_t *>(hdr);
  int sc, m;
  scale_min_k4(j, hdr + 4, sc, m);
  o.scm = static_cast<uint32_t>(sc | (sc << 8) | (m << 16));
}

// Layout as in unpack32<Q4_K>: sub-blocks 2p, 2p + 1 are the low and high nibbles of the
// same 32 bytes qs (16-byte aligned: blocks and rows are multiples of 144 = 9 * 16 bytes).
__device__ __forceinline__ void stage_q4k(const uint8_t *hdr, const uint8_t *qs, int j, I8Weights &o) {
  const int sh = (j & 1) * 4;
  k4_header(hdr, j, o);
  const uint4 *q4 = reinterpret_cast<const uint4 *>(qs);
  const uint4 v0 = q4[0], v1 = q4[1];
  const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = (words[k] >> sh) & 0x0F0F0F0Fu;
}

// Layout as in unpack32<Q5_K>: the Q4_K nibbles of ql plus bit j of the 32 bytes qh as bit 4.
__device__ __forceinline__ void stage_q5k(const uint8_t *hdr, const uint8_t *qh, const uint8_t *ql, int j, I8Weights &o) {
  k4_header(hdr, j, o);
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(qh);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(ql);
  const uint4 h0 = qh4[0], h1 = qh4[1], l0 = ql4[0], l1 = ql4[1];
  const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
  const uint32_t lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
  const int sh = (j & 1) * 4;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = ((lw[k] >> sh) & 0x0F0F0F0Fu) | (((hw[k] >> j) & 0x01010101u) << 4);
}

// Layout as in unpack32<Q6_K>, codes q + 32: the 32 bytes ql (nibble g / 2) and qh (bit pair
// g) of sub-block j (g = j % 4), its two int8 scales sc2 and the block's d. Only 2-byte
// aligned: words_at reads [ql - 2, ql + 36) and the same around qh (see its callers).
__device__ __forceinline__ void stage_q6k(const uint8_t *ql, const uint8_t *qh, const uint8_t *sc2, const uint8_t *d, int g, I8Weights &o) {
  uint32_t wl[8], wh[8];
  words_at(ql, wl);
  words_at(qh, wh);
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = codes_minus<32>(((wl[k] >> shl) & 0x0F0F0F0Fu) | (((wh[k] >> shh) & 0x03030303u) << 4));
  o.scm = u16_at(sc2);  // the two int8 scales
  o.dm = u16_at(d);
}

// Q4_0: codes q + 8, elements 0-15 in the low nibbles of the 16 bytes, 16-31 in the high ones.
__device__ __forceinline__ void stage_q40(const uint8_t *blk, I8Weights &o) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t v = word16(blk + 2, k);
    o.w[k] = codes_minus<8>(v & 0x0F0F0F0Fu);
    o.w[4 + k] = codes_minus<8>((v >> 4) & 0x0F0F0F0Fu);
  }
  o.scm = 0x0101u;
  o.dm = u16_at(blk);
}

__device__ __forceinline__ void stage_q80(const uint8_t *blk, I8Weights &o) {
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = word16(blk + 2, k);
  o.scm = 0x0101u;
  o.dm = u16_at(blk);
}

// MXFP4 (17-byte blocks, any alignment): the exponent byte, then elements 0-15 in the low
// nibbles of the 16 bytes, 16-31 in the high ones.
__device__ __forceinline__ void stage_mxfp4(const uint8_t *blk, I8Weights &o) {
  uint32_t v[4];
  words_any<4>(blk + 1, v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o.w[k] = mxfp4_bytes(v[k] & 0x0F0F0F0Fu);
    o.w[4 + k] = mxfp4_bytes((v[k] >> 4) & 0x0F0F0F0Fu);
  }
  o.scm = 0x0101u;
  o.dm = __float_as_uint(e8m0_half(blk[0]));
}

template <DType T> __device__ __forceinline__ void stage_i8(const uint8_t *row, int s, I8Weights &o) {
  const int j = s & 7;
  if constexpr (i8_extra<T>) {
    SubBlock b;
    decode_sub<T>(row, s, b);
    extra_to_i8<T>(b, o);
  } else if constexpr (T == DType::Q4_K) {
    const uint8_t *blk = row + (s >> 3) * 144;
    stage_q4k(blk, blk + 16 + 32 * (j >> 1), j, o);
  } else if constexpr (T == DType::Q5_K) {
    const uint8_t *blk = row + (s >> 3) * 176;
    stage_q5k(blk, blk + 16, blk + 48 + 32 * (j >> 1), j, o);
  } else if constexpr (T == DType::Q6_K) {
    // 210-byte blocks: words_at reads [ql - 2, ql + 36) and [qh - 2, qh + 36), inside the
    // block unless a word straddles its start, and then the block is not the tensor's first
    // (the tensor is aligned).
    const uint8_t *blk = row + (s >> 3) * 210;
    const int g = j & 3;
    stage_q6k(blk + 64 * (j >> 2) + (g & 1) * 32, blk + 128 + 32 * (j >> 2), blk + 192 + 2 * j, blk + 208, g, o);
  } else if constexpr (T == DType::Q4_0) {
    stage_q40(row + s * 18, o);
  } else if constexpr (T == DType::MXFP4) {
    stage_mxfp4(row + s * 17, o);
  } else {
    static_assert(T == DType::Q8_0, "an int8 MMQ type");
    stage_q80(row + s * 34, o);
  }
}

// The row bytes a K step of 64 (elements k0 .. k0 + 63, k0 % 64 == 0, k0 < K) reads, as up to
// kI8Regions regions (offset in the row, length; region r exists where chunks(r) > 0), and the
// 16-byte chunks that the pipeline of matmul_mmq_i8.cu reserves per region for its cover
// (the aligned chunks holding it; chunks(r) >= the most any alignment needs). Regions
// start where stage_i8 reads:
//   Q4_K (144-byte blocks): header 16, the step's 32 qs bytes (both sub-blocks).
//   Q5_K (176): header 16, qh 32, the step's 32 ql bytes.
//   Q6_K (210, 2-byte aligned): the 64 ql bytes of the step's half-block, its 32 qh bytes,
//     its 4 scale bytes through d ([192 + 4 s4, 210)); covers <= 5, 3, 2 chunks (start % 16
//     <= 14), and words_at's over-read stays inside them (chunks sized for the worst start).
//   Q4_0 / Q8_0 / MXFP4: the step's one or two blocks (one at a K tail), <= 4 / 6 / 4 chunks.
template <DType T> struct I8Raw;
template <> struct I8Raw<DType::Q4_K> {
  __host__ __device__ static constexpr int chunks(int r) { return r == 0 ? 1 : r == 1 ? 2 : 0; }
  __device__ static int2 region(int r, int k0, int) {
    const int blk = (k0 >> 8) * 144;
    return r == 0 ? make_int2(blk, 16) : make_int2(blk + 16 + 32 * ((k0 >> 6) & 3), 32);
  }
};
template <> struct I8Raw<DType::Q5_K> {
  __host__ __device__ static constexpr int chunks(int r) { return r == 0 ? 1 : r == 1 ? 2 : r == 2 ? 2 : 0; }
  __device__ static int2 region(int r, int k0, int) {
    const int blk = (k0 >> 8) * 176;
    return r == 0 ? make_int2(blk, 16) : r == 1 ? make_int2(blk + 16, 32) : make_int2(blk + 48 + 32 * ((k0 >> 6) & 3), 32);
  }
};
template <> struct I8Raw<DType::Q6_K> {
  __host__ __device__ static constexpr int chunks(int r) { return r == 0 ? 5 : r == 1 ? 3 : r == 2 ? 2 : 0; }
  __device__ static int2 region(int r, int k0, int) {
    const int blk = (k0 >> 8) * 210, s4 = (k0 >> 6) & 3;
    if (r == 0) return make_int2(blk + 64 * (s4 >> 1), 64);
    return r == 1 ? make_int2(blk + 128 + 32 * (s4 >> 1), 32) : make_int2(blk + 192 + 4 * s4, 18 - 4 * s4);
  }
};
// The 32-element block types: the step's blocks of B bytes, covered by C chunks.
template <int B, int C> struct I8RawPer32 {
  __host__ __device__ static constexpr int chunks(int r) { return r == 0 ? C : 0; }
  __device__ static int2 region(int, int k0, int K) { return make_int2((k0 >> 5) * B, (K - k0 >= 64 ? 2 : 1) * B); }
};
template <> struct I8Raw<DType::Q4_0> : I8RawPer32<18, 4> {};
template <> struct I8Raw<DType::Q8_0> : I8RawPer32<34, 6> {};
template <> struct I8Raw<DType::MXFP4> : I8RawPer32<17, 4> {};
template <DType T> constexpr int i8_raw_chunks = I8Raw<T>::chunks(0) + I8Raw<T>::chunks(1) + I8Raw<T>::chunks(2) + I8Raw<T>::chunks(3);

// Sub-block h (0, 1) of the K step at k0 from p[r] = region r's first byte (wherever its
// bytes were put, same position modulo 16).
template <DType T> __device__ __forceinline__ void stage_i8_regions(const uint8_t *const (&p)[kI8Regions], int k0, int h, I8Weights &o) {
  const int s4 = (k0 >> 6) & 3, j = 2 * s4 + h;
  if constexpr (i8_extra<T>) {
    SubBlock b;
    extra_sub_regions<T>(p, k0, h, b);
    extra_to_i8<T>(b, o);
  } else if constexpr (T == DType::Q4_K) {
    stage_q4k(p[0], p[1], j, o);
  } else if constexpr (T == DType::Q5_K) {
    stage_q5k(p[0], p[1], p[2], j, o);
  } else if constexpr (T == DType::Q6_K) {
    const int g = j & 3;
    stage_q6k(p[0] + (g & 1) * 32, p[1], p[2] + 2 * h, p[2] + 16 - 4 * s4, g, o);
  } else if constexpr (T == DType::Q4_0) {
    stage_q40(p[0] + 18 * h, o);
  } else if constexpr (T == DType::MXFP4) {
    stage_mxfp4(p[0] + 17 * h, o);
  } else {
    stage_q80(p[0] + 34 * h, o);
  }
}

}  // namespace mmq
}  // namespace moe
