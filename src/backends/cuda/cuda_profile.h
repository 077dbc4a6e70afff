// Per-node kernel time of eager (non-graph) passes, for tests and benchmarks: one per
// CudaBackend, so per context (each context owns its registry). Off by default; while on, the
// backend's executors time each node (or fused group) between two CUDA events and wait for a
// pass's last event when it is flushed. It changes no kernel or plan, and another context's
// passes are never timed or counted here.
//
//   CudaProfile &prof = cuda_backend->profile();
//   prof.enable(true);
//   ... decode ...
//   std::string table = prof.report(true);   // time per op kind and weight type, largest first
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace moe {

class CudaProfile {
public:
  void enable(bool on) { on_.store(on); }
  bool enabled() const { return on_.load(); }
  // One timed launch of `label` (an executor's, at the end of a profiled pass).
  void add(const std::string &label, double ms);
  // The table of what was added; reset: start a new one.
  std::string report(bool reset);
  // Timed launches added since the last reset.
  int64_t calls();

private:
  struct Entry {
    int64_t count = 0;
    double ms = 0;
  };
  std::atomic<bool> on_{false};
  std::mutex mu_;  // a test's thread may read the report while the context decodes on another
  std::map<std::string, Entry> entries_;
};

}  // namespace moe
