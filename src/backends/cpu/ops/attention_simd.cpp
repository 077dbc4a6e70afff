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

void attn_axpy_f32(int n, float *acc, const float *v, float p) {
  for (int i = 0; i < n; ++i) acc[i] += v[i] * p;
}

}  // namespace moe
