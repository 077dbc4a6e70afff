// Direct expert reads (Graph::moe_direct_slots_by_layer): in a one-token step with a layer's
// experts in host memory, the first slots of each token's routed experts run on the layer's
// GPU, which reads the host weights in place, while the CPU computes the others. Checked on
// a stand-in GPU (the CPU backend presented as a device with its own memory): where each part
// runs, that no weight is copied, which stretch may overlap the CPU, and the result against
// the same layer unsplit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "graph/compiler.h"
#include "model/arch/blocks.h"
#include "support/forwarding_backend.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;

namespace {

// The CPU backend presented as a GPU (memory of its own, so reads from the CPU need a
// Transfer unless a product reads its weight in place).
class StandInGpu final : public moe_test::ForwardingBackend {
public:
  explicit StandInGpu(std::unique_ptr<Backend> cpu) : ForwardingBackend(std::move(cpu)) {
    info_ = ForwardingBackend::info();
    info_.name = "standin_gpu";
    info_.is_gpu = true;
  }
  const DeviceInfo &info() const override { return info_; }
  bool host_memory() const override { return false; }

private:
  DeviceInfo info_;
};

constexpr int64_t kEmbd = 64, kFf = 32, kExperts = 8, kUsed = 4;

struct MoeLayer {
  moe_test::WeightStore ws;
  const GgufTensorInfo *router = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;
  std::vector<float> x;
  explicit MoeLayer(DType expert_type) {
    using moe_test::randn;
    router = ws.add("blk.0.ffn_gate_inp.weight", DType::F32, {kEmbd, kExperts}, randn(kEmbd * kExperts, 11));
    gate = ws.add("blk.0.ffn_gate_exps.weight", expert_type, {kEmbd, kFf, kExperts}, randn(kEmbd * kFf * kExperts, 12, 0.3f));
    up = ws.add("blk.0.ffn_up_exps.weight", expert_type, {kEmbd, kFf, kExperts}, randn(kEmbd * kFf * kExperts, 13, 0.3f));
    down = ws.add("blk.0.ffn_down_exps.weight", expert_type, {kFf, kEmbd, kExperts}, randn(kFf * kEmbd * kExperts, 14, 0.3f));
    x = randn(kEmbd, 15);
  }
  Graph build(int direct_slots) const {
    Graph g;
    g.set_segment(1);  // layer 0
    if (direct_slots > 0) g.moe_direct_slots_by_layer = {direct_slots};
    const int xi = g.input("x", DType::F32, {kEmbd, 1});
    MoeWeights w{g.weight(router), g.weight(gate), g.weight(up), g.weight(down)};
    g.mark_output(moe_ffn_softmax(g, xi, w, static_cast<int>(kUsed), true), "out");
    return g;
  }
};

bool is_expert(const GgufTensorInfo *t) { return t && t->name.find("_exps") != std::string::npos; }

// Runs a placed plan on its devices (all host memory underneath) and returns "out".
std::vector<float> run_placed(CompiledPlan &plan, const CompileOptions &o, const std::vector<float> &x) {
  std::vector<std::unique_ptr<DeviceBuffer>> arenas;
  void *bases[kMaxDevices] = {nullptr};
  std::vector<std::unique_ptr<Executor>> ex;
  for (size_t d = 0; d < o.devices.size(); ++d) {
    arenas.push_back(o.devices[d]->alloc(plan.arena_bytes[d] + 64, "test"));
    arenas.back()->clear();
    bases[d] = arenas.back()->data();
    ex.push_back(o.devices[d]->make_executor(2, o.gpu_tuning));
  }
  bind_plan(plan, bases, [](const Node &n) { return const_cast<uint8_t *>(n.weight->data); });
  const Graph &g = plan.graph;
  const Node &xin = g.node(g.find_input("x"));
  std::memcpy(xin.data, x.data(), x.size() * 4);
  ExecEnv env;
  for (const Segment &s : plan.segments) ex[static_cast<size_t>(s.device)]->run(g, s.begin, s.end, env);
  const Node &out = g.node(g.find_output("out"));
  const float *p = static_cast<const float *>(out.data);
  return std::vector<float>(p, p + out.nelements());
}

}  // namespace

TEST_CASE("direct expert reads: the GPU part reads host experts in place and may overlap the CPU part; same result as unsplit", "[placement]") {
  BackendRegistry reg;
  StandInGpu gpu(make_cpu_backend("cpu_inner", false));
  Backend *cpu = reg.find("cpu");
  REQUIRE(cpu);
  for (DType t : {DType::F32, DType::Q8_0}) {
    INFO("expert type " << dtype_name(t));
    MoeLayer layer(t);
    CompileOptions o;
    o.devices = {cpu, &gpu};
    o.n_threads = 2;
    o.weight_device = [](const GgufTensorInfo *w) { return is_expert(w) ? 0 : 1; };  // experts on the CPU
    o.kv_device = [](int) { return 1; };
    o.default_device = 1;
    o.direct_device = [](int) { return 1; };

    // Reference: the same layer unsplit, every expert product on the CPU.
    auto whole = compile_graph(layer.build(0), o);
    for (const Node &n : whole->graph.nodes()) {
      CHECK_FALSE(n.direct_read);
      if (n.op == Op::MatMulId) CHECK(n.device == 0);
    }
    const std::vector<float> want = run_placed(*whole, o, layer.x);

    for (int slots = 1; slots < kUsed; ++slots) {
      INFO("slots on the GPU: " << slots);
      auto split = compile_graph(layer.build(slots), o);
      const Graph &g = split->graph;
      int direct = 0, host_products = 0;
      for (const Node &n : g.nodes()) {
        if (n.op == Op::Transfer) CHECK(g.node(n.src[0]).leaf != LeafKind::Weight);  // no weight is copied
        if (n.op != Op::MatMulId) continue;
        if (n.direct_read) {
          ++direct;
          CHECK(n.device == 1);
          CHECK(g.node(n.src[0]).device == 0);  // the host copy, read in place
          CHECK(g.node(n.src[2]).ne[0] == slots);
        } else {
          ++host_products;
          CHECK(n.device == 0);
          CHECK(g.node(n.src[2]).ne[0] == kUsed - slots);
        }
      }
      CHECK(direct == 3);
      CHECK(host_products == 3);
      // One overlapped stretch: the GPU's expert products, launched before the CPU's part and
      // not read by it.
      int overlapped = 0;
      for (size_t k = 0; k < split->segments.size(); ++k) {
        const Segment &s = split->segments[k];
        if (!s.overlap) continue;
        ++overlapped;
        CHECK(s.device == 1);
        REQUIRE(k + 1 < split->segments.size());
        CHECK(split->segments[k + 1].device == 0);
        for (int i = s.begin; i < s.end; ++i) {
          const Op op = g.node(i).op;
          CHECK((op == Op::MatMulId || op == Op::SwiGLU || op == Op::MoeCombine || op == Op::Leaf || op == Op::View));
        }
      }
      CHECK(overlapped == 1);
      const std::vector<float> got = run_placed(*split, o, layer.x);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-4).margin(1e-5));
    }

    // Without a device that reads host memory, the split parts stay with their weights.
    CompileOptions no_direct = o;
    no_direct.direct_device = nullptr;
    auto kept = compile_graph(layer.build(2), no_direct);
    for (const Node &n : kept->graph.nodes())
      if (n.op == Op::MatMulId) CHECK(n.device == 0);
    for (const Segment &s : kept->segments) CHECK_FALSE(s.overlap);
    const std::vector<float> got = run_placed(*kept, no_direct, layer.x);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-4).margin(1e-5));
  }
}
