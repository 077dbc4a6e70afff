// A simple quantizer for the 1-, 2- and 3-bit i-quants: not the reference's search (which
// weighs values by an importance matrix and walks grid neighbourhoods), but a plain one that
// writes valid blocks: one scale per super-block, the nearest sub-scale per 16 or 32 values,
// then for every 8 (IQ3: 4) values the grid entry nearest to their magnitudes, signs from
// the values. Formats with 7 stored sign bits per 8 (the eighth is parity) flip the sign of
// the smallest value when the parity does not match. IQ1 picks the delta sign too.
// Exhaustive grid search: fine for test models, slow for big ones.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "quant/iq_decode.h"
#include "quant/iq_grids.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

struct Format {
  int group;      // values per sub-scale (16 or 32)
  int smax;       // sub-scale s in 0..smax, multiplier 2s+1
  float k;        // value = d * k * (2s+1) * grid value
  int chunk;      // values per grid entry (8 or 4)
  int ngrid;
  float maxmag;   // largest grid magnitude
  bool iq1;       // grid values in {-1,0,1} plus a +-1/8 delta
};

Format format_of(DType t) {
  switch (t) {
    case DType::IQ2_XXS: return {32, 15, 0.125f, 8, 256, 43, false};
    case DType::IQ2_XS: return {16, 15, 0.125f, 8, 512, 43, false};
    case DType::IQ2_S: return {16, 15, 0.125f, 8, 1024, 43, false};
    case DType::IQ3_XXS: return {32, 15, 0.25f, 4, 256, 62, false};
    case DType::IQ3_S: return {32, 15, 1.0f, 4, 512, 15, false};
    case DType::IQ1_S: return {32, 7, 1.0f, 8, 2048, 1.125f, true};
    case DType::IQ1_M: return {16, 7, 1.0f, 8, 2048, 1.125f, true};
    default: fail(Status::Internal, "iq quantizer: %s", dtype_name(t));
  }
}

float grid_value(DType t, int idx, int j) {
  switch (t) {
    case DType::IQ2_XXS: return static_cast<float>((kIq2xxsGrid[idx] >> (8 * j)) & 0xFF);
    case DType::IQ2_XS: return static_cast<float>((kIq2xsGrid[idx] >> (8 * j)) & 0xFF);
    case DType::IQ2_S: return static_cast<float>((kIq2sGrid[idx] >> (8 * j)) & 0xFF);
    case DType::IQ3_XXS: return static_cast<float>((kIq3xxsGrid[idx] >> (8 * j)) & 0xFF);
    case DType::IQ3_S: return static_cast<float>((kIq3sGrid[idx] >> (8 * j)) & 0xFF);
    default: return static_cast<float>(static_cast<int8_t>((kIq1sGrid[idx] >> (8 * j)) & 0xFF));
  }
}

// Choices for one super-block, before packing.
struct Plan {
  float d = 0;
  uint16_t dh = 0;
  int s[16] = {};         // sub-scale per 16 values
  int idx[64] = {};       // grid index per chunk
  uint8_t sign8[32] = {}; // sign bits per 8 values (bit j: value j negative)
  bool neg_delta[32] = {};// IQ1: per 8 values
};

float nearest_grid(DType t, const Format &f, const float *target, float delta, int *best) {
  float best_err = INFINITY;
  for (int g = 0; g < f.ngrid; ++g) {
    float err = 0;
    for (int j = 0; j < f.chunk; ++j) {
      const float e = target[j] - (grid_value(t, g, j) + delta);
      err += e * e;
    }
    if (err < best_err) { best_err = err; *best = g; }
  }
  return best_err;
}

void plan_block(DType t, const Format &f, const float *x, Plan *p) {
  float mult[16] = {}, max_mult = 0;
  for (int g = 0; g < QK_K / f.group; ++g) {
    float amax = 0;
    for (int j = 0; j < f.group; ++j) amax = std::fmax(amax, std::fabs(x[g * f.group + j]));
    mult[g] = amax / f.maxmag;
    max_mult = std::fmax(max_mult, mult[g]);
  }
  p->dh = fp32_to_fp16(max_mult / (f.k * (2 * f.smax + 1)));
  p->d = fp16_to_fp32(p->dh);
  if (p->d == 0) return;  // all zero: every code 0 decodes to 0 with d = 0
  for (int g = 0; g < QK_K / f.group; ++g) {
    int s = nearest_int((mult[g] / (p->d * f.k) - 1) / 2);
    s = s < 0 ? 0 : (s > f.smax ? f.smax : s);
    for (int h = 0; h < f.group / 16; ++h) p->s[g * f.group / 16 + h] = s;
  }
  for (int c = 0; c < QK_K / f.chunk; ++c) {
    const float *xc = x + c * f.chunk;
    const float scale = p->d * f.k * (2 * p->s[c * f.chunk / 16] + 1);
    float target[8];
    for (int j = 0; j < f.chunk; ++j) target[j] = f.iq1 ? xc[j] / scale : std::fabs(xc[j]) / scale;
    if (f.iq1) {
      int ip = 0, in = 0;
      const float ep = nearest_grid(t, f, target, 0.125f, &ip), en = nearest_grid(t, f, target, -0.125f, &in);
      p->neg_delta[c] = en < ep;
      p->idx[c] = en < ep ? in : ip;
    } else {
      nearest_grid(t, f, target, 0, &p->idx[c]);
    }
  }
  if (f.iq1) {
    if (t == DType::IQ1_S) {  // one delta per 32: the majority of the four choices
      for (int ib = 0; ib < 8; ++ib) {
        int neg = 0;
        for (int l = 0; l < 4; ++l) neg += p->neg_delta[4 * ib + l];
        for (int l = 0; l < 4; ++l) p->neg_delta[4 * ib + l] = neg > 2;
      }
    }
    return;
  }
  const bool parity = t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ3_XXS;
  for (int o = 0; o < 32; ++o) {
    const float *x8 = x + 8 * o;
    uint8_t bits = 0;
    int smallest = 0;
    for (int j = 0; j < 8; ++j) {
      if (x8[j] < 0) bits = static_cast<uint8_t>(bits | (1u << j));
      if (std::fabs(x8[j]) < std::fabs(x8[smallest])) smallest = j;
    }
    if (parity && (__builtin_popcount(bits) & 1)) bits = static_cast<uint8_t>(bits ^ (1u << smallest));
    p->sign8[o] = bits;
  }
}

void pack(DType t, const Plan &p, uint8_t *blk) {
  const size_t bytes = type_traits(t).type_size;
  std::memset(blk, 0, bytes);
  if (t != DType::IQ1_M) std::memcpy(blk, &p.dh, 2);
  uint8_t *q = blk + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const int s0 = p.s[2 * ib], s1 = p.s[2 * ib + 1];
    switch (t) {
      case DType::IQ2_XXS: case DType::IQ3_XXS: {
        uint32_t aux = static_cast<uint32_t>(s0) << 28;
        for (int l = 0; l < 4; ++l) aux |= static_cast<uint32_t>(p.sign8[4 * ib + l] & 127) << (7 * l);
        if (t == DType::IQ2_XXS) {
          for (int l = 0; l < 4; ++l) q[8 * ib + l] = static_cast<uint8_t>(p.idx[4 * ib + l]);
          std::memcpy(q + 8 * ib + 4, &aux, 4);
        } else {
          for (int c = 0; c < 8; ++c) q[8 * ib + c] = static_cast<uint8_t>(p.idx[8 * ib + c]);
          std::memcpy(q + QK_K / 4 + 4 * ib, &aux, 4);
        }
        break;
      }
      case DType::IQ2_XS:
        for (int l = 0; l < 4; ++l) {
          const uint16_t v = static_cast<uint16_t>(p.idx[4 * ib + l] | ((p.sign8[4 * ib + l] & 127) << 9));
          std::memcpy(q + 2 * (4 * ib + l), &v, 2);
        }
        q[64 + ib] = static_cast<uint8_t>(s0 | (s1 << 4));
        break;
      case DType::IQ2_S:
        for (int l = 0; l < 4; ++l) {
          q[4 * ib + l] = static_cast<uint8_t>(p.idx[4 * ib + l] & 255);
          q[32 + 4 * ib + l] = p.sign8[4 * ib + l];
          q[64 + ib] = static_cast<uint8_t>(q[64 + ib] | ((p.idx[4 * ib + l] >> 8) << (2 * l)));
        }
        q[72 + ib] = static_cast<uint8_t>(s0 | (s1 << 4));
        break;
      case DType::IQ3_S:
        for (int c = 0; c < 8; ++c) {
          q[8 * ib + c] = static_cast<uint8_t>(p.idx[8 * ib + c] & 255);
          q[64 + ib] = static_cast<uint8_t>(q[64 + ib] | ((p.idx[8 * ib + c] >> 8) << c));
        }
        for (int l = 0; l < 4; ++l) q[72 + 4 * ib + l] = p.sign8[4 * ib + l];
        q[104 + ib / 2] = static_cast<uint8_t>(q[104 + ib / 2] | (s0 << (4 * (ib % 2))));
        break;
      case DType::IQ1_S: {
        uint16_t qh = static_cast<uint16_t>((s0 << 12) | (p.neg_delta[4 * ib] ? 0x8000 : 0));
        for (int l = 0; l < 4; ++l) {
          q[4 * ib + l] = static_cast<uint8_t>(p.idx[4 * ib + l] & 255);
          qh = static_cast<uint16_t>(qh | ((p.idx[4 * ib + l] >> 8) << (3 * l)));
        }
        std::memcpy(q + 32 + 2 * ib, &qh, 2);
        break;
      }
      default: {  // IQ1_M: no leading f16
        uint8_t *qs = blk, *qh = blk + 32;
        uint16_t sc[4];
        std::memcpy(sc, blk + 48, 8);
        for (int l = 0; l < 4; ++l) {
          qs[4 * ib + l] = static_cast<uint8_t>(p.idx[4 * ib + l] & 255);
          const int hb = ((p.idx[4 * ib + l] >> 8) & 7) | (p.neg_delta[4 * ib + l] ? 8 : 0);
          qh[2 * ib + l / 2] = static_cast<uint8_t>(qh[2 * ib + l / 2] | (hb << (4 * (l % 2))));
        }
        sc[ib / 2] = static_cast<uint16_t>(sc[ib / 2] | (s0 << (6 * (ib % 2))) | (s1 << (6 * (ib % 2) + 3)));
        if (ib == 7)
          for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(sc[k] | (((p.dh >> (4 * k)) & 0xF) << 12));
        std::memcpy(blk + 48, sc, 8);
        break;
      }
    }
  }
}

}  // namespace

void quantize_row_iq(DType t, const float *x, void *dst, int64_t n) {
  const Format f = format_of(t);
  uint8_t *blk = static_cast<uint8_t *>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, blk += type_traits(t).type_size) {
    Plan p;
    plan_block(t, f, x, &p);
    pack(t, p, blk);
  }
}

}  // namespace moe
