#include "backends/cpu/kernels/f16_halfsum_dot.h"

#include "backends/cpu/kernels/vec_dot.h"
#include "core/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MOE_HALFSUM_AVX512 1
#endif

namespace moe {

namespace {

// Round a + b (exact value; a, b floats) to the nearest half, ties to even, with a single
// rounding. s = fl(a + b) plus its exact error e (TwoSum); rounding s is correct except when
// s lands exactly on a midpoint between two halves while e != 0: then e picks the side.
// Midpoints are floats (12 significant bits), so s cannot step over one.
inline float half_round_sum(float a, float b) {
  const float s = a + b;
  const float bb = s - a;
  const float e = (a - (s - bb)) + (b - bb);
  const float h = round_fp16(s);
  const float d = s - h;  // exact: h is s rounded to a coarser grid
  if (e == 0.0f || d == 0.0f) return h;
  const float other = h + 2.0f * d;  // the neighbour on s's side when s is a midpoint
  if (round_fp16(other) != other) return h;  // s was not a midpoint
  return (e > 0.0f) == (d > 0.0f) ? other : h;
}

#ifdef MOE_HALFSUM_AVX512
// The same rounding, 16 lanes at a time (AVX-512F converts to and from F16 with round to
// nearest even). Bit-identical to half_round_sum; FMA contraction is harmless everywhere
// here because every product involved (w*x of two halves, 2*d) is exact in float.
// Masked forms: the unmasked intrinsics start from an "undefined" register that GCC 12
// warns about under a target attribute.
__attribute__((target("avx512f"))) inline __m512 load_halves16(const uint16_t *p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}
__attribute__((target("avx512f"))) inline __m512 round16(__m512 v) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm512_maskz_cvtps_ph(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

__attribute__((target("avx512f"))) inline __m512 half_round_sum16(__m512 a, __m512 b) {
  const __m512 s = _mm512_add_ps(a, b);
  const __m512 bb = _mm512_sub_ps(s, a);
  const __m512 e = _mm512_add_ps(_mm512_sub_ps(a, _mm512_sub_ps(s, bb)), _mm512_sub_ps(b, bb));
  const __m512 h = round16(s);
  const __m512 d = _mm512_sub_ps(s, h);
  const __m512 other = _mm512_add_ps(h, _mm512_add_ps(d, d));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 other_r = round16(other);
  __mmask16 m = _mm512_cmp_ps_mask(e, zero, _CMP_NEQ_OQ) & _mm512_cmp_ps_mask(d, zero, _CMP_NEQ_OQ) &
                _mm512_cmp_ps_mask(other_r, other, _CMP_EQ_OQ);
  m &= static_cast<__mmask16>(~(_mm512_cmp_ps_mask(e, zero, _CMP_GT_OQ) ^ _mm512_cmp_ps_mask(d, zero, _CMP_GT_OQ)));
  return _mm512_mask_blend_ps(m, h, other);
}

__attribute__((target("avx512f"))) float halfsum_steps_avx512(int np, const uint16_t *w, const uint16_t *x) {
  __m512 acc[8];
  for (auto &v : acc) v = _mm512_setzero_ps();
  for (int i = 0; i < np; i += 128)
    for (int v = 0; v < 8; ++v) {
      acc[v] = half_round_sum16(_mm512_mul_ps(load_halves16(w + i + 16 * v), load_halves16(x + i + 16 * v)), acc[v]);
    }
  for (int v = 0; v < 4; ++v) acc[v] = half_round_sum16(acc[v], acc[v + 4]);  // acc0+acc2, acc1+acc3
  for (int v = 0; v < 2; ++v) acc[v] = half_round_sum16(acc[v], acc[v + 2]);  // acc0+acc1
  float lanes[32];
  _mm512_storeu_ps(lanes, acc[0]);
  _mm512_storeu_ps(lanes + 16, acc[1]);
  for (int width = 16; width >= 1; width /= 2)  // the reduce-add tree
    for (int l = 0; l < width; ++l) lanes[l] = half_round_sum(lanes[l], lanes[l + width]);
  return lanes[0];
}

// AVX2 + F16C: the same with 8 lanes.
__attribute__((target("avx2,f16c"))) inline __m256 round8(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("avx2,f16c"))) inline __m256 half_round_sum8(__m256 a, __m256 b) {
  const __m256 s = _mm256_add_ps(a, b);
  const __m256 bb = _mm256_sub_ps(s, a);
  const __m256 e = _mm256_add_ps(_mm256_sub_ps(a, _mm256_sub_ps(s, bb)), _mm256_sub_ps(b, bb));
  const __m256 h = round8(s);
  const __m256 d = _mm256_sub_ps(s, h);
  const __m256 other = _mm256_add_ps(h, _mm256_add_ps(d, d));
  const __m256 zero = _mm256_setzero_ps();
  __m256 m = _mm256_and_ps(_mm256_cmp_ps(e, zero, _CMP_NEQ_OQ), _mm256_cmp_ps(d, zero, _CMP_NEQ_OQ));
  m = _mm256_and_ps(m, _mm256_cmp_ps(round8(other), other, _CMP_EQ_OQ));
  m = _mm256_andnot_ps(_mm256_xor_ps(_mm256_cmp_ps(e, zero, _CMP_GT_OQ), _mm256_cmp_ps(d, zero, _CMP_GT_OQ)), m);
  return _mm256_blendv_ps(h, other, m);
}

__attribute__((target("avx2,f16c"))) float halfsum_steps_avx2(int np, const uint16_t *w, const uint16_t *x) {
  __m256 acc[16];
  for (auto &v : acc) v = _mm256_setzero_ps();
  for (int i = 0; i < np; i += 128)
    for (int v = 0; v < 16; ++v) {
      const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + i + 8 * v)));
      const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i + 8 * v)));
      acc[v] = half_round_sum8(_mm256_mul_ps(wv, xv), acc[v]);
    }
  for (int v = 0; v < 8; ++v) acc[v] = half_round_sum8(acc[v], acc[v + 8]);  // acc0+acc2, acc1+acc3
  for (int v = 0; v < 4; ++v) acc[v] = half_round_sum8(acc[v], acc[v + 4]);  // acc0+acc1
  float lanes[32];
  for (int v = 0; v < 4; ++v) _mm256_storeu_ps(lanes + 8 * v, acc[v]);
  for (int width = 16; width >= 1; width /= 2)  // the reduce-add tree
    for (int l = 0; l < width; ++l) lanes[l] = half_round_sum(lanes[l], lanes[l + width]);
  return lanes[0];
}
#endif

}  // namespace

float f16_halfsum_dot(int n, const uint16_t *w, const uint16_t *x) {
  constexpr int kStep = 128;  // 4 accumulators x 32 lanes; lane l of the step = acc[l / 32][l % 32]
  const int np = n - n % kStep;
  double sum = 0.0;
#ifdef MOE_HALFSUM_AVX512
  if (np > 0 && active_cpu_isa() == CpuIsa::Avx512) {
    sum = static_cast<double>(halfsum_steps_avx512(np, w, x));
  } else if (np > 0 && active_cpu_isa() == CpuIsa::Avx2) {
    sum = static_cast<double>(halfsum_steps_avx2(np, w, x));
  } else
#endif
  if (np > 0) {
    float acc[kStep] = {};
    for (int i = 0; i < np; i += kStep)
      for (int l = 0; l < kStep; ++l)
        // the product of two halves is exact in float, so this is one FP16 fma rounding
        acc[l] = half_round_sum(fp16_to_fp32(w[i + l]) * fp16_to_fp32(x[i + l]), acc[l]);
    // acc0+acc2 and acc1+acc3 (offset 64), acc0+acc1 (32), then the reduce-add tree
    // (halves 16, 8, 4, 2, 1): every step lane-wise, rounded to FP16.
    for (int width = kStep / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) acc[l] = half_round_sum(acc[l], acc[l + width]);
    sum = static_cast<double>(acc[0]);
  }
  for (int i = np; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(w[i]) * fp16_to_fp32(x[i]));
  return static_cast<float>(sum);
}

void f16_halfsum_dot_rows(int n, int nrows, float *out, const void *w, size_t w_row_stride, const void *x) {
  const uint8_t *wb = static_cast<const uint8_t *>(w);
  const uint16_t *xh = static_cast<const uint16_t *>(x);
  for (int r = 0; r < nrows; ++r)
    out[r] = f16_halfsum_dot(n, reinterpret_cast<const uint16_t *>(wb + r * w_row_stride), xh);
}

}  // namespace moe
