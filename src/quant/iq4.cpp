// IQ4_NL and IQ4_XS: 4-bit codes index the non-linear value table kIq4nlValues (GGML's
// kvalues_iq4nl); IQ4_NL has one f16 scale per 32 values, IQ4_XS one f16 scale per 256 and
// a 6-bit sub-scale (biased by 32) per 32, low 4 bits in scales_l, high 2 bits in scales_h.
// Nibble order as Q4_0: element j of a 32-group low nibble of qs[j], element j+16 high.
// The quantizer is GGML's search (quantize_row_iq4_nl_impl, 7 trial scales each side, no
// importance weights), so files match what its quantize tool writes.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/quant_ref.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

// Index of the table value nearest to x (ties to the upper one, as GGML's best_index_int8).
int best_index_iq4(float x) {
  const int8_t *v = kIq4nlValues;
  if (x <= v[0]) return 0;
  if (x >= v[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < v[mid]) hi = mid; else lo = mid;
  }
  return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

// Weighted least-squares scale for 32 values given the inverse trial scale id.
void fit(const float *x, const float *w, float id, float *sumqx, float *sumq2, uint8_t *L) {
  float a = 0, b = 0;
  for (int j = 0; j < 32; ++j) {
    const int l = best_index_iq4(id * x[j]);
    if (L) L[j] = static_cast<uint8_t>(l);
    const float q = kIq4nlValues[l];
    a += w[j] * q * x[j];
    b += w[j] * q * q;
  }
  *sumqx = a;
  *sumq2 = b;
}

// Best scale of one 32-value group (0 for an all-zero group); L gets the codes for it.
float group_scale(const float *x, uint8_t *L) {
  constexpr int kTries = 7;
  float w[32], amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    w[j] = x[j] * x[j];
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
  }
  if (amax < 1e-15f) {
    std::memset(L, 0, 32);
    return 0;
  }
  float sumqx, sumq2;
  fit(x, w, 1 / (-max / kIq4nlValues[0]), &sumqx, &sumq2, L);
  float d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int t = -kTries; t <= kTries; ++t) {
    fit(x, w, (t + kIq4nlValues[0]) / max, &sumqx, &sumq2, nullptr);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) { d = sumqx / sumq2; best = d * sumqx; }
  }
  return d;
}

void pack_nibbles(const uint8_t *L, uint8_t *qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

void codes_for_scale(const float *x, float d, uint8_t *L) {
  const float id = d ? 1 / d : 0.f;
  for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(best_index_iq4(id * x[j]));
}

}  // namespace

void dequantize_row_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_NL; ++b, y += QK4_NL) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIq4nlValues[x[b].qs[j] & 0xF];
      y[j + 16] = d * kIq4nlValues[x[b].qs[j] >> 4];
    }
  }
}

void quantize_row_iq4_nl(const float *x, BlockIQ4_NL *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_NL; ++b, x += QK4_NL) {
    uint8_t L[32];
    const float d = group_scale(x, L);
    y[b].d = fp32_to_fp16(d);
    // Re-coded against the unrounded scale, as GGML does; a zero scale codes every value as 8.
    codes_for_scale(x, d, L);
    pack_nibbles(L, y[b].qs);
  }
}

void dequantize_row_iq4_xs(const BlockIQ4_XS *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int g = 0; g < QK_K / 32; ++g, y += 32) {
      const int ls = iq4xs_scale(x[b].scales_l, x[b].scales_h, g);
      const float dl = d * (ls - 32);
      const uint8_t *qs = x[b].qs + 16 * g;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4nlValues[qs[j] & 0xF];
        y[j + 16] = dl * kIq4nlValues[qs[j] >> 4];
      }
    }
  }
}

void quantize_row_iq4_xs(const float *x, BlockIQ4_XS *y, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float scales[QK_K / 32];
    uint8_t L[32];
    float max_scale = 0, amax_scale = 0;
    for (int g = 0; g < QK_K / 32; ++g) {
      scales[g] = group_scale(x + 32 * g, L);
      if (std::fabs(scales[g]) > amax_scale) { amax_scale = std::fabs(scales[g]); max_scale = scales[g]; }
    }
    const float d = -max_scale / 32;
    const float id = d ? 1 / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    y[b].scales_h = 0;
    std::memset(y[b].scales_l, 0, sizeof(y[b].scales_l));
    for (int g = 0; g < QK_K / 32; ++g) {
      int l = nearest_int(id * scales[g]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      codes_for_scale(x + 32 * g, d * l, L);
      pack_nibbles(L, y[b].qs + 16 * g);
      l += 32;
      y[b].scales_l[g / 2] = static_cast<uint8_t>(y[b].scales_l[g / 2] | ((l & 0xF) << (4 * (g % 2))));
      y[b].scales_h = static_cast<uint16_t>(y[b].scales_h | ((l >> 4) << (2 * g)));
    }
  }
}

}  // namespace moe
