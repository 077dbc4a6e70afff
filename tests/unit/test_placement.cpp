// Placement pieces on their own: the compiler's device boundaries (Transfer nodes, no buffer,
// view or in-place result across devices: the seed report's illegal memory access), silent
// fallback off, the placement settings' conflicts, the fit search's set-versus-unset rule and
// its error for an impossible budget, and the one-host-round-trip-per-layer bound on CUDA.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/context_impl.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "graph/compiler.h"
#include "model/hparams.h"
#include "model/model_impl.h"
#include "placement/fit.h"
#include "support/cuda_counts.h"
#include "support/forwarding_backend.h"
#include "support/tiny_model.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#endif

using namespace moe;

namespace {

// A CPU backend that refuses one op (placement must then fail, or fall back when allowed).
class RefusingBackend final : public moe_test::ForwardingBackend {
public:
  RefusingBackend(std::unique_ptr<Backend> cpu, Op refused) : ForwardingBackend(std::move(cpu)), refused_(refused) {}
  bool supports(const Graph &g, int node) const override { return g.node(node).op != refused_ && ForwardingBackend::supports(g, node); }

private:
  Op refused_;
};

struct TwoDeviceGraph {
  std::vector<float> w0, w1, x;
  GgufTensorInfo t0, t1;
  Graph g;
  int out = -1;
};

// x * w0 (weight on device 0), then rms_norm, then + w1 (weight on device 1): the Add can run
// in place and its input dies there, so without a boundary it would write over device 0's buffer.
std::unique_ptr<TwoDeviceGraph> two_device_graph() {
  auto t = std::make_unique<TwoDeviceGraph>();
  const int n = 64;
  for (int i = 0; i < n; ++i) {
    t->w0.push_back(0.5f + 0.01f * static_cast<float>(i));
    t->w1.push_back(-0.25f + 0.02f * static_cast<float>(i));
    t->x.push_back(std::sin(static_cast<float>(i)));
  }
  for (GgufTensorInfo *w : {&t->t0, &t->t1}) {
    w->n_dims = 1;
    w->ne[0] = n;
    w->type = DType::F32;
    w->nbytes = static_cast<size_t>(n) * 4;
  }
  t->t0.name = "w0";
  t->t1.name = "w1";
  t->t0.data = reinterpret_cast<const uint8_t *>(t->w0.data());
  t->t1.data = reinterpret_cast<const uint8_t *>(t->w1.data());
  Graph &g = t->g;
  const int x = g.input("x", DType::F32, {n});
  int h = g.mul(x, g.weight(&t->t0));
  h = g.rms_norm(h, 1e-6f);
  h = g.add(h, g.weight(&t->t1));
  g.mark_output(h, "out");
  return t;
}

}  // namespace

TEST_CASE("placement compiler: values cross devices only through Transfer nodes; no in-place op takes another device's buffer", "[placement]") {
  BackendRegistry reg("cpu");
  Backend *a = reg.find("cpu"), *b = reg.find("cpu_twin");
  REQUIRE(b);
  auto t = two_device_graph();
  CompileOptions o;
  o.devices = {a, b};
  o.weight_device = [&](const GgufTensorInfo *w) { return w == &t->t1 ? 1 : 0; };
  auto plan = compile_graph(std::move(t->g), o);
  const Graph &g = plan->graph;
  CHECK(plan->n_transfers == 1);
  int n_add = 0;
  for (const Node &n : g.nodes()) {
    for (int s : n.src)
      if (s >= 0) CHECK((g.node(s).device == n.device) == (n.op != Op::Transfer));
    if (n.storage >= 0) CHECK(g.node(n.storage).device == n.device);
    if (n.op == Op::Add) {
      ++n_add;
      CHECK(n.device == 1);
      CHECK(g.node(n.src[0]).op == Op::Transfer);  // reads its own device's copy
    }
  }
  CHECK(n_add == 1);
  REQUIRE(plan->segments.size() >= 2);
  CHECK(plan->segments.front().device == 0);
  CHECK(plan->segments.back().device == 1);

  // Run it on the two devices and compare with float64.
  std::vector<std::unique_ptr<DeviceBuffer>> arenas;
  void *bases[kMaxDevices] = {nullptr};
  for (int d = 0; d < 2; ++d) {
    arenas.push_back(o.devices[static_cast<size_t>(d)]->alloc(plan->arena_bytes[d] + 64, "test"));
    arenas.back()->clear();
    bases[d] = arenas.back()->data();
  }
  bind_plan(*plan, bases, [](const Node &n) { return const_cast<uint8_t *>(n.weight->data); });
  const Node &xin = g.node(g.find_input("x"));
  std::memcpy(xin.data, t->x.data(), t->x.size() * 4);
  auto e0 = a->make_executor(1, GpuTuning{}), e1 = b->make_executor(1, GpuTuning{});
  ExecEnv env;
  for (const Segment &s : plan->segments) (s.device == 0 ? e0 : e1)->run(g, s.begin, s.end, env);
  const float *got = static_cast<const float *>(g.node(g.find_output("out")).data);
  double ss = 0;
  for (size_t i = 0; i < t->x.size(); ++i) ss += double(t->x[i]) * t->w0[i] * double(t->x[i]) * t->w0[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(t->x.size()) + 1e-6);
  for (size_t i = 0; i < t->x.size(); ++i) CHECK(got[i] == Approx(double(t->x[i]) * t->w0[i] * inv + t->w1[i]).epsilon(1e-5).margin(1e-6));
}

TEST_CASE("placement compiler: an op its device cannot run is an error naming op and device, unless fallback is allowed", "[placement]") {
  RefusingBackend gpu_like(make_cpu_backend("limited"), Op::RmsNorm);
  auto cpu = make_cpu_backend();
  for (bool fallback : {false, true}) {
    auto t = two_device_graph();
    CompileOptions o;
    o.devices = {&gpu_like, cpu.get()};
    o.allow_fallback = fallback;
    if (!fallback) {
      try {
        compile_graph(std::move(t->g), o);
        FAIL("compiled an rms_norm on a device that cannot run it");
      } catch (const Error &e) {
        CHECK(e.code() == Status::Unsupported);
        CHECK(std::string(e.what()).find("rms_norm") != std::string::npos);
        CHECK(std::string(e.what()).find("limited") != std::string::npos);
      }
    } else {
      auto plan = compile_graph(std::move(t->g), o);
      for (const Node &n : plan->graph.nodes())
        if (n.op == Op::RmsNorm) CHECK(n.device == 1);
      CHECK(plan->n_transfers >= 2);  // there and back
    }
  }
}

TEST_CASE("placement settings: contradictions and unknown devices fail at load, naming both settings", "[placement]") {
  const std::string path = moe_test::tiny_model("q8_0");
  struct Bad {
    const char *why;
    PlacementParams p;
    std::vector<std::string> devices;
    std::vector<const char *> words;
  };
  std::vector<Bad> bad;
  PlacementParams p;
  p.cpu_moe = true; p.n_cpu_moe = 1; bad.push_back({"cpu_moe + n_cpu_moe", p, {}, {"cpu_moe", "n_cpu_moe"}}); p = {};
  p.n_cpu_moe = 99; bad.push_back({"n_cpu_moe > layers", p, {}, {"n_cpu_moe", "layers"}}); p = {};
  p.tensor_split = {1, 1}; bad.push_back({"tensor_split, no GPU", p, {"cpu"}, {"tensor_split", "no GPU"}}); p = {};
  p.tensor_split = {1}; p.n_gpu_layers = 0; bad.push_back({"tensor_split + n_gpu_layers 0", p, {}, {"tensor_split", "n_gpu_layers=0"}}); p = {};
  p.n_gpu_layers = 2; bad.push_back({"n_gpu_layers, no GPU", p, {"cpu"}, {"n_gpu_layers", "no GPU"}}); p = {};
  p.overrides = {"attn_q=nodev"}; bad.push_back({"override to an unknown device", p, {}, {"attn_q=nodev", "nodev"}}); p = {};
  p.overrides = {"attn_(q=cpu"}; bad.push_back({"bad regex", p, {}, {"attn_(q=cpu", "regular expression"}}); p = {};
  p.overrides = {"attn_q"}; bad.push_back({"override without a device", p, {}, {"REGEX=DEVICE"}}); p = {};
  p.main_device = "cuda7"; bad.push_back({"unknown main device", p, {}, {"main_device", "cuda7"}}); p = {};
  p.cpu_moe = true; bad.push_back({"cpu_moe without the CPU", p, {"cpu_twin"}, {"cpu_moe", "no CPU"}}); p = {};
  for (const Bad &c : bad) {
    INFO(c.why);
    ModelLoadParams mp;
    mp.placement = c.p;
    mp.placement.twin_device = "cpu";
    mp.devices = c.devices;
    try {
      Model::load(path, mp);
      FAIL("loaded");
    } catch (const Error &e) {
      CHECK(e.code() == Status::InvalidArgument);
      for (const char *w : c.words) CHECK_THAT(e.what(), Catch::Contains(w));
    }
  }
}

namespace {

// A model of 10 layers whose attention takes 100 MiB and routed experts 900 MiB on the GPU
// unless moved; the CPU has no budget.
constexpr uint64_t kMiB = 1ull << 20;
std::vector<DevicePlan> fake_plan(const PlacementParams &p, uint32_t n_ctx, uint64_t budget) {
  const int L = 10;
  const int on_gpu = p.n_gpu_layers < 0 ? L : p.n_gpu_layers;
  const int moe_cpu = p.cpu_moe ? L : std::max(p.n_cpu_moe, 0);
  DevicePlan gpu{"gpu", 0, 0, 50 * kMiB, 10 * kMiB, budget}, cpu{"cpu", 0, 0, 0, 0, 0};
  for (int l = 0; l < L; ++l) {
    const bool layer_gpu = l >= L - on_gpu;
    (layer_gpu ? gpu : cpu).weights += 100 * kMiB;
    (layer_gpu && l >= moe_cpu ? gpu : cpu).weights += 900 * kMiB;
    (layer_gpu ? gpu : cpu).kv_cache += n_ctx * 4096ull;
  }
  return {gpu, cpu};
}

}  // namespace

TEST_CASE("fit search: experts leave first, user-set values are kept, an impossible budget says by how much", "[placement][fit]") {
  for (uint64_t budget_mib : {2000ull, 4000ull, 6000ull, 9500ull}) {
    INFO("budget " << budget_mib << " MiB");
    PlacementParams u;
    u.fit = true;
    u.fit_n_ctx = 4096;
    const uint64_t budget = budget_mib * kMiB;
    FitPlan f = choose_fit(u, 10, [&](const PlacementParams &p, uint32_t c) { return fake_plan(p, c, budget); });
    CHECK(f.devices[0].total() <= budget);
    CHECK(f.devices[0].total() + 900 * kMiB > budget);  // experts move one layer at a time: nothing left on the table
    CHECK(f.n_gpu_layers == 10);                       // attention stays: experts go first
    CHECK(f.chose_n_cpu_moe);
    // One layer fewer on the CPU would not fit.
    PlacementParams q = u;
    q.n_cpu_moe = f.n_cpu_moe - 1;
    CHECK(fake_plan(q, 4096, budget)[0].total() > budget);
  }
  // A user-set n_cpu_moe is kept; the fit moves whole layers instead.
  PlacementParams u;
  u.fit = true;
  u.n_cpu_moe = 2;
  FitPlan f = choose_fit(u, 10, [&](const PlacementParams &p, uint32_t c) { return fake_plan(p, c, 3000 * kMiB); });
  CHECK(f.n_cpu_moe == 2);
  CHECK_FALSE(f.chose_n_cpu_moe);
  CHECK(f.chose_n_gpu_layers);
  CHECK(f.n_gpu_layers < 10);
  CHECK(f.devices[0].total() <= 3000 * kMiB);
  PlacementParams applied = u;
  apply_fit(f, applied);
  CHECK(applied.n_cpu_moe == 2);
  CHECK(applied.n_gpu_layers == f.n_gpu_layers);
  // A user-set n_gpu_layers is kept too: with both set the budget either fits or fails.
  u.n_gpu_layers = 10;
  try {
    choose_fit(u, 10, [&](const PlacementParams &p, uint32_t c) { return fake_plan(p, c, 3000 * kMiB); });
    FAIL("fitted with both values set and too small a budget");
  } catch (const Error &e) {
    CHECK(e.code() == Status::OutOfMemory);
    CHECK_THAT(e.what(), Catch::Contains("more than its budget"));
    CHECK_THAT(e.what(), Catch::Contains("(set by the user)"));
  }
  // Impossible: even everything on the CPU leaves the fixed 60 MiB on a 10 MiB budget.
  PlacementParams w;
  w.fit = true;
  try {
    choose_fit(w, 10, [&](const PlacementParams &p, uint32_t c) { return fake_plan(p, c, 10 * kMiB); });
    FAIL("fitted an impossible budget");
  } catch (const Error &e) {
    CHECK(e.code() == Status::OutOfMemory);
    CHECK_THAT(e.what(), Catch::Contains("1.18 GiB (1268776960 bytes) more than its budget of 0.01 GiB"));
  }
  // The context shrinks only when allowed.
  w.fit_shrink_ctx = true;
  w.n_cpu_moe = 10;
  w.n_gpu_layers = 10;
  FitPlan s = choose_fit(w, 10, [&](const PlacementParams &p, uint32_t c) { return fake_plan(p, c, 1000 * kMiB + 60 * kMiB + 10 * 2048 * 4096ull); });
  CHECK(s.n_ctx == 2048);
}

TEST_CASE("fit on a real file: the dry run's plan and a load with the fit's choice", "[placement][fit]") {
  const std::string path = moe_test::tiny_model("q8_0");
  ModelLoadParams mp;
  mp.placement.twin_device = "cpu";  // the twin stands in for a GPU with a budget
  mp.devices = {"cpu_twin", "cpu"};
  mp.placement.fit = true;
  mp.placement.fit_n_ctx = 256;
  const FitPlan all = fit_model(path, mp);  // cpu_twin's free memory: everything fits there
  REQUIRE(all.devices.size() == 2);
  CHECK(all.devices[0].device == "cpu_twin");
  CHECK(all.n_cpu_moe == 0);
  CHECK(all.devices[0].weights > 0);
  CHECK(all.devices[0].kv_cache > 0);
  CHECK(all.devices[0].activations > 0);
  const uint64_t expert_bytes = all.devices[0].weights / 2;  // a budget the experts must leave
  mp.placement.budgets = {"cpu_twin=" + std::to_string(all.devices[0].total() - expert_bytes)};
  const FitPlan some = fit_model(path, mp);
  CHECK(some.n_cpu_moe > 0);
  CHECK(some.devices[0].total() <= all.devices[0].total() - expert_bytes);
  auto model = Model::load(path, mp);  // loads with the fit's choice
  CHECK(model->impl().placement.weight_bytes()[0] == some.devices[0].weights);
  mp.placement.budgets = {"cpu_twin=1K"};
  const FitPlan none = fit_model(path, mp);  // every layer leaves: the CPU has no budget
  CHECK(none.n_gpu_layers == 0);
  CHECK(none.devices[0].weights == 0);
  mp.placement.n_gpu_layers = 2;  // set by the user: kept, so 1 KiB cannot be met
  CHECK_THROWS_WITH(fit_model(path, mp), Catch::Contains("more than its budget"));
  mp.placement.n_gpu_layers = -1;
  mp.placement.budgets = {"cpu_twin=12Q"};
  CHECK_THROWS_WITH(fit_model(path, mp), Catch::Contains("suffix"));
}

TEST_CASE("placement on CUDA: experts on the CPU keep GPU stretches in graphs, at most one host round trip per layer", "[placement][cuda]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry probe;
  if (!probe.find("cuda0")) { WARN("no CUDA device: skipped"); return; }
  const std::string path = moe_test::tiny_model("q8_0");
  ModelLoadParams mp;
  mp.placement.cpu_moe = true;
  auto model = Model::load(path, mp);
  const int L = static_cast<int>(model->hparams().n_layer);
  ContextParams cp;
  cp.n_ctx = 64;
  auto ctx = Context::create(*model, cp);
  std::vector<BatchToken> prompt;
  for (int32_t i = 0; i < 6; ++i) prompt.push_back({(i * 37 + 5) % model->n_vocab(), i, 0, i == 5});
  ctx->decode(prompt.data(), prompt.size());
  for (int step = 0; step < 8; ++step) {
    BatchToken t{(step * 11 + 3) % model->n_vocab(), 6 + step, 0, true};
    const moe_test::CudaCounts before = moe_test::cuda_counts(*ctx);
    ctx->decode(&t, 1);
    const moe_test::CudaCounts done = moe_test::cuda_counts(*ctx) - before;
    const uint64_t syncs = done.syncs, launches = done.launches;
    if (step >= 3) {
      std::string segs;
      const CompiledPlan &pl = ctx->impl().plan_for(1, 1);
      for (const Segment &sg : pl.segments)
        for (int i = sg.begin; i < sg.end; ++i)
          if (pl.graph.node(i).op != Op::Leaf && pl.graph.node(i).op != Op::View)
            segs += std::string(i == sg.begin ? " | d" + std::to_string(sg.device) + ":" : ",") + op_name(pl.graph.node(i).op);
      std::string by;
      for (int k = 0; k < kSyncWhyCount; ++k) by += std::to_string(done.by[k]) + " ";
      if (syncs > static_cast<uint64_t>(L) + 1) WARN("syncs by kind (download, staging, executor, setup, teardown): " << by << "; segments of the one-token plan: " << segs);
      INFO("step " << step << ": " << syncs << " host waits, " << launches << " eager kernel launches, " << L << " layers");
      CHECK(syncs <= static_cast<uint64_t>(L) + 1);  // one per layer (GPU -> CPU) + the logits download
      CHECK(launches == 0);                          // every GPU stretch replayed from its CUDA graph
    }
  }
  // Direct expert reads (an option: the GPU computes some of each token's experts over the
  // bus while the CPU computes the rest): same bounds on host waits and eager launches, and
  // the logits of the same steps with every expert on the CPU.
  cp.direct_expert_slots = 1;
  auto direct = Context::create(*model, cp);
  direct->decode(prompt.data(), prompt.size());
  for (int step = 0; step < 8; ++step) {
    BatchToken t{(step * 11 + 3) % model->n_vocab(), 6 + step, 0, true};
    const moe_test::CudaCounts before = moe_test::cuda_counts(*direct);
    direct->decode(&t, 1);
    if (step >= 3) {
      const moe_test::CudaCounts done = moe_test::cuda_counts(*direct) - before;
      CHECK(done.syncs <= static_cast<uint64_t>(L) + 1);
      CHECK(done.launches == 0);
    }
  }
  const CompiledPlan &pl = direct->impl().plan_for(1, 1);
  int on_gpu = 0, overlapped = 0;
  for (const Node &n : pl.graph.nodes()) on_gpu += n.direct_read && !direct->impl().devices[static_cast<size_t>(n.device)]->host_memory() ? 1 : 0;
  for (const Segment &sg : pl.segments) overlapped += sg.overlap ? 1 : 0;
  INFO("direct-read products on a GPU: " << on_gpu << ", overlapped stretches: " << overlapped);
  CHECK(on_gpu == 3 * L);
  CHECK(overlapped == L);
  const float *got = direct->logits(0), *want = ctx->logits(0);
  double worst = 0;
  for (int32_t i = 0; i < model->n_vocab(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  INFO("largest logit difference, direct reads vs all experts on the CPU: " << worst);
  CHECK(worst < 0.05);
#endif
}
