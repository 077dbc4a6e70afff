// cuBLAS through dlopen (see cuda_blas.h for why). Only the four entry points used are
// resolved; cublas_v2.h is included for its types and enums, never linked.
#include "backends/cuda/cuda_blas.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>

#include "core/status.h"

namespace moe {

namespace {

struct BlasLib {
  using Create = cublasStatus_t (*)(cublasHandle_t *);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *, const void *,
                                    cudaDataType, int, const void *, cudaDataType, int, const void *, void *, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  Create create = nullptr;
  Destroy destroy = nullptr;
  SetStream set_stream = nullptr;
  GemmEx gemm_ex = nullptr;
};

// The library of the toolkit we were built with first, then older / unversioned names.
const BlasLib *blas_lib() {
  static std::once_flag once;
  static BlasLib lib;
  static bool ok = false;
  std::call_once(once, [] {
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *h = nullptr;
    for (const char *n : names)
      if ((h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (!h) return;
    lib.create = reinterpret_cast<BlasLib::Create>(dlsym(h, "cublasCreate_v2"));
    lib.destroy = reinterpret_cast<BlasLib::Destroy>(dlsym(h, "cublasDestroy_v2"));
    lib.set_stream = reinterpret_cast<BlasLib::SetStream>(dlsym(h, "cublasSetStream_v2"));
    lib.gemm_ex = reinterpret_cast<BlasLib::GemmEx>(dlsym(h, "cublasGemmEx"));
    ok = lib.create && lib.destroy && lib.set_stream && lib.gemm_ex;  // the handle stays open for the process
  });
  return ok ? &lib : nullptr;
}

}  // namespace

void *cuda_blas_create(cudaStream_t stream) {
  const BlasLib *lib = blas_lib();
  if (!lib) return nullptr;
  cublasHandle_t h = nullptr;
  if (lib->create(&h) != CUBLAS_STATUS_SUCCESS) return nullptr;
  if (lib->set_stream(h, stream) != CUBLAS_STATUS_SUCCESS) {
    lib->destroy(h);
    return nullptr;
  }
  return h;
}

void cuda_blas_destroy(void *handle) {
  if (handle) (void)blas_lib()->destroy(static_cast<cublasHandle_t>(handle));
}

namespace {

// Column-major view: W is K x M (ld ldw), X is K x N (ld ldx), Y is M x N (ld ldy); Y = W^T X.
void gemm(void *handle, int M, int N, int K, const void *W, int ldw, const void *X, int ldx, float *Y, int ldy, cudaDataType in,
          cublasComputeType_t compute) {
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = blas_lib()->gemm_ex(static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, W, in, ldw, X,
                                                in, ldx, &zero, Y, CUDA_R_32F, ldy, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) fail(Status::Internal, "cublasGemmEx (M %d, N %d, K %d) failed: status %d", M, N, K, static_cast<int>(st));
}

}  // namespace

void cuda_blas_gemm_f16(void *handle, int M, int N, int K, const void *W, int ldw, const void *X, int ldx, float *Y, int ldy) {
  gemm(handle, M, N, K, W, ldw, X, ldx, Y, ldy, CUDA_R_16F, CUBLAS_COMPUTE_32F);
}

void cuda_blas_gemm_f32(void *handle, int M, int N, int K, const float *W, int ldw, const float *X, int ldx, float *Y, int ldy) {
  gemm(handle, M, N, K, W, ldw, X, ldx, Y, ldy, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC);
}

}  // namespace moe
