// AVX-512 forms of refmath::expf_v / silu_v (ref_math.h), operation for operation.
#include <cstdint>

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
// GCC 12's AVX-512 headers trip these on their own undefined-vector idiom (_mm512_abs_ps).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace moe {

namespace {

inline __m512 expf_v16(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  // fnmadd(a, b, c) = fma(-a, b, c)
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);  // j * 2^n (n is integral): ldexp
  // |n| > 192 (ordered: NaN keeps res): 0 when n <= 0, else +inf
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  if (!big) return res;
  const __mmask16 neg = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512 alt = _mm512_mask_blend_ps(neg, _mm512_set1_ps(__builtin_inff()), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, res, alt);
}

}  // namespace

void ref_expf_shift_avx512(int64_t n, const float *src, float mx, float *dst) {
  const __m512 m = _mm512_set1_ps(mx);
  for (int64_t i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, expf_v16(_mm512_sub_ps(_mm512_loadu_ps(src + i), m)));
}

void ref_silu_mul_avx512(int64_t n, const float *g, const float *u, float *dst) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = expf_v16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
}

void ref_silu_avx512(int64_t n, const float *x, float *dst) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(dst + i, _mm512_div_ps(v, _mm512_add_ps(one, expf_v16(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
  }
}

bool ref_math_avx512_built() { return true; }

}  // namespace moe

#else

namespace moe {
void ref_expf_shift_avx512(int64_t, const float *, float, float *) {}
void ref_silu_mul_avx512(int64_t, const float *, const float *, float *) {}
void ref_silu_avx512(int64_t, const float *, float *) {}
bool ref_math_avx512_built() { return false; }
}  // namespace moe

#endif
