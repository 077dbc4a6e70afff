// The CUDA backend object (one per device per context, since each context owns its
// registry): the context's stream on this device, pinned staging for host<->device copies,
// and buffers from cudaMalloc. Kernels run through CudaExecutor (cuda_executor.cpp). What
// tests and diagnostics read or switch lives here too, never process-wide: the device it
// emulates (GpuEmulation), its launch and wait counters, its per-op profile.
#pragma once
#include <memory>

#include "backends/backend.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_paths.h"
#include "backends/cuda/cuda_profile.h"

namespace moe {

class CudaBackend final : public Backend {
public:
  // emulate: take the kernel paths of an older GPU (tests, debugging); default: the device's own.
  explicit CudaBackend(int device, const GpuEmulation &emulate = {});
  ~CudaBackend() override;
  const DeviceInfo &info() const override { return info_; }
  bool supports(const Graph &g, int node) const override;
  bool host_memory() const override { return false; }
  std::unique_ptr<DeviceBuffer> alloc(size_t bytes, const char *purpose) override;
  std::unique_ptr<DeviceBuffer> alloc_pinned_host(size_t bytes) override;
  std::unique_ptr<DeviceBuffer> alloc_mapped_host(size_t bytes) override;
  std::unique_ptr<HostRegistration> register_host(void *p, size_t bytes) override;
  void rename(const std::string &name) { info_.name = name; }  // the test twin of a device
  size_t work_size(const Graph &g, int node, int n_threads, const GpuTuning &tuning) const override;
  void extend_lifetimes(const Graph &g, int device, std::vector<int> &keep_until) const override;
  std::unique_ptr<Executor> make_executor(int n_threads, const GpuTuning &tuning) override;
  double read_bandwidth() override;  // ops/read_bandwidth.cu

  int device() const { return device_; }
  int n_sm() const { return n_sm_; }
  // The kernel paths this device takes (cuda_paths.h), chosen at creation.
  const CudaPaths &paths() const { return paths_; }
  const GpuEmulation &emulation() const { return emulate_; }
  // This backend's kernel launches and host waits (its executors' and its copies').
  CudaCounters &counters() { return counters_; }
  const CudaCounters &counters() const { return counters_; }
  // Per-op kernel time of its executors' eager passes (off until enabled).
  CudaProfile &profile() { return profile_; }
  void set_current() const;  // cudaSetDevice(device_)
  cudaStream_t stream();     // created on first use

  // Host -> device through the pinned staging ring, ordered on stream(); returns once src
  // may be reused (it was copied to staging), without waiting for the device.
  void upload_async(void *dst, const void *src, size_t n);
  // Device -> host: one counted synchronisation per staging chunk.
  void download(void *dst, const void *src, size_t n);
  void memset_async(void *dst, int value, size_t n);

private:
  void ensure_staging();
  int device_;
  GpuEmulation emulate_;
  CudaPaths paths_;
  CudaCounters counters_;
  CudaProfile profile_;
  int n_sm_ = 0;
  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  // Upload ring: two halves; a half is reused only after its last copy completed.
  static constexpr size_t kHalf = 8u << 20;
  uint8_t *up_ = nullptr;
  cudaEvent_t up_ev_[2] = {nullptr, nullptr};
  bool up_pending_[2] = {false, false};
  int up_half_ = 0;
  size_t up_used_ = 0;
  uint8_t *down_ = nullptr;  // kHalf bytes
  double read_bw_ = 0.0;     // measured once
};

}  // namespace moe
