// Device-side GGUF block decoding: dequant32<T>(row, s, w) writes the 32 weights of
// sub-block s (elements 32s .. 32s+31) of a row, with the same float operations as the
// reference dequantizers in src/quant/*.cpp, so CUDA and CPU agree to rounding;
// unpack32<T> gives the same weights as integers and scales (tensor-core MMQ path).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "quant/dtype.h"

namespace moe {

__device__ __forceinline__ float h2f(const uint8_t *p) {
  __half h;
  *reinterpret_cast<uint16_t *>(&h) = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(h);
}

__device__ __forceinline__ float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return __uint_as_float(bits);
}

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &d, int &m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

constexpr bool is_plain(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Bytes per 256-element K-quant block / per 32-element block.
template <DType T> struct BlockInfo;
template <> struct BlockInfo<DType::Q4_0> { static constexpr int qk = 32, bytes = 18; };
template <> struct BlockInfo<DType::Q8_0> { static constexpr int qk = 32, bytes = 34; };
template <> struct BlockInfo<DType::MXFP4> { static constexpr int qk = 32, bytes = 17; };
template <> struct BlockInfo<DType::Q2_K> { static constexpr int qk = 256, bytes = 84; };
template <> struct BlockInfo<DType::Q3_K> { static constexpr int qk = 256, bytes = 110; };
template <> struct BlockInfo<DType::Q4_K> { static constexpr int qk = 256, bytes = 144; };
template <> struct BlockInfo<DType::Q5_K> { static constexpr int qk = 256, bytes = 176; };
template <> struct BlockInfo<DType::Q6_K> { static constexpr int qk = 256, bytes = 210; };

// unpack32<T>(row, s, q, a, b): sub-block s as small integers and per-16 affine scales,
// weight l = a[l / 16] * q[l] + b[l / 16] with |q| <= 127 (exact in f16, so a tensor-core
// product of q with int8 activations is an exact integer). b is 0 unless has_min<T>.
// dequant32 is this map applied in f32, so both paths decode from one definition.
template <DType T> constexpr bool has_min = T == DType::Q2_K || T == DType::Q4_K || T == DType::Q5_K;
// Weights sharing one (a, b): 32 (one per sub-block) or 16 (two groups per sub-block).
template <DType T> constexpr int scale_group = T == DType::Q2_K || T == DType::Q3_K || T == DType::Q6_K ? 16 : 32;

template <DType T> __device__ __forceinline__ void unpack32(const uint8_t *row, int s, int *q, float *a, float *b);

// K-quants whose group scales are a = d * sc with one f16 d per 256-weight block and a small
// integer sc (|sc| <= 63; Q6_K's are int8): superblock_d<T> gives that d (a / d is exact).
template <DType T> constexpr bool has_int_group_scale = T == DType::Q2_K || T == DType::Q3_K || T == DType::Q4_K || T == DType::Q5_K;
template <DType T> __device__ __forceinline__ float superblock_d(const uint8_t *row, int s) {
  static_assert(has_int_group_scale<T>, "only the K-quants with small integer group scales");
  if constexpr (T == DType::Q2_K) return h2f(row + (s >> 3) * 84 + 80);
  if constexpr (T == DType::Q3_K) return h2f(row + (s >> 3) * 110 + 108);
  if constexpr (T == DType::Q4_K) return h2f(row + (s >> 3) * 144);
  return h2f(row + (s >> 3) * 176);  // Q5_K
}
// Of those, the ones with a min term have b = -(dmin * m), m <= 63: the block's dmin.
template <DType T> __device__ __forceinline__ float superblock_dmin(const uint8_t *row, int s) {
  static_assert(has_min<T>, "only the K-quants with a min term");
  if constexpr (T == DType::Q2_K) return h2f(row + (s >> 3) * 84 + 82);
  if constexpr (T == DType::Q4_K) return h2f(row + (s >> 3) * 144 + 2);
  return h2f(row + (s >> 3) * 176 + 2);  // Q5_K
}

template <> __device__ __forceinline__ void unpack32<DType::Q4_0>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + s * 18;
  a[0] = a[1] = h2f(blk);
  b[0] = b[1] = 0.0f;
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const int v = blk[2 + l];
    q[l] = (v & 0xF) - 8;
    q[l + 16] = (v >> 4) - 8;
  }
}

template <> __device__ __forceinline__ void unpack32<DType::Q8_0>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + s * 34;
  a[0] = a[1] = h2f(blk);
  b[0] = b[1] = 0.0f;
#pragma unroll
  for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(blk[2 + l]);
}

// MXFP4 code n: {0, 1, 2, 3, 4, 6, 8, 12}[n & 7], negative when n & 8 (a byte permute
// rather than a table, which would live in local memory).
__device__ __forceinline__ int mxfp4_value(int n) {
  const int m = static_cast<int>(__byte_perm(0x03020100u, 0x0C080604u, static_cast<unsigned>(n & 7)) & 0xFFu);
  return (n & 8) ? -m : m;
}

template <> __device__ __forceinline__ void unpack32<DType::MXFP4>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + s * 17;
  a[0] = a[1] = e8m0_half(blk[0]);
  b[0] = b[1] = 0.0f;
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const int v = blk[1 + l];
    q[l] = mxfp4_value(v & 0xF);
    q[l + 16] = mxfp4_value(v >> 4);
  }
}

template <> __device__ __forceinline__ void unpack32<DType::Q2_K>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + (s >> 3) * 84;
  const int j = s & 7, h = j >> 2, r = j & 3;
  const float d = h2f(blk + 80), dmin = h2f(blk + 82);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int sc = blk[8 * h + 2 * r + k];
    a[k] = d * (sc & 0xF);
    b[k] = -(dmin * (sc >> 4));
#pragma unroll
    for (int l = 0; l < 16; ++l) q[16 * k + l] = (blk[16 + 32 * h + 16 * k + l] >> (2 * r)) & 3;
  }
}

template <> __device__ __forceinline__ void unpack32<DType::Q3_K>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + (s >> 3) * 110;
  const int j = s & 7, h = j >> 2, r = j & 3;
  const float d_all = h2f(blk + 108);
  const uint8_t *sc12 = blk + 96;
  const int m = 1 << (4 * h + r);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int is = 8 * h + 2 * r + k;
    const int lo = is < 8 ? (sc12[is] & 0xF) : (sc12[is - 8] >> 4);
    const int hi = (sc12[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    a[k] = d_all * static_cast<float>((lo | (hi << 4)) - 32);
    b[k] = 0.0f;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int ll = 16 * k + l;
      q[ll] = ((blk[32 + 32 * h + ll] >> (2 * r)) & 3) - ((blk[ll] & m) ? 0 : 4);
    }
  }
}

template <> __device__ __forceinline__ void unpack32<DType::Q4_K>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + (s >> 3) * 144;
  const int j = s & 7;
  const float d = h2f(blk), dmin = h2f(blk + 2);
  int sc, m;
  scale_min_k4(j, blk + 4, sc, m);
  a[0] = a[1] = d * sc;
  b[0] = b[1] = -(dmin * m);
  // Rows of Q4_K are multiples of 144 = 9*16 bytes: the 32 quant bytes are 16-byte aligned.
  const uint4 *q4 = reinterpret_cast<const uint4 *>(blk + 16 + 32 * (j >> 1));
  uint4 v[2] = {q4[0], q4[1]};
  const uint8_t *qb = reinterpret_cast<const uint8_t *>(v);
  const int sh = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) q[l] = (qb[l] >> sh) & 0xF;
}

template <> __device__ __forceinline__ void unpack32<DType::Q5_K>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + (s >> 3) * 176;
  const int j = s & 7, p = j >> 1, hi = j & 1;
  const float d = h2f(blk), dmin = h2f(blk + 2);
  int sc, m;
  scale_min_k4(j, blk + 4, sc, m);
  a[0] = a[1] = d * sc;
  b[0] = b[1] = -(dmin * m);
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(blk + 16);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(blk + 48 + 32 * p);
  uint4 vh[2] = {qh4[0], qh4[1]}, vl[2] = {ql4[0], ql4[1]};
  const uint8_t *qh = reinterpret_cast<const uint8_t *>(vh), *ql = reinterpret_cast<const uint8_t *>(vl);
  const int bit = 1 << (2 * p + hi), sh = hi * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) q[l] = ((ql[l] >> sh) & 0xF) + ((qh[l] & bit) ? 16 : 0);
}

template <> __device__ __forceinline__ void unpack32<DType::Q6_K>(const uint8_t *row, int s, int *q, float *a, float *b) {
  const uint8_t *blk = row + (s >> 3) * 210;
  const int j = s & 7, h = j >> 2, g = j & 3;
  const float d = h2f(blk + 208);
  // 210-byte blocks are only 2-byte aligned: read 16-bit words.
  const uint16_t *ql16 = reinterpret_cast<const uint16_t *>(blk + 64 * h + (g & 1) * 32);
  const uint16_t *qh16 = reinterpret_cast<const uint16_t *>(blk + 128 + 32 * h);
  uint16_t vl[16], vh[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) { vl[i] = ql16[i]; vh[i] = qh16[i]; }
  const uint8_t *ql = reinterpret_cast<const uint8_t *>(vl), *qh = reinterpret_cast<const uint8_t *>(vh);
  const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192 + 8 * h + 2 * g);
  a[0] = d * sc[0];
  a[1] = d * sc[1];
  b[0] = b[1] = 0.0f;
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int l = 0; l < 32; ++l) q[l] = (((ql[l] >> shl) & 0xF) | (((qh[l] >> shh) & 3) << 4)) - 32;
}

// The 32 weights of sub-block s (elements 32s .. 32s+31) of a row, in f32.
template <DType T> __device__ __forceinline__ void dequant32(const uint8_t *row, int s, float *w) {
  int q[32];
  float a[2], b[2];
  unpack32<T>(row, s, q, a, b);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    if constexpr (has_min<T>)
      w[l] = a[l >> 4] * q[l] + b[l >> 4];
    else
      w[l] = a[l >> 4] * q[l];
  }
}

// Plain types: element i of a row.
template <DType T> __device__ __forceinline__ float plain_at(const uint8_t *row, int64_t i);
template <> __device__ __forceinline__ float plain_at<DType::F32>(const uint8_t *row, int64_t i) {
  return reinterpret_cast<const float *>(row)[i];
}
template <> __device__ __forceinline__ float plain_at<DType::F16>(const uint8_t *row, int64_t i) {
  return __half2float(reinterpret_cast<const __half *>(row)[i]);
}
template <> __device__ __forceinline__ float plain_at<DType::BF16>(const uint8_t *row, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t *>(row)[i]) << 16);
}

}  // namespace moe
