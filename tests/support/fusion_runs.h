// The GPU fusion tests' common steps (test_cuda_fusion.cpp, test_cuda_fusion_gpt_oss.cpp,
// test_cuda_newtypes.cpp): the CUDA fusion plan of a hand-built graph as a GPU run plans it,
// and one run of the graph on the GPU, fused or not, with the kernel launches it took.
//
//   const FusionPlan fp = moe_test::plan_on(*gpu, build());
//   const moe_test::FusedRun f = moe_test::run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
//   const moe_test::FusedRun u = moe_test::run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
//   CHECK(f.out[0] == u.out[0]);
//   CHECK(f.launches < u.launches);
#pragma once
#ifdef MOEINFER_WITH_CUDA
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_fusion.h"
#include "graph/compiler.h"
#include "support/device_graph.h"

namespace moe_test {

// The GPU's fusion plan of g under tuning (compiled like run_on compiles it, planned with the
// executor's flags).
inline moe::FusionPlan plan_on(moe::Backend &gpu, moe::Graph g, const moe::GpuTuning &tuning = moe::GpuTuning{}) {
  moe::CompileOptions o;
  o.devices = {&gpu};
  o.n_threads = 2;
  o.allow_fallback = false;
  o.gpu_tuning = tuning;
  auto plan = moe::compile_graph(std::move(g), o);
  return moe::plan_fusion(plan->graph, tuning.delta_norm ? 0u : moe::kNoDeltaNorm);
}

struct FusedRun {
  std::vector<std::vector<uint8_t>> out;  // the bytes of outs, in order
  uint64_t launches = 0;                   // kernel launches of the run
  uint64_t mla_glue = 0;                   // launches of the MLA glue kernel (ops/mla_glue.cu)
};

// One run_on of g on the GPU; base: the other options (the LM head's order, ...); fused sets
// GpuTuning::fusion.
inline FusedRun run_gpu(moe::Backend &gpu, moe::Graph g, const std::vector<Input> &ins, const std::vector<int> &outs, const moe::ExecEnv &env,
                        bool fused, const moe::GpuTuning &base = moe::GpuTuning{}) {
  moe::GpuTuning t = base;
  t.fusion = fused;
  const moe::CudaCounters &counted = static_cast<moe::CudaBackend &>(gpu).counters();
  const uint64_t before = counted.launches(), glue_before = counted.mla_glue_launches();
  FusedRun r;
  r.out = run_on(gpu, std::move(g), ins, outs, env, 1, t);
  r.launches = counted.launches() - before;
  r.mla_glue = counted.mla_glue_launches() - glue_before;
  return r;
}

}  // namespace moe_test
#endif
