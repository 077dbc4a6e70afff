// CUDA devices, buffers and staging. Errors become Status::DeviceError naming the call.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/cuda/cuda_alloc.h"
#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_paths.h"
#include "core/alloc_test_hook.h"
#include "core/log.h"

namespace moe {

void cuda_fail(cudaError_t e, const char *call, const char *file, int line) {
  const char *base = std::strrchr(file, '/');
  fail(e == cudaErrorMemoryAllocation ? Status::OutOfMemory : Status::DeviceError, "%s failed: %s (%s) at %s:%d", call,
       cudaGetErrorName(e), cudaGetErrorString(e), base ? base + 1 : file, line);
}

// The counters of the executor launching on this thread (CudaLaunchCounting); a binding
// for the length of one launch, not a setting: two contexts, on one thread or several,
// each count only their own launches.
static thread_local CudaCounters *t_launches = nullptr;

CudaLaunchCounting::CudaLaunchCounting(CudaCounters &c) noexcept : previous_(t_launches) { t_launches = &c; }
CudaLaunchCounting::~CudaLaunchCounting() { t_launches = previous_; }

void cuda_note_launch() noexcept {
  if (t_launches) t_launches->count_launch();
}

void cuda_note_mla_glue() noexcept {
  if (t_launches) t_launches->count_mla_glue();
}

// ---- paths per device (cuda_paths.h) ----

namespace {

// What a device is and runs never changes while the process lives: read once per device.
// Packed as device_arch | code_arch << 10 | (smem_optin / 16) << 20; 0: not read yet. The
// one process-wide state of the backend, and no setting: a cache of immutable hardware
// facts (what a backend does with them, e.g. GpuEmulation, is the backend's).
constexpr int kMaxDevices = 64;
std::atomic<uint64_t> g_device_facts[kMaxDevices];

#ifndef MOEINFER_CUDA_ARCHS
#define MOEINFER_CUDA_ARCHS "?"
#endif

uint64_t device_facts(int device) {
  if (device < 0 || device >= kMaxDevices) fail(Status::Unsupported, "CUDA device %d: at most %d devices are supported", device, kMaxDevices);
  uint64_t f = g_device_facts[device].load(std::memory_order_relaxed);
  if (f != 0) return f;
  int major = 0, minor = 0, optin = 0;
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int code = cuda_code_arch(device);
  f = static_cast<uint64_t>(10 * major + minor) | static_cast<uint64_t>(code) << 10 | static_cast<uint64_t>(optin / 16) << 20;
  g_device_facts[device].store(f, std::memory_order_relaxed);
  return f;
}

}  // namespace

CudaPaths cuda_device_paths(int device) {
  const uint64_t f = device_facts(device);
  const int dev_arch = static_cast<int>(f & 1023), code = static_cast<int>((f >> 10) & 1023), optin = static_cast<int>(f >> 20) * 16;
  if (code == 0) {
    cudaDeviceProp p;
    const char *name = cudaGetDeviceProperties(&p, device) == cudaSuccess ? p.name : "?";
    fail(Status::Unsupported,
         "CUDA device %d (%s, sm_%d): this build has no code it can run (built for CUDA architectures %s); rebuild with "
         "-DCMAKE_CUDA_ARCHITECTURES=%d (README: GPU architectures)",
         device, name, dev_arch, MOEINFER_CUDA_ARCHS, dev_arch);
  }
  return cuda_select_paths(dev_arch, code, optin);
}

CudaPaths cuda_current_paths() {
  int dev = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  return cuda_device_paths(dev);
}

void cuda_sync_stream(cudaStream_t s, SyncWhy why, CudaCounters &counted) {
  counted.count_sync(why);
  MOE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void cuda_sync_stream_nothrow(cudaStream_t s, CudaCounters &counted) noexcept {
  counted.count_sync(SyncWhy::Teardown);
  if (cudaStreamSynchronize(s) != cudaSuccess) (void)cudaGetLastError();
}

void cuda_sync_event(cudaEvent_t e, SyncWhy why, CudaCounters &counted) {
  counted.count_sync(why);
  MOE_CUDA_CHECK(cudaEventSynchronize(e));
}

TView tview(const Node &n) {
  TView v;
  v.data = n.data;
  for (int i = 0; i < 4; ++i) { v.ne[i] = n.ne[i]; v.nb[i] = static_cast<int64_t>(n.nb[i]); }
  return v;
}

namespace {

class CudaBuffer final : public DeviceBuffer {
public:
  CudaBuffer(CudaBackend &be, size_t n, const char *purpose) : be_(be), size_(n) {
    be_.set_current();
    const std::string what = std::string(purpose ? purpose : "a buffer") + " on " + be_.info().name;
    p_ = cuda_malloc_checked(n, what.c_str());
  }
  ~CudaBuffer() override {
    be_.set_current();
    (void)cudaFree(p_);  // synchronises the device; errors here cannot be reported
  }
  void *data() override { return p_; }
  size_t size() const override { return size_; }
  void upload(size_t off, const void *src, size_t n) override { be_.upload_async(static_cast<uint8_t *>(p_) + off, src, n); }
  void download(size_t off, void *dst, size_t n) const override { be_.download(dst, static_cast<const uint8_t *>(p_) + off, n); }
  void clear() override { be_.memset_async(p_, 0, size_); }
  void clear_range(size_t off, size_t n) override { be_.memset_async(static_cast<uint8_t *>(p_) + off, 0, n); }
  void copy_within(size_t dst, size_t src, size_t n) override {
    be_.set_current();
    MOE_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t *>(p_) + dst, static_cast<uint8_t *>(p_) + src, n, cudaMemcpyDeviceToDevice, be_.stream()));
  }

private:
  CudaBackend &be_;
  void *p_ = nullptr;
  size_t size_;
};

// Page-locked host memory. Pinned: a host arena that GPU streams copy to and from (a copy
// from pageable memory would be staged and could not be captured in a CUDA graph). Mapped:
// zero-copy weights, read by kernels in place over the bus (integrated GPUs: the same DRAM).
class PinnedHostBuffer final : public DeviceBuffer {
public:
  PinnedHostBuffer(const CudaBackend &be, size_t n, bool mapped) : size_(n) {
    be.set_current();
    const unsigned flags = cudaHostAllocPortable | (mapped ? cudaHostAllocMapped : 0u);
    host_ = cuda_host_alloc_checked(n, flags, mapped ? "mapped weights" : "a pinned arena");
    dev_ = host_;
    if (mapped) MOE_CUDA_CHECK(cudaHostGetDevicePointer(&dev_, host_, 0));
  }
  ~PinnedHostBuffer() override { (void)cudaFreeHost(host_); }
  void *data() override { return dev_; }
  size_t size() const override { return size_; }
  void upload(size_t off, const void *src, size_t n) override { std::memcpy(static_cast<uint8_t *>(host_) + off, src, n); }
  void download(size_t off, void *dst, size_t n) const override { std::memcpy(dst, static_cast<const uint8_t *>(host_) + off, n); }
  void clear() override { std::memset(host_, 0, size_); }
  void clear_range(size_t off, size_t n) override { std::memset(static_cast<uint8_t *>(host_) + off, 0, n); }
  void copy_within(size_t dst, size_t src, size_t n) override { std::memcpy(static_cast<uint8_t *>(host_) + dst, static_cast<uint8_t *>(host_) + src, n); }

private:
  void *host_ = nullptr, *dev_ = nullptr;
  size_t size_;
};

}  // namespace

std::unique_ptr<DeviceBuffer> CudaBackend::alloc_pinned_host(size_t bytes) { return std::make_unique<PinnedHostBuffer>(*this, bytes, false); }
std::unique_ptr<DeviceBuffer> CudaBackend::alloc_mapped_host(size_t bytes) { return std::make_unique<PinnedHostBuffer>(*this, bytes, true); }

namespace {
class CudaHostRegistration final : public HostRegistration {
public:
  CudaHostRegistration(void *p, bool in_place) : p_(p), in_place_(in_place) {}
  ~CudaHostRegistration() override { (void)cudaHostUnregister(p_); }
  bool readable_in_place() const override { return in_place_; }

private:
  void *p_;
  bool in_place_;
};
}  // namespace

std::unique_ptr<HostRegistration> CudaBackend::register_host(void *p, size_t bytes) {
  set_current();
  allocation_point(bytes, "page-locking host weights");  // a test failure here: Error(OutOfMemory), as for the others
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    MOE_LOG_WARN("cudaHostRegister of %zu bytes failed (%s): CPU weights stay pageable", bytes, cudaGetErrorString(e));
    return nullptr;
  }
  // Kernels may take the host address itself only when the device maps registered memory
  // at the same address (then direct-read products need no pointer translation).
  int same = 0;
  void *dev = nullptr;
  const bool in_place = cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, device_) == cudaSuccess && same &&
                        cudaHostGetDevicePointer(&dev, p, 0) == cudaSuccess && dev == p;
  (void)cudaGetLastError();
  return std::make_unique<CudaHostRegistration>(p, in_place);
}

std::unique_ptr<Backend> make_cuda_twin(const Backend &of, const std::string &name) {
  const auto &cuda = static_cast<const CudaBackend &>(of);
  auto b = std::make_unique<CudaBackend>(cuda.device(), cuda.emulation());
  b->rename(name);
  return b;
}

CudaBackend::CudaBackend(int device, const GpuEmulation &emulate)
    : device_(device), emulate_(emulate), paths_(cuda_emulated_paths(cuda_device_paths(device), emulate.arch, emulate.smem_optin)) {
  cudaDeviceProp p;
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  info_.name = "cuda" + std::to_string(device);
  info_.description = p.name;
  info_.is_gpu = true;
  info_.integrated = p.integrated != 0;
  info_.total_memory = p.totalGlobalMem;
  info_.compute_major = p.major;
  info_.compute_minor = p.minor;
  n_sm_ = p.multiProcessorCount;
  size_t fr = 0, tot = 0;
  set_current();
  if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) info_.free_memory = fr;
  else (void)cudaGetLastError();
}

CudaBackend::~CudaBackend() {
  if (stream_) {
    (void)cudaSetDevice(device_);
    cuda_sync_stream_nothrow(stream_, counters_);
    (void)cudaStreamDestroy(stream_);
  }
  for (auto &e : up_ev_)
    if (e) (void)cudaEventDestroy(e);
  if (up_) (void)cudaFreeHost(up_);
  if (down_) (void)cudaFreeHost(down_);
}

void CudaBackend::set_current() const { MOE_CUDA_CHECK(cudaSetDevice(device_)); }

cudaStream_t CudaBackend::stream() {
  if (!stream_) {
    set_current();
    // Non-blocking: never serialised with the legacy default stream other code may use.
    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  return stream_;
}

void CudaBackend::ensure_staging() {
  if (up_) return;
  set_current();
  // All or nothing: up_ marks the staging as ready, so it is set last.
  void *up = cuda_host_alloc_checked(2 * kHalf, cudaHostAllocDefault, "the upload staging");
  void *down = nullptr;
  try {
    down = cuda_host_alloc_checked(kHalf, cudaHostAllocDefault, "the download staging");
    for (auto &e : up_ev_)
      if (!e) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    (void)cudaFreeHost(up);
    if (down) (void)cudaFreeHost(down);
    throw;
  }
  down_ = static_cast<uint8_t *>(down);
  up_ = static_cast<uint8_t *>(up);
}

void CudaBackend::upload_async(void *dst, const void *src, size_t n) {
  ensure_staging();
  cudaStream_t s = stream();
  const uint8_t *p = static_cast<const uint8_t *>(src);
  uint8_t *d = static_cast<uint8_t *>(dst);
  while (n > 0) {
    if (up_used_ >= kHalf) {
      up_half_ ^= 1;
      up_used_ = 0;
      if (up_pending_[up_half_]) {
        // Only wait when the device has not finished with that half yet.
        cudaError_t q = cudaEventQuery(up_ev_[up_half_]);
        if (q == cudaErrorNotReady) cuda_sync_event(up_ev_[up_half_], SyncWhy::StagingReuse, counters_);
        else MOE_CUDA_CHECK(q);
        up_pending_[up_half_] = false;
      }
    }
    const size_t chunk = std::min(n, kHalf - up_used_);
    uint8_t *stage = up_ + static_cast<size_t>(up_half_) * kHalf + up_used_;
    std::memcpy(stage, p, chunk);
    MOE_CUDA_CHECK(cudaMemcpyAsync(d, stage, chunk, cudaMemcpyHostToDevice, s));
    MOE_CUDA_CHECK(cudaEventRecord(up_ev_[up_half_], s));
    up_pending_[up_half_] = true;
    up_used_ += (chunk + 255) & ~size_t(255);
    p += chunk;
    d += chunk;
    n -= chunk;
  }
}

void CudaBackend::download(void *dst, const void *src, size_t n) {
  ensure_staging();
  cudaStream_t s = stream();
  uint8_t *o = static_cast<uint8_t *>(dst);
  const uint8_t *p = static_cast<const uint8_t *>(src);
  while (n > 0) {
    const size_t chunk = std::min(n, kHalf);
    MOE_CUDA_CHECK(cudaMemcpyAsync(down_, p, chunk, cudaMemcpyDeviceToHost, s));
    cuda_sync_stream(s, SyncWhy::Download, counters_);
    std::memcpy(o, down_, chunk);
    o += chunk;
    p += chunk;
    n -= chunk;
  }
}

void CudaBackend::memset_async(void *dst, int value, size_t n) {
  set_current();
  MOE_CUDA_CHECK(cudaMemsetAsync(dst, value, n, stream()));
}

bool CudaBackend::supports(const Graph &g, int node) const { return cuda_supports_node(g, node); }

std::unique_ptr<DeviceBuffer> CudaBackend::alloc(size_t bytes, const char *purpose) {
  return std::make_unique<CudaBuffer>(*this, bytes, purpose);
}

size_t CudaBackend::work_size(const Graph &g, int node, int, const GpuTuning &tuning) const {
  return cuda_work_size(g, node, tuning, paths_);
}

void CudaBackend::extend_lifetimes(const Graph &g, int device, std::vector<int> &keep_until) const {
  cuda_fusion_keep_live(g, device, keep_until);
}

std::unique_ptr<Executor> make_cuda_executor(CudaBackend &be, const GpuTuning &tuning);
std::unique_ptr<Executor> CudaBackend::make_executor(int, const GpuTuning &tuning) { return make_cuda_executor(*this, tuning); }

void append_cuda_backends(std::vector<std::unique_ptr<Backend>> &out, const GpuEmulation &emulate) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    // No driver or no device: the CPU stays the only backend.
    (void)cudaGetLastError();
    return;
  }
  for (int d = 0; d < n; ++d) {
    try {
      out.push_back(std::make_unique<CudaBackend>(d, emulate));
    } catch (const Error &err) {
      MOE_LOG_WARN("CUDA device %d unusable: %s", d, err.what());
    }
  }
}

}  // namespace moe
