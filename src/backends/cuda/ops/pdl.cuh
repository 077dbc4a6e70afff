// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be started
// while the kernel before it on the stream is still draining, so its launch latency and
// its independent prologue (loads of constant weights) overlap the previous kernel.
//
// Contract for every kernel launched with launch_pdl (breaking it is a data race):
//   * before pdl_wait() it may only read memory no earlier kernel of the pass writes
//     (weights) and write nothing in global memory;
//   * every thread that reads or writes activations / KV / work buffers does so after
//     pdl_wait() (call it unconditionally at one point of every thread's path, also in
//     threads that exit early, so a grid never completes before its predecessor);
//   * pdl_trigger() after pdl_wait(): the next kernel may then be scheduled. Triggering
//     only after waiting keeps at most two grids in flight.
// Where the stream says no PDL (LaunchStream::pdl: GpuTuning::dependent_launch off, or code
// before sm_90 on the device, cuda_paths.h) launch_pdl is an ordinary launch; in code before
// sm_90 pdl_wait / pdl_trigger compile to nothing, so the attribute would be a race there.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/cuda_common.h"

namespace moe {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream` (counted like every launch); with PDL when stream.pdl.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const LaunchStream &stream,
                Args &&...args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = stream.pdl ? 1 : 0;
  MOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  cuda_note_launch();
}

}  // namespace moe
