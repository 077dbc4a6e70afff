// AVX-512 (F/BW/VL/DQ + VNNI) kernels for Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS; the 1-3 bit
// i-quants are in vec_dot_iq_grid_avx512.cpp. Used only where cpuid reports all of these (a
// CPU with AVX-512 but no VNNI gets the AVX2 table, see vec_dot.cpp). Activation formats as
// in vec_dot_extra_scalar.cpp.
//
// 32-value blocks: one block per 256-bit dpbusd (unsigned codes x int8 activations, exact
// int32 lanes); signed codes are biased to unsigned and the bias removed as bias * sum(y),
// which dpbusd also computes, so no sign fix-ups. Two float accumulators (even and odd
// blocks) hide the FMA latency, like the AVX-512 Q4_0 kernel. IQ4_XS: 128 values per two
// 512-bit dpbusd, group scales applied to the exact int32 sums once per super-block.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__) && defined(__BMI2__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/quant_util.h"

namespace moe {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }

inline uint32_t load_u32(const void *p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two f16 at p -> lanes 0 and 1 (lanes 2, 3 zero).
inline __m128 two_halves(const void *p) { return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(p)))); }

inline float hsum256(__m256 v) {
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

// 16 bytes of packed codes -> 32 bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i nibbles32(const uint8_t *q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

inline __m256i dpbusd(__m256i u, __m256i y) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y); }

// kIq4nlValues + 128 as unsigned bytes: the code table that dpbusd can take.
inline __m128i iq4_biased_table() {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues));
  return _mm_xor_si128(t, _mm_set1_epi8(static_cast<char>(0x80)));
}

// sum over nb blocks of dot(i, acc): even blocks into one accumulator, odd into another.
template <class BlockFma>
inline float two_accumulators(int nb, BlockFma fma) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    acc0 = fma(i, acc0);
    acc1 = fma(i + 1, acc1);
  }
  if (i < nb) acc0 = fma(i, acc0);
  return hsum256(_mm256_add_ps(acc0, acc1));
}

// Q4_1 / Q5_1 against Q8_1: d_w*d_x*isum in vector lanes, m_w*s_x summed in lane 1 of `mins`.
template <bool kFive>
void dot_with_min(int n, float *s, const void *w, const void *x) {
  const uint8_t *base = static_cast<const uint8_t *>(w);
  const size_t bytes = kFive ? sizeof(BlockQ5_1) : sizeof(BlockQ4_1);
  const BlockQ8_1 *b = static_cast<const BlockQ8_1 *>(x);
  __m128 mins = _mm_setzero_ps();
  const float dots = two_accumulators(n / 32, [&](int i, __m256 acc) {
    const uint8_t *blk = base + static_cast<size_t>(i) * bytes;
    const __m128 dm = _mm_mul_ps(two_halves(blk), two_halves(&b[i]));  // [d_w*d_x, m_w*s_x]
    mins = _mm_add_ps(mins, dm);
    __m256i q = nibbles32(blk + (kFive ? 8 : 4));
    if (kFive) q = _mm256_mask_add_epi8(q, load_u32(blk + 4), q, _mm256_set1_epi8(16));  // fifth bits
    const __m256i p = dpbusd(q, load256(b[i].qs));
    return _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(p), acc);
  });
  *s = dots + _mm_cvtss_f32(_mm_movehdup_ps(mins));
}

// Product of the two f16 block scales at a and b (lane 0 only: the other lanes hold bytes
// that are not scales, and must not go through the multiplier).
inline __m256 scale_product(const void *a, const void *b) {
  return _mm256_broadcastss_ps(_mm_mul_ss(two_halves(a), two_halves(b)));
}

// Q5_0: codes 0..31 (value + 16) against Q8_0; 16 * sum(y) removed per lane.
void dot_q5_0(int n, float *s, const void *w, const void *x) {
  const BlockQ5_0 *a = static_cast<const BlockQ5_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m256i sixteen = _mm256_set1_epi8(16);
  *s = two_accumulators(n / QK5_0, [&](int i, __m256 acc) {
    const __m256i y = load256(b[i].qs);
    __m256i q = nibbles32(a[i].qs);
    q = _mm256_mask_add_epi8(q, load_u32(a[i].qh), q, sixteen);
    const __m256i p = _mm256_sub_epi32(dpbusd(q, y), dpbusd(sixteen, y));
    return _mm256_fmadd_ps(scale_product(&a[i].d, &b[i].d), _mm256_cvtepi32_ps(p), acc);
  });
}

// IQ4_NL: table values + 128 against Q8_0; 128 * sum(y) removed per lane.
void dot_iq4_nl(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_NL *a = static_cast<const BlockIQ4_NL *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const __m128i t = iq4_biased_table();
  const __m256i table = _mm256_set_m128i(t, t), bias = _mm256_set1_epi8(static_cast<char>(0x80));
  *s = two_accumulators(n / QK4_NL, [&](int i, __m256 acc) {
    const __m256i y = load256(b[i].qs);
    const __m256i u = _mm256_shuffle_epi8(table, nibbles32(a[i].qs));
    const __m256i p = _mm256_sub_epi32(dpbusd(u, y), dpbusd(bias, y));
    return _mm256_fmadd_ps(scale_product(&a[i].d, &b[i].d), _mm256_cvtepi32_ps(p), acc);
  });
}

// IQ4_XS: per half super-block (4 groups of 32), the 64 qs bytes give the 4 groups' low
// nibbles (values 0..15 of each group) and high nibbles (16..31); the activations are
// regrouped to match with one 128-bit-lane shuffle each. After dpbusd, int32 lanes 4c..4c+3
// belong to group 4h + c. The +128 bias comes off through the Q8_K group sums (bsums).
void dot_iq4_xs(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_XS *a = static_cast<const BlockIQ4_XS *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m512i table = _mm512_broadcast_i32x4(iq4_biased_table());
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i group_of_lane[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                    _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    // byte g = 6-bit scale of group g (still +32): 4 low bits from scales_l, 2 from scales_h
    const uint64_t sc8 = _pdep_u64(load_u32(a[i].scales_l), 0x0F0F0F0F0F0F0F0FULL) |
                         _pdep_u64(a[i].scales_h, 0x3030303030303030ULL);
    const __m256i ls = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(sc8))),
                                        _mm256_set1_epi32(32));
    __m512i tot = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i z = load512(a[i].qs + 64 * h);
      const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(z, m4));
      const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
      const __m512i y0 = load512(b[i].qs + 128 * h), y1 = load512(b[i].qs + 128 * h + 64);
      const __m512i ylo = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
      const __m512i yhi = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
      const __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ylo), hi, yhi);
      const __m512i scale = _mm512_permutexvar_epi32(group_of_lane[h], _mm512_zextsi256_si512(ls));
      tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(t, scale));
    }
    // 128 * sum_g ls_g * (sum of the activations of group g)
    const __m256i ysum = _mm256_madd_epi16(load256(b[i].bsums), _mm256_set1_epi16(1));
    const int isum = _mm512_reduce_add_epi32(tot) - 128 * hsum_i32(_mm256_mullo_epi32(ysum, ls));
    sum += h2f(a[i].d) * b[i].d * static_cast<float>(isum);
  }
  *s = sum;
}

}  // namespace

VecDotFn vec_dot_extra_kernel_avx512(DType t) {
  switch (t) {
    case DType::Q4_1: return dot_with_min<false>;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q5_1: return dot_with_min<true>;
    case DType::IQ4_NL: return dot_iq4_nl;
    case DType::IQ4_XS: return dot_iq4_xs;
    default: return vec_dot_iq_grid_kernel_avx512(t);
  }
}

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_extra_kernel_avx512(DType) { return nullptr; }
}  // namespace moe

#endif
