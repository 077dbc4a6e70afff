// Q4_0: blocks of 32 values as 4-bit codes q in [0,15], value = (q - 8) * d.
// Element j sits in the low nibble of qs[j] and element j+16 in the high nibble.
#include <cmath>

#include "core/fp16.h"
#include "quant/quant_ref.h"

namespace moe {

void dequantize_row_q4_0(const BlockQ4_0 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_0; ++b, y += QK4_0) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = ((x[b].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = ((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_row_q4_0_ref(const float *x, BlockQ4_0 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_0; ++b, x += QK4_0) {
    // The signed extreme maps to -8 so the asymmetric range [-8,7] is used fully.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      // Truncation after +8.5 is GGML's rounding here; keep it for identical bytes.
      const int q0 = static_cast<int8_t>(x[j] * id + 8.5f);
      const int q1 = static_cast<int8_t>(x[j + QK4_0 / 2] * id + 8.5f);
      const uint8_t c0 = static_cast<uint8_t>(q0 < 15 ? q0 : 15);
      const uint8_t c1 = static_cast<uint8_t>(q1 < 15 ? q1 : 15);
      y[b].qs[j] = static_cast<uint8_t>(c0 | (c1 << 4));
    }
  }
}

}  // namespace moe
