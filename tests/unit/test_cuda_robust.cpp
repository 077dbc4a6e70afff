// The CUDA backend's robustness: bad indices met inside kernels (a get_rows row id, an expert
// id, a KV cell) become a DeviceError at the step's synchronisation, and the process and
// other contexts go on; the attention scratch planned only for the cache type in use.
// [cuda] cases WARN and return without a CUDA build or device; the planner case runs on the
// host (its CUDA part in any CUDA build, GPU or not).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "backends/backend.h"
#include "engine/engine.h"
#include "graph/compiler.h"
#include "kv/kv_cache.h"
#include "memory/planner.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"
#include "model/synth/synth_model.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#include "support/temp_files.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_kernel_errors.h"
#include "backends/cuda/cuda_ops.h"
#endif

using namespace moe;
using moe_test::as_f32;
using moe_test::BoundGraph;
using moe_test::error_after_run;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::randn;
using moe_test::WeightStore;

namespace {

std::string write_tiny_model(const char *tag) {
  const std::string path = moe_test::temp_path(std::string("cuda-robust-") + tag + ".gguf");
  SynthSpec spec;
  spec.preset = "tiny";
  spec.type_mix = "q8_0";
  write_synthetic_model(spec, path);
  return path;
}

bool has(const std::string &msg, const std::string &part) {
  UNSCOPED_INFO("message: " << msg);
  return msg.find(part) != std::string::npos;
}

// From an empty cache: a prompt without logits (a step with no download, whose error check
// finds its copy still in flight), then one with, then greedy steps; true when every step
// succeeds with finite logits and the context stays usable.
bool decodes_fine(Context &ctx) {
  ctx.kv_clear();
  std::vector<BatchToken> prompt;
  for (int32_t i = 0; i < 4; ++i) prompt.push_back({10 + 7 * i, i, 0, false});
  ctx.decode(prompt.data(), prompt.size());
  BatchToken last{99, 4, 0, true};
  ctx.decode(&last, 1);
  for (int32_t step = 0; step < 3; ++step) {
    const float *l = ctx.logits(-1);
    int32_t best = 0;
    for (int32_t v = 0; v < ctx.n_vocab(); ++v) {
      if (!std::isfinite(l[v])) return false;
      if (l[v] > l[best]) best = v;
    }
    BatchToken t{best, 5 + step, 0, true};
    ctx.decode(&t, 1);
  }
  std::string why;
  return !ctx.unusable(&why);
}

}  // namespace

TEST_CASE("graph builders put the context's KV cache type on every Attention node", "[planner][attention]") {
  const std::string path = write_tiny_model("kvtype");
  {
    auto model = Model::load(path, ModelLoadParams{});
    const Model::Impl &m = model->impl();
    for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0}) {
      GraphBuildParams gp;
      gp.n_tokens = 1;
      gp.n_cells = 2048;
      gp.kv_type = kt;
      Graph g;
      m.arch->build(m, gp, g);
      int n_attn = 0;
      for (const Node &n : g.nodes()) {
        if (n.op != Op::Attention) continue;
        ++n_attn;
        REQUIRE(n.kv_type.has_value());
        CHECK(*n.kv_type == kv_dtype(kt));
        CHECK(n.ip[1] == 2048);
      }
      CHECK(n_attn == static_cast<int>(m.hp.n_layer));
    }
  }
  std::remove(path.c_str());
}

TEST_CASE("cuda planner: the reference-order attention scratch only for an F32 cache", "[planner][attention]") {
#ifdef MOEINFER_WITH_CUDA
  // Host only: the decode graph compiled on the CPU, its arena laid out with the CUDA
  // backend's scratch sizes (as plan_by_layer in test_cuda_fusion.cpp).
  BackendRegistry reg;
  const std::string path = write_tiny_model("plan");
  {
    auto model = Model::load(path, ModelLoadParams{});
    const Model::Impl &m = model->impl();
    struct Planned {
      std::vector<size_t> attn_work;  // per Attention node, in graph order
      size_t arena = 0;
    };
    // forget_type: the nodes as a hand-built graph leaves them (no cache type).
    auto plan = [&](KvType kt, bool forget_type) {
      GraphBuildParams gp;
      gp.n_tokens = 1;
      gp.n_cells = 16384;  // the reference-order scratch grows with the cells: the largest thing planned here
      gp.kv_type = kt;
      Graph g;
      m.arch->build(m, gp, g);
      if (forget_type)
        for (Node &n : g.nodes()) n.kv_type.reset();
      CompileOptions co;
      co.devices = {reg.cpu()};
      auto cp = compile_graph(std::move(g), co);
      const Graph &cg = cp->graph;
      Planned p;
      const CudaPaths paths = cuda_select_paths(90, 90, 232448);  // an H200 (runs without a GPU)
      p.arena = plan_memory(cp->graph, [&](int id) { return cuda_work_size(cg, id, GpuTuning{}, paths); }).arena_bytes[0];
      for (int id = 0; id < static_cast<int>(cg.nodes().size()); ++id)
        if (cg.node(id).op == Op::Attention) p.attn_work.push_back(cuda_work_size(cg, id, GpuTuning{}, paths));
      return p;
    };
    const Planned f32 = plan(KvType::F32, false), f16 = plan(KvType::F16, false), q8 = plan(KvType::Q8_0, false),
                  untyped = plan(KvType::F16, true);
    REQUIRE(!f32.attn_work.empty());
    REQUIRE(f16.attn_work.size() == f32.attn_work.size());
    for (size_t i = 0; i < f32.attn_work.size(); ++i) {
      INFO("attention node " << i);
      CHECK(f16.attn_work[i] < f32.attn_work[i]);
      CHECK(q8.attn_work[i] == f16.attn_work[i]);
      CHECK(untyped.attn_work[i] == f32.attn_work[i]);  // no type: room for every kernel, as before
    }
    INFO("arena bytes: F32 cache " << f32.arena << ", F16 " << f16.arena);
    CHECK(f16.arena < f32.arena);
  }
  std::remove(path.c_str());
#endif
}

TEST_CASE("cuda kernel errors: the message names every kind and the first report", "[errors]") {
#ifdef MOEINFER_WITH_CUDA
  const unsigned one[kKernelErrorWords] = {kKernelErrExpertId, kKernelErrExpertId, 7u, 4u};
  const std::string m1 = cuda_kernel_error_message(one);
  CHECK(has(m1, "(MatMulId: expert id outside the experts)"));
  CHECK(has(m1, "first: MatMulId index 7 outside [0, 4)"));
  const unsigned two[kKernelErrorWords] = {kKernelErrGetRows | kKernelErrKvCell, kKernelErrKvCell, static_cast<unsigned>(-2), 16u};
  const std::string m2 = cuda_kernel_error_message(two);
  CHECK(has(m2, "GetRows: row id (token id) outside the table; KvStore: KV cell outside the cache"));
  CHECK(has(m2, "first: KvStore index -2 outside [0, 16)"));
#endif
}

TEST_CASE("cuda kernel errors: bad get_rows / expert / gather ids and KV cells become a DeviceError; the process goes on",
          "[cuda][errors]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  const std::string path = write_tiny_model("errors");
  {
    auto model = Model::load(path, ModelLoadParams{});
    ContextParams cp;
    cp.n_ctx = 64;
    cp.device = "cuda";
    auto before = Context::create(*model, cp);  // lives through every failure below
    CHECK(decodes_fine(*before));

    SECTION("get_rows: a row id outside the table") {
      WeightStore ws;
      const GgufTensorInfo *tab = ws.add("tab", DType::Q8_0, {64, 10}, randn(640, 5));
      Graph g;
      const int ids = g.input("ids", DType::I32, {3});
      const int rows = g.get_rows(g.weight(tab), ids);
      g.mark_output(rows, "rows");
      BoundGraph bg(*gpu, std::move(g));
      std::string msg = error_after_run(bg, {in(ids, std::vector<int32_t>{1, 12, 3})}, rows);
      CHECK(has(msg, "GetRows"));
      CHECK(has(msg, "index 12 outside [0, 10)"));
      const std::vector<float> out = as_f32(bg.read(rows));
      bool zeros = true;
      for (int i = 64; i < 128; ++i) zeros = zeros && out[static_cast<size_t>(i)] == 0.0f;
      CHECK(zeros);  // the bad row's output stays defined
      // Runs 2..4 are captured into a CUDA graph, then replayed: reports come through both.
      msg = error_after_run(bg, {in(ids, std::vector<int32_t>{-1, 2, 3})}, rows);
      CHECK(has(msg, "index -1 outside [0, 10)"));  // the words were cleared: this run's report, not the last one's
      CHECK(error_after_run(bg, {in(ids, std::vector<int32_t>{0, 9, 3})}, rows).empty());
      msg = error_after_run(bg, {in(ids, std::vector<int32_t>{0, 10, 3})}, rows);
      CHECK(has(msg, "index 10 outside [0, 10)"));
    }

    SECTION("matmul_id: an expert id outside the experts, one token (mat-vec) and many (routing tables), F16 and Q8_0") {
      for (DType t : {DType::Q8_0, DType::F16})
        for (int64_t T : {1, 5}) {
          INFO("type " << dtype_name(t) << " T=" << T);
          WeightStore ws;
          const GgufTensorInfo *w = ws.add("experts", t, {64, 32, 4}, randn(64 * 32 * 4, 7));
          Graph g;
          const int x = g.input("x", DType::F32, {64, 1, T});
          const int ids = g.input("ids", DType::I32, {2, T});
          const int y = g.matmul_id(g.weight(w), x, ids);
          g.mark_output(y, "y");
          BoundGraph bg(*gpu, std::move(g));
          std::vector<int32_t> id(static_cast<size_t>(2 * T));
          for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<int32_t>(i % 4);
          id.back() = T == 1 ? 7 : -3;
          const std::vector<Input> ins = {in(x, randn(static_cast<size_t>(64 * T), 8)), in(ids, id)};
          const std::string msg = error_after_run(bg, ins, y);
          CHECK(has(msg, "MatMulId"));
          CHECK(has(msg, T == 1 ? "index 7 outside [0, 4)" : "index -3 outside [0, 4)"));
          id.back() = 3;
          CHECK(error_after_run(bg, {in(ids, id)}, y).empty());
        }
    }

    SECTION("a MoE FFN of one token (fused gate/up + SwiGLU and down + combine launches): an expert id outside the experts") {
      WeightStore ws;
      const GgufTensorInfo *up = ws.add("up", DType::Q8_0, {64, 32, 4}, randn(64 * 32 * 4, 13));
      const GgufTensorInfo *gate = ws.add("gate", DType::Q8_0, {64, 32, 4}, randn(64 * 32 * 4, 14));
      const GgufTensorInfo *down = ws.add("down", DType::Q8_0, {32, 64, 4}, randn(32 * 64 * 4, 15));
      Graph g;
      const int x = g.input("x", DType::F32, {64, 1, 1});
      const int ids = g.input("ids", DType::I32, {2, 1});
      const int wts = g.input("weights", DType::F32, {2, 1});
      const int act = g.swiglu(g.matmul_id(g.weight(gate), x, ids), g.matmul_id(g.weight(up), x, ids));
      const int out = g.moe_combine(g.matmul_id(g.weight(down), act, ids), wts);
      g.mark_output(out, "out");
      BoundGraph bg(*gpu, std::move(g));
      const std::vector<Input> ins = {in(x, randn(64, 16)), in(ids, std::vector<int32_t>{1, 5}), in(wts, std::vector<float>{0.7f, 0.3f})};
      const std::string msg = error_after_run(bg, ins, out);
      CHECK(has(msg, "MatMulId"));
      CHECK(has(msg, "index 5 outside [0, 4)"));
      CHECK(error_after_run(bg, {in(ids, std::vector<int32_t>{1, 3})}, out).empty());
    }

    SECTION("gather_cols: an id outside the router's row") {
      Graph g;
      const int probs = g.input("probs", DType::F32, {8, 2});
      const int ids = g.input("ids", DType::I32, {2, 2});
      const int out = g.gather_cols(probs, ids);
      g.mark_output(out, "out");
      BoundGraph bg(*gpu, std::move(g));
      const std::string msg = error_after_run(bg, {in(probs, randn(16, 9)), in(ids, std::vector<int32_t>{1, 9, 0, 3})}, out);
      CHECK(has(msg, "GatherCols"));
      CHECK(has(msg, "index 9 outside [0, 8)"));
    }

    SECTION("kv_store: a cell outside the cache") {
      const int64_t hd = 64, T = 2;
      const uint32_t n_cells = 16;
      KvCache kv(n_cells, 1, KvType::F16, {{hd, hd}}, *gpu);
      std::vector<int32_t> cells(T), pos = {0, 1}, seq = {0, 0};
      REQUIRE(kv.find_slots(static_cast<uint32_t>(T), cells.data()));
      kv.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
      std::vector<int32_t> bad_cells = cells;
      bad_cells[1] = static_cast<int32_t>(n_cells) + 5;  // what the kernels get; the host cache holds the real ones
      Graph g;
      const int q = g.input("q", DType::F32, {hd, 1, T});
      const int k = g.input("k", DType::F32, {hd, 1, T});
      const int v = g.input("v", DType::F32, {hd, 1, T});
      const int o = g.attention(q, g.kv_store(k, 0, 0), g.kv_store(v, 0, 1), hd, 0.125f);
      g.node(o).ip[1] = static_cast<int32_t>(n_cells);
      g.mark_output(o, "o");
      BoundGraph bg(*gpu, std::move(g));
      UbatchInfo ub;
      ub.n_tokens = static_cast<int32_t>(T);
      ub.cells = bad_cells.data();
      ub.pos = pos.data();
      ub.seq = seq.data();
      ub.n_kv = kv.n_kv();
      ub.cell_state = kv.cells();
      const ExecEnv env{&ub, &kv};
      const std::vector<Input> ins = {in(q, randn(hd * T, 10)), in(k, randn(hd * T, 11)), in(v, randn(hd * T, 12))};
      const std::string msg = error_after_run(bg, ins, o, env);
      CHECK(has(msg, "KvStore"));
      CHECK(has(msg, "index 21 outside [0, 16)"));
      ub.cells = cells.data();
      CHECK(error_after_run(bg, ins, o, env).empty());
    }

    // The device is still usable: the context made before and a new one decode as usual.
    CHECK(decodes_fine(*before));
    auto after = Context::create(*model, cp);
    CHECK(decodes_fine(*after));
  }
  std::remove(path.c_str());
}
