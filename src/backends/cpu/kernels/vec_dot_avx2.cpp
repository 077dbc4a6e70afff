// AVX2 + FMA + F16C kernels. Built with those flags (see src/CMakeLists.txt) and only
// called after cpuid says the CPU has them. Integer products use the maddubs sign trick
// (|a| as the unsigned operand, b with a's sign as the signed one) so every partial sum
// stays exact; only the per-block scaling is floating point.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

// F16C conversion: exact, like fp16_to_fp32, but one instruction.
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 32 signed x 32 signed int8 -> 8 int32 partial sums (pairs of 4 products).
inline __m256i dot_i8(__m256i a, __m256i b) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// 32 unsigned (< 128) x 32 signed int8 -> 16 int16 pair sums.
inline __m256i dot_u8_i16(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

// Q4_0/MXFP4 nibbles: element j low nibble, j+16 high nibble -> 32 bytes in order.
inline __m256i unpack_nibbles(const uint8_t *q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

void dot_f32(int n, float *s, const void *w, const void *x) {
  const float *a = static_cast<const float *>(w), *b = static_cast<const float *>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  *s = sum;
}

inline __m256 load_f16x8(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
inline __m256 load_bf16x8(const uint16_t *p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <bool kBf16>
void dot_half(int n, float *s, const void *w, const void *x) {
  const uint16_t *a = static_cast<const uint16_t *>(w), *b = static_cast<const uint16_t *>(x);
  auto ld = [](const uint16_t *p) { return kBf16 ? load_bf16x8(p) : load_f16x8(p); };
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
    acc1 = _mm256_fmadd_ps(ld(a + i + 8), ld(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(ld(a + i + 16), ld(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(ld(a + i + 24), ld(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i)
    sum += kBf16 ? bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]) : h2f(a[i]) * h2f(b[i]);
  *s = sum;
}

void dot_q8_0(int n, float *s, const void *w, const void *x) {
  const BlockQ8_0 *a = static_cast<const BlockQ8_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK8_0; ++i) {
    const __m256i p = dot_i8(load256(a[i].qs), load256(b[i].qs));
    const __m256 d = _mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  *s = hsum(acc);
}

void dot_q4_0(int n, float *s, const void *w, const void *x) {
  const BlockQ4_0 *a = static_cast<const BlockQ4_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK4_0; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(a[i].qs), eight);
    const __m256i p = dot_i8(q, load256(b[i].qs));
    const __m256 d = _mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  *s = hsum(acc);
}

void dot_mxfp4(int n, float *s, const void *w, const void *x) {
  const BlockMXFP4 *a = static_cast<const BlockMXFP4 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4Values));
  const __m256i table = _mm256_set_m128i(t, t);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_MXFP4; ++i) {
    const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(a[i].qs));
    const __m256i p = dot_i8(q, load256(b[i].qs));
    const __m256 d = _mm256_set1_ps(h2f(b[i].d) * kE8m0Half.v[a[i].e]);
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  *s = hsum(acc);
}

// 4 rows at once with the single-row accumulation order (one accumulator per row, one FMA
// per block), sharing the activation block load/scale and, for Q4_0, the 8*sum(y) term.
template <int kKind>  // 0 q8_0, 1 q4_0, 2 mxfp4
void dot4_b32(int n, float *s, const void *w, size_t stride, const void *x) {
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const uint8_t *base = static_cast<const uint8_t *>(w);
  const size_t bsz = kKind == 0 ? sizeof(BlockQ8_0) : kKind == 1 ? sizeof(BlockQ4_0) : sizeof(BlockMXFP4);
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4Values));
  const __m256i table = _mm256_set_m128i(t, t);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int i = 0; i < n / QK8_0; ++i) {
    const __m256i y = load256(b[i].qs);
    const float dy = h2f(b[i].d);
    __m256i y8 = _mm256_setzero_si256();
    if (kKind == 1) y8 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), y), ones16);
    for (int r = 0; r < 4; ++r) {
      const uint8_t *blk = base + r * stride + static_cast<size_t>(i) * bsz;
      __m256i p;
      float d;
      uint16_t h;
      if (kKind == 0) {
        p = dot_i8(load256(blk + 2), y);
        std::memcpy(&h, blk, 2);
        d = h2f(h) * dy;
      } else if (kKind == 1) {
        p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(unpack_nibbles(blk + 2), y), ones16), y8);
        std::memcpy(&h, blk, 2);
        d = h2f(h) * dy;
      } else {
        p = dot_i8(_mm256_shuffle_epi8(table, unpack_nibbles(blk + 1)), y);
        d = dy * kE8m0Half.v[blk[0]];
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) s[r] = hsum(acc[r]);
}

// Scale vector for a 32-value run made of two 16-value groups with scales s0, s1.
inline __m256i scale_pair(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
}

void dot_q2_K(int n, float *s, const void *w, const void *x) {
  const BlockQ2_K *a = static_cast<const BlockQ2_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_K; ++i) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(a[i].scales));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0xF)));
    const __m256i summs = _mm256_madd_epi16(load256(b[i].bsums), mins);
    const int8_t *q8 = b[i].qs;
    const uint8_t *sc = a[i].scales;
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q2 = load256(a[i].qs + 32 * half);
      for (int sh = 0; sh < 4; ++sh, q8 += 32, sc += 2) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * sh), m3);
        const __m256i p = dot_u8_i16(q, load256(q8));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sc[0] & 0xF, sc[1] & 0xF)));
      }
    }
    const float dall = b[i].d * h2f(a[i].d);
    const float dmin = b[i].d * h2f(a[i].dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(isum), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(summs), acc);
  }
  *s = hsum(acc);
}

void dot_q3_K(int n, float *s, const void *w, const void *x) {
  const BlockQ3_K *a = static_cast<const BlockQ3_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_K; ++i) {
    int8_t sc[16];
    unpack_q3k_scales(a[i].scales, sc);
    // value = (q2 + 4*h) - 4: the -4 part is -4 * sum_g sc[g] * bsums[g].
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sc)));
    // the -4 offset folded into the int32 lanes: isum starts at -4 * bsums . sc
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load256(b[i].bsums), sc16), 2);
    const __m256i hm = load256(a[i].hmask);
    const int8_t *q8 = b[i].qs;
    __m256i isum = _mm256_setzero_si256();
    int g = 0, bit = 0;
    for (int half = 0; half < 2; ++half) {
      const __m256i q3 = load256(a[i].qs + 32 * half);
      for (int sh = 0; sh < 4; ++sh, q8 += 32, g += 2, ++bit) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q3, 2 * sh), m3);
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, bit), one);
        const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(h, 2));
        const __m256i p = dot_u8_i16(q, load256(q8));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a[i].d) * b[i].d), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, offset)), acc);
  }
  *s = hsum(acc);
}

template <bool kFive>
void dot_q45_K(int n, float *s, const void *w, const void *x) {
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const size_t stride = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const uint8_t *base = static_cast<const uint8_t *>(w);
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_K; ++i) {
    const uint8_t *blk = base + i * stride;
    uint16_t dh, dminh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&dminh, blk + 2, 2);
    uint8_t sc[8], mn[8];
    unpack_q4k_scales(blk + 4, sc, mn);
    const uint8_t *qh = blk + 4 + K_SCALE_SIZE;
    const uint8_t *qs = qh + (kFive ? QK_K / 8 : 0);
    // mins per 16-group: mn[g/2]
    const __m128i mn8 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(mn));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    const __m256i summ = _mm256_madd_epi16(load256(b[i].bsums), mn16);
    const __m256i hbits = kFive ? load256(qh) : _mm256_setzero_si256();
    const int8_t *q8 = b[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c, qs += 32, q8 += 64) {
      const __m256i q4 = load256(qs);
      __m256i lo = _mm256_and_si256(q4, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      if (kFive) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
      }
      const __m256i plo = _mm256_madd_epi16(dot_u8_i16(lo, load256(q8)), _mm256_set1_epi16(sc[2 * c]));
      const __m256i phi = _mm256_madd_epi16(dot_u8_i16(hi, load256(q8 + 32)), _mm256_set1_epi16(sc[2 * c + 1]));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(plo, phi));
    }
    const float d = h2f(dh) * b[i].d;
    const float dmin = h2f(dminh) * b[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(summ), acc);
  }
  *s = hsum(acc);
}

void dot_q6_K(int n, float *s, const void *w, const void *x) {
  const BlockQ6_K *a = static_cast<const BlockQ6_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK_K; ++i) {
    const int8_t *sc = a[i].scales;
    // value = q - 32 with q in [0,63]: the -32 part is -32 * sum_g sc[g] * bsums[g].
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sc)));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load256(b[i].bsums), sc16), 5);
    const uint8_t *ql = a[i].ql, *qhp = a[i].qh;
    const int8_t *q8 = b[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half, ql += 64, qhp += 32, q8 += 128, sc += 8) {
      const __m256i l0 = load256(ql), l1 = load256(ql + 32), qh = load256(qhp);
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
      const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
      const __m256i p1 = _mm256_madd_epi16(dot_u8_i16(q1, load256(q8)), scale_pair(sc[0], sc[1]));
      const __m256i p2 = _mm256_madd_epi16(dot_u8_i16(q2, load256(q8 + 32)), scale_pair(sc[2], sc[3]));
      const __m256i p3 = _mm256_madd_epi16(dot_u8_i16(q3, load256(q8 + 64)), scale_pair(sc[4], sc[5]));
      const __m256i p4 = _mm256_madd_epi16(dot_u8_i16(q4, load256(q8 + 96)), scale_pair(sc[6], sc[7]));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_add_epi32(p1, p2), _mm256_add_epi32(p3, p4)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a[i].d) * b[i].d), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, offset)), acc);
  }
  *s = hsum(acc);
}

// ---- activation quantizers (byte-identical to the reference ones) ----

inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 32 int32 (4 vectors, in order) -> 32 int8 in order.
inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1), c = _mm256_packs_epi32(i2, i3);
  const __m256i p = _mm256_packs_epi16(a, c);
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// roundf (half away from zero) for |v| < 2^23.
inline __m256i round_away(__m256 v) {
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 a = abs_ps(v);
  const __m256 f = _mm256_floor_ps(a);
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, f), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                  _mm256_set1_ps(1.0f));
  return _mm256_cvttps_epi32(_mm256_or_ps(_mm256_add_ps(f, up), sign));
}

void from_float_q8_0(const float *x, void *vy, int64_t n) {
  BlockQ8_0 *y = static_cast<BlockQ8_0 *>(vy);
  for (int64_t b = 0; b < n / QK8_0; ++b, x += QK8_0) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      m = _mm256_max_ps(m, abs_ps(v[k]));
    }
    const float amax = hmax(m);
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    const __m256 mul = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = round_away(_mm256_mul_ps(v[k], mul));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs), pack32(q[0], q[1], q[2], q[3]));
  }
}

void from_float_q8_K(const float *x, void *vy, int64_t n) {
  BlockQ8_K *y = static_cast<BlockQ8_K *>(vy);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < QK_K; k += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + k)));
    const float amax = hmax(m);
    if (!amax) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The reference keeps the first element of largest magnitude; only its sign matters.
    float max = amax;
    for (int j = 0; j < QK_K; ++j)
      if (std::fabs(x[j]) == amax) { max = x[j]; break; }
    const float iscale = -127.f / max;
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i lim = _mm256_set1_epi32(127);
    for (int k = 0; k < QK_K; k += 32) {
      __m256i q[4];
      // cvtps rounds to nearest-even like nearest_int(); the min mirrors the reference clamp.
      for (int t = 0; t < 4; ++t)
        q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * t), mul)), lim);
      const __m256i packed = pack32(q[0], q[1], q[2], q[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs + k), packed);
      // bsums of the two 16-groups: widen to int16 and pair-sum.
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(packed));
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(packed, 1));
      y[b].bsums[k / 16] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(w0, _mm256_set1_epi16(1))));
      y[b].bsums[k / 16 + 1] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(w1, _mm256_set1_epi16(1))));
    }
    y[b].d = 1 / iscale;
  }
}

// F16C conversion with round-to-nearest-even: same bits as fp32_to_fp16 for every non-NaN.
void from_float_f16(const float *x, void *vy, int64_t n) {
  uint16_t *y = static_cast<uint16_t *>(vy);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// fp32_to_bf16 on 8 lanes: round to nearest even on the upper 16 bits, NaN kept quiet.
void from_float_bf16(const float *x, void *vy, int64_t n) {
  uint16_t *y = static_cast<uint16_t *>(vy);
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one))), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // 8 x u32 (values < 65536) -> 8 x u16
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i), packed);
  }
  for (; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

}  // namespace

VecDotFn vec_dot_kernel_avx2(DType t) {
  switch (t) {
    case DType::F32: return dot_f32;
    case DType::F16: return dot_half<false>;
    case DType::BF16: return dot_half<true>;
    case DType::Q4_0: return dot_q4_0;
    case DType::Q8_0: return dot_q8_0;
    case DType::MXFP4: return dot_mxfp4;
    case DType::Q2_K: return dot_q2_K;
    case DType::Q3_K: return dot_q3_K;
    case DType::Q4_K: return dot_q45_K<false>;
    case DType::Q5_K: return dot_q45_K<true>;
    case DType::Q6_K: return dot_q6_K;
    default: return vec_dot_extra_kernel_avx2(t);
  }
}

VecDot4Fn vec_dot4_kernel_avx2(DType t) {
  switch (t) {
    case DType::Q8_0: return dot4_b32<0>;
    case DType::Q4_0: return dot4_b32<1>;
    case DType::MXFP4: return dot4_b32<2>;
    default: return nullptr;
  }
}

FromFloatFn from_float_kernel_avx2(DType act) {
  switch (act) {
    case DType::F16: return from_float_f16;
    case DType::BF16: return from_float_bf16;
    case DType::Q8_0: return from_float_q8_0;
    case DType::Q8_K: return from_float_q8_K;
    default: return nullptr;
  }
}

}  // namespace moe

#else  // not built for AVX2: the dispatcher falls back to scalar

namespace moe {
VecDotFn vec_dot_kernel_avx2(DType) { return nullptr; }
VecDot4Fn vec_dot4_kernel_avx2(DType) { return nullptr; }
FromFloatFn from_float_kernel_avx2(DType) { return nullptr; }
}  // namespace moe

#endif
