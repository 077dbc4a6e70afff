// Bytes per device and kind (weights, KV cache, activations), as planned for a context.
// Weights a CPU context reads (the huge-page copy of a mapped model, or the mapped file
// pages in place) are counted as weights of the CPU.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace moe {

struct DeviceMemory {
  std::string device;
  size_t weights = 0;
  size_t kv_cache = 0;
  size_t activations = 0;  // activation arena (max over compiled batch buckets)
  size_t other = 0;        // logits buffer, staging
  size_t total() const { return weights + kv_cache + activations + other; }
};

struct MemoryReport {
  std::vector<DeviceMemory> devices;
  std::string to_text() const;  // one line per device, MiB
};

}  // namespace moe
