// The architecture of the code a device runs from this build: the attributes of one trivial
// kernel, compiled like every other (the same architecture list), tell which of the build's
// images the driver chose for the device (cuda_paths.h).
#include <cuda_runtime.h>

#include "backends/cuda/cuda_alloc.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_paths.h"

namespace moe {

namespace {
__global__ void code_arch_probe_kernel() {}

__global__ void code_arch_report_kernel(int *out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__ / 10;
#endif
}
}  // namespace

// ptxVersion: the virtual architecture the chosen code was compiled for (= __CUDA_ARCH__ /
// 10), for machine code too; binaryVersion only if a driver leaves it 0.
int cuda_code_arch(int device) {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, code_arch_probe_kernel);
  (void)cudaSetDevice(prev);
  (void)cudaGetLastError();  // cudaErrorNoKernelImageForDevice is an answer here, not a failure
  if (e != cudaSuccess) return 0;
  return attr.ptxVersion > 0 ? attr.ptxVersion : attr.binaryVersion;
}

// Test aid (the [paths] probe test): the wait goes through the counted sync point.
int cuda_code_arch_launched(CudaCounters &counted) {
  int *d = static_cast<int *>(cuda_malloc_checked(sizeof(int), "architecture probe"));
  int h = 0;
  code_arch_report_kernel<<<1, 1>>>(d);
  const cudaError_t e = cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  if (e == cudaSuccess) {
    try {
      cuda_sync_stream(nullptr, SyncWhy::Setup, counted);
    } catch (...) {
      (void)cudaFree(d);
      throw;
    }
  }
  (void)cudaFree(d);
  MOE_CUDA_CHECK(e);
  return h;
}

}  // namespace moe
