// Backend interface: a device that can hold buffers and run graph nodes. The context owns a
// BackendRegistry listing every usable device (CPU always; CUDA when built and present).
// The compiler asks each backend which ops it supports, places nodes, plans arenas per
// device, then each device's Executor runs its nodes.
//
//   BackendRegistry reg;                        // enumerates devices
//   Backend *cpu = reg.find("cpu");
//   auto buf = cpu->alloc(bytes, "kv cache");   // device memory
//   auto ex = cpu->make_executor(n_threads, tuning);  // per-context thread pool / stream
//   ex->run(graph, begin, end, env);            // nodes [begin, end) in schedule order
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/gpu_tuning.h"
#include "graph/ir.h"

namespace moe {

class KvCache;
struct UbatchInfo;

struct DeviceInfo {
  std::string name;         // "cpu", "cuda0"
  std::string description;  // CPU model / GPU product name
  bool is_gpu = false;
  bool integrated = false;  // shares memory with the host (Jetson, CPU)
  size_t total_memory = 0;
  size_t free_memory = 0;
  int compute_major = 0, compute_minor = 0;  // GPUs
};

// A page-locked host range (Backend::register_host); unlocked when destroyed.
class HostRegistration {
public:
  virtual ~HostRegistration() = default;
  // The device's kernels may read the range through its host addresses (unified addressing
  // of registered memory), so a product can run on the GPU over weights left in host memory.
  virtual bool readable_in_place() const { return false; }
};

class DeviceBuffer {
public:
  virtual ~DeviceBuffer() = default;
  virtual void *data() = 0;
  virtual size_t size() const = 0;
  virtual void upload(size_t offset, const void *src, size_t n) = 0;    // host -> buffer
  virtual void download(size_t offset, void *dst, size_t n) const = 0;  // buffer -> host
  virtual void clear() = 0;
  // Zero bytes [offset, offset + n); copy n bytes from src_offset to dst_offset (ranges must
  // not overlap). On a GPU both are ordered on the device's stream like upload (no host wait).
  virtual void clear_range(size_t offset, size_t n) = 0;
  virtual void copy_within(size_t dst_offset, size_t src_offset, size_t n) = 0;
};

// What kernels may read at run time besides their node: the current ubatch and KV cache.
struct ExecEnv {
  const UbatchInfo *ub = nullptr;
  KvCache *kv = nullptr;
  uint64_t step = 0;  // changes with every ubatch: a GPU uploads the ubatch once per step, not per segment
  // The context's abort callback (true = stop), or nullptr. The CPU executor polls it on the
  // decoding thread after every node and then throws Error(Aborted); GPU executors ignore it
  // (the context polls between segments).
  bool (*abort)(void *) = nullptr;
  void *abort_data = nullptr;
  // A cancel flag any thread may read (moe_decode_cancel's), or nullptr; abort also reports it.
  const std::atomic<bool> *cancel = nullptr;
};

class Executor {
public:
  virtual ~Executor() = default;
  // Run nodes [begin, end) of g (already placed on this device and bound to memory).
  virtual void run(const Graph &g, int begin, int end, const ExecEnv &env) = 0;
  // End of the step's work on this device (the host does not wait).
  virtual void synchronize() = 0;
  // Cross-device ordering of a placed plan (src/engine/context.cpp runs the segments):
  // flush: the segments run so far are submitted (a GPU ends its captured stretch here; the
  //   host does not wait). A CPU executor runs synchronously: nothing to do.
  // host_wait: flush, then the host blocks until they are done (before a CPU segment reads
  //   what this device wrote: the one host round trip of a boundary, counted on CUDA).
  // wait_for(other): work submitted here from now on starts after other's flushed work
  //   (GPU -> GPU: an event, no host wait).
  virtual void flush() {}
  virtual void host_wait() {}
  virtual void wait_for(Executor &other) { (void)other; }
  // mark: flush, then remember this point of the submitted work; host_wait_mark blocks until
  //   the work up to the mark is done, while later work (an overlapped stretch) may still
  //   run. CPU executors: nothing to wait for.
  virtual void mark() {}
  virtual void host_wait_mark() {}
  // After the step's host synchronisation (the logits download): throws DeviceError when a
  // kernel of an earlier pass met a bad index (GPU executors; never waits: a report whose
  // copy has not landed yet, after a step without a download, comes at a later check).
  virtual void check_errors() {}
  // GPU executors: capture and replay repeated passes as device graphs (default on).
  virtual void set_graphs_enabled(bool) {}
};

class Backend {
public:
  virtual ~Backend() = default;
  virtual const DeviceInfo &info() const = 0;
  // Supported-op query used by placement.
  virtual bool supports(const Graph &g, int node) const = 0;
  // True when buffers are ordinary host memory (weights are then used in place from mmap).
  virtual bool host_memory() const = 0;
  virtual std::unique_ptr<DeviceBuffer> alloc(size_t bytes, const char *purpose) = 0;
  // Host memory this device's copy engine reads and writes without staging (GPU: pinned),
  // for host arenas that Transfer nodes touch; nullptr when the device has no such memory.
  virtual std::unique_ptr<DeviceBuffer> alloc_pinned_host(size_t bytes) { (void)bytes; return nullptr; }
  // Host memory this device reads in place (zero-copy weights: mapped pinned memory; data()
  // is an address this device's kernels may read); nullptr when unsupported.
  virtual std::unique_ptr<DeviceBuffer> alloc_mapped_host(size_t bytes) { (void)bytes; return nullptr; }
  // Page-lock existing host memory for this device's copy engine; nullptr when unsupported
  // or refused (the caller then keeps the memory pageable).
  virtual std::unique_ptr<HostRegistration> register_host(void *p, size_t bytes) { (void)p; (void)bytes; return nullptr; }
  // Scratch bytes a node's kernel needs (quantized activations, routing tables), for kernels
  // that run with these options (the executor must get the same ones: some choose the
  // kernel and so its scratch). CPU backends ignore tuning.
  virtual size_t work_size(const Graph &g, int node, int n_threads, const GpuTuning &tuning) const = 0;
  // (optional) Values that must outlive their last reader on this device (index `device` of the
  // plan): raise keep_until[i] to the last node whose run must still find node i intact (see
  // plan_memory). A fused launch that reads a value after it has written outputs placed later
  // needs it. Defaults to nothing.
  virtual void extend_lifetimes(const Graph &g, int device, std::vector<int> &keep_until) const {
    (void)g;
    (void)device;
    (void)keep_until;
  }
  // An executor whose kernels use `tuning` (the context's options; CPU executors ignore it).
  virtual std::unique_ptr<Executor> make_executor(int n_threads, const GpuTuning &tuning) = 0;
  // Bytes per second this device streams out of its own memory, measured on the first call
  // (a read of a buffer far larger than any cache; ~0.1-0.5 s) and kept; 0 when unknown.
  // A diagnostic for benchmarks (the decode roofline), never used by the engine.
  virtual double read_bandwidth() { return 0.0; }
};

// Tests and debugging: the GPU backends of one registry take the kernel paths of an older
// GPU than the one present (the fallbacks of a Turing or Ampere GPU, run on a Hopper). An
// option of the registry, not of the process: a registry built without it, alive at the
// same time, keeps the device's own paths. Ignored by the CPU backend.
struct GpuEmulation {
  int arch = 0;        // compute capability as 10 * major + minor (75: Turing); 0: the device's own
  int smem_optin = 0;  // bytes of shared memory per block at most, with arch > 0 (65536: 64 KB)
};

class BackendRegistry {
public:
  // CPU + every CUDA device found (when built with CUDA). twin: a device name ("cpu",
  // "cuda0") presented a second time as "<name>_twin" (tests: multi-device placements on
  // one device); an unknown name is an InvalidArgument error. emulate: see GpuEmulation.
  explicit BackendRegistry(const std::string &twin = "", const GpuEmulation &emulate = {});
  ~BackendRegistry();
  size_t size() const { return backends_.size(); }
  Backend *at(size_t i) const { return backends_[i].get(); }
  Backend *find(const std::string &name) const;  // "cpu", "cuda", "cuda0"
  Backend *cpu() const { return backends_[0].get(); }

private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

// as_gpu: reported as a GPU (DeviceInfo::is_gpu) so placement treats it as one (the test twin).
std::unique_ptr<Backend> make_cpu_backend(const std::string &name = "cpu", bool as_gpu = false);
// Why no GPU backend is listed, for device errors: "" when one is; else whether CUDA is not
// compiled into this build or no device/driver answered (the two have different fixes).
std::string gpu_unavailable_reason();
#ifdef MOEINFER_WITH_CUDA
// Appends one Backend per CUDA device (none when no device or driver is present).
void append_cuda_backends(std::vector<std::unique_ptr<Backend>> &out, const GpuEmulation &emulate);
// A second CudaBackend (own stream, own buffers, the same emulation) on the device of `of`, named `name`.
std::unique_ptr<Backend> make_cuda_twin(const Backend &of, const std::string &name);
#endif

}  // namespace moe
