// AVX2 + FMA one-token step of the gated delta rule (ops/delta_net.cpp picks it at run time):
// per state row, the decay, the k product, the update and the q product in one pass, 8 lanes.
#include "backends/cpu/ops/delta_net_step.h"

// Built with -mavx2 -mfma on x86 (src/CMakeLists.txt); empty elsewhere (an aarch64 build).
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>

namespace moe {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

void delta_step_avx2(float *S, const float *S_in, int64_t d, const float *q, const float *k, const float *v, float decay, float beta,
                     float scale, float *o) {
  const int64_t d8 = d / 8 * 8;
  const __m256 vdecay = _mm256_set1_ps(decay);
  for (int64_t j = 0; j < d; ++j) {
    float *row = S + j * d;
    const float *in = S_in + j * d;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(in + i), vdecay);
      _mm256_storeu_ps(row + i, r);
      acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
    }
    float kv = hsum(acc);
    for (int64_t i = d8; i < d; ++i) {
      row[i] = in[i] * decay;
      kv += row[i] * k[i];
    }
    const float delta = beta * (v[j] - kv);
    const __m256 vdelta = _mm256_set1_ps(delta);
    acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      const __m256 r = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), vdelta, _mm256_loadu_ps(row + i));
      _mm256_storeu_ps(row + i, r);
      acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), acc);
    }
    float out = hsum(acc);
    for (int64_t i = d8; i < d; ++i) {
      row[i] += k[i] * delta;
      out += row[i] * q[i];
    }
    o[j] = out * scale;
  }
}

}  // namespace moe
#endif
