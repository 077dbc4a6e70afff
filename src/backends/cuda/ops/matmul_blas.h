// Prompt products of quantized dense weights on cuBLAS (f16 tensor cores): the weight matrix
// is dequantized once into f16 scratch, the activations rounded through the weight type's
// activation format (as the CPU does) into f16 (launch_act_round), then one GEMM.
// Why: with hundreds of columns sharing every weight, the int8 MMQ kernels spend their issue
// slots unpacking and rescaling integers per mma; a dequantization pass (a few MB written)
// plus cuBLAS's GEMM costs less. The f16 weights keep ~5e-4 relative error per weight, less
// than the Q8_K activation rounding of the int8 path.
#pragma once
#include <cuda_fp16.h>

#include "backends/cuda/cuda_common.h"
#include "quant/dtype.h"

namespace moe {

// W16[m][k] = the weight, rounded to f16, for the M x K matrix W of type t (rows of row_bytes); t is
// one of the MMQ's block types (cuda_mmq_type_supported), dequantized by quant.cuh dequant32.
void launch_dequant_f16(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int K, int M, __half *W16);

}  // namespace moe
