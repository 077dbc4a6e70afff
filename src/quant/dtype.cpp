#include "quant/dtype.h"

#include <cstring>
#include <strings.h>

#include "core/fp16.h"
#include "core/status.h"
#include "quant/iq_decode.h"
#include "quant/quant_ref.h"

namespace moe {

namespace {
struct Entry { uint32_t id; TypeTraits t; };
const Entry kTypes[] = {
    {0, {"f32", 1, 4, false, true, DType::F32}},
    {1, {"f16", 1, 2, false, true, DType::F16}},
    {2, {"q4_0", 32, 18, true, true, DType::Q8_0}},
    {3, {"q4_1", 32, 20, true, true, DType::Q8_1}},
    {6, {"q5_0", 32, 22, true, true, DType::Q8_0}},
    {7, {"q5_1", 32, 24, true, true, DType::Q8_1}},
    {8, {"q8_0", 32, 34, true, true, DType::Q8_0}},
    {9, {"q8_1", 32, 36, true, true, DType::Q8_1}},
    {10, {"q2_K", 256, 84, true, true, DType::Q8_K}},
    {11, {"q3_K", 256, 110, true, true, DType::Q8_K}},
    {12, {"q4_K", 256, 144, true, true, DType::Q8_K}},
    {13, {"q5_K", 256, 176, true, true, DType::Q8_K}},
    {14, {"q6_K", 256, 210, true, true, DType::Q8_K}},
    {15, {"q8_K", 256, 292, true, true, DType::Q8_K}},
    {16, {"iq2_xxs", 256, 66, true, true, DType::Q8_K}},
    {17, {"iq2_xs", 256, 74, true, true, DType::Q8_K}},
    {18, {"iq3_xxs", 256, 98, true, true, DType::Q8_K}},
    {19, {"iq1_s", 256, 50, true, true, DType::Q8_K}},
    {20, {"iq4_nl", 32, 18, true, true, DType::Q8_0}},
    {21, {"iq3_s", 256, 110, true, true, DType::Q8_K}},
    {22, {"iq2_s", 256, 82, true, true, DType::Q8_K}},
    {23, {"iq4_xs", 256, 136, true, true, DType::Q8_K}},
    {24, {"i8", 1, 1, false, false, DType::I8}},
    {25, {"i16", 1, 2, false, false, DType::I16}},
    {26, {"i32", 1, 4, false, false, DType::I32}},
    {27, {"i64", 1, 8, false, false, DType::I64}},
    {28, {"f64", 1, 8, false, false, DType::F64}},
    {29, {"iq1_m", 256, 56, true, true, DType::Q8_K}},
    {30, {"bf16", 1, 2, false, true, DType::BF16}},
    {34, {"tq1_0", 256, 54, true, false, DType::Q8_K}},
    {35, {"tq2_0", 256, 66, true, false, DType::Q8_K}},
    {39, {"mxfp4", 32, 17, true, true, DType::Q8_0}},
};
}  // namespace

bool is_known_dtype(uint32_t id) {
  for (const auto &e : kTypes)
    if (e.id == id) return true;
  return false;
}

const TypeTraits &type_traits(DType t) {
  for (const auto &e : kTypes)
    if (e.id == static_cast<uint32_t>(t)) return e.t;
  static const TypeTraits unknown{"unknown", 1, 0, false, false, DType::F32};
  return unknown;
}

const char *dtype_name(DType t) { return type_traits(t).name; }

bool dtype_from_name(const char *name, DType *out) {
  for (const auto &e : kTypes)
    if (strcasecmp(e.t.name, name) == 0) { *out = static_cast<DType>(e.id); return true; }
  return false;
}

size_t row_size(DType t, int64_t n) {
  const TypeTraits &tr = type_traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

void dequantize_row(DType t, const void *src, float *dst, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      const uint16_t *s = static_cast<const uint16_t *>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case DType::BF16: {
      const uint16_t *s = static_cast<const uint16_t *>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    case DType::Q4_0: dequantize_row_q4_0(static_cast<const BlockQ4_0 *>(src), dst, n); return;
    case DType::Q8_0: dequantize_row_q8_0(static_cast<const BlockQ8_0 *>(src), dst, n); return;
    case DType::Q2_K: dequantize_row_q2_K(static_cast<const BlockQ2_K *>(src), dst, n); return;
    case DType::Q3_K: dequantize_row_q3_K(static_cast<const BlockQ3_K *>(src), dst, n); return;
    case DType::Q4_K: dequantize_row_q4_K(static_cast<const BlockQ4_K *>(src), dst, n); return;
    case DType::Q5_K: dequantize_row_q5_K(static_cast<const BlockQ5_K *>(src), dst, n); return;
    case DType::Q6_K: dequantize_row_q6_K(static_cast<const BlockQ6_K *>(src), dst, n); return;
    case DType::Q8_K: dequantize_row_q8_K(static_cast<const BlockQ8_K *>(src), dst, n); return;
    case DType::MXFP4: dequantize_row_mxfp4(static_cast<const BlockMXFP4 *>(src), dst, n); return;
    case DType::Q4_1: dequantize_row_q4_1(static_cast<const BlockQ4_1 *>(src), dst, n); return;
    case DType::Q5_0: dequantize_row_q5_0(static_cast<const BlockQ5_0 *>(src), dst, n); return;
    case DType::Q5_1: dequantize_row_q5_1(static_cast<const BlockQ5_1 *>(src), dst, n); return;
    case DType::Q8_1: dequantize_row_q8_1(static_cast<const BlockQ8_1 *>(src), dst, n); return;
    case DType::IQ4_NL: dequantize_row_iq4_nl(static_cast<const BlockIQ4_NL *>(src), dst, n); return;
    case DType::IQ4_XS: dequantize_row_iq4_xs(static_cast<const BlockIQ4_XS *>(src), dst, n); return;
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M: dequantize_row_iq(t, src, dst, n); return;
    default: fail(Status::Unsupported, "dequantize: type %s is not supported", dtype_name(t));
  }
}

void quantize_row(DType t, const float *src, void *dst, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      uint16_t *d = static_cast<uint16_t *>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      uint16_t *d = static_cast<uint16_t *>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0: quantize_row_q4_0_ref(src, static_cast<BlockQ4_0 *>(dst), n); return;
    case DType::Q8_0: quantize_row_q8_0_ref(src, static_cast<BlockQ8_0 *>(dst), n); return;
    case DType::Q2_K: quantize_row_q2_K_ref(src, static_cast<BlockQ2_K *>(dst), n); return;
    case DType::Q3_K: quantize_row_q3_K_ref(src, static_cast<BlockQ3_K *>(dst), n); return;
    case DType::Q4_K: quantize_row_q4_K_ref(src, static_cast<BlockQ4_K *>(dst), n); return;
    case DType::Q5_K: quantize_row_q5_K_ref(src, static_cast<BlockQ5_K *>(dst), n); return;
    case DType::Q6_K: quantize_row_q6_K_ref(src, static_cast<BlockQ6_K *>(dst), n); return;
    case DType::Q8_K: quantize_row_q8_K_ref(src, static_cast<BlockQ8_K *>(dst), n); return;
    case DType::MXFP4: quantize_row_mxfp4_ref(src, static_cast<BlockMXFP4 *>(dst), n); return;
    case DType::Q4_1: quantize_row_q4_1_ref(src, static_cast<BlockQ4_1 *>(dst), n); return;
    case DType::Q5_0: quantize_row_q5_0_ref(src, static_cast<BlockQ5_0 *>(dst), n); return;
    case DType::Q5_1: quantize_row_q5_1_ref(src, static_cast<BlockQ5_1 *>(dst), n); return;
    case DType::Q8_1: quantize_row_q8_1_ref(src, static_cast<BlockQ8_1 *>(dst), n); return;
    case DType::IQ4_NL: quantize_row_iq4_nl(src, static_cast<BlockIQ4_NL *>(dst), n); return;
    case DType::IQ4_XS: quantize_row_iq4_xs(src, static_cast<BlockIQ4_XS *>(dst), n); return;
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M: quantize_row_iq(t, src, dst, n); return;
    default: fail(Status::Unsupported, "quantize: type %s is not supported", dtype_name(t));
  }
}

}  // namespace moe
