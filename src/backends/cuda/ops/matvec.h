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

}  // namespace moe
