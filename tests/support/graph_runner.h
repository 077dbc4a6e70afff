// Test helper: run a small hand-built graph on one backend with host-side inputs, so an op
// can be compared with a naive float64 reference.
#pragma once
#include <cstring>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "graph/compiler.h"
#include "gguf/gguf_reader.h"
#include "kv/kv_cache.h"

namespace moe_test {

// Weights for test graphs: GgufTensorInfo records pointing at owned bytes.
struct WeightStore {
  std::vector<std::unique_ptr<moe::GgufTensorInfo>> infos;
  std::vector<std::vector<uint8_t>> bytes;
  const moe::GgufTensorInfo *add(const std::string &name, moe::DType type, std::vector<int64_t> ne, const std::vector<float> &values) {
    auto t = std::make_unique<moe::GgufTensorInfo>();
    t->name = name;
    t->type = type;
    t->n_dims = static_cast<uint32_t>(ne.size());
    for (size_t d = 0; d < ne.size(); ++d) t->ne[d] = ne[d];
    const int64_t rows = t->n_elements() / ne[0];
    const size_t rs = moe::row_size(type, ne[0]);
    bytes.emplace_back(rs * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) moe::quantize_row(type, values.data() + r * ne[0], bytes.back().data() + r * rs, ne[0]);
    t->nbytes = bytes.back().size();
    t->data = bytes.back().data();
    infos.push_back(std::move(t));
    return infos.back().get();
  }
};

struct GraphRun {
  std::unique_ptr<moe::CompiledPlan> plan;
  std::unique_ptr<moe::DeviceBuffer> arena;
  std::unique_ptr<moe::Executor> exec;
  moe::Backend *dev = nullptr;

  // tuning: the GPU options the plan is sized for and the executor runs with.
  GraphRun(moe::Graph g, moe::Backend &backend, int n_threads, const moe::GpuTuning &tuning = moe::GpuTuning{}) : dev(&backend) {
    moe::CompileOptions o;
    o.devices = {&backend};
    o.n_threads = n_threads;
    o.gpu_tuning = tuning;
    plan = moe::compile_graph(std::move(g), o);
    arena = backend.alloc(plan->arena_bytes[0] ? plan->arena_bytes[0] : 64, "test");
    void *bases[1] = {arena->data()};
    moe::bind_plan(*plan, bases, [](const moe::Node &n) { return const_cast<uint8_t *>(n.weight->data); });
    exec = backend.make_executor(n_threads, tuning);
  }
  void set_input(int node, const void *src, size_t bytes) { arena->upload(plan->graph.node(node).offset, src, bytes); }
  void run(const moe::ExecEnv &env = {}) {
    exec->run(plan->graph, 0, static_cast<int>(plan->graph.nodes().size()), env);
    exec->synchronize();
  }
  std::vector<float> output(int node) {
    const moe::Node &n = plan->graph.node(node);
    std::vector<float> out(static_cast<size_t>(n.nelements()));
    arena->download(n.offset, out.data(), out.size() * 4);
    return out;
  }
  std::vector<int32_t> output_i32(int node) {
    const moe::Node &n = plan->graph.node(node);
    std::vector<int32_t> out(static_cast<size_t>(n.nelements()));
    arena->download(n.offset, out.data(), out.size() * 4);
    return out;
  }
};

}  // namespace moe_test
