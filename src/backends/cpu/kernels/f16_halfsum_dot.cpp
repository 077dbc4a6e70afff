#include "backends/cpu/kernels/f16_halfsum_dot.h"

#include "core/fp16.h"

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

}  // namespace

float f16_halfsum_dot(int n, const uint16_t *w, const uint16_t *x) {
  constexpr int kStep = 128;  // 4 accumulators x 32 lanes; lane l of the step = acc[l / 32][l % 32]
  const int np = n - n % kStep;
  double sum = 0.0;
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
