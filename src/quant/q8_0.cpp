// Q8_0: blocks of 32 int8 with one f16 scale (d = amax / 127), rounding half away from zero
// (roundf), exactly as GGML's quantize_row_q8_0_ref.
#include <cmath>

#include "core/fp16.h"
#include "quant/quant_ref.h"

namespace moe {

void dequantize_row_q8_0(const BlockQ8_0 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK8_0; ++j) y[b * QK8_0 + j] = x[b].qs[j] * d;
  }
}

void quantize_row_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) {
      const float a = std::fabs(x[b * QK8_0 + j]);
      amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(x[b * QK8_0 + j] * id));
  }
}

}  // namespace moe
