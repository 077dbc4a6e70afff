// Q3_K: 256-value super-blocks of 16 sub-blocks x 16 values, value = d * (scale-32) * q with
// q in [-4,3]. Low 2 bits of q are packed like Q2_K's qs; the third bit lives in hmask
// (bit k of hmask[l] belongs to element 32k + l), and a SET bit means "no -4 offset".
// Scales are 6 bits: see unpack_q3k_scales in quant_util.h.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/kquant_search.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q3_K(const BlockQ3_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d_all = fp16_to_fp32(x[b].d);
    int8_t sc[16];
    unpack_q3k_scales(x[b].scales, sc);
    const uint8_t *q = x[b].qs;
    const uint8_t *hm = x[b].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int k = 0; k < 2; ++k) {
          const float dl = d_all * sc[is++];
          for (int l = 16 * k; l < 16 * k + 16; ++l)
            *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
      }
    }
  }
}

void quantize_row_q3_K_ref(const float *x, BlockQ3_K *y, int64_t n) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
      const float a = std::fabs(scales[j]);
      if (a > amax) { amax = a; max_scale = scales[j]; }
    }
    std::memset(y[b].scales, 0, 12);
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>((l < -32 ? -32 : (l > 31 ? 31 : l)) + 32);
        if (j < 8) y[b].scales[j] = l & 0xF;
        else y[b].scales[j - 8] = static_cast<uint8_t>(y[b].scales[j - 8] | ((l & 0xF) << 4));
        l = static_cast<int8_t>(l >> 4);
        y[b].scales[j % 4 + 8] = static_cast<uint8_t>(y[b].scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      y[b].d = fp32_to_fp16(1 / iscale);
    } else {
      y[b].d = fp32_to_fp16(0.f);
    }
    int8_t sc[16];
    unpack_q3k_scales(y[b].scales, sc);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp16_to_fp32(y[b].d) * sc[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>((l < -4 ? -4 : (l > 3 ? 3 : l)) + 4);
      }
    }
    std::memset(y[b].hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
      if (L[j] > 3) {
        y[b].hmask[m] |= hm;
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
      if (++m == QK_K / 8) { m = 0; hm = static_cast<uint8_t>(hm << 1); }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[b].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

}  // namespace moe
