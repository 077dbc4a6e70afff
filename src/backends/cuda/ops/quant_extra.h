// MatMul, MatMulId, MatMulHeads and GetRows on CUDA for the weight types without an MMQ / fused mat-vec path
// (Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M).
// cuda_dispatch.cpp sends their nodes here; matvec.cu's launchers of the fused one-token
// groups (cuda_fusion.h: gate/up + SwiGLU, down + combine [+ Add], MatMul + Add, MatVecs) hand
// groups of these types to cuda_extra_fused_* below.
//
//   if (cuda_extra_type(w.type)) { size = cuda_extra_matmul_work_size(g, n, tuning, paths); ... cuda_op_matmul_extra(c); }
//
// Paths (quant_extra.cu):
//   * activations are rounded into the CPU's activation blocks for the type (its vec_dot_type:
//     Q8_1 for Q4_1 / Q5_1, Q8_0 for Q5_0 / IQ4_NL, Q8_K for the 256-blocks), int8 + scales;
//   * MatMul, MatMulId: a warp per weight row dots each 32-weight sub-block, decoded to int8,
//     with up to 8 activation columns (dp4a; the CPU's per-block integer sums and float steps);
//     one token, a few tokens, and MatMulId's expert tiles (routed on the device, matmul_route.h)
//     take this kernel;
//   * on sm_80+ (cuda_mmq_i8_extra_gemm), dense MatMul of >= kMmaMinCols columns and MatMulId of
//     >= kMmaMinEntries entries: the int8 tensor-core GEMM of the K-quants (matmul_mmq_i8.cu,
//     staging in mmq_i8_extra.cuh), the same integers and the CPU's float steps per block;
//   * dense MatMul of >= GpuTuning::blas_min_tokens columns with a cuBLAS handle (before the MMQ): the weights
//     dequantized to f16 (the CPU's values, rounded once) and one cuBLAS GEMM, as matmul.cu
//     does for the MMQ types;
//   * GetRows: the CPU's dequantized values, bit for bit.
//   * MatMulHeads: head h as expert h on the same kernel (token tiles of 8 per head).
// A type in neither this list nor the MMQ one is refused when the graph is compiled, naming the
// op and the type.
#pragma once
#include "backends/cuda/cuda_ops.h"

namespace moe {

bool cuda_extra_type(DType t);
// Scratch for n under tuning on a device taking paths (the launch makes the same choices).
size_t cuda_extra_matmul_work_size(const Graph &g, const Node &n, const GpuTuning &tuning, const CudaPaths &paths);
// MatMulHeads nodes of these types whose shape the kernel takes (x [K, H, T], f32 output rows).
bool cuda_extra_heads_supported(const Graph &g, const Node &n);
void cuda_op_matmul_extra(const CudaOpCtx &c);  // MatMul, MatMulId and MatMulHeads
void cuda_op_get_rows_extra(const CudaOpCtx &c);

// One-token fused groups (cuda_fusion.h) of these types in one launch each, the unfused
// products bit for bit; false: not taken (another type, a shape they do not take), nothing
// launched. gate/up: MatMulId x2 (or MatMul x2) + SwiGLU(gate, up); down: MatMulId +
// MoeCombine [+ Add] (add: null or the Add of the combine and a row); MatMul + Add.
bool cuda_extra_fused_gate_up(const CudaOpCtx &c, const Node &gate, const Node &up, const Node &swiglu);
bool cuda_extra_fused_down(const CudaOpCtx &c, const Node &down, const Node &combine, const Node *add);
bool cuda_extra_fused_matmul_add(const CudaOpCtx &c, const Node &mm, const Node &add);
// MatVecs (cuda_ops.h cuda_fused_matvecs): MatMuls of one activation and one extra type, each
// optionally followed by its Add(product, row). Group key (cuda_matvec_group_key): one per type.
int cuda_extra_matvec_group_key(DType t);
bool cuda_extra_fused_matvecs(const CudaOpCtx &c, const std::vector<int> &members);

}  // namespace moe
