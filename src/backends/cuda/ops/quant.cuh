// Device-side GGUF block decoding: dequant32<T>(row, s, w) writes the 32 weights of
// sub-block s (elements 32s .. 32s+31) of a row, with the same float operations as the
// reference dequantizers in src/quant/*.cpp, so CUDA and CPU agree to rounding.
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

template <DType T> __device__ __forceinline__ void dequant32(const uint8_t *row, int s, float *w);

template <> __device__ __forceinline__ void dequant32<DType::Q4_0>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + s * 18;
  const float d = h2f(b);
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const int q = b[2 + l];
    w[l] = ((q & 0xF) - 8) * d;
    w[l + 16] = ((q >> 4) - 8) * d;
  }
}

template <> __device__ __forceinline__ void dequant32<DType::Q8_0>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + s * 34;
  const float d = h2f(b);
#pragma unroll
  for (int l = 0; l < 32; ++l) w[l] = static_cast<int8_t>(b[2 + l]) * d;
}

template <> __device__ __forceinline__ void dequant32<DType::MXFP4>(const uint8_t *row, int s, float *w) {
  const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const uint8_t *b = row + s * 17;
  const float d = e8m0_half(b[0]);
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const int q = b[1 + l];
    w[l] = kv[q & 0xF] * d;
    w[l + 16] = kv[q >> 4] * d;
  }
}

template <> __device__ __forceinline__ void dequant32<DType::Q2_K>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + (s >> 3) * 84;
  const int j = s & 7, h = j >> 2, r = j & 3;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int sc = b[8 * h + 2 * r + k];
    const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
#pragma unroll
    for (int l = 0; l < 16; ++l) w[16 * k + l] = dl * ((b[16 + 32 * h + 16 * k + l] >> (2 * r)) & 3) - ml;
  }
}

template <> __device__ __forceinline__ void dequant32<DType::Q3_K>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + (s >> 3) * 110;
  const int j = s & 7, h = j >> 2, r = j & 3;
  const float d_all = h2f(b + 108);
  const uint8_t *sc12 = b + 96;
  const int m = 1 << (4 * h + r);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int is = 8 * h + 2 * r + k;
    const int lo = is < 8 ? (sc12[is] & 0xF) : (sc12[is - 8] >> 4);
    const int hi = (sc12[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    const float dl = d_all * static_cast<float>((lo | (hi << 4)) - 32);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int ll = 16 * k + l;
      w[ll] = dl * (((b[32 + 32 * h + ll] >> (2 * r)) & 3) - ((b[ll] & m) ? 0 : 4));
    }
  }
}

template <> __device__ __forceinline__ void dequant32<DType::Q4_K>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + (s >> 3) * 144;
  const int j = s & 7;
  const float d = h2f(b), dmin = h2f(b + 2);
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  const float d1 = d * sc, m1 = dmin * m;
  // Rows of Q4_K are multiples of 144 = 9*16 bytes: the 32 quant bytes are 16-byte aligned.
  const uint4 *q4 = reinterpret_cast<const uint4 *>(b + 16 + 32 * (j >> 1));
  uint4 v[2] = {q4[0], q4[1]};
  const uint8_t *q = reinterpret_cast<const uint8_t *>(v);
  const int sh = (j & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) w[l] = d1 * ((q[l] >> sh) & 0xF) - m1;
}

template <> __device__ __forceinline__ void dequant32<DType::Q5_K>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + (s >> 3) * 176;
  const int j = s & 7, p = j >> 1, hi = j & 1;
  const float d = h2f(b), dmin = h2f(b + 2);
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  const float d1 = d * sc, m1 = dmin * m;
  const uint4 *qh4 = reinterpret_cast<const uint4 *>(b + 16);
  const uint4 *ql4 = reinterpret_cast<const uint4 *>(b + 48 + 32 * p);
  uint4 vh[2] = {qh4[0], qh4[1]}, vl[2] = {ql4[0], ql4[1]};
  const uint8_t *qh = reinterpret_cast<const uint8_t *>(vh), *ql = reinterpret_cast<const uint8_t *>(vl);
  const int bit = 1 << (2 * p + hi), sh = hi * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) w[l] = d1 * (((ql[l] >> sh) & 0xF) + ((qh[l] & bit) ? 16 : 0)) - m1;
}

template <> __device__ __forceinline__ void dequant32<DType::Q6_K>(const uint8_t *row, int s, float *w) {
  const uint8_t *b = row + (s >> 3) * 210;
  const int j = s & 7, h = j >> 2, g = j & 3;
  const float d = h2f(b + 208);
  // 210-byte blocks are only 2-byte aligned: read 16-bit words.
  const uint16_t *ql16 = reinterpret_cast<const uint16_t *>(b + 64 * h + (g & 1) * 32);
  const uint16_t *qh16 = reinterpret_cast<const uint16_t *>(b + 128 + 32 * h);
  uint16_t vl[16], vh[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) { vl[i] = ql16[i]; vh[i] = qh16[i]; }
  const uint8_t *ql = reinterpret_cast<const uint8_t *>(vl), *qh = reinterpret_cast<const uint8_t *>(vh);
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * g);
  const float d0 = d * sc[0], d1 = d * sc[1];
  const int shl = (g >> 1) * 4, shh = 2 * g;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int q = (((ql[l] >> shl) & 0xF) | (((qh[l] >> shh) & 3) << 4)) - 32;
    w[l] = (l < 16 ? d0 : d1) * q;
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
