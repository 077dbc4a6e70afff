// Tensor element types with the GGUF/GGML numbering, and the reference (scalar, bit-exact)
// row conversions for each. Fast dot-product kernels live in the CPU backend
// (src/backends/cpu/kernels/); this file is the format definition every component shares.
//
//   const TypeTraits &t = type_traits(DType::Q4_K);       // block 256, 144 bytes
//   size_t bytes = row_size(DType::Q4_K, 2048);            // 8 blocks -> 1152
//   dequantize_row(DType::Q4_K, src, out, 2048);
//   quantize_row(DType::Q8_0, x, dst, n);                  // reference quantizer
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

// Values are the GGML type ids stored in GGUF tensor infos.
enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, IQ1_M = 29,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30, MXFP4 = 39,
};

struct TypeTraits {
  const char *name;       // "q4_K" etc., as GGML names it
  int64_t block_size;     // elements per block (1 for plain types)
  size_t type_size;       // bytes per block
  bool is_quantized;
  bool supported;         // we can dequantize / compute with it
  DType vec_dot_type;     // activation type the dot kernels take against this weight type
};

// Known GGML type ids: is_known_dtype() is what the GGUF reader validates against.
bool is_known_dtype(uint32_t id);
const TypeTraits &type_traits(DType t);
const char *dtype_name(DType t);
bool dtype_from_name(const char *name, DType *out);  // "f16", "q8_0", "q4_k" (case-insensitive)

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t row_size(DType t, int64_t n);

// Reference conversions (scalar; defined per format in src/quant/*.cpp).
void dequantize_row(DType t, const void *src, float *dst, int64_t n);
void quantize_row(DType t, const float *src, void *dst, int64_t n);

// Block sizes used by the formats.
constexpr int QK4_0 = 32;
constexpr int QK8_0 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;
constexpr int QK_MXFP4 = 32;
constexpr int QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_1 = 32, QK4_NL = 32;

// GGML block layouts (little endian; d/dmin are IEEE half unless noted).
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[QK8_0]; };
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d; uint16_t dmin; };
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };  // e: E8M0 shared exponent
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[QK4_1 / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };  // qh: bit j = 5th bit of element j
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[QK8_1]; };  // s = d * sum(qs)
struct BlockIQ4_NL { uint16_t d; uint8_t qs[QK4_NL / 2]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
// I-quants (super-blocks of 256; grids in quant/iq_grids.h). IQ1_M keeps its f16 scale in the
// top nibbles of the four 16-bit words of scales.
struct BlockIQ2_XXS { uint16_t d; uint16_t qs[QK_K / 8]; };
struct BlockIQ2_XS { uint16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; };
struct BlockIQ2_S { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; };
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[3 * QK_K / 8]; };
struct BlockIQ3_S { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; };
struct BlockIQ1_S { uint16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; };
struct BlockIQ1_M { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; };

static_assert(sizeof(BlockQ4_0) == 18, "q4_0 layout");
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 layout");
static_assert(sizeof(BlockQ2_K) == 84, "q2_K layout");
static_assert(sizeof(BlockQ3_K) == 110, "q3_K layout");
static_assert(sizeof(BlockQ4_K) == 144, "q4_K layout");
static_assert(sizeof(BlockQ5_K) == 176, "q5_K layout");
static_assert(sizeof(BlockQ6_K) == 210, "q6_K layout");
static_assert(sizeof(BlockQ8_K) == 292, "q8_K layout");
static_assert(sizeof(BlockMXFP4) == 17, "mxfp4 layout");
static_assert(sizeof(BlockQ4_1) == 20, "q4_1 layout");
static_assert(sizeof(BlockQ5_0) == 22, "q5_0 layout");
static_assert(sizeof(BlockQ5_1) == 24, "q5_1 layout");
static_assert(sizeof(BlockQ8_1) == 36, "q8_1 layout");
static_assert(sizeof(BlockIQ4_NL) == 18, "iq4_nl layout");
static_assert(sizeof(BlockIQ4_XS) == 136, "iq4_xs layout");
static_assert(sizeof(BlockIQ2_XXS) == 66, "iq2_xxs layout");
static_assert(sizeof(BlockIQ2_XS) == 74, "iq2_xs layout");
static_assert(sizeof(BlockIQ2_S) == 82, "iq2_s layout");
static_assert(sizeof(BlockIQ3_XXS) == 98, "iq3_xxs layout");
static_assert(sizeof(BlockIQ3_S) == 110, "iq3_s layout");
static_assert(sizeof(BlockIQ1_S) == 50, "iq1_s layout");
static_assert(sizeof(BlockIQ1_M) == 56, "iq1_m layout");

}  // namespace moe
