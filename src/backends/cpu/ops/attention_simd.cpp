#include "backends/cpu/ops/attention_simd.h"

#include "core/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c,fma"))) static void axpy_f16_avx2(int n, float *acc, const uint16_t *v, float p) {
  const __m256 vp = _mm256_set1_ps(p);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(v + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(x, vp, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += fp16_to_fp32(v[i]) * p;
}

__attribute__((target("avx2,f16c,fma"))) static void f16_to_f32_avx2(int n, float *dst, const uint16_t *src) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

__attribute__((target("avx2,f16c,fma"))) static float dot_f32_avx2(int n, const float *a, const float *b) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  s0 = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

static bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return ok;
}
#endif

void attn_axpy_f16(int n, float *acc, const uint16_t *v, float p) {
#if defined(__x86_64__)
  if (have_f16c()) { axpy_f16_avx2(n, acc, v, p); return; }
#endif
  for (int i = 0; i < n; ++i) acc[i] += fp16_to_fp32(v[i]) * p;
}

void attn_f16_to_f32(int n, float *dst, const uint16_t *src) {
#if defined(__x86_64__)
  if (have_f16c()) { f16_to_f32_avx2(n, dst, src); return; }
#endif
  for (int i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

float attn_dot_f32(int n, const float *a, const float *b) {
#if defined(__x86_64__)
  if (have_f16c()) return dot_f32_avx2(n, a, b);
#endif
  float r = 0.0f;
  for (int i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

void attn_axpy_f32(int n, float *acc, const float *v, float p) {
  for (int i = 0; i < n; ++i) acc[i] += v[i] * p;
}

}  // namespace moe
