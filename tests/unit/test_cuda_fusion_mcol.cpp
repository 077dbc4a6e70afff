// MoE gate/up + SwiGLU of a few tokens (several sequences decoding together) in one launch of
// the few-column tensor-core kernel (ops/matvec_cols.cu, launch_mcol_swiglu; cuda_mcol_swiglu in
// ops/matmul.cu): the plan's GateUpSwiGLU group against the same graph unfused on CUDA (gate,
// up and SwiGLU in their own launches: bit for bit, each product's sums are the unfused launch's
// and the SwiGLU value is the SwiGLU kernel's) and against the CPU; and the planned scratch
// (host code, no GPU needed). Without a CUDA build or device the GPU case WARNs and returns.
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
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_paths.h"
#endif

using namespace moe;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::random_ids;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::WeightStore;

namespace {

// x [K, 1, T] through gate and up [K, M, E] (k of E experts per token), SwiGLU(gate, up); the
// products built up first (qwen3moe's order) or gate first.
struct GateUp {
  const GgufTensorInfo *wg, *wu;
  int64_t K, M, k, T;
  bool up_first;
  int x = -1, ids = -1, gate = -1, up = -1, sw = -1;  // node ids, set by graph()
  Graph graph() {
    Graph g;
    x = g.input("x", DType::F32, {K, 1, T});
    ids = g.input("ids", DType::I32, {k, T});
    if (up_first) up = g.matmul_id(g.weight(wu), x, ids);
    gate = g.matmul_id(g.weight(wg), x, ids);
    if (!up_first) up = g.matmul_id(g.weight(wu), x, ids);
    sw = g.swiglu(gate, up);
    g.mark_output(sw, "y");
    return g;
  }
};

}  // namespace

TEST_CASE("cuda fusion: MoE gate/up + SwiGLU at 2..15 tokens in one few-column launch equals unfused and the CPU",
          "[ops][cuda][fusion][moe][mcol]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  GpuTuning tn;
  tn.ref_order_max_tokens = 0;  // test graphs ask for the CPU's order; the decode graphs of a context do not
  struct Shape {
    int64_t K, M;
  };
  // K 768: 3 blocks (K parts over up to 2 warps); K 2048 (Qwen3's gate/up) and odd M (a tile's
  // rows past M); 16 experts, 4 per token.
  const Shape shapes[] = {{768, 77}, {2048, 300}};
  const int64_t E = 16, k = 4;
  uint32_t seed = 7100;
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (const Shape &sh : shapes)
      for (int64_t T : {2, 3, 4, 8, 15}) {
        WeightStore ws;
        GateUp m{ws.add("gate", t, {sh.K, sh.M, E}, randn(static_cast<size_t>(sh.K * sh.M * E), seed, 0.3f)),
                 ws.add("up", t, {sh.K, sh.M, E}, randn(static_cast<size_t>(sh.K * sh.M * E), seed + 1, 0.3f)),
                 sh.K,
                 sh.M,
                 k,
                 T,
                 T % 2 == 1};
        seed += 2;
        INFO("type " << dtype_name(t) << " K " << sh.K << " M " << sh.M << " T " << T << (m.up_first ? " up first" : " gate first"));
        std::vector<std::string> labels;
        for (const FusedGroup &grp : moe_test::plan_on(*gpu, m.graph(), tn).groups) labels.push_back(grp.label);
        CHECK(labels == std::vector<std::string>{"fused:matmul_id+matmul_id+swiglu"});
        const std::vector<Input> ins = {in(m.x, randn(static_cast<size_t>(sh.K * T), seed++)), in(m.ids, random_ids(T, E, k, seed++))};
        const auto rc = run_on(*reg.cpu(), m.graph(), ins, {m.sw});
        const moe_test::FusedRun f = moe_test::run_gpu(*gpu, m.graph(), ins, {m.sw}, ExecEnv{}, true, tn);
        const moe_test::FusedRun u = moe_test::run_gpu(*gpu, m.graph(), ins, {m.sw}, ExecEnv{}, false, tn);
        // Fused: activation rounding, route tables, the pair launch; unfused: those three per
        // product and the SwiGLU.
        CHECK(f.launches + 4 == u.launches);
        CHECK(f.out[0] == u.out[0]);  // bit for bit
        const double e = rel_err(f.out[0], rc[0]);
        INFO("relative error vs the CPU " << e);
        CHECK(e < 1e-4);
        // Off: the dp4a kernel takes the products (no pair kernel), the members run in order.
        GpuTuning dp4a = tn;
        dp4a.mcol_tensor_cores = dp4a.mcol_tensor_cores_q6k = false;
        const moe_test::FusedRun d = moe_test::run_gpu(*gpu, m.graph(), ins, {m.sw}, ExecEnv{}, true, dp4a);
        CHECK(d.launches == u.launches);
        CHECK(rel_err(d.out[0], rc[0]) < 1e-4);
      }
#endif
}

// q / k / v of a few columns (several sequences decoding) with one activation rounding
// (cuda_mcol_matvecs, GpuTuning::mcol_shared_rounding): the MatVecs group against the same graph
// unfused (bit for bit: the same rounding, the same few-column launches) and the CPU; Q4_K_M's
// types (q, k Q4_K, v Q6_K: one activation format), odd rows, 2..15 columns.
TEST_CASE("cuda fusion: q / k / v at 2..15 columns with one activation rounding equal unfused and the CPU", "[ops][cuda][fusion][mcol]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  GpuTuning tn;
  tn.ref_order_max_tokens = 0;
  tn.mcol_shared_rounding = true;
  const int64_t K = 2048;
  const std::vector<std::pair<DType, int64_t>> ws_of = {{DType::Q4_K, 301}, {DType::Q4_K, 64}, {DType::Q6_K, 77}};
  uint32_t seed = 7300;
  WeightStore ws;
  std::vector<const GgufTensorInfo *> w;
  for (size_t i = 0; i < ws_of.size(); ++i)
    w.push_back(ws.add("w" + std::to_string(i), ws_of[i].first, {K, ws_of[i].second},
                       randn(static_cast<size_t>(K * ws_of[i].second), seed++, 0.5f)));
  for (int64_t N : {2, 4, 8, 15}) {
    INFO("columns " << N);
    int x = -1;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {K, N});
      outs.clear();
      for (size_t i = 0; i < w.size(); ++i) outs.push_back(g.matmul(g.weight(w[i]), x));
      for (size_t i = 0; i < w.size(); ++i) g.mark_output(outs[i], "y" + std::to_string(i));
      return g;
    };
    std::vector<std::string> labels;
    for (const FusedGroup &grp : moe_test::plan_on(*gpu, build(), tn).groups) labels.push_back(grp.label);
    CHECK(labels == std::vector<std::string>{"fused:matmul+matmul+matmul"});
    const std::vector<Input> ins = {in(x, randn(static_cast<size_t>(K * N), seed++))};
    const auto rc = run_on(*reg.cpu(), build(), ins, outs);
    const GpuTuning own = moe_test::cpu_order_final_outputs(tn);
    const moe_test::FusedRun f = moe_test::run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true, own);
    const moe_test::FusedRun u = moe_test::run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false, own);
    CHECK(f.launches + 2 == u.launches);  // two rounding launches fewer
    for (size_t i = 0; i < outs.size(); ++i) {
      INFO("output " << i);
      CHECK(f.out[i] == u.out[i]);
      CHECK(rel_err(f.out[i], rc[i]) < 1e-4);
    }
    GpuTuning off = own;
    off.mcol_shared_rounding = false;
    CHECK(moe_test::run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true, off).launches == u.launches);
  }
#endif
}

// A MatMul of a few columns + a residual Add (several sequences' attention output projection) in
// one few-column launch that adds the residual as it stores (cuda_mcol_matmul_add,
// GpuTuning::mcol_add): against the same graph unfused (bit for bit: the same rounding and
// product kernel, then the Add's one float addition) and the CPU. The tensor-core types (Q4_K,
// Q6_K), the dp4a kernel's (Q5_K, Q8_0) and a plain one (F16: no rounding launch); odd rows (a
// tile's rows past M), the residual as either operand.
TEST_CASE("cuda fusion: a MatMul + residual Add at 2..15 columns in one few-column launch equals unfused and the CPU",
          "[ops][cuda][fusion][mcol]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  GpuTuning tn;
  tn.ref_order_max_tokens = 0;
  const int64_t K = 2048, M = 301;
  uint32_t seed = 7500;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q8_0, DType::F16}) {
    WeightStore ws;
    const GgufTensorInfo *wi = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
    for (int64_t N : {2, 5, 8, 15}) {
      const bool res_first = N % 2 == 1;
      INFO("type " << dtype_name(t) << " columns " << N << (res_first ? " Add(r, product)" : " Add(product, r)"));
      int x = -1, r = -1, y = -1;
      auto build = [&]() {
        Graph g;
        x = g.input("x", DType::F32, {K, N});
        r = g.input("r", DType::F32, {M, N});
        const int p = g.matmul(g.weight(wi), x);
        y = res_first ? g.add(r, p) : g.add(p, r);
        g.mark_output(y, "y");
        return g;
      };
      std::vector<std::string> labels;
      for (const FusedGroup &grp : moe_test::plan_on(*gpu, build(), tn).groups) labels.push_back(grp.label);
      CHECK(labels == std::vector<std::string>{"fused:matmul+add"});
      const std::vector<Input> ins = {in(x, randn(static_cast<size_t>(K * N), seed++)), in(r, randn(static_cast<size_t>(M * N), seed++))};
      const auto rc = run_on(*reg.cpu(), build(), ins, {y});
      const GpuTuning own = moe_test::cpu_order_final_outputs(tn);
      const moe_test::FusedRun f = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, true, own);
      const moe_test::FusedRun u = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, false, own);
      CHECK(f.launches + 1 == u.launches);  // the Add launch fewer
      CHECK(f.out[0] == u.out[0]);          // bit for bit
      const double e = rel_err(f.out[0], rc[0]);
      INFO("relative error vs the CPU " << e);
      CHECK(e < 1e-4);
      GpuTuning off = own;
      off.mcol_add = false;  // the members in order
      const moe_test::FusedRun o = moe_test::run_gpu(*gpu, build(), ins, {y}, ExecEnv{}, true, off);
      CHECK(o.launches == u.launches);
      CHECK(o.out[0] == u.out[0]);
    }
  }
#endif
}

#ifdef MOEINFER_WITH_CUDA
// The Add node carries the fused MatMul + Add launch's scratch (the product's rounded
// activations) exactly where that launch applies: 2..15 columns of a quantized type on the
// few-column kernel, fusion and GpuTuning::mcol_add on.
TEST_CASE("cuda plan: a few-column MatMul + Add carries the fused launch's scratch", "[cuda][mcol][fusion]") {
  const CudaPaths h200 = cuda_select_paths(90, 90, 232448);
  WeightStore ws;
  auto works = [&](DType t, int64_t N, const GpuTuning &tu) {
    const int64_t K = 512, M = 96;
    const GgufTensorInfo *wi = ws.add("w" + std::to_string(ws.infos.size()), t, {K, M}, randn(static_cast<size_t>(K * M), 3, 0.5f));
    Graph g;
    const int x = g.input("x", DType::F32, {K, N}), r = g.input("r", DType::F32, {M, N});
    const int p = g.matmul(g.weight(wi), x), y = g.add(p, r);
    g.mark_output(y, "y");
    g.cpu_float_order = false;
    return std::make_pair(cuda_work_size(g, y, tu, h200), cuda_work_size(g, p, tu, h200));
  };
  const GpuTuning tn;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0})
    for (int64_t N : {2, 8, 15}) {
      INFO("type " << dtype_name(t) << " columns " << N);
      const auto w = works(t, N, tn);
      CHECK(w.first > 0);
      CHECK(w.first == w.second);
    }
  CHECK(works(DType::Q4_K, 1, tn).first == 0);   // one column: the one-token mat-vec rounds inside
  CHECK(works(DType::Q4_K, 16, tn).first == 0);  // the tensor-core GEMM
  CHECK(works(DType::F16, 4, tn).first == 0);    // plain weights: read in place, nothing rounded
  GpuTuning off = tn;
  off.fusion = false;
  CHECK(works(DType::Q4_K, 4, off).first == 0);
  off = tn;
  off.mcol_add = false;
  CHECK(works(DType::Q4_K, 4, off).first == 0);
}

// The SwiGLU node carries the pair launch's scratch (the gate product's: int8 activations,
// scales, route tables) exactly where that launch applies: 2+ tokens, Q4_K / Q6_K on the
// tensor-core kernel, under the GEMM's threshold, fusion on.
TEST_CASE("cuda plan: a few-token gate/up + SwiGLU carries the fused launch's scratch", "[cuda][mcol][fusion]") {
  const CudaPaths h200 = cuda_select_paths(90, 90, 232448);
  WeightStore ws;
  auto works = [&](DType t, int64_t T, const GpuTuning &tu, const CudaPaths &paths) {
    const int64_t K = 256, M = 64, E = 16;
    GateUp m{ws.add("g" + std::to_string(ws.infos.size()), t, {K, M, E}, randn(static_cast<size_t>(K * M * E), 1, 0.5f)),
             ws.add("u" + std::to_string(ws.infos.size()), t, {K, M, E}, randn(static_cast<size_t>(K * M * E), 2, 0.5f)),
             K,
             M,
             8,
             T,
             false};
    Graph g = m.graph();
    g.cpu_float_order = false;
    return std::make_pair(cuda_work_size(g, m.sw, tu, paths), cuda_work_size(g, m.gate, tu, paths));
  };
  const GpuTuning tn;
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (int64_t T : {2, 4, 15}) {  // up to 120 entries: under 8 per expert
      INFO("type " << dtype_name(t) << " T " << T);
      const auto w = works(t, T, tn, h200);
      CHECK(w.first > 0);
      CHECK(w.first == w.second);
    }
  CHECK(works(DType::Q4_K, 1, tn, h200).first == 0);   // one token: the one-token group kernel
  CHECK(works(DType::Q4_K, 16, tn, h200).first == 0);  // 128 entries: the GEMM
  CHECK(works(DType::Q5_K, 4, tn, h200).first == 0);   // the dp4a few-column kernel: members in order
  GpuTuning off = tn;
  off.fusion = false;
  CHECK(works(DType::Q4_K, 4, off, h200).first == 0);
  off = tn;
  off.mcol_swiglu = false;
  CHECK(works(DType::Q4_K, 4, off, h200).first == 0);
  off = tn;
  off.mcol_tensor_cores = false;
  CHECK(works(DType::Q4_K, 4, off, h200).first == 0);
  CHECK(works(DType::Q6_K, 4, off, h200).first > 0);
  CHECK(works(DType::Q4_K, 4, tn, cuda_select_paths(75, 75, 65536)).first == 0);  // no tensor-core code
}
#endif
