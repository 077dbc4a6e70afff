// Reference-order dot kernels (see ref_order_dot.h), compiled twice: portable
// (ref_order_dot.cpp) and with AVX2/FMA flags (ref_order_dot_avx2.cpp). Every float step is
// an explicit operation or std::fma, so both builds give the same bits; the flags only let
// the compiler use hardware FMA and vectorise the integer sums.
// Include with REFDOT_NS defined to the namespace to build into.
#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/ref_order_dot.h"
#include "core/fp16.h"

namespace moe::REFDOT_NS {

using refmath::hsum8;

inline float dot_q8_0(int n, const BlockQ8_0 *x, const BlockQ8_0 *y) {
  float acc[8] = {};
  for (int ib = 0; ib < n / QK8_0; ++ib) {
    const float d = fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d);
    int32_t s[8];
    for (int k = 0; k < 8; ++k) {
      s[k] = 0;
      for (int b = 0; b < 4; ++b) s[k] += int32_t(x[ib].qs[4 * k + b]) * int32_t(y[ib].qs[4 * k + b]);
    }
    for (int k = 0; k < 8; ++k) acc[k] = std::fma(d, static_cast<float>(s[k]), acc[k]);
  }
  return hsum8(acc);
}

// 6-bit scales and mins of Q4_K/Q5_K: sc[0..7], mn[0..7].
inline void unpack_scales_mins(const uint8_t *q, int32_t *sc, int32_t *mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Integer lanes of one super-block as the reference's AVX2 loop holds them: lane k gets
// bytes 4k..4k+3 of every 32-element group g, times that group's scale.
inline void lanes32(const uint8_t *q, const int8_t *q8, const int32_t *sc, int32_t *lanes) {
  for (int k = 0; k < 8; ++k) lanes[k] = 0;
  for (int g = 0; g < 8; ++g)
    for (int k = 0; k < 8; ++k) {
      int32_t s = 0;
      for (int b = 0; b < 4; ++b) s += int32_t(q[32 * g + 4 * k + b]) * int32_t(q8[32 * g + 4 * k + b]);
      lanes[k] += sc[g] * s;
    }
}

// Q4_K 6-bit quants laid out by element: group 2j = low nibbles of qs[32j..], 2j+1 = high.
inline void q4_k_values(const BlockQ4_K &x, uint8_t *q) {
  for (int j = 0; j < 4; ++j)
    for (int b = 0; b < 32; ++b) {
      q[64 * j + b] = x.qs[32 * j + b] & 0xF;
      q[64 * j + 32 + b] = x.qs[32 * j + b] >> 4;
    }
}

// Q4_K through the reference's plain vec_dot (rows not a multiple of 8: not repacked).
inline float dot_q4_k(int n, const BlockQ4_K *x, const BlockQ8_K *y) {
  float acc[8] = {}, acc_m[4] = {};
  uint8_t q[QK_K];
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = -y[i].d * fp16_to_fp32(x[i].dmin);
    int32_t sc[8], mn[8];
    unpack_scales_mins(x[i].scales, sc, mn);
    for (int k = 0; k < 4; ++k) {
      const int32_t s0 = y[i].bsums[4 * k + 0] + y[i].bsums[4 * k + 1];
      const int32_t s1 = y[i].bsums[4 * k + 2] + y[i].bsums[4 * k + 3];
      acc_m[k] = std::fma(dmin, static_cast<float>(mn[2 * k] * s0 + mn[2 * k + 1] * s1), acc_m[k]);
    }
    q4_k_values(x[i], q);
    int32_t lanes[8];
    lanes32(q, y[i].qs, sc, lanes);
    for (int k = 0; k < 8; ++k) acc[k] = std::fma(d, static_cast<float>(lanes[k]), acc[k]);
  }
  const float m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
  return hsum8(acc) + m;
}

// Q4_K as the reference runs it once repacked into 8-row interleaved blocks (always, on
// x86, when the row count is a multiple of 8). gemv (single activation rows, MoE experts,
// leftovers): one int32 per super-block for the scaled quants and one for the mins, each
// fused into its own float accumulator, subtracted at the end. gemm (4-row groups of a
// multi-token product): the same with one step per 64-element pair of sub-blocks.
inline float dot_q4_k_repacked(int n, const BlockQ4_K *x, const BlockQ8_K *y, bool gemm) {
  float acc = 0.f, accm = 0.f;
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    const float dm = fp16_to_fp32(x[i].dmin) * y[i].d;
    int32_t sc[8], mn[8];
    unpack_scales_mins(x[i].scales, sc, mn);
    int32_t sb_q[4], sb_m[4];
    for (int j = 0; j < 4; ++j) {
      int32_t lo = 0, hi = 0;
      const uint8_t *q = x[i].qs + 32 * j;
      const int8_t *q8 = y[i].qs + 64 * j;
      for (int b = 0; b < 32; ++b) {
        lo += int32_t(q[b] & 0xF) * q8[b];
        hi += int32_t(q[b] >> 4) * q8[32 + b];
      }
      sb_q[j] = sc[2 * j] * lo + sc[2 * j + 1] * hi;
      sb_m[j] = mn[2 * j] * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) +
                mn[2 * j + 1] * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
    }
    if (gemm) {
      for (int j = 0; j < 4; ++j) {
        acc = std::fma(static_cast<float>(sb_q[j]), d, acc);
        accm = std::fma(static_cast<float>(sb_m[j]), dm, accm);
      }
    } else {
      acc = std::fma(static_cast<float>(sb_q[0] + sb_q[1] + sb_q[2] + sb_q[3]), d, acc);
      accm = std::fma(static_cast<float>(sb_m[0] + sb_m[1] + sb_m[2] + sb_m[3]), dm, accm);
    }
  }
  return acc - accm;
}

inline float dot_q5_k(int n, const BlockQ5_K *x, const BlockQ8_K *y) {
  float acc[8] = {};
  float summs = 0.f;
  uint8_t q[QK_K];
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = -y[i].d * fp16_to_fp32(x[i].dmin);
    int32_t sc[8], mn[8];
    unpack_scales_mins(x[i].scales, sc, mn);
    int32_t msum = 0;
    for (int j = 0; j < 8; ++j) msum += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    summs = std::fma(dmin, static_cast<float>(msum), summs);  // the reference's compiler fuses this
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 32; ++b) {
        const uint8_t h = x[i].qh[b];
        q[64 * j + b] = static_cast<uint8_t>((x[i].qs[32 * j + b] & 0xF) | (((h >> (2 * j)) & 1) << 4));
        q[64 * j + 32 + b] = static_cast<uint8_t>((x[i].qs[32 * j + b] >> 4) | (((h >> (2 * j + 1)) & 1) << 4));
      }
    int32_t lanes[8];
    lanes32(q, y[i].qs, sc, lanes);
    for (int k = 0; k < 8; ++k) acc[k] = std::fma(d, static_cast<float>(lanes[k]), acc[k]);
  }
  return hsum8(acc) + summs;
}

inline float dot_q6_k(int n, const BlockQ6_K *x, const BlockQ8_K *y) {
  float acc[8] = {};
  uint8_t q[QK_K];
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    for (int j = 0; j < 2; ++j) {
      const uint8_t *ql = x[i].ql + 64 * j;
      const uint8_t *qh = x[i].qh + 32 * j;
      for (int b = 0; b < 32; ++b) {
        q[128 * j + b] = static_cast<uint8_t>((ql[b] & 0xF) | ((qh[b] & 3) << 4));
        q[128 * j + 32 + b] = static_cast<uint8_t>((ql[32 + b] & 0xF) | (((qh[b] >> 2) & 3) << 4));
        q[128 * j + 64 + b] = static_cast<uint8_t>((ql[b] >> 4) | (((qh[b] >> 4) & 3) << 4));
        q[128 * j + 96 + b] = static_cast<uint8_t>((ql[32 + b] >> 4) | (((qh[b] >> 6) & 3) << 4));
      }
    }
    // Unsigned 6-bit values, scale per 16 elements; lane k = bytes 4k..4k+3 of every
    // 32-element group, minus 32 * (scale * bsum) of the 16-groups 2k and 2k+1.
    int32_t lanes[8] = {};
    for (int g = 0; g < 8; ++g)
      for (int k = 0; k < 8; ++k) {
        int32_t s = 0;
        for (int b = 0; b < 4; ++b) s += int32_t(q[32 * g + 4 * k + b]) * int32_t(y[i].qs[32 * g + 4 * k + b]);
        lanes[k] += x[i].scales[2 * g + (k >> 2)] * s;
      }
    for (int k = 0; k < 8; ++k)
      lanes[k] -= 32 * (y[i].bsums[2 * k] * x[i].scales[2 * k] + y[i].bsums[2 * k + 1] * x[i].scales[2 * k + 1]);
    for (int k = 0; k < 8; ++k) acc[k] = std::fma(d, static_cast<float>(lanes[k]), acc[k]);
  }
  return hsum8(acc);
}

inline float dot(DType t, int n, const void *w, const void *x) {
  switch (t) {
    case DType::F32: return refmath::dot_f32_vec(n, static_cast<const float *>(w), 1, static_cast<const float *>(x), 1);
    case DType::Q8_0: return dot_q8_0(n, static_cast<const BlockQ8_0 *>(w), static_cast<const BlockQ8_0 *>(x));
    case DType::Q4_K: return dot_q4_k(n, static_cast<const BlockQ4_K *>(w), static_cast<const BlockQ8_K *>(x));
    case DType::Q5_K: return dot_q5_k(n, static_cast<const BlockQ5_K *>(w), static_cast<const BlockQ8_K *>(x));
    case DType::Q6_K: return dot_q6_k(n, static_cast<const BlockQ6_K *>(w), static_cast<const BlockQ8_K *>(x));
    default: return 0.f;
  }
}

void rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path) {
  const uint8_t *wr = static_cast<const uint8_t *>(w);
  switch (path) {
    case RefPath::F32Gemm:
      for (int r = 0; r < nrows; ++r)
        out[r] = refmath::dot_f32_gemm(n, reinterpret_cast<const float *>(wr + r * ws), 1, static_cast<const float *>(x), 1);
      return;
    case RefPath::RepackGemv:
    case RefPath::RepackGemm:
      if (t == DType::Q4_K) {
        for (int r = 0; r < nrows; ++r)
          out[r] = dot_q4_k_repacked(n, reinterpret_cast<const BlockQ4_K *>(wr + r * ws), static_cast<const BlockQ8_K *>(x),
                                     path == RefPath::RepackGemm);
        return;
      }
      break;
    case RefPath::VecDot: break;
  }
  for (int r = 0; r < nrows; ++r) out[r] = dot(t, n, wr + r * ws, x);
}

}  // namespace moe::REFDOT_NS
