// Q2_K: 256-value super-blocks of 16 sub-blocks x 16 values. Each sub-block has a 4-bit
// scale and 4-bit min (scales[j] = scale | min << 4), scaled by the f16 d and dmin:
// value = d*scale*q - dmin*min, q in [0,3]. qs holds 4 codes per byte: within each
// 128-value half, byte l carries elements l, l+32, l+64, l+96 at bit offsets 0,2,4,6.
#include <cmath>

#include "core/fp16.h"
#include "quant/kquant_search.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q2_K(const BlockQ2_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    const uint8_t *q = x[b].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int k = 0; k < 2; ++k) {
          const uint8_t sc = x[b].scales[is++];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * k + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void quantize_row_q2_K_ref(const float *x, BlockQ2_K *y, int64_t n) {
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  const float q4scale = 15.f;
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                   -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) y[b].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[b].d = fp32_to_fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y[b].scales[j] = 0;
      y[b].d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j)
        y[b].scales[j] = static_cast<uint8_t>(y[b].scales[j] | (nearest_int(iscale * mins[j]) << 4));
      y[b].dmin = fp32_to_fp16(max_min / q4scale);
    } else {
      y[b].dmin = fp32_to_fp16(0.f);
    }
    // Re-quantize against the rounded (f16, 4-bit) scales actually stored.
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp16_to_fp32(y[b].d) * (y[b].scales[j] & 0xF);
      if (!d) continue;
      const float dm = fp16_to_fp32(y[b].dmin) * (y[b].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(l < 0 ? 0 : (l > 3 ? 3 : l));
      }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[b].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

}  // namespace moe
