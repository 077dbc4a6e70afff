// Weight staging of the int8 tensor-core GEMM (matmul_mmq_i8.cu): one 32-weight sub-block of
// a GGUF row as 32 int8 mma operands (byte i of w[k] is weight 4 k + i) plus the scales that
// turn their exact integer products back into weights:
//   Q4_K, Q5_K: weight l = d sc q_l - dmin m (sc, m per 32; d, dmin per 256-block)
//   Q6_K:       weight l = d sc[l / 16] q_l (int8 sc per 16; d per 256-block)
//   Q4_0, Q8_0: weight l = d q_l (d per 32; sc = 1)
// The integers are the codes of the GGUF layouts (Q4_K 0..15, Q5_K 0..31, Q6_K -32..31,
// Q4_0 -8..7, Q8_0 as stored), taken four per 32-bit word without per-byte work.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/ops/quant.cuh"

namespace moe {
namespace mmq {

// The types matmul_mmq_i8.cu takes; of those, the K-quants sum integers over a 256-block.
template <DType T>
constexpr bool i8_type = T == DType::Q4_0 || T == DType::Q8_0 || T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K;
template <DType T> constexpr bool i8_block_sum = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K;

// Packed to keep the kernel's register staging small.
struct I8Weights {
  uint32_t w[8];  // the 32 integers, int8
  uint32_t scm;   // bytes 0, 1: integer scale of k16 group 0, 1 (int8); byte 2: m (0 without a min)
  uint32_t dm;    // f16 pair (d, dmin) (dmin 0 without a min term)
};

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

template <DType T> __device__ __forceinline__ void stage_i8(const uint8_t *row, int s, I8Weights &o);

// Q4_K / Q5_K block header (4-byte aligned): d, dmin, the 6-bit scale and min of sub-block j.
__device__ __forceinline__ void k4_header(const uint8_t *blk, int j, I8Weights &o) {
  o.dm = *reinterpret_cast<const uint32_t *>(blk);
  int sc, m;
  scale_min_k4(j, blk + 4, sc, m);
  o.scm = static_cast<uint32_t>(sc | (sc << 8) | (m << 16));
}

// Layout as in unpack32<Q4_K>: sub-blocks 2p, 2p + 1 are the low and high nibbles of the
// same 32 bytes (16-byte aligned: blocks and rows are multiples of 144 = 9 * 16 bytes).
template <> __device__ __forceinline__ void stage_i8<DType::Q4_K>(const uint8_t *row, int s, I8Weights &o) {
  const uint8_t *blk = row + (s >> 3) * 144;
  const int j = s & 7, sh = (j & 1) * 4;
  k4_header(blk, j, o);
  const uint4 *q4 = reinterpret_cast<const uint4 *>(blk + 16 + 32 * (j >> 1));
  const uint4 v0 = q4[0], v1 = q4[1];
  const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = (words[k] >> sh) & 0x0F0F0F0Fu;
}

// Layout as in unpack32<Q5_K>: the Q4_K nibbles plus bit 2p + (j & 1) of qh as bit 4.
template <> __device__ __forceinline__ void stage_i8<DType::Q5_K>(const uint8_t *row, int s, I8Weights &o) {
  const uint8_t *blk = row + (s >> 3) * 176;
  const int j = s & 7, p = j >> 1, hi = j & 1;
  k4_header(blk, j, o);
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(blk + 16);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(blk + 48 + 32 * p);
  const uint4 h0 = qh4[0], h1 = qh4[1], l0 = ql4[0], l1 = ql4[1];
  const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
  const uint32_t lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
  const int sh = hi * 4, hb = 2 * p + hi;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = ((lw[k] >> sh) & 0x0F0F0F0Fu) | (((hw[k] >> hb) & 0x01010101u) << 4);
}

// Layout as in unpack32<Q6_K>; codes q + 32. 210-byte blocks are only 2-byte aligned:
// words_at reads [ql - 2, ql + 36) and [qh - 2, qh + 36), inside the block unless a word
// straddles its start, and then the block is not the tensor's first (the tensor is aligned).
template <> __device__ __forceinline__ void stage_i8<DType::Q6_K>(const uint8_t *row, int s, I8Weights &o) {
  const uint8_t *blk = row + (s >> 3) * 210;
  const int j = s & 7, h = j >> 2, g = j & 3;
  uint32_t ql[8], qh[8];
  words_at(blk + 64 * h + (g & 1) * 32, ql);  // ends by blk + 132
  words_at(blk + 128 + 32 * h, qh);           // ends by blk + 196
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = codes_minus<32>(((ql[k] >> shl) & 0x0F0F0F0Fu) | (((qh[k] >> shh) & 0x03030303u) << 4));
  o.scm = u16_at(blk + 192 + 2 * j);  // the two int8 scales
  o.dm = u16_at(blk + 208);
}

// Q4_0: codes q + 8, elements 0-15 in the low nibbles of the 16 bytes, 16-31 in the high ones.
template <> __device__ __forceinline__ void stage_i8<DType::Q4_0>(const uint8_t *row, int s, I8Weights &o) {
  const uint8_t *blk = row + s * 18;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t v = word16(blk + 2, k);
    o.w[k] = codes_minus<8>(v & 0x0F0F0F0Fu);
    o.w[4 + k] = codes_minus<8>((v >> 4) & 0x0F0F0F0Fu);
  }
  o.scm = 0x0101u;
  o.dm = u16_at(blk);
}

template <> __device__ __forceinline__ void stage_i8<DType::Q8_0>(const uint8_t *row, int s, I8Weights &o) {
  const uint8_t *blk = row + s * 34;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.w[k] = word16(blk + 2, k);
  o.scm = 0x0101u;
  o.dm = u16_at(blk);
}

}  // namespace mmq
}  // namespace moe
