// AVX-512 (F/BW/VL/DQ + VNNI) kernels. Only selected when cpuid reports all of these.
// Only the kernels that measured faster than their AVX2 versions live here (F32/F16/BF16,
// Q4_0, MXFP4, Q2_K, Q3_K); for Q8_0/Q4_K/Q5_K/Q6_K the dispatcher uses the AVX2 ones (see
// docs/perf/quant_kernels.md). Q4_0/MXFP4: one block per 256-bit VNNI dpbusd (unsigned x
// signed bytes -> int32). Q2_K/Q3_K: 64 values per 512-bit vector, maddubs + madd with
// per-16 scales broadcast by permutexvar, one float FMA per block. Q4_1, Q5_0, Q5_1 and the
// i-quants: vec_dot_extra_avx512.cpp and vec_dot_iq_grid_avx512.cpp.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "core/fp16.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

// F16C conversion: exact, like fp16_to_fp32, but one instruction.
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline __m512i cat256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1); }

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// ---- plain float types ----

template <int kKind>  // 0 f32, 1 f16, 2 bf16
inline __m512 load16(const void *p) {
  if (kKind == 0) return _mm512_loadu_ps(p);
  const __m256i h = load256(p);
  if (kKind == 1) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int kKind>
inline float scalar_at(const void *p, int i) {
  if (kKind == 0) return static_cast<const float *>(p)[i];
  const uint16_t h = static_cast<const uint16_t *>(p)[i];
  return kKind == 1 ? h2f(h) : bf16_to_fp32(h);
}

template <int kKind>
void dot_float(int n, float *s, const void *w, const void *x) {
  const size_t es = kKind == 0 ? 4 : 2;
  const uint8_t *a = static_cast<const uint8_t *>(w), *b = static_cast<const uint8_t *>(x);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(load16<kKind>(a + es * i), load16<kKind>(b + es * i), acc0);
    acc1 = _mm512_fmadd_ps(load16<kKind>(a + es * (i + 16)), load16<kKind>(b + es * (i + 16)), acc1);
    acc2 = _mm512_fmadd_ps(load16<kKind>(a + es * (i + 32)), load16<kKind>(b + es * (i + 32)), acc2);
    acc3 = _mm512_fmadd_ps(load16<kKind>(a + es * (i + 48)), load16<kKind>(b + es * (i + 48)), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load16<kKind>(a + es * i), load16<kKind>(b + es * i), acc0);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += scalar_at<kKind>(w, i) * scalar_at<kKind>(x, i);
  *s = sum;
}

// ---- 32-value blocks against Q8_0 ----


inline __m256i nibbles32(const uint8_t *q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// 256-bit VNNI per block: the 512-bit two-block variant needed three lane inserts per
// vector and measured slower than this on the dev machine (see docs/perf/quant_kernels.md).
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// (q - 8) . y = q . y - 8 . y with q unsigned: two dpbusd, no sign fix-ups.
template <bool kMx>
inline __m256i block32_dot(const uint8_t *qs, const int8_t *ys) {
  const __m256i code = nibbles32(qs);
  const __m256i y = load256(ys);
  if (kMx) {
    const __m256i abs_table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12,
                                               0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
    const __m256i u = _mm256_shuffle_epi8(abs_table, code);
    const __m256i sy = _mm256_mask_sub_epi8(y, _mm256_test_epi8_mask(code, _mm256_set1_epi8(8)), _mm256_setzero_si256(), y);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, sy);
  }
  return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), code, y),
                          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), y));
}

void dot_q4_0(int n, float *s, const void *w, const void *x) {
  const BlockQ4_0 *a = static_cast<const BlockQ4_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  const int nb = n / QK4_0;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d)),
                           _mm256_cvtepi32_ps(block32_dot<false>(a[i].qs, b[i].qs)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a[i + 1].d) * h2f(b[i + 1].d)),
                           _mm256_cvtepi32_ps(block32_dot<false>(a[i + 1].qs, b[i + 1].qs)), acc1);
  }
  for (; i < nb; ++i)
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a[i].d) * h2f(b[i].d)),
                           _mm256_cvtepi32_ps(block32_dot<false>(a[i].qs, b[i].qs)), acc0);
  *s = hsum256(_mm256_add_ps(acc0, acc1));
}

void dot_mxfp4(int n, float *s, const void *w, const void *x) {
  const BlockMXFP4 *a = static_cast<const BlockMXFP4 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  const int nb = n / QK_MXFP4;
  int i = 0;
  for (; i + 2 <= nb; i += 2) {
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d) * kE8m0Half.v[a[i].e]),
                           _mm256_cvtepi32_ps(block32_dot<true>(a[i].qs, b[i].qs)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i + 1].d) * kE8m0Half.v[a[i + 1].e]),
                           _mm256_cvtepi32_ps(block32_dot<true>(a[i + 1].qs, b[i + 1].qs)), acc1);
  }
  for (; i < nb; ++i)
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d) * kE8m0Half.v[a[i].e]),
                           _mm256_cvtepi32_ps(block32_dot<true>(a[i].qs, b[i].qs)), acc0);
  *s = hsum256(_mm256_add_ps(acc0, acc1));
}

// 4 rows at once, same per-row accumulation order as the single-row kernels above (even
// blocks into acc0, odd into acc1): the activation block, its scale and for Q4_0 the 8*sum(y)
// term are computed once per block instead of once per row.
template <int kKind>  // 1 q4_0, 2 mxfp4
void dot4_b32(int n, float *s, const void *w, size_t stride, const void *x) {
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const uint8_t *base = static_cast<const uint8_t *>(w);
  const size_t bsz = kKind == 1 ? sizeof(BlockQ4_0) : sizeof(BlockMXFP4);
  const __m256i abs_table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12,
                                             0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc[4][2];
  for (auto &r : acc) r[0] = r[1] = _mm256_setzero_ps();
  const int nb = n / QK8_0;
  for (int i = 0; i < nb; ++i) {
    const __m256i y = load256(b[i].qs);
    const float dy = h2f(b[i].d);
    __m256i y8 = _mm256_setzero_si256();
    if (kKind == 1) y8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, y);
    // single-row kernels pair blocks (i, i+1) into acc0/acc1 and put an odd tail into acc0
    const int slot = (i % 2 == 1) ? 1 : 0;
    for (int r = 0; r < 4; ++r) {
      const uint8_t *blk = base + r * stride + static_cast<size_t>(i) * bsz;
      __m256i p;
      float d;
      if (kKind == 1) {
        p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(blk + 2), y), y8);
        uint16_t h;
        std::memcpy(&h, blk, 2);
        d = h2f(h) * dy;
      } else {
        const __m256i code = nibbles32(blk + 1);
        const __m256i sy = _mm256_mask_sub_epi8(y, _mm256_test_epi8_mask(code, eight), _mm256_setzero_si256(), y);
        p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_shuffle_epi8(abs_table, code), sy);
        d = dy * kE8m0Half.v[blk[0]];
      }
      acc[r][slot] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc[r][slot]);
    }
  }
  for (int r = 0; r < 4; ++r) s[r] = hsum256(_mm256_add_ps(acc[r][0], acc[r][1]));
}

// ---- K-quants against Q8_K ----
// Each block becomes 4 runs of 64 unsigned codes u_k (aligned with q8[64k..64k+63]) and 16
// per-16-value scales gs. isum = sum_k madd(maddubs(u_k, y_k), expand(gs, k)).

// Lane i of run k uses group 4k + i/8 (maddubs pairs: 8 int16 lanes per 16 values).
inline __m512i expand_scales(__m512i gs16, int k) {
  alignas(64) static const int16_t idx[4][32] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
      {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
      {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
       14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx[k]), gs16);
}

inline __m512i run_dot(__m512i u, const int8_t *q8, __m512i scales) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, load512(q8)), scales);
}

// sum_g bsums[g] * m[g] for 16 int16 m.
inline int bsums_dot(const int16_t *bsums, __m256i m16) {
  return hsum_i32(_mm256_madd_epi16(load256(bsums), m16));
}

inline __m256i srl_and(__m256i v, int sh, __m256i mask) { return _mm256_and_si256(_mm256_srli_epi16(v, sh), mask); }

void dot_q2_K(int n, float *s, const void *w, const void *x) {
  const BlockQ2_K *a = static_cast<const BlockQ2_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m512 acc = _mm512_setzero_ps();
  float sum_min = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(a[i].scales));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0xF)));
    const __m512i gs = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm_set1_epi8(0xF))));
    __m512i isum = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m256i q2 = load256(a[i].qs + 32 * (k / 2));
      const int sh = 4 * (k % 2);
      const __m512i u = cat256(srl_and(q2, sh, m3), srl_and(q2, sh + 2, m3));
      isum = _mm512_add_epi32(isum, run_dot(u, b[i].qs + 64 * k, expand_scales(gs, k)));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(b[i].d * h2f(a[i].d)), _mm512_cvtepi32_ps(isum), acc);
    sum_min += (b[i].d * h2f(a[i].dmin)) * bsums_dot(b[i].bsums, mins);
  }
  *s = _mm512_reduce_add_ps(acc) - sum_min;
}

void dot_q3_K(int n, float *s, const void *w, const void *x) {
  const BlockQ3_K *a = static_cast<const BlockQ3_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i < n / QK_K; ++i) {
    int8_t sc[16];
    unpack_q3k_scales(a[i].scales, sc);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sc)));
    const __m512i gs = _mm512_zextsi256_si512(sc16);
    const __m256i hm = load256(a[i].hmask);
    __m512i isum = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m256i q3 = load256(a[i].qs + 32 * (k / 2));
      const int s0 = 2 * (k % 2), bit0 = 2 * k;  // shift index and hmask bit of the first 32
      const __m256i u0 = _mm256_or_si256(srl_and(q3, 2 * s0, m3), _mm256_slli_epi16(srl_and(hm, bit0, one), 2));
      const __m256i u1 = _mm256_or_si256(srl_and(q3, 2 * s0 + 2, m3), _mm256_slli_epi16(srl_and(hm, bit0 + 1, one), 2));
      isum = _mm512_add_epi32(isum, run_dot(cat256(u0, u1), b[i].qs + 64 * k, expand_scales(gs, k)));
    }
    // codes are q+4 (q in [-4,3]); remove 4 * sum_g sc[g] * bsums[g]
    const int offset = 4 * bsums_dot(b[i].bsums, sc16);
    const __m512i corr = _mm512_mask_set1_epi32(_mm512_setzero_si512(), 1, -offset);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(h2f(a[i].d) * b[i].d),
                          _mm512_cvtepi32_ps(_mm512_add_epi32(isum, corr)), acc);
  }
  *s = _mm512_reduce_add_ps(acc);
}

}  // namespace

VecDotFn vec_dot_kernel_avx512(DType t) {
  switch (t) {
    case DType::F32: return dot_float<0>;
    case DType::F16: return dot_float<1>;
    case DType::BF16: return dot_float<2>;
    case DType::Q4_0: return dot_q4_0;
    case DType::MXFP4: return dot_mxfp4;
    case DType::Q2_K: return dot_q2_K;
    case DType::Q3_K: return dot_q3_K;
    default: return vec_dot_extra_kernel_avx512(t);
  }
}

VecDot4Fn vec_dot4_kernel_avx512(DType t) {
  switch (t) {
    case DType::Q4_0: return dot4_b32<1>;
    case DType::MXFP4: return dot4_b32<2>;
    default: return nullptr;
  }
}

// The AVX2 activation quantizers are already memory-bound; reuse them.
FromFloatFn from_float_kernel_avx512(DType) { return nullptr; }

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_kernel_avx512(DType) { return nullptr; }
VecDot4Fn vec_dot4_kernel_avx512(DType) { return nullptr; }
FromFloatFn from_float_kernel_avx512(DType) { return nullptr; }
}  // namespace moe

#endif
