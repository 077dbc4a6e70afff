#include "backends/cuda/cuda_alloc.h"

#include <cuda_runtime.h>

#include "core/alloc_test_hook.h"
#include "core/status.h"

namespace moe {

void *cuda_malloc_checked(size_t bytes, const char *what) {
  allocation_point(bytes, what);
  void *p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so the next call does not report it
    fail(Status::OutOfMemory, "cudaMalloc of %zu bytes for %s failed: %s", bytes, what, cudaGetErrorString(e));
  }
  return p;
}

void *cuda_host_alloc_checked(size_t bytes, unsigned flags, const char *what) {
  allocation_point(bytes, what);
  void *p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 256, flags);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(Status::OutOfMemory, "cudaHostAlloc of %zu bytes for %s failed: %s", bytes, what, cudaGetErrorString(e));
  }
  return p;
}

}  // namespace moe
