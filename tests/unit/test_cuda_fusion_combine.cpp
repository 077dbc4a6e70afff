// MoeCombine + residual Add of 2+ tokens (where no DownCombine group took the combine: several
// sequences, prompts) in one launch (FusedKind::CombineAdd, cuda_fused_combine_add in
// ops/moe_route.cu): against the same graph unfused on CUDA (bit for bit: the combine's rounded
// products and sums, then the Add's one float addition) and against the CPU. Both combine
// kernels (4 values a thread: M % 4 == 0 and k <= 8; one value: odd M or more slots), the
// residual as either operand. Without a CUDA build or device the case WARNs and returns.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backends/backend.h"
#include "support/device_graph.h"
#include "support/fusion_runs.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_fusion.h"
#endif

using namespace moe;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;

TEST_CASE("cuda fusion: MoE combine + residual add of 2+ tokens in one launch equals unfused and the CPU", "[ops][cuda][fusion][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Shape {
    int64_t M, k;
  };
  const Shape shapes[] = {{2048, 8}, {2048, 1}, {301, 4}, {64, 10}};
  uint32_t seed = 7700;
  for (const Shape &sh : shapes)
    for (int64_t T : {2, 7, 64}) {
      const bool res_first = T % 2 == 1;
      INFO("M " << sh.M << " k " << sh.k << " T " << T << (res_first ? " Add(r, combine)" : " Add(combine, r)"));
      int ex = -1, w = -1, r = -1, y = -1;
      auto build = [&]() {
        Graph g;
        ex = g.input("ex", DType::F32, {sh.M, sh.k, T});
        w = g.input("w", DType::F32, {sh.k, T});
        r = g.input("r", DType::F32, {sh.M, T});
        const int c = g.moe_combine(ex, w);
        y = res_first ? g.add(r, c) : g.add(c, r);
        g.mark_output(y, "y");
        return g;
      };
      std::vector<std::string> labels;
      for (const FusedGroup &grp : moe_test::plan_on(*gpu, build()).groups) labels.push_back(grp.label);
      CHECK(labels == std::vector<std::string>{"fused:moe_combine+add"});
      const std::vector<Input> ins = {in(ex, randn(static_cast<size_t>(sh.M * sh.k * T), seed++)),
                                      in(w, randn(static_cast<size_t>(sh.k * T), seed++, 0.5f)),
                                      in(r, randn(static_cast<size_t>(sh.M * T), seed++))};
      const auto rc = run_on(*reg.cpu(), build(), ins, {y});
      const moe_test::FusedRun f = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, true);
      const moe_test::FusedRun u = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, false);
      CHECK(f.launches + 1 == u.launches);  // the Add launch fewer
      CHECK(f.out[0] == u.out[0]);          // bit for bit
      CHECK(rel_err(f.out[0], rc[0]) < 1e-6);
      GpuTuning off;
      off.combine_add = false;  // the members in order
      const moe_test::FusedRun o = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, true, off);
      CHECK(o.launches == u.launches);
      CHECK(o.out[0] == u.out[0]);
    }
#endif
}
