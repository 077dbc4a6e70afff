// AVX2 kernels for Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (activation formats as in
// vec_dot_extra_scalar.cpp). Integer parts are exact (maddubs with an unsigned operand
// below 128, or the sign trick for signed codes); per-block scaling is float FMA.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <cstring>

#include "quant/iq_decode.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

inline __m256i loadu(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

inline float reduce_add(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

inline int reduce_add_i32(__m256i v) {
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 1));
  return _mm_cvtsi128_si32(q);
}

// 16 bytes of packed codes -> 32 bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i nibbles_in_order(const uint8_t *q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// The fifth bits of a Q5 block as bytes: 0x10 where bit j of qh is set, else 0.
inline __m256i fifth_bits(const uint8_t *qh) {
  uint32_t w;
  std::memcpy(&w, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(w)),
      _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// 32 unsigned codes (< 128) x 32 int8 -> 8 int32 partial sums.
inline __m256i udot(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 signed codes (> -128) x 32 int8: move the sign onto the activations.
inline __m256i sdot(__m256i a, __m256i s) { return udot(_mm256_sign_epi8(a, a), _mm256_sign_epi8(s, a)); }

// Q4_1 / Q5_1 against Q8_1: sum of d_w*d_x*isum in vector lanes, m_w*s_x on the side.
template <bool kFive>
void dot_with_min(int n, float *s, const void *w, const void *x) {
  const uint8_t *blk = static_cast<const uint8_t *>(w);
  const size_t bytes = kFive ? sizeof(BlockQ5_1) : sizeof(BlockQ4_1);
  const BlockQ8_1 *b = static_cast<const BlockQ8_1 *>(x);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int i = 0; i < n / 32; ++i, blk += bytes) {
    uint16_t d, m;
    std::memcpy(&d, blk, 2);
    std::memcpy(&m, blk + 2, 2);
    __m256i q = nibbles_in_order(blk + (kFive ? 8 : 4));
    if (kFive) q = _mm256_or_si256(q, fifth_bits(blk + 4));
    const __m256i p = udot(q, loadu(b[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(d) * half_to_float(b[i].d)), _mm256_cvtepi32_ps(p), acc);
    mins += half_to_float(m) * half_to_float(b[i].s);
  }
  *s = reduce_add(acc) + mins;
}

void dot_q5_0(int n, float *s, const void *w, const void *x) {
  const BlockQ5_0 *a = static_cast<const BlockQ5_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK5_0; ++i) {
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles_in_order(a[i].qs), fifth_bits(a[i].qh)), sixteen);
    const __m256i p = sdot(q, loadu(b[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(a[i].d) * half_to_float(b[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  *s = reduce_add(acc);
}

inline __m256i iq4_table() {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues));
  return _mm256_set_m128i(t, t);
}

void dot_iq4_nl(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_NL *a = static_cast<const BlockIQ4_NL *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m256i table = iq4_table();
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / QK4_NL; ++i) {
    const __m256i q = _mm256_shuffle_epi8(table, nibbles_in_order(a[i].qs));
    const __m256i p = sdot(q, loadu(b[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d) * half_to_float(a[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  *s = reduce_add(acc);
}

// IQ4_XS: the 6-bit group scales are applied in integers (|sum| < 2^31 for a super-block),
// so only one float multiply per 256 values.
void dot_iq4_xs(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_XS *a = static_cast<const BlockIQ4_XS *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i table = iq4_table();
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    __m256i isum = _mm256_setzero_si256();
    for (int g = 0; g < QK_K / 32; ++g) {
      const __m256i q = _mm256_shuffle_epi8(table, nibbles_in_order(a[i].qs + 16 * g));
      const __m256i p = sdot(q, loadu(b[i].qs + 32 * g));
      const int ls = iq4xs_scale(a[i].scales_l, a[i].scales_h, g) - 32;
      isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, _mm256_set1_epi32(ls)));
    }
    sum += half_to_float(a[i].d) * b[i].d * static_cast<float>(reduce_add_i32(isum));
  }
  *s = sum;
}

// 1-, 2-, 3-bit i-quants: scalar table decode per super-block (quant/iq_decode.h), then
// the int8 products in vector lanes; lanes 0-3 of a 32-byte product hold the first 16
// values, lanes 4-7 the second 16, so each half gets its own integer scale.
template <DType T>
void dot_iq_grid(int n, float *s, const void *w, const void *x) {
  *s = iq_dot(T, n, w, static_cast<const BlockQ8_K *>(x), [](const IqDecoded &o, const int8_t *q8) {
    __m256i isum = _mm256_setzero_si256();
    for (int g = 0; g < QK_K / 32; ++g) {
      const __m256i p = sdot(loadu(o.q + 32 * g), loadu(q8 + 32 * g));
      const int a = o.ls[2 * g], b = o.ls[2 * g + 1];
      isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, _mm256_setr_epi32(a, a, a, a, b, b, b, b)));
    }
    return reduce_add_i32(isum);
  });
}

}  // namespace

VecDotFn vec_dot_extra_kernel_avx2(DType t) {
  switch (t) {
    case DType::Q4_1: return dot_with_min<false>;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q5_1: return dot_with_min<true>;
    case DType::IQ4_NL: return dot_iq4_nl;
    case DType::IQ4_XS: return dot_iq4_xs;
    case DType::IQ2_XXS: return dot_iq_grid<DType::IQ2_XXS>;
    case DType::IQ2_XS: return dot_iq_grid<DType::IQ2_XS>;
    case DType::IQ2_S: return dot_iq_grid<DType::IQ2_S>;
    case DType::IQ3_XXS: return dot_iq_grid<DType::IQ3_XXS>;
    case DType::IQ3_S: return dot_iq_grid<DType::IQ3_S>;
    case DType::IQ1_S: return dot_iq_grid<DType::IQ1_S>;
    case DType::IQ1_M: return dot_iq_grid<DType::IQ1_M>;
    default: return nullptr;
  }
}

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_extra_kernel_avx2(DType) { return nullptr; }
}  // namespace moe

#endif
