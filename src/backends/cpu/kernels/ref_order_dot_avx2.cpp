// AVX2/FMA kernels with the reference's float grouping (see ref_order_dot.h). The lane
// layout is the reference's own, so SIMD gives the same bits as the portable build in
// ref_order_dot_impl.h (which the unit test holds it to) at vec_dot speed. Integer sums
// are exact in any order; only the float steps are mirrored.
#if defined(MOEINFER_X86)
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/ref_order_dot.h"
#include "core/fp16.h"

namespace moe::refdot_avx2 {
namespace {

// (x_k + x_{k+4}), then (r0 + r2) + (r1 + r3): the reference's hsum of 8 lanes.
inline float hsum8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// The 16-lane tree, lanes 0-7 in lo and 8-15 in hi.
inline float hsum16(__m256 lo, __m256 hi) { return hsum8(_mm256_add_ps(hi, lo)); }

// Signed int8 products summed over each 4 bytes (no saturation for |values| <= 127).
inline __m256i dot4_s8(__m256i a, __m256i b) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Unsigned (<= 63) times signed int8, summed over each 4 bytes, times an int16 scale vector.
inline __m256i dot4_us8_scaled(__m256i u, __m256i s, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
  return _mm_cvtsi128_si32(r);
}

float dot_f32_vec(int n, const float *x, const float *y) {
  __m256 a[4][2];
  for (auto &r : a) r[0] = r[1] = _mm256_setzero_ps();
  const int np = n & ~63;
  for (int i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h)
        a[j][h] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16 * j + 8 * h), _mm256_loadu_ps(y + i + 16 * j + 8 * h), a[j][h]);
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0][0], a[2][0]), _mm256_add_ps(a[1][0], a[3][0]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(a[0][1], a[2][1]), _mm256_add_ps(a[1][1], a[3][1]));
  float s = hsum16(lo, hi);
  for (int e = np; e < n; ++e) s = std::fma(x[e], y[e], s);
  return s;
}

float dot_f32_gemm(int n, const float *x, const float *y) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int np = n & ~15;
  for (int e = 0; e < np; e += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + e), _mm256_loadu_ps(y + e), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + e + 8), _mm256_loadu_ps(y + e + 8), hi);
  }
  if (np < n) {
    alignas(32) float l[16];
    _mm256_store_ps(l, lo);
    _mm256_store_ps(l + 8, hi);
    for (int e = np; e < n; ++e) l[e & 15] = std::fma(x[e], y[e], l[e & 15]);
    lo = _mm256_load_ps(l);
    hi = _mm256_load_ps(l + 8);
  }
  return hsum16(lo, hi);
}

float dot_q8_0(int n, const BlockQ8_0 *x, const BlockQ8_0 *y) {
  __m256 acc = _mm256_setzero_ps();
  for (int ib = 0; ib < n / QK8_0; ++ib) {
    const __m256 d = _mm256_set1_ps(fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d));
    const __m256i s = dot4_s8(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[ib].qs)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y[ib].qs)));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
  }
  return hsum8(acc);
}

inline void scales_mins(const uint8_t *q, int32_t *sc, int32_t *mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// 32-byte quant vectors of super-block sub-blocks 2j (lo) and 2j+1 (hi) for Q4_K / Q5_K.
inline void q4_k_pair(const BlockQ4_K &x, int j, __m256i &lo, __m256i &hi) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x.qs + 32 * j));
  const __m256i m4 = _mm256_set1_epi8(0xF);
  lo = _mm256_and_si256(b, m4);
  hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
}

inline void q5_k_pair(const BlockQ5_K &x, int j, __m256i &lo, __m256i &hi) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x.qs + 32 * j));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x.qh));
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j), one), 4);
  const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j + 1), one), 4);
  lo = _mm256_or_si256(_mm256_and_si256(b, m4), h0);
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), h1);
}

inline __m256i load32(const int8_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }

template <class Block, class Pair>
inline __m256i k_lanes(const Block &x, const BlockQ8_K &y, const int32_t *sc, Pair pair) {
  __m256i sumi = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    __m256i lo, hi;
    pair(x, j, lo, hi);
    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(dot4_us8_scaled(lo, load32(y.qs + 64 * j), _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j]))),
                                                   dot4_us8_scaled(hi, load32(y.qs + 64 * j + 32), _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j + 1])))));
  }
  return sumi;
}

float dot_q4_k(int n, const BlockQ4_K *x, const BlockQ8_K *y) {
  __m256 acc = _mm256_setzero_ps();
  float acc_m[4] = {};
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = -y[i].d * fp16_to_fp32(x[i].dmin);
    int32_t sc[8], mn[8];
    scales_mins(x[i].scales, sc, mn);
    for (int k = 0; k < 4; ++k) {
      const int32_t s0 = y[i].bsums[4 * k + 0] + y[i].bsums[4 * k + 1];
      const int32_t s1 = y[i].bsums[4 * k + 2] + y[i].bsums[4 * k + 3];
      acc_m[k] = std::fma(dmin, static_cast<float>(mn[2 * k] * s0 + mn[2 * k + 1] * s1), acc_m[k]);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k_lanes(x[i], y[i], sc, q4_k_pair)), acc);
  }
  return hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

float dot_q4_k_repacked(int n, const BlockQ4_K *x, const BlockQ8_K *y, bool gemm) {
  float acc = 0.f, accm = 0.f;
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    const float dm = fp16_to_fp32(x[i].dmin) * y[i].d;
    int32_t sc[8], mn[8];
    scales_mins(x[i].scales, sc, mn);
    int32_t sb_m[4];
    for (int j = 0; j < 4; ++j)
      sb_m[j] = mn[2 * j] * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + mn[2 * j + 1] * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
    if (gemm) {
      // One step per 64-element pair of sub-blocks (exact int32 sums of the scaled lanes).
      for (int j = 0; j < 4; ++j) {
        __m256i lo, hi;
        q4_k_pair(x[i], j, lo, hi);
        const __m256i v = _mm256_add_epi32(dot4_us8_scaled(lo, load32(y[i].qs + 64 * j), _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j]))),
                                           dot4_us8_scaled(hi, load32(y[i].qs + 64 * j + 32), _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j + 1]))));
        acc = std::fma(static_cast<float>(hsum_i32(v)), d, acc);
        accm = std::fma(static_cast<float>(sb_m[j]), dm, accm);
      }
    } else {
      acc = std::fma(static_cast<float>(hsum_i32(k_lanes(x[i], y[i], sc, q4_k_pair))), d, acc);
      accm = std::fma(static_cast<float>(sb_m[0] + sb_m[1] + sb_m[2] + sb_m[3]), dm, accm);
    }
  }
  return acc - accm;
}

float dot_q5_k(int n, const BlockQ5_K *x, const BlockQ8_K *y) {
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.f;
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = -y[i].d * fp16_to_fp32(x[i].dmin);
    int32_t sc[8], mn[8];
    scales_mins(x[i].scales, sc, mn);
    int32_t msum = 0;
    for (int j = 0; j < 8; ++j) msum += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    summs = std::fma(dmin, static_cast<float>(msum), summs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k_lanes(x[i], y[i], sc, q5_k_pair)), acc);
  }
  return hsum8(acc) + summs;
}

float dot_q6_k(int n, const BlockQ6_K *x, const BlockQ8_K *y) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
  for (int i = 0; i < n / QK_K; ++i) {
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 2; ++j) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[i].ql + 64 * j));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[i].ql + 64 * j + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[i].qh + 32 * j));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
      for (int g = 0; g < 4; ++g) {
        const int gi = 4 * j + g;  // 32-element group of the super-block
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[2 * gi + 1]), _mm_set1_epi16(x[i].scales[2 * gi]));
        sumi = _mm256_add_epi32(sumi, dot4_us8_scaled(q[g], load32(y[i].qs + 32 * gi), scale));
      }
    }
    alignas(32) int32_t corr[8];
    for (int k = 0; k < 8; ++k)
      corr[k] = 32 * (y[i].bsums[2 * k] * x[i].scales[2 * k] + y[i].bsums[2 * k + 1] * x[i].scales[2 * k + 1]);
    sumi = _mm256_sub_epi32(sumi, _mm256_load_si256(reinterpret_cast<const __m256i *>(corr)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

float dot(DType t, int n, const void *w, const void *x) {
  switch (t) {
    case DType::F32: return dot_f32_vec(n, static_cast<const float *>(w), static_cast<const float *>(x));
    case DType::Q8_0: return dot_q8_0(n, static_cast<const BlockQ8_0 *>(w), static_cast<const BlockQ8_0 *>(x));
    case DType::Q4_K: return dot_q4_k(n, static_cast<const BlockQ4_K *>(w), static_cast<const BlockQ8_K *>(x));
    case DType::Q5_K: return dot_q5_k(n, static_cast<const BlockQ5_K *>(w), static_cast<const BlockQ8_K *>(x));
    case DType::Q6_K: return dot_q6_k(n, static_cast<const BlockQ6_K *>(w), static_cast<const BlockQ8_K *>(x));
    default: return 0.f;
  }
}

}  // namespace

void rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path) {
  const uint8_t *wr = static_cast<const uint8_t *>(w);
  switch (path) {
    case RefPath::F32Gemm:
      for (int r = 0; r < nrows; ++r)
        out[r] = dot_f32_gemm(n, reinterpret_cast<const float *>(wr + r * ws), static_cast<const float *>(x));
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

}  // namespace moe::refdot_avx2
#endif
