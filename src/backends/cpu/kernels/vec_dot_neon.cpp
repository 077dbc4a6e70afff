// AArch64 Advanced SIMD kernels. On other targets this file only provides the empty table.
// Int8 products use SDOT when the target has it (__ARM_FEATURE_DOTPROD), else widening
// multiplies with pairwise accumulation; both are exact.
#include "backends/cpu/kernels/vec_dot_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>

#include "core/fp16.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_high_s8(a, b);
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

inline float h2f(uint16_t h) { return fp16_to_fp32(h); }

void dot_f32(int n, float *s, const void *w, const void *x) {
  const float *a = static_cast<const float *>(w), *b = static_cast<const float *>(x);
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
  float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  *s = sum;
}

template <bool kBf16>
inline float32x4_t load_half4(const uint16_t *p) {
  const uint16x4_t h = vld1_u16(p);
  if (kBf16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
  return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

template <bool kBf16>
void dot_half(int n, float *s, const void *w, const void *x) {
  const uint16_t *a = static_cast<const uint16_t *>(w), *b = static_cast<const uint16_t *>(x);
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    acc0 = vfmaq_f32(acc0, load_half4<kBf16>(a + i), load_half4<kBf16>(b + i));
    acc1 = vfmaq_f32(acc1, load_half4<kBf16>(a + i + 4), load_half4<kBf16>(b + i + 4));
  }
  float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
  for (; i < n; ++i)
    sum += kBf16 ? bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]) : fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
  *s = sum;
}

void dot_q8_0(int n, float *s, const void *w, const void *x) {
  const BlockQ8_0 *a = static_cast<const BlockQ8_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float32x4_t acc = vdupq_n_f32(0);
  for (int i = 0; i < n / QK8_0; ++i) {
    int32x4_t p = dot16(vdupq_n_s32(0), vld1q_s8(a[i].qs), vld1q_s8(b[i].qs));
    p = dot16(p, vld1q_s8(a[i].qs + 16), vld1q_s8(b[i].qs + 16));
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(a[i].d) * h2f(b[i].d));
  }
  *s = vaddvq_f32(acc);
}

void dot_q4_0(int n, float *s, const void *w, const void *x) {
  const BlockQ4_0 *a = static_cast<const BlockQ4_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  float32x4_t acc = vdupq_n_f32(0);
  for (int i = 0; i < n / QK4_0; ++i) {
    const uint8x16_t q = vld1q_u8(a[i].qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, m4)), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
    int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(b[i].qs));
    p = dot16(p, hi, vld1q_s8(b[i].qs + 16));
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(a[i].d) * h2f(b[i].d));
  }
  *s = vaddvq_f32(acc);
}

void dot_mxfp4(int n, float *s, const void *w, const void *x) {
  const BlockMXFP4 *a = static_cast<const BlockMXFP4 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  const int8x16_t table = vld1q_s8(kMxfp4Values);
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  float32x4_t acc = vdupq_n_f32(0);
  for (int i = 0; i < n / QK_MXFP4; ++i) {
    const uint8x16_t q = vld1q_u8(a[i].qs);
    const int8x16_t lo = vqtbl1q_s8(table, vandq_u8(q, m4));
    const int8x16_t hi = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
    int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(b[i].qs));
    p = dot16(p, hi, vld1q_s8(b[i].qs + 16));
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(b[i].d) * e8m0_to_fp32_half(a[i].e));
  }
  *s = vaddvq_f32(acc);
}

// sum_g bsums[g] * m[g] (16 groups).
inline int bsums_dot(const int16_t *bsums, const int16_t *m) {
  int32x4_t acc = vmull_s16(vld1_s16(bsums), vld1_s16(m));
  acc = vmlal_s16(acc, vld1_s16(bsums + 4), vld1_s16(m + 4));
  acc = vmlal_s16(acc, vld1_s16(bsums + 8), vld1_s16(m + 8));
  acc = vmlal_s16(acc, vld1_s16(bsums + 12), vld1_s16(m + 12));
  return vaddvq_s32(acc);
}

template <bool kFive>
void dot_q45_K(int n, float *s, const void *w, const void *x) {
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const size_t stride = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const uint8_t *base = static_cast<const uint8_t *>(w);
  const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const uint8_t *blk = base + i * stride;
    uint16_t dh, dminh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&dminh, blk + 2, 2);
    uint8_t sc[8], mn[8];
    unpack_q4k_scales(blk + 4, sc, mn);
    int16_t m16[16];
    for (int g = 0; g < 16; ++g) m16[g] = mn[g / 2];
    const int summ = bsums_dot(b[i].bsums, m16);
    const uint8_t *qh = blk + 4 + K_SCALE_SIZE;
    const uint8_t *qs = qh + (kFive ? QK_K / 8 : 0);
    const uint8x16_t h0 = kFive ? vld1q_u8(qh) : vdupq_n_u8(0), h1 = kFive ? vld1q_u8(qh + 16) : vdupq_n_u8(0);
    const int8_t *q8 = b[i].qs;
    int isum = 0;
    for (int c = 0; c < 4; ++c, qs += 32, q8 += 64) {
      const uint8x16_t a0 = vld1q_u8(qs), a1 = vld1q_u8(qs + 16);
      uint8x16_t lo0 = vandq_u8(a0, m4), lo1 = vandq_u8(a1, m4);
      uint8x16_t hi0 = vshrq_n_u8(a0, 4), hi1 = vshrq_n_u8(a1, 4);
      if (kFive) {
        const int8x16_t sl = vdupq_n_s8(static_cast<int8_t>(-2 * c)), sh = vdupq_n_s8(static_cast<int8_t>(-2 * c - 1));
        lo0 = vorrq_u8(lo0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, sl), one), 4));
        lo1 = vorrq_u8(lo1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, sl), one), 4));
        hi0 = vorrq_u8(hi0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, sh), one), 4));
        hi1 = vorrq_u8(hi1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, sh), one), 4));
      }
      int32x4_t plo = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(lo0), vld1q_s8(q8));
      plo = dot16(plo, vreinterpretq_s8_u8(lo1), vld1q_s8(q8 + 16));
      int32x4_t phi = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(hi0), vld1q_s8(q8 + 32));
      phi = dot16(phi, vreinterpretq_s8_u8(hi1), vld1q_s8(q8 + 48));
      isum += sc[2 * c] * vaddvq_s32(plo) + sc[2 * c + 1] * vaddvq_s32(phi);
    }
    sum += (h2f(dh) * b[i].d) * isum - (h2f(dminh) * b[i].d) * summ;
  }
  *s = sum;
}

void dot_q6_K(int n, float *s, const void *w, const void *x) {
  const BlockQ6_K *a = static_cast<const BlockQ6_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
  const int8x16_t off = vdupq_n_s8(32);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const int8_t *sc = a[i].scales;
    const int8_t *q8 = b[i].qs;
    int isum = 0;
    for (int half = 0; half < 2; ++half, q8 += 128, sc += 8) {
      const uint8_t *ql = a[i].ql + 64 * half, *qh = a[i].qh + 32 * half;
      for (int k = 0; k < 2; ++k) {  // 16-value column k of each quarter
        const uint8x16_t l0 = vld1q_u8(ql + 16 * k), l1 = vld1q_u8(ql + 32 + 16 * k);
        const uint8x16_t h = vld1q_u8(qh + 16 * k);
        const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(h, m3), 4))), off);
        const int8x16_t q2 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 2), m3), 4))), off);
        const int8x16_t q3 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 4), m3), 4))), off);
        const int8x16_t q4 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(h, 6), 4))), off);
        isum += sc[0 + k] * vaddvq_s32(dot16(vdupq_n_s32(0), q1, vld1q_s8(q8 + 16 * k)));
        isum += sc[2 + k] * vaddvq_s32(dot16(vdupq_n_s32(0), q2, vld1q_s8(q8 + 32 + 16 * k)));
        isum += sc[4 + k] * vaddvq_s32(dot16(vdupq_n_s32(0), q3, vld1q_s8(q8 + 64 + 16 * k)));
        isum += sc[6 + k] * vaddvq_s32(dot16(vdupq_n_s32(0), q4, vld1q_s8(q8 + 96 + 16 * k)));
      }
    }
    sum += (h2f(a[i].d) * b[i].d) * isum;
  }
  *s = sum;
}

}  // namespace

// Q2_K/Q3_K use the scalar kernels on NEON for now.
VecDotFn vec_dot_kernel_neon(DType t) {
  switch (t) {
    case DType::F32: return dot_f32;
    case DType::F16: return dot_half<false>;
    case DType::BF16: return dot_half<true>;
    case DType::Q4_0: return dot_q4_0;
    case DType::Q8_0: return dot_q8_0;
    case DType::MXFP4: return dot_mxfp4;
    case DType::Q4_K: return dot_q45_K<false>;
    case DType::Q5_K: return dot_q45_K<true>;
    case DType::Q6_K: return dot_q6_K;
    default: return vec_dot_extra_kernel_neon(t);
  }
}

}  // namespace moe

#else

namespace moe {
VecDotFn vec_dot_kernel_neon(DType) { return nullptr; }
}  // namespace moe

#endif
