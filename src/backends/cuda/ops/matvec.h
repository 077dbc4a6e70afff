// Decode mat-vec (one activation column) for MatMul / MatMulId: see matvec.cu.
#pragma once
#include "backends/cuda/cuda_ops.h"

namespace moe {

// Runs a one-column MatMul or MatMulId (T == 1) with the activation rounding inside the
// kernel; returns false, launching nothing, where the shape is not covered (the caller
// takes the general path).
bool cuda_matvec(const CudaOpCtx &c);

// Process-wide switch (default on): MatVecs groups of 2..3 logical blocks per multiprocessor
// take the lean 8-warp kernel (matvec.cu: group_lean); off: the 16-warp launch as before.
void cuda_matvec_lean_groups(bool on);

}  // namespace moe
