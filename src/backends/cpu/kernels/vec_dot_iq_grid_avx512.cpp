// AVX-512 (F/BW/VL/DQ + VNNI, BMI2) kernels for the 1-, 2- and 3-bit i-quants against Q8_K.
// Unlike the scalar/AVX2/NEON kernels, which decode a super-block to int8 first
// (quant/iq_decode.h), these decode in registers, 64 values at a time:
//   grid entries   one gather of 8 (8-byte entries) or 16 (4-byte entries) table rows;
//   signs          a 64-bit mask, one bit per value, that negates the activations
//                  (IQ2_S/IQ3_S store it as is; the ksigns types store 7 bits per 8 values
//                  and the 8th is their parity, rebuilt with pdep and a SWAR parity);
//   IQ1 values     8 * grid + delta, biased by 9 to be unsigned; 9 * sum(y) comes off
//                  through the Q8_K sums of 16 (bsums);
//   scales         per 16 values, applied with maddubs + madd as in the K-quant kernels.
// The integer sum of each super-block is exact and the float steps are iq_dot's, so the
// results are bit-identical to the other ISAs (tests/unit/test_quant_new_types.cpp).
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__F16C__) && defined(__BMI2__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/iq_decode.h"
#include "quant/iq_grids.h"

namespace moe {

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m128i load128(const void *p) { return _mm_loadu_si128(static_cast<const __m128i *>(p)); }
inline __m128i load64(const void *p) { return _mm_loadl_epi64(static_cast<const __m128i *>(p)); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

template <class T>
inline T load_as(const void *p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 16 int16 scales (one per 16 values) -> the 32 int16 madd weights of 64-value run k:
// lane l multiplies the pair of values 2l, 2l+1, which lie in group 4k + l/8.
inline __m512i run_scales(__m256i ls16, int k) {
  alignas(64) static const int16_t idx[4][32] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
      {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
      {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
       14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx[k]), _mm512_zextsi256_si512(ls16));
}

// 64 magnitudes u (< 128) against 64 activations, negated where `neg` has a bit, weighted
// by the run's scales: 16 int32 partial sums.
inline __m512i run_dot(__m512i u, __mmask64 neg, const int8_t *q8, __m512i scales) {
  const __m512i y = _mm512_loadu_si512(q8);
  const __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, sy), scales);
}

// 2s + 1 for 16 int16 s.
inline __m256i odd_scales(__m256i s) { return _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)); }

// 8 scales (one per 32 values) as int16 -> 16 (one per 16 values).
inline __m256i twice_each(__m128i s8) { return _mm256_set_m128i(_mm_unpackhi_epi16(s8, s8), _mm_unpacklo_epi16(s8, s8)); }

// Byte g of s: nibble g of the 32-bit word -> 16 int16, each nibble twice.
inline __m256i nibbles_twice(uint32_t w) {
  const __m128i b = _mm_cvtsi64_si128(static_cast<long long>(_pdep_u64(w, 0x0F0F0F0F0F0F0F0FULL)));
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}

// IQ2_XS/IQ2_S: scales[ib] holds the scales of values 32ib..+15 (low nibble), +16..+31 (high).
inline __m256i nibble_pairs(const uint8_t *scales) {
  const __m128i v = load64(scales);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4)));
}

// Byte j of s7 holds 7 sign bits of values 8j..8j+6; value 8j+7's sign is their parity.
inline __mmask64 signs_with_parity(uint64_t s7) {
  uint64_t p = s7 ^ (s7 >> 4);
  p ^= p >> 2;
  p ^= p >> 1;
  return s7 | ((p & 0x0101010101010101ULL) << 7);
}

// Four 7-bit sign fields in each of two words (bits 0..27) -> 8 bytes of 7 bits.
inline uint64_t sign_fields(uint32_t w0, uint32_t w1) {
  return _pdep_u64((w0 & 0x0FFFFFFFu) | (static_cast<uint64_t>(w1 & 0x0FFFFFFFu) << 28), 0x7F7F7F7F7F7F7F7FULL);
}

inline __m512i gather8(__m256i idx, const uint64_t *grid) { return _mm512_i32gather_epi64(idx, grid, 8); }
inline __m512i gather16(__m512i idx, const uint32_t *grid) { return _mm512_i32gather_epi32(idx, grid, 4); }

// ---- per super-block: exact isum = sum_g16 ls[g16] * sum_{j in g16} q[j] * y[j] ----

int sb_iq2_xxs(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2;  // per 32 values: 4 grid indices, then 4x7 sign bits + 4-bit scale
  const __m128i s8 = _mm512_cvtepi64_epi16(_mm512_srli_epi64(_mm512_loadu_si512(qs), 60));
  const __m256i ls = odd_scales(twice_each(s8));
  const __m128i pick = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const uint8_t *p = qs + 16 * k;
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(load128(p), pick));
    const __mmask64 neg = signs_with_parity(sign_fields(load_as<uint32_t>(p + 4), load_as<uint32_t>(p + 12)));
    acc = _mm512_add_epi32(acc, run_dot(gather8(idx, kIq2xxsGrid), neg, y.qs + 64 * k, run_scales(ls, k)));
  }
  return _mm512_reduce_add_epi32(acc);
}

int sb_iq2_xs(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2;  // uint16 per 8 values: 9-bit grid index, 7 sign bits
  const __m256i ls = odd_scales(nibble_pairs(blk + 66));
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const __m128i v = load128(qs + 16 * k);
    const __m256i idx = _mm256_and_si256(_mm256_cvtepu16_epi32(v), _mm256_set1_epi32(511));
    const __m128i s7 = _mm_packus_epi16(_mm_srli_epi16(v, 9), _mm_setzero_si128());
    const __mmask64 neg = signs_with_parity(static_cast<uint64_t>(_mm_cvtsi128_si64(s7)));
    acc = _mm512_add_epi32(acc, run_dot(gather8(idx, kIq2xsGrid), neg, y.qs + 64 * k, run_scales(ls, k)));
  }
  return _mm512_reduce_add_epi32(acc);
}

int sb_iq2_s(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2, *signs = blk + 34, *qh = blk + 66;
  const __m256i ls = odd_scales(nibble_pairs(blk + 74));
  // index bits 8-9 of entry l of 32-value group ib: bits 2l, 2l+1 of qh[ib]
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22);
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const uint32_t h = qh[2 * k] | (static_cast<uint32_t>(qh[2 * k + 1]) << 16);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(h)), shift), _mm256_set1_epi32(3));
    const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(load64(qs + 8 * k)), _mm256_slli_epi32(hi, 8));
    const __mmask64 neg = load_as<uint64_t>(signs + 8 * k);
    acc = _mm512_add_epi32(acc, run_dot(gather8(idx, kIq2sGrid), neg, y.qs + 64 * k, run_scales(ls, k)));
  }
  return _mm512_reduce_add_epi32(acc);
}

int sb_iq3_xxs(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2, *aux = blk + 66;  // aux: per 32 values 4x7 sign bits + 4-bit scale
  const __m128i s8 = _mm256_cvtepi32_epi16(_mm256_srli_epi32(load256(aux), 28));
  const __m256i ls = odd_scales(twice_each(s8));
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const __m512i idx = _mm512_cvtepu8_epi32(load128(qs + 16 * k));
    const __mmask64 neg =
        signs_with_parity(sign_fields(load_as<uint32_t>(aux + 8 * k), load_as<uint32_t>(aux + 8 * k + 4)));
    acc = _mm512_add_epi32(acc, run_dot(gather16(idx, kIq3xxsGrid), neg, y.qs + 64 * k, run_scales(ls, k)));
  }
  return _mm512_reduce_add_epi32(acc);
}

int sb_iq3_s(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74;
  const __m256i ls = odd_scales(nibbles_twice(load_as<uint32_t>(blk + 106)));
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    // entry e (4 values) of the run takes bit 8 of its index from bit e of qh[2k] | qh[2k+1] << 8
    const __mmask16 bit8 = static_cast<__mmask16>(load_as<uint16_t>(qh + 2 * k));
    __m512i idx = _mm512_cvtepu8_epi32(load128(qs + 16 * k));
    idx = _mm512_mask_or_epi32(idx, bit8, idx, _mm512_set1_epi32(256));
    const __mmask64 neg = load_as<uint64_t>(signs + 8 * k);
    acc = _mm512_add_epi32(acc, run_dot(gather16(idx, kIq3sGrid), neg, y.qs + 64 * k, run_scales(ls, k)));
  }
  return _mm512_reduce_add_epi32(acc);
}

// IQ1 runs: u = 8 * (grid + 1) + (delta + 1) = value + 9, with grid bytes in {-1, 0, 1} and
// delta = -1 for the qwords (8 values) whose bit in neg_delta is set, else +1.
inline __m512i iq1_biased(__m256i idx, __mmask8 neg_delta) {
  const __m512i g = gather8(idx, kIq1sGrid);
  const __m512i eight_g1 = _mm512_slli_epi16(_mm512_add_epi8(g, _mm512_set1_epi8(1)), 3);  // bytes <= 16: no carry
  return _mm512_or_si512(eight_g1, _mm512_maskz_mov_epi64(static_cast<__mmask8>(~neg_delta), _mm512_set1_epi8(2)));
}

// sum_g16 ls[g16] * (sum of values - 9 * sum of activations) for the IQ1 types.
inline int iq1_unbias(__m512i acc, __m256i ls, const BlockQ8_K &y) {
  return _mm512_reduce_add_epi32(acc) - 9 * hsum_i32(_mm256_madd_epi16(load256(y.bsums), ls));
}

int sb_iq1_s(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk + 2, *qh = blk + 34;  // qh: per 32 values 4x3 index bits, 3-bit scale, delta sign
  const __m128i h8 = load128(qh);
  const __m256i ls = odd_scales(twice_each(_mm_and_si128(_mm_srli_epi16(h8, 12), _mm_set1_epi16(7))));
  const __m256i shift = _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25);
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const uint32_t h = load_as<uint32_t>(qh + 4 * k);  // qh[2k] | qh[2k+1] << 16
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(h)), shift), _mm256_set1_epi32(7));
    const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(load64(qs + 8 * k)), _mm256_slli_epi32(hi, 8));
    const __mmask8 neg_delta = static_cast<__mmask8>(((h >> 15) & 1 ? 0x0F : 0) | ((h >> 31) & 1 ? 0xF0 : 0));
    acc = _mm512_add_epi32(acc, run_dot(iq1_biased(idx, neg_delta), 0, y.qs + 64 * k, run_scales(ls, k)));
  }
  return iq1_unbias(acc, ls, y);
}

inline uint16_t iq1_m_half(const uint8_t *blk) {
  uint16_t sc[4];
  std::memcpy(sc, blk + 48, 8);
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

int sb_iq1_m(const uint8_t *blk, const BlockQ8_K &y) {
  const uint8_t *qs = blk, *qh = blk + 32;  // qh: a nibble per 8 values, 3 index bits + delta sign
  // 16 3-bit scales at bits 0, 3, 6, 9 of each 16-bit word (bits 12-15 hold the f16 scale)
  const uint64_t fields = _pext_u64(load_as<uint64_t>(blk + 48), 0x0FFF0FFF0FFF0FFFULL);
  const __m128i s16 = _mm_set_epi64x(static_cast<long long>(_pdep_u64(fields >> 24, 0x0707070707070707ULL)),
                                     static_cast<long long>(_pdep_u64(fields, 0x0707070707070707ULL)));
  const __m256i ls = odd_scales(_mm256_cvtepu8_epi16(s16));
  const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const uint32_t h = load_as<uint32_t>(qh + 4 * k);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(h)), shift), _mm256_set1_epi32(7));
    const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(load64(qs + 8 * k)), _mm256_slli_epi32(hi, 8));
    const __mmask8 neg_delta = static_cast<__mmask8>(_pext_u32(h, 0x88888888u));
    acc = _mm512_add_epi32(acc, run_dot(iq1_biased(idx, neg_delta), 0, y.qs + 64 * k, run_scales(ls, k)));
  }
  return iq1_unbias(acc, ls, y);
}

// iq_dot's float frame over the super-blocks (same steps, same bits).
template <DType T>
void dot_grid(int n, float *s, const void *w, const void *x) {
  const BlockQ8_K *y = static_cast<const BlockQ8_K *>(x);
  const uint8_t *blk = static_cast<const uint8_t *>(w);
  const size_t bytes = type_traits(T).type_size;
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i, blk += bytes) {
    int isum;
    uint16_t d;
    switch (T) {
      case DType::IQ2_XXS: isum = sb_iq2_xxs(blk, y[i]); break;
      case DType::IQ2_XS: isum = sb_iq2_xs(blk, y[i]); break;
      case DType::IQ2_S: isum = sb_iq2_s(blk, y[i]); break;
      case DType::IQ3_XXS: isum = sb_iq3_xxs(blk, y[i]); break;
      case DType::IQ3_S: isum = sb_iq3_s(blk, y[i]); break;
      case DType::IQ1_S: isum = sb_iq1_s(blk, y[i]); break;
      default: isum = sb_iq1_m(blk, y[i]); break;
    }
    if (T == DType::IQ1_M) d = iq1_m_half(blk);
    else std::memcpy(&d, blk, 2);
    sum += iq_block_term(h2f(d), y[i].d, isum);
  }
  // the constant relating the integer scales to the value scales (IqDecoded::k)
  const float k = T == DType::IQ3_S ? 1.0f : T == DType::IQ3_XXS ? 0.25f : 0.125f;
  *s = k * sum;
}

}  // namespace

VecDotFn vec_dot_iq_grid_kernel_avx512(DType t) {
  switch (t) {
    case DType::IQ2_XXS: return dot_grid<DType::IQ2_XXS>;
    case DType::IQ2_XS: return dot_grid<DType::IQ2_XS>;
    case DType::IQ2_S: return dot_grid<DType::IQ2_S>;
    case DType::IQ3_XXS: return dot_grid<DType::IQ3_XXS>;
    case DType::IQ3_S: return dot_grid<DType::IQ3_S>;
    case DType::IQ1_S: return dot_grid<DType::IQ1_S>;
    case DType::IQ1_M: return dot_grid<DType::IQ1_M>;
    default: return nullptr;
  }
}

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_iq_grid_kernel_avx512(DType) { return nullptr; }
}  // namespace moe

#endif
