// MatMulHeads (per-head matrices, MLA's absorbed k_b / v_b) on CUDA: few tokens on the
// warp-per-row kernel of matmul.cu, many on the tensor-core GEMMs with each head as an
// "expert" that every token visits (matmul_heads.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace moe {

// Warp-per-row kernel, activations rounded on the fly (matmul.cu). With `concat` (a Concat
// whose first operand is this product, cuda_fusion.h: HeadsConcat) the product's rows are
// written into the Concat's output and the launch copies the Concat's second operand after them.
void cuda_matmul_heads_rows(const CudaOpCtx &c, const Node *concat = nullptr);

// The HeadsConcat group (c: the product's node): false where the product takes the tensor-core
// path (many tokens; the caller then runs the two nodes unfused).
bool cuda_fused_heads_concat(const CudaOpCtx &c, const Node &concat);

// act_round_kernel of matmul.cu over `rows` activation rows of x (row r = element (r % ne1,
// r / ne1 % ne2, ...) of x's rows), K values each, rounded through vdt (see cuda_op_matmul):
// f32 values (f16 with out_f16) into out[r K ..] when q_out is null, else integers into q_out and per-16 (scale,
// sum) into s_out. Launched with PDL.
void launch_act_round(const LaunchStream &s, const TView &x, int64_t rows, int64_t K, DType vdt, void *out, void *q_out, bool q_int8,
                      float2 *s_out, bool out_f16 = false);

// Scratch of the tensor-core path (0 where the node stays on the warp kernel, as on devices
// without cuda_tensor_core_gemm for the type).
size_t cuda_matmul_heads_work_size(const Graph &g, const Node &n, const CudaPaths &paths);

}  // namespace moe
