// cuBLAS, loaded at run time: libmoeinfer does not link it, so a host without cuBLAS (or an
// embedder who never runs a prompt on the GPU) still loads the library; prompt products then
// stay on the int8 MMQ kernels. One handle per executor (its stream), created with it.
// cuBLAS allocates its workspace on a handle's first GEMM, outside the memory planner; that is
// always an eager pass (the executor captures a graph on its second run), never a capture.
#pragma once
#include <cuda_runtime.h>

namespace moe {

// A cuBLAS handle bound to `stream`, or null when cuBLAS cannot be loaded or created (the
// caller falls back). Thread-safe; the library is opened once per process.
void *cuda_blas_create(cudaStream_t stream);
void cuda_blas_destroy(void *handle);

// Y = W X^T on f16 tensor cores with f32 accumulation: W [M][K] row-major f16 (row stride
// ldw halves), X [N][K] row-major f16 (row stride ldx), Y [N][M] row-major f32 (row stride
// ldy floats). Enqueued on the handle's stream; a cuBLAS error fails with its status named.
void cuda_blas_gemm_f16(void *handle, int M, int N, int K, const void *W, int ldw, const void *X, int ldx, float *Y, int ldy);
// The same with f32 W and X, in full f32 (CUBLAS_COMPUTE_32F_PEDANTIC: never TF32).
void cuda_blas_gemm_f32(void *handle, int M, int N, int K, const float *W, int ldw, const float *X, int ldx, float *Y, int ldy);

}  // namespace moe
