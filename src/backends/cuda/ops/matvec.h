// Decode mat-vec (one activation column) for MatMul / MatMulId: see matvec.cu.
#pragma once
#include "backends/cuda/cuda_ops.h"

namespace moe {

// Runs a one-column MatMul or MatMulId (T == 1) with the activation rounding inside the
// kernel; returns false, launching nothing, where the shape is not covered (the caller
// takes the general path).
bool cuda_matvec(const CudaOpCtx &c);

// Whether node n is a weight tensor (or a view of one): padded to 256 bytes, so the mat-vecs'
// 16-byte loads covering its last row stay inside the allocation.
bool cuda_weight_backed(const Graph &g, const Node &n);

// gpt-oss's experts with their biases (AddId(MatMulId, bias rows [M, E], the same ids)), one
// token, in the fused mat-vec kernels with MvBias (matvec.cu): SwiGLU-OAI(AddId(gate),
// AddId(up)) in one launch; down's AddId + MoeCombine (+ Add residual) in one. c.n: the
// group's last node. Weight types of cuda_matvec_bias_type; other types and shapes the kernels
// do not take run the members unfused in graph order. (Declared here, not beside the other fused launchers in cuda_ops.h,
// which every CUDA source includes.)
bool cuda_matvec_bias_type(DType t);
void cuda_fused_gate_up_oai(const CudaOpCtx &c, const Node &gate_bias, const Node &up_bias, const Node &swiglu_oai);
void cuda_fused_down_bias_combine(const CudaOpCtx &c, const Node &down, const Node &bias, const Node &combine, const Node *add,
                                  bool ids_settled = false);

}  // namespace moe
