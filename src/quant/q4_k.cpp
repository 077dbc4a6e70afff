// Q4_K: 256-value super-blocks of 8 sub-blocks x 32 values; value = d*sc*q - dmin*m with
// q in [0,15] and 6-bit sc/m packed in 12 bytes (get_scale_min_k4). qs: for each 64-value
// chunk, 32 bytes whose low nibbles are elements 0..31 and high nibbles 32..63.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/kquant_search.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

void dequantize_row_q4_K(const BlockQ4_K *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    const float min = fp16_to_fp32(x[b].dmin);
    const uint8_t *q = x[b].qs;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, m;
      get_scale_min_k4(is, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

namespace {
// Pack 8 six-bit scales and mins into the 12-byte layout shared by Q4_K and Q5_K.
void pack_q4k_scales(const float *scales, const float *mins, float max_scale, float max_min,
                     uint8_t *out) {
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      out[j - 4] = static_cast<uint8_t>(out[j - 4] | ((ls >> 4) << 6));
      out[j] = static_cast<uint8_t>(out[j] | ((lm >> 4) << 6));
    }
  }
}

}  // namespace

void quantize_qk_affine_block(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                              uint8_t *packed_scales, uint16_t *d_out, uint16_t *dmin_out) {
  uint8_t Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                 rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  pack_q4k_scales(scales, mins, max_scale, max_min, packed_scales);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, packed_scales, &sc, &m);
    const float d = fp16_to_fp32(*d_out) * sc;
    if (!d) continue;
    const float dm = fp16_to_fp32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(l < 0 ? 0 : (l > nmax ? nmax : l));
    }
  }
}

void quantize_row_q4_K_ref(const float *x, BlockQ4_K *y, int64_t n) {
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    std::memset(y[b].scales, 0, K_SCALE_SIZE);
    quantize_qk_affine_block(x, 15, -1.f, 20, L, y[b].scales, &y[b].d, &y[b].dmin);
    uint8_t *q = y[b].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

}  // namespace moe
