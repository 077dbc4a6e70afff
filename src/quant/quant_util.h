// Small helpers shared by the reference formats (src/quant/*.cpp) and the CPU dot kernels:
// GGML's rounding trick, the packed K-quant scale decoders and the MXFP4 value table.
//
//   uint8_t sc[8], mn[8]; unpack_q4k_scales(blk.scales, sc, mn);   // Q4_K / Q5_K
//   int8_t s16[16];      unpack_q3k_scales(blk.scales, s16);       // Q3_K, already minus 32
//   float d = e8m0_to_fp32_half(blk.e);                            // MXFP4 block scale
#pragma once
#include <cstdint>
#include <cstring>

namespace moe {

// Round to nearest (ties to even) via the 1.5*2^23 magic add; only valid for |f| <= 2^22.
// GGML uses exactly this in the K-quant searches, so we must too (roundf differs on ties).
inline int nearest_int(float f) {
  const float v = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins packed into 12 bytes.
inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Same result as get_scale_min_k4 for j = 0..7, done on 32-bit words (the hot kernels
// call this once per block).
inline void unpack_q4k_scales(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  const uint32_t s_lo = w[0] & 0x3f3f3f3fu, m_lo = w[1] & 0x3f3f3f3fu;
  const uint32_t s_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  std::memcpy(sc, &s_lo, 4);
  std::memcpy(sc + 4, &s_hi, 4);
  std::memcpy(mn, &m_lo, 4);
  std::memcpy(mn + 4, &m_hi, 4);
}

// Q3_K: 16 six-bit scales (low 4 bits in bytes 0..7, high 2 bits in bytes 8..11), biased by 32.
inline void unpack_q3k_scales(const uint8_t *q, int8_t *out) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  const uint32_t u[4] = {
      (w[0] & 0x0f0f0f0fu) | (((w[2] >> 0) & 0x03030303u) << 4),
      (w[1] & 0x0f0f0f0fu) | (((w[2] >> 2) & 0x03030303u) << 4),
      ((w[0] >> 4) & 0x0f0f0f0fu) | (((w[2] >> 4) & 0x03030303u) << 4),
      ((w[1] >> 4) & 0x0f0f0f0fu) | (((w[2] >> 6) & 0x03030303u) << 4)};
  uint8_t b[16];
  std::memcpy(b, u, 16);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<int8_t>(b[j] - 32);
}

// E2M1 code -> 2x its value (GGML stores doubled values and halves the E8M0 scale instead).
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// IQ4_NL / IQ4_XS code -> value (GGML's kvalues_iq4nl).
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_XS: 6-bit sub-scale g (0..7) of a super-block, still biased by 32.
inline int iq4xs_scale(const uint8_t *scales_l, uint16_t scales_h, int g) {
  return ((scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((scales_h >> (2 * g)) & 3) << 4);
}

// 2^(e-127) / 2, exact, including the two subnormal results for e = 0 and 1.
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace moe
