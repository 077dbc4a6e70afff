// The older 32-value block formats next to Q4_0: Q4_1 (4-bit with min), Q5_0 (5-bit
// symmetric), Q5_1 (5-bit with min), and Q8_1, the activation format Q4_1/Q5_1 dot
// products take (Q8_0 plus s = d * sum(qs), so the min term costs one multiply per block).
// Codes: element j in the low nibble of qs[j], element j+16 in the high nibble; the 5-bit
// formats keep the fifth bit of element j in bit j of the 32-bit little-endian qh.
// Quantizers reproduce GGML's *_ref ones byte for byte (truncating casts included).
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/quant_ref.h"

namespace moe {

namespace {

// Code of element j (0..31) in a 4-bit + optional fifth-bit block.
inline int code5(const uint8_t *qs, uint32_t qh, int j) {
  const int lo = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
  return lo | static_cast<int>(((qh >> j) & 1u) << 4);
}

inline uint32_t load_qh(const uint8_t *qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// Packs 32 codes (< 32) into nibbles and the fifth-bit word.
void pack5(const uint8_t *codes, uint8_t *qs, uint8_t *qh_out) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((codes[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((codes[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}

void min_max(const float *x, float *mn, float *mx) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  *mn = lo;
  *mx = hi;
}

}  // namespace

void dequantize_row_q4_1(const BlockQ4_1 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_1; ++b, y += QK4_1) {
    const float d = fp16_to_fp32(x[b].d), m = fp16_to_fp32(x[b].m);
    for (int j = 0; j < 32; ++j) y[j] = code5(x[b].qs, 0, j) * d + m;
  }
}

void quantize_row_q4_1_ref(const float *x, BlockQ4_1 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK4_1; ++b, x += QK4_1) {
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = static_cast<int8_t>((x[j] - mn) * id + 0.5f);
      const int q1 = static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f);
      y[b].qs[j] = static_cast<uint8_t>((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
    }
  }
}

void dequantize_row_q5_0(const BlockQ5_0 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK5_0; ++b, y += QK5_0) {
    const float d = fp16_to_fp32(x[b].d);
    const uint32_t qh = load_qh(x[b].qh);
    for (int j = 0; j < 32; ++j) y[j] = (code5(x[b].qs, qh, j) - 16) * d;
  }
}

void quantize_row_q5_0_ref(const float *x, BlockQ5_0 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK5_0; ++b, x += QK5_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    uint8_t codes[32];
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int8_t>(x[j] * id + 16.5f);
      codes[j] = static_cast<uint8_t>(q < 31 ? q : 31);
    }
    pack5(codes, y[b].qs, y[b].qh);
  }
}

void dequantize_row_q5_1(const BlockQ5_1 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK5_1; ++b, y += QK5_1) {
    const float d = fp16_to_fp32(x[b].d), m = fp16_to_fp32(x[b].m);
    const uint32_t qh = load_qh(x[b].qh);
    for (int j = 0; j < 32; ++j) y[j] = code5(x[b].qs, qh, j) * d + m;
  }
}

void quantize_row_q5_1_ref(const float *x, BlockQ5_1 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK5_1; ++b, x += QK5_1) {
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(mn);
    uint8_t codes[32];
    // No clamp here (GGML has none): (x - min) * id + 0.5 stays below 32 by construction.
    for (int j = 0; j < 32; ++j) codes[j] = static_cast<uint8_t>((x[j] - mn) * id + 0.5f);
    pack5(codes, y[b].qs, y[b].qh);
  }
}

void dequantize_row_q8_1(const BlockQ8_1 *x, float *y, int64_t n) {
  for (int64_t b = 0; b < n / QK8_1; ++b, y += QK8_1) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < 32; ++j) y[j] = x[b].qs[j] * d;
  }
}

void quantize_row_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t n) {
  for (int64_t b = 0; b < n / QK8_1; ++b, x += QK8_1) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

}  // namespace moe
