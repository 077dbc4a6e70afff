// Two CUDA contexts (or registries) in one process never share a switch or a count: the
// device a registry emulates (GpuEmulation), the launch and wait counters (CudaCounters) and
// the per-op profile (CudaProfile) belong to each CudaBackend, so to each context. The
// counting and profile objects are checked without a GPU in any CUDA build; on a GPU
// ([cuda], skipped without one) an emulating and a native registry alive together, and two
// contexts decoding side by side, one profiled, on two threads.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "engine/context_impl.h"
#include "engine/engine.h"
#include "support/cuda_counts.h"
#include "support/device_graph.h"
#include "support/tiny_model.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_profile.h"
#endif

using namespace moe;

TEST_CASE("cuda counters: a launch counts on the counters its thread names, and nowhere else", "[cuda][isolation]") {
#ifdef MOEINFER_WITH_CUDA
  CudaCounters a, b;
  cuda_note_launch();  // no executor launching: counted nowhere
  {
    const CudaLaunchCounting on_a(a);
    cuda_note_launch();
    {
      const CudaLaunchCounting on_b(b);  // nested: b until it ends, then a again
      cuda_note_launch();
    }
    cuda_note_launch();
    // Another thread names its own counters (or none): never a's.
    std::thread other([&] {
      cuda_note_launch();
      const CudaLaunchCounting on_b(b);
      cuda_note_launch();
    });
    other.join();
  }
  cuda_note_launch();
  CHECK(a.launches() == 2);
  CHECK(b.launches() == 2);
  a.count_sync(SyncWhy::Download);
  a.count_sync(SyncWhy::Executor);
  b.count_sync(SyncWhy::Teardown);
  CHECK(a.syncs() == 2);
  CHECK(a.syncs(SyncWhy::Download) == 1);
  CHECK(a.syncs(SyncWhy::Executor) == 1);
  CHECK(a.syncs(SyncWhy::Teardown) == 0);
  CHECK(b.syncs() == 1);
  CHECK(b.syncs(SyncWhy::Teardown) == 1);
#else
  WARN("a build without CUDA: CUDA test skipped");
#endif
}

TEST_CASE("cuda profile: each profile tables its own launches", "[cuda][isolation]") {
#ifdef MOEINFER_WITH_CUDA
  CudaProfile p, q;
  CHECK_FALSE(p.enabled());
  p.enable(true);
  CHECK(p.enabled());
  CHECK_FALSE(q.enabled());
  p.add("MatMul q8_0 T=1", 0.25);
  p.add("MatMul q8_0 T=1", 0.75);
  p.add("RmsNorm", 0.5);
  q.add("Attention T=1", 2.0);
  CHECK(p.calls() == 3);
  CHECK(q.calls() == 1);
  const std::string table = p.report(true);
  INFO(table);
  CHECK(table.find("MatMul q8_0 T=1") != std::string::npos);
  CHECK(table.find("RmsNorm") != std::string::npos);
  CHECK(table.find("Attention") == std::string::npos);
  CHECK(table.find("1.500") != std::string::npos);  // the total
  CHECK(table.find("MatMul") < table.find("RmsNorm"));  // largest first
  CHECK(p.calls() == 0);  // reset
  CHECK(q.calls() == 1);
#else
  WARN("a build without CUDA: CUDA test skipped");
#endif
}

TEST_CASE("cuda backends: a registry emulating sm_75 and native ones, alive together, keep their own paths", "[cuda][isolation][paths]") {
  BackendRegistry native;
  Backend *gpu = moe_test::gpu_or_skip(native);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  const auto &own = static_cast<const CudaBackend &>(*gpu);
  const CudaPaths device = cuda_device_paths(own.device());
  const std::string name = own.info().name;
  BackendRegistry older(name, GpuEmulation{75, 65536});  // with a twin: it emulates too
  BackendRegistry later;                                  // made while the emulating one lives
  const auto *emu = dynamic_cast<const CudaBackend *>(older.find(name));
  const auto *twin = dynamic_cast<const CudaBackend *>(older.find(name + "_twin"));
  const auto *after = dynamic_cast<const CudaBackend *>(later.find(name));
  REQUIRE(emu);
  REQUIRE(twin);
  REQUIRE(after);
  INFO("device sm_" << device.device_arch << " running sm_" << device.code_arch << " code");
  for (const CudaBackend *b : {&own, after}) {
    CHECK(b->emulation().arch == 0);
    CHECK(b->paths().device_arch == device.device_arch);
    CHECK(b->paths().code_arch == device.code_arch);
    CHECK(b->paths().tensor_cores == device.tensor_cores);
    CHECK(b->paths().pdl == device.pdl);
    CHECK(b->paths().smem_optin == device.smem_optin);
  }
  for (const CudaBackend *b : {emu, twin}) {
    CHECK(b->emulation().arch == 75);
    CHECK(b->paths().code_arch <= 75);
    CHECK_FALSE(b->paths().tensor_cores);
    CHECK_FALSE(b->paths().pdl);
    CHECK(b->paths().smem_optin <= 65536);
  }
  if (device.code_arch <= 75) WARN("this device runs sm_75 code or older: its own paths equal the emulated ones");
  else CHECK(own.paths().code_arch != emu->paths().code_arch);
#endif
}

#ifdef MOEINFER_WITH_CUDA
namespace {

// One greedy one-token decode of a context after its prompt (sequence 0).
struct Stepper {
  std::unique_ptr<Context> ctx;
  int32_t pos = 0, next = 0;
  Stepper(const Model &m, const ContextParams &cp) : ctx(Context::create(m, cp)) {
    std::vector<BatchToken> prompt;
    const int32_t ids[] = {510, 1, 300, 42, 77, 5};
    for (int32_t i = 0; i < 6; ++i) prompt.push_back({ids[i], i, 0, i == 5});
    ctx->decode(prompt.data(), prompt.size());
    pos = 6;
    take_argmax();
  }
  void step() {
    BatchToken t{next, pos++, 0, true};
    ctx->decode(&t, 1);
    take_argmax();
  }
  void take_argmax() {
    const float *l = ctx->logits(-1);
    next = 0;
    for (int32_t v = 1; v < ctx->n_vocab(); ++v)
      if (l[v] > l[next]) next = v;
  }
  CudaBackend &gpu() const { return dynamic_cast<CudaBackend &>(*ctx->impl().devices.at(0)); }
};

}  // namespace
#endif

// Eager passes (no CUDA graphs), so every step launches its kernels one by one. Three
// contexts of one model follow the same greedy tokens: c alone sets the expected counts of
// each step; a (profiled) and b then take the same steps, first one after the other, then at
// once on two threads, and each must count exactly its own, its profile alone filling.
TEST_CASE("cuda contexts: counters and the profile of one context never record another's", "[cuda][isolation][engine]") {
  BackendRegistry probe;
  if (!moe_test::gpu_or_skip(probe)) return;
#ifdef MOEINFER_WITH_CUDA
  auto model = Model::load(moe_test::tiny_model("q8_0"), ModelLoadParams{});
  ContextParams cp;
  cp.n_ctx = 64;
  cp.n_threads = 2;
  cp.device = "cuda";
  cp.gpu_graphs = false;
  Stepper a(*model, cp), b(*model, cp), c(*model, cp);
  REQUIRE(&a.gpu() != &b.gpu());
  REQUIRE(&a.gpu() != &c.gpu());
  constexpr int kSteps = 5;
  std::vector<uint64_t> want_launches;  // c's, step by step
  for (int k = 0; k < kSteps; ++k) {
    const moe_test::CudaCounts c0 = moe_test::cuda_counts(*c.ctx);
    c.step();
    want_launches.push_back((moe_test::cuda_counts(*c.ctx) - c0).launches);
    CHECK(want_launches.back() > 0);
  }
  a.gpu().profile().enable(true);

  // One after the other: b's step moves b's counts only and fills no profile; a's step
  // counts what c's did and fills a's profile (one timed launch per node or fused group).
  const moe_test::CudaCounts a0 = moe_test::cuda_counts(*a.ctx), b0 = moe_test::cuda_counts(*b.ctx);
  b.step();
  const moe_test::CudaCounts b_step = moe_test::cuda_counts(*b.ctx) - b0;
  CHECK(b_step.launches == want_launches[0]);
  CHECK(b_step.syncs >= 1);  // the logits download at least
  CHECK((moe_test::cuda_counts(*a.ctx) - a0).launches == 0);
  CHECK((moe_test::cuda_counts(*a.ctx) - a0).syncs == 0);
  CHECK(a.gpu().profile().calls() == 0);
  CHECK(b.gpu().profile().calls() == 0);
  a.step();
  CHECK((moe_test::cuda_counts(*a.ctx) - a0).launches == want_launches[0]);
  CHECK((moe_test::cuda_counts(*b.ctx) - b0).launches == want_launches[0]);
  const int64_t timed = a.gpu().profile().calls();  // the same plan each step: the same count
  CHECK(timed > 0);
  CHECK(b.gpu().profile().calls() == 0);
  CHECK(c.gpu().profile().calls() == 0);

  // At once, on two threads: each context counts exactly its own steps.
  uint64_t want = 0;
  for (int k = 1; k < kSteps; ++k) want += want_launches[static_cast<size_t>(k)];
  const moe_test::CudaCounts a1 = moe_test::cuda_counts(*a.ctx), b1 = moe_test::cuda_counts(*b.ctx);
  std::thread tb([&] {
    for (int k = 1; k < kSteps; ++k) b.step();
  });
  for (int k = 1; k < kSteps; ++k) a.step();
  tb.join();
  CHECK(a.next == c.next);  // the same tokens all along
  CHECK(b.next == c.next);
  CHECK((moe_test::cuda_counts(*a.ctx) - a1).launches == want);
  CHECK((moe_test::cuda_counts(*b.ctx) - b1).launches == want);
  CHECK(a.gpu().profile().calls() == kSteps * timed);
  CHECK(b.gpu().profile().calls() == 0);
  a.gpu().profile().enable(false);
#endif
}
