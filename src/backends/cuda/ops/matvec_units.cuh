// One lane's share of a decode mat-vec: the dot product of one 32-weight sub-block, read
// from GGUF block bytes staged in shared memory, with 32 activations already rounded to
// int8 (Q8_0 / Q8_K values: q * xd). Integer products (__dp4a) are exact; the block and
// sub-block scales are applied once per sub-block, as the CPU's integer dot kernels do,
// so the result equals the float reference up to the order of float additions.
// The staged bytes keep their global alignment (mod 16), which for several types is only
// 2 or 1 bytes: words are read through ld_words, which never needs alignment.
#pragma once
#include "backends/cuda/ops/quant.cuh"

namespace moe {

// Rounded activations of one 32-element sub-block: 32 int8 values (16-byte aligned), their
// scale, and the sums of the two 16-element halves (for weight offsets / mins).
struct XSub {
  const int8_t *q;
  float d;
  int sum_lo, sum_hi;
};

// N little-endian 32-bit words starting at any byte address of shared memory (reads one
// aligned word past the span: staging buffers keep 16 bytes of slack).
template <int N> __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t (&w)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *b = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  const uint32_t sh = static_cast<uint32_t>(a & 3) * 8;
  uint32_t lo = b[0];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t hi = b[i + 1];
    w[i] = __funnelshift_r(lo, hi, sh);
    lo = hi;
  }
}

// ld_words for types whose block size is a multiple of 16 (Q4_K, Q5_K): a word's address
// has the alignment of its row's staged start, the same for every lane (a warp-uniform
// branch), and rows of such types usually start 16-byte aligned: two 16-byte loads then.
template <int N> __device__ __forceinline__ void ld_words_rows16(const uint8_t *p, uint32_t (&w)[N]) {
  static_assert(N % 4 == 0, "whole 16-byte words");
  if ((reinterpret_cast<uintptr_t>(p) & 15) != 0) return ld_words<N>(p, w);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint4 v = reinterpret_cast<const uint4 *>(p)[i];
    w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
  }
}

__device__ __forceinline__ void ld_x8(const int8_t *x, int (&v)[8]) {
  const int4 a = reinterpret_cast<const int4 *>(x)[0], b = reinterpret_cast<const int4 *>(x)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Exact int -> float for |q| < 2^22 (an add on the mantissa; I2F is a quarter-rate op).
__device__ __forceinline__ float small_i2f(int q) { return __int_as_float(0x4B400000 + q) - 12582912.0f; }

// Generic: float weights from dequant32 (same operations as the CPU dequantizer).
template <DType T> __device__ __forceinline__ float unit_dot(const uint8_t *blk, int j, const XSub &x) {
  float w[32];
  dequant32<T>(blk, j, w);
  float s = 0.0f;
#pragma unroll
  for (int l = 0; l < 32; ++l) s += w[l] * small_i2f(x.q[l]);
  return x.d * s;
}

// Q4_K / Q5_K sub-block j from its integer dot s: the block's 6-bit scale and min applied,
// x.d * (d sc s - dmin m sum(x)).
__device__ __forceinline__ float k4_fold(const uint8_t *b, int j, const XSub &x, int s) {
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  const float d1 = h2f(b) * sc, m1 = h2f(b + 2) * m;
  return x.d * (d1 * static_cast<float>(s) - m1 * static_cast<float>(x.sum_lo + x.sum_hi));
}

// Q4_K / Q5_K: w = d*sc * q - dmin*m, so sum(w x) = d*sc * sum(q x) - dmin*m * sum(x).
template <> __device__ __forceinline__ float unit_dot<DType::Q4_K>(const uint8_t *b, int j, const XSub &x) {
  uint32_t q[8];
  ld_words_rows16<8>(b + 16 + 32 * (j >> 1), q);
  int xv[8];
  ld_x8(x.q, xv);
  const int sh = (j & 1) * 4;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = __dp4a(static_cast<int>((q[i] >> sh) & 0x0F0F0F0Fu), xv[i], s);
  return k4_fold(b, j, x, s);
}

template <> __device__ __forceinline__ float unit_dot<DType::Q5_K>(const uint8_t *b, int j, const XSub &x) {
  const int p = j >> 1, hi = j & 1;
  uint32_t ql[8], qh[8];
  ld_words_rows16<8>(b + 48 + 32 * p, ql);
  ld_words_rows16<8>(b + 16, qh);
  int xv[8];
  ld_x8(x.q, xv);
  const int shl = hi * 4, shh = 2 * p + hi;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t v = ((ql[i] >> shl) & 0x0F0F0F0Fu) | (((qh[i] >> shh) & 0x01010101u) << 4);
    s = __dp4a(static_cast<int>(v), xv[i], s);
  }
  return k4_fold(b, j, x, s);
}

// Q6_K: q in 0..63, w = d*sc_half * (q - 32); one scale per 16 weights.
template <> __device__ __forceinline__ float unit_dot<DType::Q6_K>(const uint8_t *b, int j, const XSub &x) {
  const int h = j >> 2, g = j & 3;
  uint32_t ql[8], qh[8];
  ld_words<8>(b + 64 * h + 32 * (g & 1), ql);
  ld_words<8>(b + 128 + 32 * h, qh);
  int xv[8];
  ld_x8(x.q, xv);
  const int shl = (g >> 1) * 4, shh = 2 * g;
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t v = ((ql[i] >> shl) & 0x0F0F0F0Fu) | (((qh[i] >> shh) & 0x03030303u) << 4);
    if (i < 4) s0 = __dp4a(static_cast<int>(v), xv[i], s0);
    else s1 = __dp4a(static_cast<int>(v), xv[i], s1);
  }
  s0 -= 32 * x.sum_lo;
  s1 -= 32 * x.sum_hi;
  const float d = h2f(b + 208);
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * g);
  return x.d * (d * sc[0] * static_cast<float>(s0) + d * sc[1] * static_cast<float>(s1));
}

template <> __device__ __forceinline__ float unit_dot<DType::Q8_0>(const uint8_t *b, int, const XSub &x) {
  uint32_t q[8];
  ld_words<8>(b + 2, q);
  int xv[8];
  ld_x8(x.q, xv);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = __dp4a(static_cast<int>(q[i]), xv[i], s);
  return x.d * (h2f(b) * static_cast<float>(s));
}

// Q4_0: low nibbles are weights 0..15, high nibbles 16..31, w = d * (q - 8).
template <> __device__ __forceinline__ float unit_dot<DType::Q4_0>(const uint8_t *b, int, const XSub &x) {
  uint32_t q[4];
  ld_words<4>(b + 2, q);
  int xv[8];
  ld_x8(x.q, xv);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = __dp4a(static_cast<int>(q[i] & 0x0F0F0F0Fu), xv[i], s);
    s = __dp4a(static_cast<int>((q[i] >> 4) & 0x0F0F0F0Fu), xv[i + 4], s);
  }
  s -= 8 * (x.sum_lo + x.sum_hi);
  return x.d * (h2f(b) * static_cast<float>(s));
}

// MXFP4: 4-bit codes -> {0, 1, 2, 3, 4, 6, 8, 12} (twice the E2M1 value), sign in bit 3;
// the E8M0 exponent is applied as e8m0_half, like the CPU dequantizer.
__device__ __forceinline__ int mxfp4_dot4(uint32_t codes, int xv, int s) {
  const uint32_t mag = codes & 0x07070707u;
  // Pack the four 3-bit magnitudes into the nibbles of a byte_perm selector.
  const uint32_t sel = __byte_perm(mag | (mag >> 4), 0, 0x0020) & 0x7777u;
  const uint32_t v = __byte_perm(0x03020100u, 0x0C080604u, sel);  // table bytes, all >= 0
  const uint32_t neg = ((codes >> 3) & 0x01010101u) * 0xFFu;       // 0xFF where the code is negative
  s = __dp4a(static_cast<int>(v & ~neg), xv, s);
  return s - __dp4a(static_cast<int>(v & neg), xv, 0);
}

template <> __device__ __forceinline__ float unit_dot<DType::MXFP4>(const uint8_t *b, int, const XSub &x) {
  uint32_t q[4];
  ld_words<4>(b + 1, q);
  int xv[8];
  ld_x8(x.q, xv);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = mxfp4_dot4(q[i] & 0x0F0F0F0Fu, xv[i], s);
    s = mxfp4_dot4((q[i] >> 4) & 0x0F0F0F0Fu, xv[i + 4], s);
  }
  return x.d * (e8m0_half(b[0]) * static_cast<float>(s));
}

}  // namespace moe
