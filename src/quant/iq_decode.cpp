// Decoders of the 1-, 2- and 3-bit i-quant super-blocks (layouts in quant/dtype.h, tables in
// quant/iq_grids.h). Float scales follow the reference's expression order exactly, so the
// dequantized values are bit-identical to it (tests/unit/test_quant_new_types.cpp).
#include "quant/iq_decode.h"

#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "quant/iq_grids.h"

namespace moe {

namespace {

// Byte j of kSignMask.v[s] is 0xFF when bit j of s is set: negation of 8 bytes at once.
struct SignMasks {
  uint64_t v[256];
  SignMasks() {
    for (int s = 0; s < 256; ++s) {
      v[s] = 0;
      for (int j = 0; j < 8; ++j)
        if (s & (1 << j)) v[s] |= 0xFFull << (8 * j);
    }
  }
};
const SignMasks kSignMask;
constexpr uint64_t kOnes = 0x0101010101010101ull;

// Bytewise two's complement negation where m has 0xFF: (g ^ m) + 1 never carries out of a
// byte because no grid magnitude is 0.
inline uint64_t apply_signs(uint64_t g, uint64_t m) { return (g ^ m) + (m & kOnes); }

// 8 magnitudes from a 64-bit grid entry with the sign bits of `signs` applied.
inline void put8(int8_t *q, uint64_t grid, uint8_t signs) {
  const uint64_t v = apply_signs(grid, kSignMask.v[signs]);
  std::memcpy(q, &v, 8);
}

// 4 magnitudes from a 32-bit grid entry with sign bits first..first+3 of `signs`.
inline void put4(int8_t *q, uint32_t grid, uint8_t signs, int first) {
  const uint32_t v = static_cast<uint32_t>(apply_signs(grid, (kSignMask.v[signs] >> (8 * first)) & 0xFFFFFFFFull));
  std::memcpy(q, &v, 4);
}

// IQ1: 8 values of grid (bytes -1, 0, 1) + delta (+-1/8), in eighths: 8 * g +- 1 per byte.
inline void put8_iq1(int8_t *q, uint64_t grid, bool neg_delta) {
  const uint64_t eight_g = (grid << 3) & 0xF8F8F8F8F8F8F8F8ull;  // bits shifted across bytes masked off
  // Bytewise add without carries between bytes (high bits added separately).
  const uint64_t d = neg_delta ? ~0ull : kOnes;
  const uint64_t lo = (eight_g & 0x7F7F7F7F7F7F7F7Full) + (d & 0x7F7F7F7F7F7F7F7Full);
  const uint64_t v = lo ^ ((eight_g ^ d) & 0x8080808080808080ull);
  std::memcpy(q, &v, 8);
}

inline uint16_t half_at(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Sub-scale s (4 bits) of a 2-bit type: value scale d * (0.5 + s) * 0.25, integer 2s+1.
inline void iq2_scale(IqDecoded *o, int g16, float d, int s) {
  o->db[g16] = d * (0.5f + s) * 0.25f;
  o->ls[g16] = 2 * s + 1;
}

void decode_iq2_xxs(const uint8_t *blk, IqDecoded *o) {
  const float d = fp16_to_fp32(half_at(blk));
  o->d = d; o->k = 0.125f; o->eighths = false;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux[2];
    std::memcpy(aux, blk + 2 + 8 * ib, 8);
    const int s = static_cast<int>(aux[1] >> 28);
    iq2_scale(o, 2 * ib, d, s);
    iq2_scale(o, 2 * ib + 1, d, s);
    for (int l = 0; l < 4; ++l) {
      const uint8_t idx = static_cast<uint8_t>(aux[0] >> (8 * l));
      put8(o->q + 32 * ib + 8 * l, kIq2xxsGrid[idx], kIq2SignBytes[(aux[1] >> (7 * l)) & 127]);
    }
  }
}

void decode_iq2_xs(const uint8_t *blk, IqDecoded *o) {
  BlockIQ2_XS b;
  std::memcpy(&b, blk, sizeof b);
  const float d = fp16_to_fp32(b.d);
  o->d = d; o->k = 0.125f; o->eighths = false;
  for (int ib = 0; ib < 8; ++ib) {
    iq2_scale(o, 2 * ib, d, b.scales[ib] & 0xF);
    iq2_scale(o, 2 * ib + 1, d, b.scales[ib] >> 4);
    for (int l = 0; l < 4; ++l) {
      const uint16_t v = b.qs[4 * ib + l];
      put8(o->q + 32 * ib + 8 * l, kIq2xsGrid[v & 511], kIq2SignBytes[v >> 9]);
    }
  }
}

void decode_iq2_s(const uint8_t *blk, IqDecoded *o) {
  BlockIQ2_S b;
  std::memcpy(&b, blk, sizeof b);
  const float d = fp16_to_fp32(b.d);
  o->d = d; o->k = 0.125f; o->eighths = false;
  const uint8_t *signs = b.qs + QK_K / 8;
  for (int ib = 0; ib < 8; ++ib) {
    iq2_scale(o, 2 * ib, d, b.scales[ib] & 0xF);
    iq2_scale(o, 2 * ib + 1, d, b.scales[ib] >> 4);
    for (int l = 0; l < 4; ++l) {
      const int idx = b.qs[4 * ib + l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300);
      put8(o->q + 32 * ib + 8 * l, kIq2sGrid[idx], signs[4 * ib + l]);
    }
  }
}

void decode_iq3_xxs(const uint8_t *blk, IqDecoded *o) {
  BlockIQ3_XXS b;
  std::memcpy(&b, blk, sizeof b);
  const float d = fp16_to_fp32(b.d);
  o->d = d; o->k = 0.25f; o->eighths = false;
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux;
    std::memcpy(&aux, b.qs + QK_K / 4 + 4 * ib, 4);
    const int s = static_cast<int>(aux >> 28);
    for (int h = 0; h < 2; ++h) {
      o->db[2 * ib + h] = d * (0.5f + s) * 0.5f;
      o->ls[2 * ib + h] = 2 * s + 1;
    }
    const uint8_t *qs = b.qs + 8 * ib;
    for (int l = 0; l < 4; ++l) {
      const uint8_t signs = kIq2SignBytes[(aux >> (7 * l)) & 127];
      put4(o->q + 32 * ib + 8 * l, kIq3xxsGrid[qs[2 * l]], signs, 0);
      put4(o->q + 32 * ib + 8 * l + 4, kIq3xxsGrid[qs[2 * l + 1]], signs, 4);
    }
  }
}

void decode_iq3_s(const uint8_t *blk, IqDecoded *o) {
  BlockIQ3_S b;
  std::memcpy(&b, blk, sizeof b);
  const float d = fp16_to_fp32(b.d);
  o->d = d; o->k = 1.0f; o->eighths = false;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = 1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF);
    for (int h = 0; h < 2; ++h) {
      o->db[2 * ib + h] = d * ls;
      o->ls[2 * ib + h] = ls;
    }
    const uint8_t *qs = b.qs + 8 * ib, *signs = b.signs + 4 * ib;
    const int qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const int i1 = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
      const int i2 = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
      put4(o->q + 32 * ib + 8 * l, kIq3sGrid[i1], signs[l], 0);
      put4(o->q + 32 * ib + 8 * l + 4, kIq3sGrid[i2], signs[l], 4);
    }
  }
}

void decode_iq1_s(const uint8_t *blk, IqDecoded *o) {
  BlockIQ1_S b;
  std::memcpy(&b, blk, sizeof b);
  const float d = fp16_to_fp32(b.d);
  o->d = d; o->k = 0.125f; o->eighths = true;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = 2 * ((b.qh[ib] >> 12) & 7) + 1;
    for (int h = 0; h < 2; ++h) {
      o->db[2 * ib + h] = d * ls;
      o->ls[2 * ib + h] = ls;
    }
    const bool neg = (b.qh[ib] & 0x8000) != 0;
    for (int l = 0; l < 4; ++l) {
      const int idx = b.qs[4 * ib + l] | (((b.qh[ib] >> (3 * l)) & 7) << 8);
      put8_iq1(o->q + 32 * ib + 8 * l, kIq1sGrid[idx], neg);
    }
  }
}

void decode_iq1_m(const uint8_t *blk, IqDecoded *o) {
  BlockIQ1_M b;
  std::memcpy(&b, blk, sizeof b);
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  const uint16_t h = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  const float d = fp16_to_fp32(h);
  o->d = d; o->k = 0.125f; o->eighths = true;
  for (int ib = 0; ib < 8; ++ib) {
    for (int h2 = 0; h2 < 2; ++h2) {
      const int ls = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h2)) & 7) + 1;
      o->db[2 * ib + h2] = d * ls;
      o->ls[2 * ib + h2] = ls;
    }
    const uint8_t *qs = b.qs + 4 * ib, *qh = b.qh + 2 * ib;
    for (int l = 0; l < 4; ++l) {
      const int hb = qh[l / 2] >> (4 * (l % 2));  // 3 index bits, then the delta sign bit
      const int idx = qs[l] | ((hb & 7) << 8);
      put8_iq1(o->q + 32 * ib + 8 * l, kIq1sGrid[idx], (hb & 8) != 0);
    }
  }
}

}  // namespace

IqDecodeFn iq_decoder(DType t) {
  switch (t) {
    case DType::IQ2_XXS: return decode_iq2_xxs;
    case DType::IQ2_XS: return decode_iq2_xs;
    case DType::IQ2_S: return decode_iq2_s;
    case DType::IQ3_XXS: return decode_iq3_xxs;
    case DType::IQ3_S: return decode_iq3_s;
    case DType::IQ1_S: return decode_iq1_s;
    case DType::IQ1_M: return decode_iq1_m;
    default: return nullptr;
  }
}

void dequantize_row_iq(DType t, const void *src, float *dst, int64_t n) {
  const IqDecodeFn dec = iq_decoder(t);
  if (!dec) fail(Status::Internal, "dequantize_row_iq: %s is not a grid i-quant", dtype_name(t));
  const size_t bytes = type_traits(t).type_size;
  const uint8_t *p = static_cast<const uint8_t *>(src);
  IqDecoded o;
  for (int64_t b = 0; b < n / QK_K; ++b, p += bytes, dst += QK_K) {
    dec(p, &o);
    for (int j = 0; j < QK_K; ++j)
      dst[j] = o.eighths ? o.db[j / 16] * (o.q[j] * 0.125f) : o.db[j / 16] * o.q[j];
  }
}

}  // namespace moe
