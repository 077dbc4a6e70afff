// Shared by the CUDA backend's host code and kernels: checked CUDA calls (every failure is
// a moe::Error with Status::DeviceError naming the call), the counted launches and
// synchronisation points, and the small device-side views of graph nodes the kernels take.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
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

// Every host-blocking wait of the backend is one of these (a decode step must perform at
// most one: the logits copy).
enum class SyncWhy { Download, StagingReuse, Executor, Setup, Teardown };
constexpr int kSyncWhyCount = 5;

// What one CudaBackend did, for tests: kernel launches (captured ones included; a replayed
// CUDA graph is none) and host waits by kind. Each backend (so each context) counts its own,
// so two contexts in one process never see each other's counts. Relaxed: counts, not
// ordering points.
class CudaCounters {
public:
  void count_launch() noexcept { launches_.fetch_add(1, std::memory_order_relaxed); }
  void count_sync(SyncWhy why) noexcept {
    syncs_.fetch_add(1, std::memory_order_relaxed);
    by_[static_cast<int>(why)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t launches() const noexcept { return launches_.load(std::memory_order_relaxed); }
  uint64_t syncs() const noexcept { return syncs_.load(std::memory_order_relaxed); }
  uint64_t syncs(SyncWhy why) const noexcept { return by_[static_cast<int>(why)].load(std::memory_order_relaxed); }
  // Launches of the MLA glue kernel (ops/mla_glue.cu), which falls back to the generic Sequence
  // kernel where a launch's buffers do not allow it: tests check which one ran.
  void count_mla_glue() noexcept { mla_glue_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t mla_glue_launches() const noexcept { return mla_glue_.load(std::memory_order_relaxed); }

private:
  std::atomic<uint64_t> launches_{0}, syncs_{0}, mla_glue_{0};
  std::atomic<uint64_t> by_[kSyncWhyCount] = {};
};

// Kernel launches go through MOE_CUDA_LAUNCH_CHECK (or launch_pdl), deep in the op launchers,
// which know no backend: the executor names the counters while it launches a stretch, on its
// own thread, and launches are counted there (none outside such a scope).
class CudaLaunchCounting {
public:
  explicit CudaLaunchCounting(CudaCounters &c) noexcept;
  ~CudaLaunchCounting();
  CudaLaunchCounting(const CudaLaunchCounting &) = delete;
  CudaLaunchCounting &operator=(const CudaLaunchCounting &) = delete;

private:
  CudaCounters *previous_;
};

// After every kernel launch: launch-configuration errors surface here, not at the next sync,
// and the launch is counted (CudaLaunchCounting).
void cuda_note_launch() noexcept;
void cuda_note_mla_glue() noexcept;  // CudaCounters::count_mla_glue of the launching executor
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
  // Bytes of shared memory one block may ask for: the backend's CudaPaths::smem_optin (an
  // emulated device's where the backend emulates one), read by launchers that pick a kernel
  // by its shared memory. 0: only the default 48 KB.
  int smem_optin = 0;
  operator cudaStream_t() const { return stream; }
};

// The waits, each counted on the backend that waits.
void cuda_sync_stream(cudaStream_t s, SyncWhy why, CudaCounters &counted);
// Teardown (destructors): counted like the others, but errors are ignored, never thrown.
void cuda_sync_stream_nothrow(cudaStream_t s, CudaCounters &counted) noexcept;
void cuda_sync_event(cudaEvent_t e, SyncWhy why, CudaCounters &counted);

// A node's tensor as kernels see it: base pointer, extents, byte strides.
struct TView {
  void *data;
  int64_t ne[4];
  int64_t nb[4];
};

}  // namespace moe
