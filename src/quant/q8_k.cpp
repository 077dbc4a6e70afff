// Q8_K: the activation format K-quant weights are multiplied with. 256 int8 with a float
// scale d = max / -127 (sign of the largest-magnitude value folded in), plus per-16 sums
// (bsums) that let the kernels apply the weights' mins without touching the values again.
#include <cmath>
#include <cstring>

#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q8_K(const BlockQ8_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b)
    for (int j = 0; j < QK_K; ++j) *y++ = x[b].d * x[b].qs[j];
}

void quantize_row_q8_K_ref(const float *x, BlockQ8_K *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (!amax) {
      // GGML leaves bsums untouched here; we zero them so the block is fully defined
      // (a kernel reading them gets 0, which is also what the values sum to).
      y[b].d = 0;
      std::memset(y[b].qs, 0, QK_K);
      std::memset(y[b].bsums, 0, sizeof(y[b].bsums));
      continue;
    }
    // -127 (not -128) keeps every code in [-127,127]; the extreme maps to +-127 exactly.
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[b].qs[j * 16 + ii];
      y[b].bsums[j] = static_cast<int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

}  // namespace moe
