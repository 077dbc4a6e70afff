// Q5_K: as Q4_K with a fifth bit per value: q = low nibble (qs, Q4_K layout) + 16 * bit,
// where for 64-value chunk c, bit 2c of qh[l] belongs to element l and bit 2c+1 to l+32.
#include <cstring>

#include "core/fp16.h"
#include "quant/kquant_search.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q5_K(const BlockQ5_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    const float min = fp16_to_fp32(x[b].dmin);
    const uint8_t *ql = x[b].qs;
    const uint8_t *qh = x[b].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32) {
      uint8_t sc, m;
      get_scale_min_k4(is, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void quantize_row_q5_K_ref(const float *x, BlockQ5_K *y, int64_t n) {
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    std::memset(y[b].scales, 0, K_SCALE_SIZE);
    quantize_qk_affine_block(x, 31, -0.5f, 15, L, y[b].scales, &y[b].d, &y[b].dmin);
    uint8_t *qh = y[b].qh;
    uint8_t *ql = y[b].qs;
    std::memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int c = 0; c < QK_K; c += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[c + j], l2 = L[c + j + 32];
        if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
        if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

}  // namespace moe
