// MXFP4 (OCP microscaling FP4): 32 values share one E8M0 exponent e; each value is an E2M1
// code (sign, 2-bit exponent, 1-bit mantissa). GGML stores the codes' values doubled
// (kMxfp4Values) and uses 2^(e-127)/2 as the scale, so value = kMxfp4Values[q] * d.
// Layout matches Q4_0: element j in the low nibble of qs[j], element j+16 in the high nibble.
#include <cmath>

#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

namespace {
// First index with the smallest error wins (strict <), as GGML's best_index_mxfp4.
int best_mxfp4_index(float x, float d) {
  int best = 0;
  float best_err = std::fabs(kMxfp4Values[0] * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kMxfp4Values[i] * d - x);
    if (err < best_err) { best = i; best_err = err; }
  }
  return best;
}
}  // namespace

void dequantize_row_mxfp4(const BlockMXFP4 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_MXFP4; ++b, y += QK_MXFP4) {
    const float d = e8m0_to_fp32_half(x[b].e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      y[j] = kMxfp4Values[x[b].qs[j] & 0x0F] * d;
      y[j + QK_MXFP4 / 2] = kMxfp4Values[x[b].qs[j] >> 4] * d;
    }
  }
}

void quantize_row_mxfp4_ref(const float *x, BlockMXFP4 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_MXFP4; ++b, x += QK_MXFP4) {
    float amax = 0.0f;
    for (int j = 0; j < QK_MXFP4; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    // Largest E2M1 magnitude is 6 = 1.5 * 2^2, hence the -2 on the exponent of amax.
    // The int step mirrors how x86 converts the (possibly negative) float before narrowing.
    const uint8_t e = amax > 0.0f
        ? static_cast<uint8_t>(static_cast<int>(std::floor(std::log2(amax)) - 2 + 127)) : 0;
    const float d = e8m0_to_fp32_half(e);
    y[b].e = e;
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      const int q0 = best_mxfp4_index(x[j], d);
      const int q1 = best_mxfp4_index(x[j + QK_MXFP4 / 2], d);
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

}  // namespace moe
