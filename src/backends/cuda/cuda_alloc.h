// Every device and page-locked host allocation of the CUDA backend goes through here: a
// failure is Error(OutOfMemory) naming what the memory was for (never a DeviceError), and the
// test hook (core/alloc_test_hook.h) can fail each one in turn, so the fault-injection tests
// cover GPU contexts too.
#pragma once
#include <cstddef>

namespace moe {

void *cuda_malloc_checked(size_t bytes, const char *what);                        // cudaMalloc
void *cuda_host_alloc_checked(size_t bytes, unsigned flags, const char *what);    // cudaHostAlloc

}  // namespace moe
