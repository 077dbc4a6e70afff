// Element values of the row-local F32 ops, shared by their kernels (elementwise.cu) and the
// fused op sequences (fused_sequence.cu), so a fused value is the unfused value bit for bit
// (one expression, contracted alike).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/ref_math.cuh"

namespace moe {

enum EwOp : int { kMul, kAdd, kScale, kSigmoid, kSwiGLU, kCopy, kSlice, kConcat, kSwiGLUOai, kSoftplus };

// Row (i1, i2, i3) of a strided F32 tensor.
__device__ __forceinline__ float *rowp(const TView &v, int64_t i1, int64_t i2, int64_t i3) {
  return reinterpret_cast<float *>(static_cast<uint8_t *>(v.data) + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3]);
}

// gpt-oss's SwiGLU-OAI of gate x and up y (the CPU's cpu_swiglu_oai): also the fused gate/up
// mat-vec's (matvec.cu, MvBias), so both are this one expression.
__device__ __forceinline__ float swiglu_oai_value(float x, float y, float alpha, float limit) {
  const float g = fminf(x, limit);
  const float u = fminf(fmaxf(y, -limit), limit);
  return g / (1.0f + expf(alpha * (-g))) * (u + 1.0f);
}

// The value of element i of a row of n: x from src0, y from src1 (0 where the op has none).
__device__ __forceinline__ float ew_value(int op, float x, float y, int64_t i, int64_t n, float f0, float f1) {
  switch (op) {
    case kSwiGLUOai: return swiglu_oai_value(x, y, f0, f1);
    case kMul: return x * y;
    case kAdd: return x + y;
    case kScale: return x * f0 + f1;
    case kSigmoid: return 1.0f / (1.0f + expf(-x));
    case kSoftplus: return x > 20.0f ? x : logf(1.0f + expf(x));  // as the CPU: float log(1 + exp), x past 20
    case kSwiGLU: return ref_swiglu(x, y, i, n);
    default: return x;
  }
}

}  // namespace moe
