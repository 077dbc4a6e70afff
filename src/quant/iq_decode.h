// The 1-, 2- and 3-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) decoded
// one super-block at a time into signed int8 codes and per-16 scales. Both the reference
// dequantization and the dot kernels start from this, so they cannot disagree on the layout.
//
//   IqDecoded dec;
//   iq_decoder(DType::IQ2_XS)(block_bytes, &dec);
//   value j = dec.db[j / 16] * dec.q[j]               (dec.eighths: dec.db[j / 16] * (dec.q[j] * 0.125f))
//   dot with Q8_K = dec.d * dec.k * y.d * sum_g dec.ls[g] * sum_{j in g} dec.q[j] * y.qs[j]
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace moe {

struct IqDecoded {
  int8_t q[QK_K];  // signed grid values; IQ1: 8 * (grid + delta), so -9..9
  float db[16];    // dequantization scale of each 16 values, computed as the reference does
  int ls[16];      // integer sub-scale of each 16 values, for the exact integer dot
  float d;         // the block's f16 scale
  float k;         // constant relating ls to db: db = d * ls * k (up to float rounding)
  bool eighths;    // IQ1: q is in eighths
};

using IqDecodeFn = void (*)(const uint8_t *block, IqDecoded *out);

// nullptr for a type that is not one of the seven.
IqDecodeFn iq_decoder(DType t);

// One super-block's float step, d_w * d_x * isum, rounded to float before it is added: a
// file built with FMA would otherwise fuse the add, and the ISAs would differ in the last bit.
inline float iq_block_term(float dw, float dx, int isum) {
  float t = dw * dx * static_cast<float>(isum);
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(t));  // opaque to the optimiser: nothing is fused across it
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(t));
#endif
  return t;
}

// The frame every ISA's i-quant dot shares: sum over super-blocks of d_w * d_x * isum, times
// the type's constant k. isum(decoded, q8) is the ISA's exact integer part; with the float
// steps fixed (iq_block_term), every ISA gives the same bits.
template <class IntDot>
float iq_dot(DType t, int n, const void *w, const BlockQ8_K *x, IntDot isum) {
  const IqDecodeFn decode = iq_decoder(t);
  const size_t bytes = type_traits(t).type_size;
  const uint8_t *blk = static_cast<const uint8_t *>(w);
  IqDecoded o{};  // o.k is read after the loop
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i, blk += bytes) {
    decode(blk, &o);
    sum += iq_block_term(o.d, x[i].d, isum(o, x[i].qs));
  }
  return o.k * sum;
}

// Dequantize n values (whole super-blocks) of one of the seven types.
void dequantize_row_iq(DType t, const void *src, float *dst, int64_t n);

// Quantize n values (whole super-blocks) into one of the seven types with a simple search
// (quant/iq_quantize.cpp): valid blocks, not the reference quantizer's bytes.
void quantize_row_iq(DType t, const float *x, void *dst, int64_t n);

}  // namespace moe
