// Portable scalar dot kernels. Integer parts are summed exactly per (sub-)block, then
// scaled in float, the same decomposition GGML's generic kernels use.
#include <cstring>

#include "backends/cpu/kernels/vec_dot_impl.h"
#include "core/fp16.h"
#include "quant/quant_util.h"

namespace moe {

E8m0HalfTable::E8m0HalfTable() {
  for (int e = 0; e < 256; ++e) v[e] = e8m0_to_fp32_half(static_cast<uint8_t>(e));
}
const E8m0HalfTable kE8m0Half;

namespace {

void dot_f32(int n, float *s, const void *w, const void *x) {
  const float *a = static_cast<const float *>(w), *b = static_cast<const float *>(x);
  double sum = 0;  // GGML's scalar path also accumulates in double
  for (int i = 0; i < n; ++i) sum += static_cast<double>(a[i] * b[i]);
  *s = static_cast<float>(sum);
}

void dot_f16(int n, float *s, const void *w, const void *x) {
  const uint16_t *a = static_cast<const uint16_t *>(w), *b = static_cast<const uint16_t *>(x);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]));
  *s = static_cast<float>(sum);
}

void dot_bf16(int n, float *s, const void *w, const void *x) {
  const uint16_t *a = static_cast<const uint16_t *>(w), *b = static_cast<const uint16_t *>(x);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
  *s = static_cast<float>(sum);
}

void dot_q4_0(int n, float *s, const void *w, const void *x) {
  const BlockQ4_0 *a = static_cast<const BlockQ4_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((a[i].qs[j] & 0xF) - 8) * b[i].qs[j];
      sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
    }
    sum += sumi * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  *s = sum;
}

void dot_q8_0(int n, float *s, const void *w, const void *x) {
  const BlockQ8_0 *a = static_cast<const BlockQ8_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += a[i].qs[j] * b[i].qs[j];
    sum += sumi * (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d));
  }
  *s = sum;
}

void dot_mxfp4(int n, float *s, const void *w, const void *x) {
  const BlockMXFP4 *a = static_cast<const BlockMXFP4 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK_MXFP4; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += kMxfp4Values[a[i].qs[j] & 0xF] * b[i].qs[j];
      sumi += kMxfp4Values[a[i].qs[j] >> 4] * b[i].qs[j + 16];
    }
    sum += sumi * (fp16_to_fp32(b[i].d) * e8m0_to_fp32_half(a[i].e));
  }
  *s = sum;
}

void dot_q2_K(int n, float *s, const void *w, const void *x) {
  const BlockQ2_K *a = static_cast<const BlockQ2_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const uint8_t *sc = a[i].scales;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += b[i].bsums[j] * (sc[j] >> 4);
    int isum = 0;
    const int8_t *q8 = b[i].qs;
    for (int half = 0; half < 2; ++half) {
      const uint8_t *q2 = a[i].qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2) {
        for (int k = 0; k < 2; ++k, q8 += 16) {
          int isuml = 0;
          for (int l = 0; l < 16; ++l) isuml += q8[l] * ((q2[16 * k + l] >> shift) & 3);
          isum += (*sc++ & 0xF) * isuml;
        }
      }
    }
    const float dall = b[i].d * fp16_to_fp32(a[i].d);
    const float dmin = b[i].d * fp16_to_fp32(a[i].dmin);
    sum += dall * isum - dmin * summs;
  }
  *s = sum;
}

void dot_q3_K(int n, float *s, const void *w, const void *x) {
  const BlockQ3_K *a = static_cast<const BlockQ3_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    int8_t sc[16];
    unpack_q3k_scales(a[i].scales, sc);
    const int8_t *q8 = b[i].qs;
    int isum = 0, is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half) {
      const uint8_t *q3 = a[i].qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int k = 0; k < 2; ++k, q8 += 16) {
          int isuml = 0;
          for (int l = 16 * k; l < 16 * k + 16; ++l)
            isuml += q8[l - 16 * k] * (((q3[l] >> shift) & 3) - ((a[i].hmask[l] & m) ? 0 : 4));
          isum += sc[is++] * isuml;
        }
      }
    }
    sum += (fp16_to_fp32(a[i].d) * b[i].d) * isum;
  }
  *s = sum;
}

// Q4_K and Q5_K share everything but the fifth bit.
template <bool kFive>
void dot_q45_K(int n, float *s, const void *w, const void *x) {
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  const size_t stride = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const uint8_t *base = static_cast<const uint8_t *>(w);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const uint8_t *blk = base + i * stride;
    uint16_t dh, dminh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&dminh, blk + 2, 2);
    const uint8_t *scales = blk + 4;
    const uint8_t *qh = kFive ? blk + 4 + K_SCALE_SIZE : nullptr;
    const uint8_t *qs = blk + 4 + K_SCALE_SIZE + (kFive ? QK_K / 8 : 0);
    uint8_t sc[8], mn[8];
    unpack_q4k_scales(scales, sc, mn);
    int summ = 0;
    for (int j = 0; j < 16; ++j) summ += b[i].bsums[j] * mn[j / 2];
    int isum = 0;
    const int8_t *q8 = b[i].qs;
    for (int c = 0; c < 4; ++c, qs += 32) {
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        int lo = qs[l] & 0xF, hi = qs[l] >> 4;
        if (kFive) {
          lo += (qh[l] >> (2 * c)) & 1 ? 16 : 0;
          hi += (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0;
        }
        s0 += lo * q8[l];
        s1 += hi * q8[l + 32];
      }
      isum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
      q8 += 64;
    }
    const float d = fp16_to_fp32(dh) * b[i].d;
    const float dmin = fp16_to_fp32(dminh) * b[i].d;
    sum += d * isum - dmin * summ;
  }
  *s = sum;
}

void dot_q6_K(int n, float *s, const void *w, const void *x) {
  const BlockQ6_K *a = static_cast<const BlockQ6_K *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const uint8_t *ql = a[i].ql, *qh = a[i].qh;
    const int8_t *q8 = b[i].qs;
    int isum = 0;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, q8 += 128) {
      int sub[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 16-value groups of this half
      for (int l = 0; l < 32; ++l) {
        const int g = l / 16;
        sub[g + 0] += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * q8[l];
        sub[g + 2] += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * q8[l + 32];
        sub[g + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * q8[l + 64];
        sub[g + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * q8[l + 96];
      }
      for (int g = 0; g < 8; ++g) isum += a[i].scales[8 * half + g] * sub[g];
    }
    sum += (fp16_to_fp32(a[i].d) * b[i].d) * isum;
  }
  *s = sum;
}

}  // namespace

VecDotFn vec_dot_kernel_scalar(DType t) {
  switch (t) {
    case DType::F32: return dot_f32;
    case DType::F16: return dot_f16;
    case DType::BF16: return dot_bf16;
    case DType::Q4_0: return dot_q4_0;
    case DType::Q8_0: return dot_q8_0;
    case DType::MXFP4: return dot_mxfp4;
    case DType::Q2_K: return dot_q2_K;
    case DType::Q3_K: return dot_q3_K;
    case DType::Q4_K: return dot_q45_K<false>;
    case DType::Q5_K: return dot_q45_K<true>;
    case DType::Q6_K: return dot_q6_K;
    default: return vec_dot_extra_kernel_scalar(t);
  }
}

}  // namespace moe
