// Test helper for device-vs-CPU op tests: run a hand-built graph on one backend (weights
// bound in place on the CPU, uploaded to a GPU) and read back the raw bytes of chosen nodes.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "engine/weight_upload.h"
#include "gguf/gguf_reader.h"
#include "graph/compiler.h"

namespace moe_test {

using namespace moe;

inline Backend *gpu_or_skip(BackendRegistry &reg) {
  Backend *g = reg.find("cuda");
  if (!g) WARN("no CUDA device (or a build without CUDA): CUDA test skipped");
  return g;
}

// GPU options under which a product marked as a graph output keeps the CPU's float order on
// CUDA like any other product (tests of bit-identical products); by default a final output
// (Node::final_output, e.g. the LM head) takes CUDA's own order.
inline GpuTuning cpu_order_final_outputs(GpuTuning t = GpuTuning{}) {
  t.own_order_head = false;
  return t;
}

struct Input {
  int node;
  std::vector<uint8_t> bytes;
};
template <typename T> Input in(int node, const std::vector<T> &v) {
  Input i{node, std::vector<uint8_t>(v.size() * sizeof(T))};
  std::memcpy(i.bytes.data(), v.data(), i.bytes.size());
  return i;
}

// A graph compiled for one backend and bound to its own arena, weights bound in place (CPU)
// or uploaded (GPU), with the executor that runs it (kept: a test may run it again or ask it
// for errors afterwards). tuning: the GPU options of plan and executor.
struct BoundGraph {
  std::unique_ptr<CompiledPlan> plan;
  std::unique_ptr<DeviceBuffer> arena;
  std::unique_ptr<DeviceWeights> dw;
  std::unique_ptr<Executor> exec;

  BoundGraph(Backend &be, Graph g, const GpuTuning &tuning = GpuTuning{}) {
    CompileOptions o;
    o.devices = {&be};
    o.n_threads = 2;
    o.gpu_tuning = tuning;
    o.allow_fallback = false;
    plan = compile_graph(std::move(g), o);
    arena = be.alloc(plan->arena_bytes[0] ? plan->arena_bytes[0] : 64, "test");
    if (!be.host_memory()) {
      std::vector<const GgufTensorInfo *> ts;
      for (const Node &n : plan->graph.nodes())
        if (n.leaf == LeafKind::Weight && n.op == Op::Leaf) ts.push_back(n.weight);
      dw = DeviceWeights::upload(ts, be);
    }
    void *bases[1] = {arena->data()};
    bind_plan(*plan, bases, [&](const Node &n) { return dw ? dw->find(n.weight) : const_cast<uint8_t *>(n.weight->data); });
    exec = be.make_executor(2, tuning);
  }
  // Uploads the inputs, runs every node, ends the pass (no wait: read() waits).
  void run(const std::vector<Input> &inputs, const ExecEnv &env = {}) {
    for (const Input &i : inputs) arena->upload(plan->graph.node(i.node).offset, i.bytes.data(), i.bytes.size());
    exec->run(plan->graph, 0, static_cast<int>(plan->graph.nodes().size()), env);
    exec->synchronize();
  }
  std::vector<uint8_t> read(int id) const {
    const Node &n = plan->graph.node(id);
    std::vector<uint8_t> b(n.nbytes());
    arena->download(n.offset, b.data(), b.size());
    return b;
  }
};

// Runs g on one backend; returns the raw bytes of each requested node.
inline std::vector<std::vector<uint8_t>> run_on(Backend &be, Graph g, const std::vector<Input> &inputs, const std::vector<int> &outs,
                                                const ExecEnv &env = {}, int runs = 1, const GpuTuning &tuning = GpuTuning{}) {
  BoundGraph bg(be, std::move(g), tuning);
  for (int r = 0; r < runs; ++r) bg.run(inputs, env);
  std::vector<std::vector<uint8_t>> res;
  for (int id : outs) res.push_back(bg.read(id));
  return res;
}

inline std::vector<float> as_f32(const std::vector<uint8_t> &b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// max |a - b| / max |b| (b: the reference; 1e30 where a is not finite). A final output in
// CUDA's own order (the LM head) differs from the CPU's order by float rounding of its sums.
inline double max_rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double m = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    m = std::max(m, std::fabs(double(b[i])));
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
  }
  return m > 0 ? d / m : d;
}

// ||a - b|| / ||b||, and every value finite.
inline double rel_err(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b) {
  auto x = as_f32(a), y = as_f32(b);
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return 1e30;
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// One pass of bg, its output read (the step's one synchronisation), then the executor's
// error check: the DeviceError's message, or "" when the kernels reported nothing.
inline std::string error_after_run(BoundGraph &bg, const std::vector<Input> &ins, int out, const ExecEnv &env = {}) {
  bg.run(ins, env);
  (void)bg.read(out);
  try {
    bg.exec->check_errors();
  } catch (const Error &e) {
    CHECK(e.code() == Status::DeviceError);
    return e.what();
  }
  return "";
}

}  // namespace moe_test
