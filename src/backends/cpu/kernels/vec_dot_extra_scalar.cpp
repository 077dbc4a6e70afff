// Portable dot kernels for Q4_1, Q5_0, Q5_1 (against Q8_1 / Q8_0 / Q8_1) and IQ4_NL, IQ4_XS
// (against Q8_0 / Q8_K). Same per-block decomposition and float order as GGML's generic
// kernels: exact integer sums per block, then d_w * d_x * sum (+ m_w * s_x for the formats
// with a min).
#include <cstring>

#include "backends/cpu/kernels/vec_dot_impl.h"
#include "core/fp16.h"
#include "quant/iq_decode.h"
#include "quant/quant_util.h"

namespace moe {

namespace {

// Integer dot of one 32-value block of 4-bit codes (plus fifth bits from qh, minus bias)
// with 32 int8 activations.
inline int block_isum(const uint8_t *qs, uint32_t qh, int bias, const int8_t *q8) {
  int sum = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = ((qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4)) - bias;
    const int hi = ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - bias;
    sum += lo * q8[j] + hi * q8[j + 16];
  }
  return sum;
}

inline uint32_t qh_word(const uint8_t *qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dot_q4_1(int n, float *s, const void *w, const void *x) {
  const BlockQ4_1 *a = static_cast<const BlockQ4_1 *>(w);
  const BlockQ8_1 *b = static_cast<const BlockQ8_1 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK4_1; ++i) {
    const int isum = block_isum(a[i].qs, 0, 0, b[i].qs);
    sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * isum + fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
  }
  *s = sum;
}

void dot_q5_0(int n, float *s, const void *w, const void *x) {
  const BlockQ5_0 *a = static_cast<const BlockQ5_0 *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK5_0; ++i) {
    const int isum = block_isum(a[i].qs, qh_word(a[i].qh), 16, b[i].qs);
    sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * isum;
  }
  *s = sum;
}

void dot_q5_1(int n, float *s, const void *w, const void *x) {
  const BlockQ5_1 *a = static_cast<const BlockQ5_1 *>(w);
  const BlockQ8_1 *b = static_cast<const BlockQ8_1 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK5_1; ++i) {
    const int isum = block_isum(a[i].qs, qh_word(a[i].qh), 0, b[i].qs);
    sum += (fp16_to_fp32(a[i].d) * fp16_to_fp32(b[i].d)) * isum + fp16_to_fp32(a[i].m) * fp16_to_fp32(b[i].s);
  }
  *s = sum;
}

// 32 table-coded values (IQ4 nibble order) against 32 int8 activations.
inline int iq4_isum(const uint8_t *qs, const int8_t *q8) {
  int s1 = 0, s2 = 0;
  for (int j = 0; j < 16; ++j) {
    s1 += q8[j] * kIq4nlValues[qs[j] & 0xF];
    s2 += q8[j + 16] * kIq4nlValues[qs[j] >> 4];
  }
  return s1 + s2;
}

void dot_iq4_nl(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_NL *a = static_cast<const BlockIQ4_NL *>(w);
  const BlockQ8_0 *b = static_cast<const BlockQ8_0 *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK4_NL; ++i)
    sum += (fp16_to_fp32(b[i].d) * fp16_to_fp32(a[i].d)) * iq4_isum(a[i].qs, b[i].qs);
  *s = sum;
}

void dot_iq4_xs(int n, float *s, const void *w, const void *x) {
  const BlockIQ4_XS *a = static_cast<const BlockIQ4_XS *>(w);
  const BlockQ8_K *b = static_cast<const BlockQ8_K *>(x);
  float sum = 0;
  for (int i = 0; i < n / QK_K; ++i) {
    const float d4d8 = fp16_to_fp32(a[i].d) * b[i].d;
    for (int g = 0; g < QK_K / 32; ++g) {
      const float dl = d4d8 * (iq4xs_scale(a[i].scales_l, a[i].scales_h, g) - 32);
      sum += dl * iq4_isum(a[i].qs + 16 * g, b[i].qs + 32 * g);
    }
  }
  *s = sum;
}

// 1-, 2-, 3-bit i-quants: decoded per super-block, then an exact integer sum with the
// per-16 integer scales (the reference sums the same integers; only where its float steps
// fall differs).
template <DType T>
void dot_iq_grid(int n, float *s, const void *w, const void *x) {
  *s = iq_dot(T, n, w, static_cast<const BlockQ8_K *>(x), [](const IqDecoded &o, const int8_t *q8) {
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) gs += o.q[j] * q8[j];
      isum += o.ls[g] * gs;
    }
    return isum;
  });
}

}  // namespace

VecDotFn vec_dot_extra_kernel_scalar(DType t) {
  switch (t) {
    case DType::Q4_1: return dot_q4_1;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q5_1: return dot_q5_1;
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
