// Test helper: a backend that forwards everything to another one (the CPU), so a test can
// change one answer: refuse an op, claim memory of its own (a stand-in GPU), and so on.
#pragma once
#include <memory>
#include <utility>

#include "backends/backend.h"

namespace moe_test {

class ForwardingBackend : public moe::Backend {
public:
  explicit ForwardingBackend(std::unique_ptr<moe::Backend> inner) : inner_(std::move(inner)) {}
  const moe::DeviceInfo &info() const override { return inner_->info(); }
  bool supports(const moe::Graph &g, int node) const override { return inner_->supports(g, node); }
  bool host_memory() const override { return inner_->host_memory(); }
  std::unique_ptr<moe::DeviceBuffer> alloc(size_t b, const char *p) override { return inner_->alloc(b, p); }
  size_t work_size(const moe::Graph &g, int node, int t, const moe::GpuTuning &tn) const override { return inner_->work_size(g, node, t, tn); }
  std::unique_ptr<moe::Executor> make_executor(int t, const moe::GpuTuning &tn) override { return inner_->make_executor(t, tn); }

private:
  std::unique_ptr<moe::Backend> inner_;
};

}  // namespace moe_test
