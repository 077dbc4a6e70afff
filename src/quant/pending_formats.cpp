// TEMPORARY: formats not yet implemented; the quant work replaces this file.
#include "core/status.h"
#include "quant/quant_ref.h"

namespace moe {
#define MOE_PENDING(fn, T, U) void fn(const T *, U *, int64_t) { fail(Status::Unsupported, #fn " not implemented yet"); }
MOE_PENDING(dequantize_row_q4_0, BlockQ4_0, float)
MOE_PENDING(quantize_row_q4_0_ref, float, BlockQ4_0)
MOE_PENDING(dequantize_row_q2_K, BlockQ2_K, float)
MOE_PENDING(quantize_row_q2_K_ref, float, BlockQ2_K)
MOE_PENDING(dequantize_row_q3_K, BlockQ3_K, float)
MOE_PENDING(quantize_row_q3_K_ref, float, BlockQ3_K)
MOE_PENDING(dequantize_row_q4_K, BlockQ4_K, float)
MOE_PENDING(quantize_row_q4_K_ref, float, BlockQ4_K)
MOE_PENDING(dequantize_row_q5_K, BlockQ5_K, float)
MOE_PENDING(quantize_row_q5_K_ref, float, BlockQ5_K)
MOE_PENDING(dequantize_row_q6_K, BlockQ6_K, float)
MOE_PENDING(quantize_row_q6_K_ref, float, BlockQ6_K)
MOE_PENDING(dequantize_row_q8_K, BlockQ8_K, float)
MOE_PENDING(quantize_row_q8_K_ref, float, BlockQ8_K)
MOE_PENDING(dequantize_row_mxfp4, BlockMXFP4, float)
MOE_PENDING(quantize_row_mxfp4_ref, float, BlockMXFP4)
}  // namespace moe
