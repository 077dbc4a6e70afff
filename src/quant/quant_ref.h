// Reference (scalar) row conversions per format, dispatched from dtype.cpp.
// Each quantizer reproduces GGML's *_ref quantizer bit for bit; each dequantizer its
// dequantize_row_*. n is a multiple of the format's block size.
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace moe {

void dequantize_row_q4_0(const BlockQ4_0 *x, float *y, int64_t n);
void quantize_row_q4_0_ref(const float *x, BlockQ4_0 *y, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0 *x, float *y, int64_t n);
void quantize_row_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t n);
void dequantize_row_q2_K(const BlockQ2_K *x, float *y, int64_t n);
void quantize_row_q2_K_ref(const float *x, BlockQ2_K *y, int64_t n);
void dequantize_row_q3_K(const BlockQ3_K *x, float *y, int64_t n);
void quantize_row_q3_K_ref(const float *x, BlockQ3_K *y, int64_t n);
void dequantize_row_q4_K(const BlockQ4_K *x, float *y, int64_t n);
void quantize_row_q4_K_ref(const float *x, BlockQ4_K *y, int64_t n);
void dequantize_row_q5_K(const BlockQ5_K *x, float *y, int64_t n);
void quantize_row_q5_K_ref(const float *x, BlockQ5_K *y, int64_t n);
void dequantize_row_q6_K(const BlockQ6_K *x, float *y, int64_t n);
void quantize_row_q6_K_ref(const float *x, BlockQ6_K *y, int64_t n);
void dequantize_row_q8_K(const BlockQ8_K *x, float *y, int64_t n);
void quantize_row_q8_K_ref(const float *x, BlockQ8_K *y, int64_t n);
void dequantize_row_mxfp4(const BlockMXFP4 *x, float *y, int64_t n);
void quantize_row_mxfp4_ref(const float *x, BlockMXFP4 *y, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1 *x, float *y, int64_t n);
void quantize_row_q4_1_ref(const float *x, BlockQ4_1 *y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0 *x, float *y, int64_t n);
void quantize_row_q5_0_ref(const float *x, BlockQ5_0 *y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1 *x, float *y, int64_t n);
void quantize_row_q5_1_ref(const float *x, BlockQ5_1 *y, int64_t n);
void dequantize_row_q8_1(const BlockQ8_1 *x, float *y, int64_t n);
void quantize_row_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t n);
// IQ4_NL/IQ4_XS quantize as GGML's quantize_iq4_nl/quantize_iq4_xs without an importance
// matrix (what its quantize tool writes), not as its *_ref variants (which skip the search).
void dequantize_row_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t n);
void quantize_row_iq4_nl(const float *x, BlockIQ4_NL *y, int64_t n);
void dequantize_row_iq4_xs(const BlockIQ4_XS *x, float *y, int64_t n);
void quantize_row_iq4_xs(const float *x, BlockIQ4_XS *y, int64_t n);

}  // namespace moe
