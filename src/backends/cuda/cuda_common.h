// Shared by the CUDA backend's host code and kernels: checked CUDA calls (every failure is
// a moe::Error with Status::DeviceError naming the call), the one counted synchronisation
// point, and the small device-side views of graph nodes the kernels take.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace moe {

[[noreturn]] void cuda_fail(cudaError_t e, const char *call, const char *file, int line);

#define MOE_CUDA_CHECK(call)                                              \
  do {                                                                    \
    cudaError_t moe_cuda_err_ = (call);                                   \
    if (moe_cuda_err_ != cudaSuccess) ::moe::cuda_fail(moe_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, not at the next sync,
// and the launch is counted (cuda_launch_count(), for tests of launches per decode step).
void cuda_note_launch() noexcept;
uint64_t cuda_launch_count();  // process-wide total of kernel launches (captured ones included)
#define MOE_CUDA_LAUNCH_CHECK(name)                \
  do {                                             \
    ::moe::cuda_note_launch();                     \
    MOE_CUDA_CHECK(cudaPeekAtLastError());         \
  } while (0)

// The stream a launcher enqueues on, and whether launch_pdl (ops/pdl.cuh) may use programmatic
// dependent launch there: the executor's choice (GpuTuning::dependent_launch where the device
// runs sm_90 code, CudaPaths::pdl). Converts to the plain stream for every other CUDA call.
struct LaunchStream {
  cudaStream_t stream = nullptr;
  bool pdl = false;
  operator cudaStream_t() const { return stream; }
};

// Every host-blocking wait of the backend goes through here, so tests can count them
// (a decode step must perform at most one: the logits copy).
enum class SyncWhy { Download, StagingReuse, Executor, Setup, Teardown };
void cuda_sync_stream(cudaStream_t s, SyncWhy why);
// Teardown (destructors): counted like the others, but errors are ignored, never thrown.
void cuda_sync_stream_nothrow(cudaStream_t s) noexcept;
void cuda_sync_event(cudaEvent_t e, SyncWhy why);
uint64_t cuda_sync_count();  // process-wide total, for tests
uint64_t cuda_sync_count(SyncWhy why);  // of one kind

// Per-node timing of eager (non-graph) passes with CUDA events, for tests and benchmarks:
// off by default; the report lists time per op kind and weight type, largest first. A
// process-wide diagnostic, not a tuning option: it changes no kernel or plan, only adds
// events (and a wait per pass) to eager passes, and its table sums every context's.
void cuda_profile_enable(bool on);
std::string cuda_profile_report(bool reset);

// A node's tensor as kernels see it: base pointer, extents, byte strides.
struct TView {
  void *data;
  int64_t ne[4];
  int64_t nb[4];
};

}  // namespace moe
