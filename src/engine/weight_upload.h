// Device copies of a model's weights for a backend whose memory is not host memory (a
// GPU): one device buffer, each tensor at a 256-byte aligned offset, filled through the
// backend's pinned staging with asynchronous copies, with load progress. Graph nodes that
// run on that device are bound to these copies (Context::Impl::weight_addr).
//
//   auto w = DeviceWeights::upload(tensors, *gpu, [](float f) { return true; });
//   void *p = w->find(info);   // device address, or nullptr when not uploaded
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace moe {

class Backend;
class DeviceBuffer;
struct GgufTensorInfo;

class DeviceWeights {
public:
  // progress(f), f in [0,1]; returning false cancels (throws Status::Aborted). zero_copy:
  // the weights go to host memory the device reads in place (Backend::alloc_mapped_host;
  // integrated GPUs share that DRAM) instead of device memory. released(p, n): called once
  // the n source bytes at p are no longer needed (the model drops their mapped pages).
  static std::unique_ptr<DeviceWeights> upload(const std::vector<const GgufTensorInfo *> &tensors, Backend &dev,
                                               const std::function<bool(float)> &progress = nullptr, bool zero_copy = false,
                                               const std::function<void(const uint8_t *, size_t)> &released = nullptr);
  bool zero_copy() const { return zero_copy_; }
  ~DeviceWeights();
  void *find(const GgufTensorInfo *t) const;
  size_t bytes() const { return bytes_; }

private:
  DeviceWeights() = default;
  std::unique_ptr<DeviceBuffer> buf_;
  std::unordered_map<const GgufTensorInfo *, size_t> offsets_;
  size_t bytes_ = 0;
  bool zero_copy_ = false;
};

}  // namespace moe
