// gpt-oss's MoE part at one token in two launches (cuda_fusion.h: GateUpSwiGLU and
// DownCombine with the experts' AddId biases; ops/matvec.cu: MvBias): the graph the gpt-oss
// builder makes (up and gate MatMulId -> AddId, SwiGLU-OAI, down MatMulId -> AddId ->
// MoeCombine -> Add residual) run fused against the same graph unfused on CUDA (bit for
// bit: the fused kernels add each bias to the same dot and take the unfused kernels' float
// expressions) and against the CPU; an expert id out of range is reported, not a crash.
// Without a CUDA build or device every case WARNs and returns.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "support/device_graph.h"
#include "support/fusion_runs.h"
#include "support/graph_runner.h"
#include "support/random_data.h"

using namespace moe;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::WeightStore;

namespace {

// One layer's MoE part as gpt_oss.cpp builds it: K activations, F expert rows, E experts,
// k used; expert weights of type t, F32 biases. Outputs: the SwiGLU-OAI activations and the
// layer output (combine + residual).
struct OssMoe {
  int64_t K, F, E, k;
  const GgufTensorInfo *wu, *wg, *wd, *bu, *bg, *bd;
  int x = -1, ids = -1, cw = -1, res = -1, act = -1, out = -1;  // node ids, set by graph()

  OssMoe(WeightStore &ws, DType t, int64_t K_, int64_t F_, int64_t E_, int64_t k_, uint32_t seed) : K(K_), F(F_), E(E_), k(k_) {
    // Weight scale 0.05: dots of a few units, so SwiGLU-OAI's clamp at 7 cuts only some of them.
    wu = ws.add("up", t, {K, F, E}, randn(static_cast<size_t>(K * F * E), seed, 0.05f));
    wg = ws.add("gate", t, {K, F, E}, randn(static_cast<size_t>(K * F * E), seed + 1, 0.05f));
    wd = ws.add("down", t, {F, K, E}, randn(static_cast<size_t>(F * K * E), seed + 2, 0.05f));
    bu = ws.add("up.bias", DType::F32, {F, E}, randn(static_cast<size_t>(F * E), seed + 3, 0.5f));
    bg = ws.add("gate.bias", DType::F32, {F, E}, randn(static_cast<size_t>(F * E), seed + 4, 0.5f));
    bd = ws.add("down.bias", DType::F32, {K, E}, randn(static_cast<size_t>(K * E), seed + 5, 0.5f));
  }
  Graph graph() {
    Graph g;
    x = g.input("x", DType::F32, {K, 1});
    ids = g.input("ids", DType::I32, {k, 1});
    cw = g.input("cw", DType::F32, {k, 1});
    res = g.input("res", DType::F32, {K, 1});
    const int x3 = g.view(x, {K, 1, 1});
    const int up = g.add_id(g.matmul_id(g.weight(wu), x3, ids), g.weight(bu), ids);
    const int gate = g.add_id(g.matmul_id(g.weight(wg), x3, ids), g.weight(bg), ids);
    act = g.swiglu_oai(gate, up, 1.702f, 7.0f);
    const int down = g.add_id(g.matmul_id(g.weight(wd), act, ids), g.weight(bd), ids);
    out = g.add(g.moe_combine(down, cw), res);
    g.mark_output(act, "act");
    g.mark_output(out, "out");
    return g;
  }
  std::vector<Input> inputs(const std::vector<int32_t> &id, uint32_t seed) const {
    return {in(x, randn(static_cast<size_t>(K), seed)), in(ids, id), in(cw, randn(static_cast<size_t>(k), seed + 1, 0.5f)),
            in(res, randn(static_cast<size_t>(K), seed + 2))};
  }
};

}  // namespace

TEST_CASE("cuda fusion: gpt-oss experts with biases and SwiGLU-OAI in two launches equal unfused and the CPU", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Shape {
    int64_t K, F, E, k;
  };
  // gpt-oss-20b's layer (K = F = 2880, 4 experts used; 8 stored instead of 32 to keep the
  // test's weights small: the 16-warp down kernel); five slots (two passes of four); F 3072
  // with eight slots (the 8-warp down kernel with two warps per row: the 16-warp one's shared
  // memory does not fit); two slots; K 1536 with 64 rows (gate/up).
  // Products of few rows run unfused in K halves (matvec.cu: rows_mode's kModeHalves at the
  // device's SM count; on the H200 down at F 3072 and gate/up at F 96, 224 and 64): the fused
  // kernels must fold as they do. Halves of 24 or 48 blocks of 32 (K 1536, 3072) sum their
  // lanes in another order than one pass; halves of 2^n blocks (K 256, 1024) happen to agree.
  const Shape shapes[] = {{2880, 2880, 8, 4}, {256, 96, 6, 5}, {256, 3072, 10, 8}, {1024, 224, 8, 2}, {1536, 64, 4, 3}};
  uint32_t seed = 4100;
  for (DType t : {DType::MXFP4, DType::Q8_0, DType::Q4_0})
    for (const Shape &sh : shapes) {
      if (t != DType::MXFP4 && sh.K == 2880) continue;  // (one real-size case)
      INFO("type " << dtype_name(t) << " K " << sh.K << " F " << sh.F << " E " << sh.E << " k " << sh.k);
      WeightStore ws;
      OssMoe m(ws, t, sh.K, sh.F, sh.E, sh.k, seed);
      seed += 10;
      std::vector<int32_t> id;
      for (int64_t j = 0; j < sh.k; ++j) id.push_back(static_cast<int32_t>((j * 7 + 3) % sh.E));
      // The plan: the two groups, nothing else.
      std::vector<std::string> labels;
      for (const FusedGroup &grp : moe_test::plan_on(*gpu, m.graph()).groups) labels.push_back(grp.label);
      CHECK(labels == std::vector<std::string>{"fused:matmul_id+add_id+matmul_id+add_id+swiglu_oai", "fused:matmul_id+add_id+moe_combine+add"});
      const std::vector<Input> ins = m.inputs(id, seed++);  // (after graph(): the input nodes' ids)
      const std::vector<int> outs = {m.act, m.out};
      const auto rc = run_on(*reg.cpu(), m.graph(), ins, outs);
      const moe_test::FusedRun fused = moe_test::run_gpu(*gpu, m.graph(), ins, outs, ExecEnv{}, true);
      const moe_test::FusedRun unfused = moe_test::run_gpu(*gpu, m.graph(), ins, outs, ExecEnv{}, false);
      const auto &rf = fused.out, &ru = unfused.out;
      CHECK(fused.launches + 7 == unfused.launches);  // 2 launches for the 9 nodes
      for (size_t o = 0; o < outs.size(); ++o) {
        INFO("output " << (o ? "out" : "act"));
        const std::vector<float> f = moe_test::as_f32(rf[o]), u = moe_test::as_f32(ru[o]);
        size_t first = 0;
        while (first < f.size() && first < u.size() && std::memcmp(&f[first], &u[first], 4) == 0) ++first;
        INFO("first differing element " << first << " of " << f.size() << (first < f.size() && first < u.size() ? ": fused " + std::to_string(f[first]) + ", unfused " + std::to_string(u[first]) : std::string()));
        CHECK(rf[o] == ru[o]);  // bit for bit
        const double e = rel_err(rf[o], rc[o]);
        INFO("relative error vs the CPU " << e);
        CHECK(e < 1e-4);
      }
    }
#endif
}

TEST_CASE("cuda fusion: a bad expert id in gpt-oss's fused expert groups is reported, not a crash", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (DType t : {DType::MXFP4, DType::Q8_0}) {
    INFO("type " << dtype_name(t));
    WeightStore ws;
    OssMoe m(ws, t, 256, 96, 6, 3, 4300);
    moe_test::BoundGraph bg(*gpu, m.graph());
    const std::string msg = moe_test::error_after_run(bg, m.inputs({4, 9, 5}, 4310), m.out);
    UNSCOPED_INFO("message: " << msg);
    CHECK(msg.find("index 9 outside [0, 6)") != std::string::npos);
    for (int node : {m.act, m.out})
      for (const float v : moe_test::as_f32(bg.read(node))) CHECK(std::isfinite(v));  // the bad slot: zeros / no contribution
    CHECK(moe_test::error_after_run(bg, m.inputs({4, 2, 5}, 4320), m.out).empty());  // the next pass, good ids: no report
    // The good slots' values equal the unfused run's with the same bad id.
    const auto rf = moe_test::run_gpu(*gpu, m.graph(), m.inputs({4, -1, 5}, 4330), {m.act, m.out}, ExecEnv{}, true).out;
    const auto ru = moe_test::run_gpu(*gpu, m.graph(), m.inputs({4, -1, 5}, 4330), {m.act, m.out}, ExecEnv{}, false).out;
    const auto af = moe_test::as_f32(rf[0]), au = moe_test::as_f32(ru[0]);
    for (size_t i = 0; i < af.size(); ++i)
      if (i / 96 != 1) CHECK(af[i] == au[i]);
    CHECK(rf[1] == ru[1]);  // the bad slot adds nothing (unfused: a zero product times its weight)
  }
#endif
}
