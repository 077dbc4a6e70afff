// GPU tuning options are per context (src/core/gpu_tuning.h): the compiler sizes scratch
// with the options it is given, a context keeps its own, and two contexts of one process
// with different options decode exactly as each does alone, alternately and at the same time.
// [tuning] cases run without a GPU (the scratch-size ones need a CUDA build); [tuning][cuda]
// cases need a device and WARN without one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "engine/context_impl.h"
#include "engine/engine.h"
#include "graph/compiler.h"
#include "placement/fit.h"
#include "support/cuda_counts.h"
#include "support/forwarding_backend.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#include "support/tiny_model.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_ops.h"
#endif

using namespace moe;

namespace {

#ifdef MOEINFER_WITH_CUDA
// The scratch sizes of an H200 running sm_90 code (these cases need no GPU).
const CudaPaths kHopper = cuda_select_paths(90, 90, 232448);
#endif

// Every option away from its default (the fused kernels off, so launch counts differ too).
GpuTuning all_off() {
  GpuTuning t;
  t.dependent_launch = false;
  t.fusion = false;
  t.own_order_head = false;
  t.lean_groups = false;
  t.lean_rows = false;
  t.mcol_tensor_cores = false;
  t.mcol_tensor_cores_q6k = false;
  t.mcol_max_entries = 100;
  t.mcol_swiglu = false;
  t.mcol_shared_rounding = false;
  t.mcol_add = false;
  t.combine_add = false;
  t.seqs_decode_attention = false;
  t.decode_max_ranges = 4;
  t.decode_min_chunk = 16;
  t.prefill_attn_blocks = 8;
  t.blas_min_tokens = 0;
  t.ref_order_max_tokens = 0;
  return t;
}

// A CPU backend that records the options the compiler sizes scratch with; with size_like_cuda
// (CUDA builds) it answers with the CUDA backend's scratch sizes, computed on the host.
class RecordingBackend : public moe_test::ForwardingBackend {
public:
  explicit RecordingBackend(bool size_like_cuda) : ForwardingBackend(make_cpu_backend()), cuda_(size_like_cuda) {}
  size_t work_size(const Graph &g, int node, int t, const GpuTuning &tn) const override {
    seen.push_back(tn);
    if (cuda_) {
#ifdef MOEINFER_WITH_CUDA
      return cuda_work_size(g, node, tn, kHopper);
#endif
    }
    return ForwardingBackend::work_size(g, node, t, tn);
  }
  mutable std::vector<GpuTuning> seen;

private:
  bool cuda_;
};

// A prompt-sized dense Q4_K product (cuBLAS from blas_min_tokens columns, else the int8 MMQ:
// different scratch) and a prefill attention (its cell splits follow prefill_attn_blocks).
Graph scratch_graph(moe_test::WeightStore &ws, int *mm, int *att) {
  constexpr int64_t K = 2048, M = 4096, T = 512, hd = 128, n_head = 32, n_head_kv = 4;
  const GgufTensorInfo *w = ws.add("w", DType::Q4_K, {K, M}, moe_test::randn(static_cast<size_t>(K * M), 3, 0.5f));
  Graph g;
  const int x = g.input("x", DType::F32, {K, T});
  *mm = g.matmul(g.weight(w), x);
  g.mark_output(*mm, "y");
  const int q = g.input("q", DType::F32, {hd, n_head, T});
  const int k = g.input("k", DType::F32, {hd, n_head_kv, T});
  const int v = g.input("v", DType::F32, {hd, n_head_kv, T});
  *att = g.attention_ext(q, g.kv_store(k, 0, 0), g.kv_store(v, 0, 1), hd, 0.125f, AttentionOptions{});
  g.node(*att).ip[1] = 1024;  // cells
  g.mark_output(*att, "o");
  return g;
}

#ifdef MOEINFER_WITH_CUDA
struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint8_t>> logits;  // raw bytes of every step's logits
  std::vector<uint64_t> launches;            // kernel launches of each one-token step (eager runs only)
  std::vector<size_t> arena_bytes;           // the context's planned arenas
};

ContextParams params_for(const GpuTuning &t, bool graphs) {
  ContextParams cp;
  cp.n_ctx = 128;
  cp.n_threads = 2;
  cp.device = "cuda";
  cp.kv_type = KvType::F32;
  cp.gpu_graphs = graphs;
  cp.gpu_tuning = t;
  return cp;
}

// One greedy decode of a fixed prompt, driven step by step so two can be interleaved.
class Decoder {
public:
  Decoder(const Model &m, const GpuTuning &t, bool graphs, bool count) : ctx_(Context::create(m, params_for(t, graphs))), count_(count) {
    run_.arena_bytes = ctx_->impl().arena_bytes;
  }
  static constexpr int kSteps = 6;
  bool done() const { return step_ > kSteps; }
  void step() {
    if (step_ == 0) {
      std::vector<BatchToken> prompt;
      const int32_t ids[] = {510, 1, 300, 42, 77, 5, 9, 100};
      for (int32_t i = 0; i < 8; ++i) prompt.push_back({ids[i], i, 0, i == 7});
      ctx_->decode(prompt.data(), prompt.size());
    } else {
      BatchToken t{run_.tokens.back(), 7 + step_, 0, true};
      const uint64_t before = moe_test::cuda_counts(*ctx_).launches;  // this context's: the other decoder's never count
      ctx_->decode(&t, 1);
      if (count_) run_.launches.push_back(moe_test::cuda_counts(*ctx_).launches - before);
    }
    const int32_t nv = ctx_->n_vocab();
    const float *l = ctx_->logits(-1);
    run_.logits.emplace_back(reinterpret_cast<const uint8_t *>(l), reinterpret_cast<const uint8_t *>(l + nv));
    run_.tokens.push_back(static_cast<int32_t>(std::max_element(l, l + nv) - l));
    ++step_;
  }
  const Run &result() {
    run_.arena_bytes = ctx_->impl().arena_bytes;
    return run_;
  }

private:
  std::unique_ptr<Context> ctx_;
  bool count_;
  Run run_;
  int step_ = 0;
};

Run alone(const Model &m, const GpuTuning &t, bool graphs) {
  Decoder d(m, t, graphs, !graphs);
  while (!d.done()) d.step();
  return d.result();
}

void check_same(const Run &got, const Run &want) {
  CHECK(got.tokens == want.tokens);
  REQUIRE(got.logits.size() == want.logits.size());
  for (size_t s = 0; s < got.logits.size(); ++s) {
    INFO("step " << s);
    CHECK(got.logits[s] == want.logits[s]);  // the same kernels: the same bits
  }
  CHECK(got.launches == want.launches);
  CHECK(got.arena_bytes == want.arena_bytes);
}
#endif

}  // namespace

TEST_CASE("gpu tuning: defaults are the documented ones", "[tuning]") {
  const GpuTuning t;
  CHECK(t.dependent_launch);
  CHECK(t.fusion);
  CHECK(t.own_order_head);
  CHECK(t.lean_groups);
  CHECK(t.lean_rows);
  CHECK(t.mcol_tensor_cores);
  CHECK(t.mcol_tensor_cores_q6k);
  CHECK(t.mcol_max_entries == 0);  // 8 per expert
  CHECK(t.mcol_swiglu);
  CHECK(t.mcol_shared_rounding);
  CHECK(t.mcol_add);
  CHECK(t.combine_add);
  CHECK(t.seqs_decode_attention);
  CHECK(t.decode_max_ranges == 32);
  CHECK(t.decode_min_chunk == 64);
  CHECK(!t.tc_decode_attention);  // opt-in until measured
  CHECK(t.prefill_attn_blocks == 2);
  CHECK(t.blas_min_tokens == kGpuBlasMinTokens);
  CHECK(t.ref_order_max_tokens == kGpuRefOrderMaxTokens);
  CHECK(ContextParams{}.gpu_tuning == t);
  CHECK(PlacementParams{}.fit_gpu_tuning == t);
  GpuTuning u = t;
  u.decode_min_chunk = 63;
  CHECK(u != t);
  GpuTuning w = t;
  w.tc_decode_attention = true;
  CHECK(w != t);
}

// The compiler sizes every node's scratch with CompileOptions::gpu_tuning, nothing else.
TEST_CASE("gpu tuning: the compiler sizes scratch with the options it is given", "[tuning]") {
  RecordingBackend be(true);
  moe_test::WeightStore ws;
  int mm = -1, att = -1;
  CompileOptions o;
  o.devices = {&be};
  o.gpu_tuning = all_off();
  auto plan = compile_graph(scratch_graph(ws, &mm, &att), o);
  REQUIRE_FALSE(be.seen.empty());
  for (const GpuTuning &t : be.seen) CHECK(t == o.gpu_tuning);
#ifdef MOEINFER_WITH_CUDA
  // With the CUDA sizes: each plan's largest scratch is its nodes' under its own options, and
  // the options that choose kernels change them (consistent planning, not a process default).
  const Graph &g = plan->graph;
  auto largest = [&](const GpuTuning &t) {
    size_t m = 0;
    for (int i = 0; i < static_cast<int>(g.nodes().size()); ++i) m = std::max(m, cuda_work_size(g, i, t, kHopper));
    return m;
  };
  CHECK(plan->work_bytes[0] == largest(o.gpu_tuning));
  be.seen.clear();
  o.gpu_tuning = GpuTuning{};
  auto plan_default = compile_graph(scratch_graph(ws, &mm, &att), o);
  for (const GpuTuning &t : be.seen) CHECK(t == GpuTuning{});
  CHECK(plan_default->work_bytes[0] == largest(GpuTuning{}));

  GpuTuning blas_off, blas_above, blocks1, blocks16;
  blas_off.blas_min_tokens = 0;
  blas_above.blas_min_tokens = 513;  // the product has 512 columns
  blocks1.prefill_attn_blocks = 1;
  blocks16.prefill_attn_blocks = 16;
  const size_t mm_blas = cuda_work_size(g, mm, GpuTuning{}, kHopper), mm_off = cuda_work_size(g, mm, blas_off, kHopper);
  CHECK(mm_blas > mm_off);  // f16 weights and activations against int8 activations
  CHECK(cuda_work_size(g, mm, blas_above, kHopper) == mm_off);
  CHECK(cuda_work_size(g, mm, blocks16, kHopper) == mm_blas);  // an attention option: the product's scratch is unchanged
  CHECK(cuda_work_size(g, att, blocks16, kHopper) > cuda_work_size(g, att, blocks1, kHopper));  // more cell splits, more partials
  // The device's paths size it too: sm_75 code has no tensor-core GEMM, so without cuBLAS the
  // product takes the f32 tile kernels' f32 activations (4 bytes a value against the int8
  // MMQ's 1 and its scales); with cuBLAS its f16 weights are the larger scratch on either.
  const CudaPaths turing = cuda_select_paths(75, 75, 65536);
  CHECK(cuda_work_size(g, mm, blas_off, turing) > mm_off);
  CHECK(cuda_work_size(g, mm, GpuTuning{}, turing) == mm_blas);
#endif
}

// Contexts keep their own options: what they compile with, and what another context's
// creation leaves alone (no process-wide state to leak into).
TEST_CASE("gpu tuning: each context compiles with its own options", "[tuning]") {
  auto model = Model::load(moe_test::tiny_model("q8_0"), ModelLoadParams{});
  ContextParams a, b;
  a.n_ctx = b.n_ctx = 64;
  a.n_threads = b.n_threads = 2;
  a.device = b.device = "cpu";
  b.gpu_tuning = all_off();
  auto ca = Context::create(*model, a);
  auto cb = Context::create(*model, b);
  CHECK(ca->params().gpu_tuning == GpuTuning{});
  CHECK(cb->params().gpu_tuning == all_off());
  for (int64_t n : {1, 64}) {
    CHECK(ca->impl().compile_options(n).gpu_tuning == GpuTuning{});
    CHECK(cb->impl().compile_options(n).gpu_tuning == all_off());
  }
  cb.reset();
  auto cc = Context::create(*model, a);
  CHECK(cc->impl().compile_options(1).gpu_tuning == GpuTuning{});
}

TEST_CASE("gpu tuning: two contexts with different options decode alternately as each does alone", "[tuning][cuda]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry probe;
  if (!probe.find("cuda")) { WARN("no CUDA device: skipped"); return; }
  for (const char *mix : {"q8_0", "q4_k_m"}) {
    INFO("tiny " << mix);
    auto model = Model::load(moe_test::tiny_model(mix), ModelLoadParams{});
    // Eager (graphs off) so every step's launches are counted.
    const Run solo_a = alone(*model, GpuTuning{}, false), solo_b = alone(*model, all_off(), false);
    // The options take effect (else the comparisons below would prove nothing): fused groups
    // launch fewer kernels per step.
    REQUIRE(solo_a.launches.size() == static_cast<size_t>(Decoder::kSteps));
    CHECK(solo_a.launches.back() < solo_b.launches.back());
    Decoder a(*model, GpuTuning{}, false, true), b(*model, all_off(), false, true);
    while (!a.done()) {
      a.step();
      b.step();
    }
    {
      INFO("defaults, next to a context with every option changed");
      check_same(a.result(), solo_a);
    }
    {
      INFO("every option changed, next to a context with the defaults");
      check_same(b.result(), solo_b);
    }
  }
#endif
}

TEST_CASE("gpu tuning: two contexts with different options decode at the same time as each does alone", "[tuning][cuda]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry probe;
  if (!probe.find("cuda")) { WARN("no CUDA device: skipped"); return; }
  auto model = Model::load(moe_test::tiny_model("q4_k_m"), ModelLoadParams{});
  // Graphs on (the default): each context captures and replays its own choice of kernels.
  const Run solo_a = alone(*model, GpuTuning{}, true), solo_b = alone(*model, all_off(), true);
  for (int round = 0; round < 3; ++round) {
    Decoder a(*model, GpuTuning{}, true, false), b(*model, all_off(), true, false);
    std::thread tb([&] {
      while (!b.done()) b.step();
    });
    while (!a.done()) a.step();
    tb.join();
    INFO("round " << round);
    check_same(a.result(), solo_a);
    check_same(b.result(), solo_b);
  }
#endif
}

// The fit plans a GPU's scratch with PlacementParams::fit_gpu_tuning: the same bytes a context
// with those options plans, whatever the defaults would need.
TEST_CASE("gpu tuning: the fit plans GPU scratch with the contexts' options", "[tuning][cuda]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry probe;
  if (!probe.find("cuda0")) { WARN("no CUDA device: skipped"); return; }
  const std::string path = moe_test::tiny_model("q4_k_m");
  for (const GpuTuning &t : {GpuTuning{}, all_off()}) {
    ModelLoadParams mp;
    mp.placement.fit_n_ctx = 512;
    mp.placement.fit_n_ubatch = 512;
    mp.placement.fit_kv_type = static_cast<int>(KvType::F32);
    mp.placement.fit_gpu_tuning = t;
    const FitPlan fit = fit_model(path, mp);
    auto model = Model::load(path, mp);
    ContextParams cp = params_for(t, true);
    cp.device = "auto";
    cp.n_ctx = 512;
    cp.n_ubatch = 512;
    cp.n_batch = 512;
    auto ctx = Context::create(*model, cp);
    const Context::Impl &c = ctx->impl();
    for (size_t d = 0; d < c.devices.size(); ++d) {
      if (c.devices[d]->host_memory()) continue;
      size_t work = 0;
      for (const auto &p : c.plans) work = std::max(work, p.second->work_bytes[d]);
      const std::string name = c.devices[d]->info().name;
      INFO("device " << name << (t == GpuTuning{} ? " (defaults)" : " (every option changed)"));
      bool found = false;
      for (const DevicePlan &dp : fit.devices)
        if (dp.device == name) {
          found = true;
          CHECK(dp.workspace == std::min<uint64_t>(work, c.arena_bytes[d]));
        }
      CHECK(found);
    }
  }
#endif
}
