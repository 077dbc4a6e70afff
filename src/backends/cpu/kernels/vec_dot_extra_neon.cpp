// AArch64 Advanced SIMD kernels for Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (activation formats
// as in vec_dot_extra_scalar.cpp). On other targets this file only provides the empty table.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>

#include "core/fp16.h"
#include "quant/iq_decode.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

// Exact int8 dot of 16 lanes into 4 int32 partial sums.
inline int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}

// Codes of elements 0..15 (lo) and 16..31 (hi), with the Q5 fifth bit added when qh != null.
inline void codes32(const uint8_t *qs, const uint8_t *qh, int8x16_t *lo, int8x16_t *hi) {
  const uint8x16_t q = vld1q_u8(qs);
  uint8x16_t l = vandq_u8(q, vdupq_n_u8(0x0F)), h = vshrq_n_u8(q, 4);
  if (qh) {
    uint32_t w;
    std::memcpy(&w, qh, 4);
    static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t kIdx[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    const uint8x16_t bits = vld1q_u8(kBit), idx = vld1q_u8(kIdx);
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(w));
    const uint8x16_t b_lo = vqtbl1q_u8(bytes, idx);
    const uint8x16_t b_hi = vqtbl1q_u8(bytes, vaddq_u8(idx, vdupq_n_u8(2)));
    l = vorrq_u8(l, vandq_u8(vtstq_u8(b_lo, bits), vdupq_n_u8(0x10)));
    h = vorrq_u8(h, vandq_u8(vtstq_u8(b_hi, bits), vdupq_n_u8(0x10)));
  }
  *lo = vreinterpretq_s8_u8(l);
  *hi = vreinterpretq_s8_u8(h);
}

inline int32x4_t block_dot(int8x16_t lo, int8x16_t hi, const int8_t *q8) {
  return sdot16(sdot16(vdupq_n_s32(0), lo, vld1q_s8(q8)), hi, vld1q_s8(q8 + 16));
}

// Q4_1 / Q5_1 against Q8_1; codes are 0..31, so the signed int8 dot is exact.
template <bool kFive>
void dot_with_min(int n, float *s, const void *w, const void *x) {
  const uint8_t *blk = static_cast<const uint8_t *>(w);
  const size_t bytes = kFive ? sizeof(BlockQ5_1) : sizeof(BlockQ4_1);
  const BlockQ8_1 *b = static_cast<const BlockQ8_1 *>(x);
  float32x4_t acc = vdupq_n_f32(0);
  float mins = 0;
  for (int i = 0; i < n / 32; ++i, blk += bytes) {
    uint16_t d, m;
    std::memcpy(&d, blk, 2);
    std::memcpy(&m, blk + 2, 2);
    int8x16_t lo, hi;
    codes32(blk + (kFive ? 8 : 4), kFive ? blk + 4 : nullptr, &lo, &hi);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(block_dot(lo, hi, b[i].qs)), fp16_to_fp32(d) * fp16_to_fp32(b[i].d));
    mins += fp16_to_fp32(m) * fp16_to_fp32(b[i].s);
  }
  *s = vaddvq_f32(acc) + mins;
}

void dot_q5_0(int n, float *s, const void *w, const void *x) {
  const BlockQ5_0 *a = static_cast<const BlockQ5_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const int8x16_t sixteen = vdupq_n_s8(16);
  float32x4_t acc = vdupq_n_f32(0);
  for (int i = 0; i < n / QK5_0; ++i) {
    int8x16_t lo, hi;
    codes32(a[i].qs, a[i].qh, &lo, &hi);
    const int32x4_t p = block_dot(vsubq_s8(lo, sixteen), vsubq_s8(hi, sixteen), b[i].qs);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  *s = vaddvq_f32(acc);
}

inline int32x4_t iq4_block_dot(int8x16_t table, const uint8_t *qs, const int8_t *q8) {
  int8x16_t lo, hi;
  codes32(qs, nullptr, &lo, &hi);
  return block_dot(vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)), vqtbl1q_s8(table, vreinterpretq_u8_s8(hi)), q8);
}

void dot_iq4_nl(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_NL *a = static_cast<const BlockIQ4_NL *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const int8x16_t table = vld1q_s8(kIq4nlValues);
  float32x4_t acc = vdupq_n_f32(0);
  for (int i = 0; i < n / QK4_NL; ++i)
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(iq4_block_dot(table, a[i].qs, b[i].qs)),
                      fp16_to_fp32(b[i].d) * fp16_to_fp32(a[i].d));
  *s = vaddvq_f32(acc);
}

void dot_iq4_xs(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_XS *a = static_cast<const BlockIQ4_XS *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const int8x16_t table = vld1q_s8(kIq4nlValues);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int g = 0; g < QK_K / 32; ++g) {
      const int ls = iq4xs_scale(a[i].scales_l, a[i].scales_h, g) - 32;
      isum = vmlaq_n_s32(isum, iq4_block_dot(table, a[i].qs + 16 * g, b[i].qs + 32 * g), ls);
    }
    sum += fp16_to_fp32(a[i].d) * b[i].d * static_cast<float>(vaddvq_s32(isum));
  }
  *s = sum;
}

// 1-, 2-, 3-bit i-quants: table decode per super-block, then 16-lane int8 products with
// the per-16 integer scales.
template <DType T>
void dot_iq_grid(int n, float *s, const void *w, const void *x) {
  *s = iq_dot(T, n, w, static_cast<const BlockQ8_K *>(x), [](const IqDecoded &o, const int8_t *q8) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int g = 0; g < 16; ++g)
      isum = vmlaq_n_s32(isum, sdot16(vdupq_n_s32(0), vld1q_s8(o.q + 16 * g), vld1q_s8(q8 + 16 * g)), o.ls[g]);
    return vaddvq_s32(isum);
  });
}

}  // namespace

VecDotFn vec_dot_extra_kernel_neon(DType t) {
  switch (t) {
    case DType::Q4_1: return dot_with_min<false>;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q5_1: return dot_with_min<true>;
    case DType::IQ4_NL: return dot_iq4_nl;
    case DType::IQ4_XS: return dot_iq4_xs;
    case DType::IQ2_XXS: return dot_iq_grid<DType::IQ2_XXS>;
    case DType::IQ2_XS: return dot_iq_grid<DType::IQ2_XS>;
    case DType::IQ2_S: return dot_iq_grid<DType::IQ2_S>;
    case DType::IQ3_XXS: return dot_iq_grid<DType::IQ3_XXS>;
    case DType::IQ3_S: return dot_iq_grid<DType::IQ3_S>;
    case DType::IQ1_S: return dot_iq_grid<DType::IQ1_S>;
    case DType::IQ1_M: return dot_iq_grid<DType::IQ1_M>;
    default: return nullptr;
  }
}

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_extra_kernel_neon(DType) { return nullptr; }
}  // namespace moe

#endif
