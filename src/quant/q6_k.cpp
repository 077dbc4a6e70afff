// Q6_K: 256-value super-blocks of 16 sub-blocks x 16 values; value = d * scale * (q - 32),
// q in [0,63], int8 scales. Per 128-value half: ql[l] low nibble = element l, high nibble =
// l+64; ql[l+32] low = l+32, high = l+96; qh[l] bits 0-1,2-3,4-5,6-7 = top bits of l, l+32,
// l+64, l+96.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/kquant_search.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q6_K(const BlockQ6_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    const uint8_t *ql = x[b].ql;
    const uint8_t *qh = x[b].qh;
    const int8_t *sc = x[b].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void quantize_row_q6_K_ref(const float *x, BlockQ6_K *y, int64_t n) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      const float a = std::fabs(scales[ib]);
      if (a > max_abs_scale) { max_abs_scale = a; max_scale = scales[ib]; }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[b], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[b].d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const int v = nearest_int(iscale * scales[ib]);
      y[b].scales[ib] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp16_to_fp32(y[b].d) * y[b].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>((l < -32 ? -32 : (l > 31 ? 31 : l)) + 32);
      }
    }
    uint8_t *ql = y[b].ql;
    uint8_t *qh = y[b].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                     ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace moe
