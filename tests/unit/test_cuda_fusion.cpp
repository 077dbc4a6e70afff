// CUDA kernel fusion (src/backends/cuda/cuda_fusion.h): each fused group against the same
// graph run unfused on CUDA (bit-identical where the fused kernel uses the same device
// functions) and against the CPU; the fusion plan on small graphs; tiny models of every
// architecture fused / unfused / CPU; kernel launches per decode step.
// Without a CUDA build or device every case WARNs and returns (tags [cuda][fusion]; the op
// cases also carry [ops] and [attention] / [routing] so the sanitizer runs of
// tests/cuda/device_check.sh cover them).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "backends/backend.h"
#include "engine/engine.h"
#include "kv/kv_cache.h"
#include "memory/planner.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"
#include "model/synth/synth_model.h"
#include "support/cuda_counts.h"
#include "support/device_graph.h"
#include "support/fusion_runs.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#include "support/temp_files.h"
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
using moe_test::WeightStore;

#ifdef MOEINFER_WITH_CUDA
using moe_test::FusedRun;
using moe_test::plan_on;
using moe_test::run_gpu;

namespace {

// The three KV caches a fusion case compares (CPU, GPU fused, GPU unfused), each holding T
// tokens of sequence 0 at positions first, first + step, ..., and each one's ubatch.
struct ThreeCaches {
  std::vector<int32_t> cells, pos, seq;
  std::unique_ptr<KvCache> c, f, u;
  UbatchInfo ub, ub_f, ub_u;
  ThreeCaches(Backend &cpu, Backend &gpu, uint32_t n_cells, KvType kt, const std::vector<KvLayerDims> &dims, int64_t T, int32_t first,
              int32_t step)
      : cells(static_cast<size_t>(T)), pos(static_cast<size_t>(T)), seq(static_cast<size_t>(T), 0),
        c(std::make_unique<KvCache>(n_cells, 1, kt, dims, cpu)), f(std::make_unique<KvCache>(n_cells, 1, kt, dims, gpu)),
        u(std::make_unique<KvCache>(n_cells, 1, kt, dims, gpu)) {
    for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = first + step * static_cast<int32_t>(i);
    REQUIRE(c->find_slots(static_cast<uint32_t>(T), cells.data()));
    for (KvCache *kv : {c.get(), f.get(), u.get()}) kv->claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
    ub.n_tokens = static_cast<int32_t>(T);
    ub.cells = cells.data();
    ub.pos = pos.data();
    ub.seq = seq.data();
    ub.n_kv = c->n_kv();
    ub.cell_state = c->cells();
    ub_f = ub_u = ub;
    ub_f.cell_state = f->cells();
    ub_u.cell_state = u->cells();
  }
  ThreeCaches(const ThreeCaches &) = delete;  // the ubatches point into the vectors
  ThreeCaches &operator=(const ThreeCaches &) = delete;
};

std::string write_tiny(const std::string &preset, const std::string &mix) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("moe-cuda-fusion-" + preset + "-" + mix + "-" + std::to_string(::getpid()) + ".gguf")).string();
  SynthSpec spec;
  spec.preset = preset;
  spec.type_mix = mix;
  write_synthetic_model(spec, path);
  return path;
}

// Whether a plan segment's launch labels include `label`.
bool has_label(const std::vector<std::string> &v, const std::string &label) { return std::find(v.begin(), v.end(), label) != v.end(); }

// The fusion groups' labels per segment (layer + 1) of m's graph for n_tokens, compiled on
// the host with the CUDA backend's scratch sizes and planned with the default GpuTuning;
// printed as "[fusion] NAME T=.. segment ..". A group is listed in the segment of its last node.
// launches (optional): per segment, the planned launches (groups + compute nodes outside them).
std::map<int, std::vector<std::string>> plan_by_layer(BackendRegistry &reg, const Model::Impl &m, int64_t n_tokens, const std::string &name,
                                                      std::map<int, int> *launches = nullptr) {
  GraphBuildParams gp;
  gp.n_tokens = n_tokens;
  gp.n_cells = 64;
  Graph g;
  m.arch->build(m, gp, g);
  CompileOptions co;
  co.devices = {reg.cpu()};
  auto plan = compile_graph(std::move(g), co);
  const Graph &cg = plan->graph;
  const GpuTuning tuning;
  const CudaPaths paths = cuda_select_paths(90, 90, 232448);  // an H200 (runs without a GPU)
  std::vector<int> keep;
  cuda_fusion_keep_live(cg, 0, keep);  // what CudaBackend::extend_lifetimes asks for
  plan_memory(plan->graph, [&](int id) { return cuda_work_size(cg, id, tuning, paths); }, keep);
  const FusionPlan fp = plan_fusion(cg, 0);
  std::map<int, std::vector<std::string>> by_layer;
  for (const FusedGroup &grp : fp.groups) by_layer[cg.node(grp.last).segment].push_back(grp.label);
  // qwen3moe's (and gpt-oss's) down + combine follows the gate/up launch that reads the same
  // ids: settled ids (read before the kernel's wait).
  if ((name == "tiny" || name == "tiny-gpt-oss") && n_tokens == 1)
    for (const FusedGroup &grp : fp.groups)
      if (grp.kind == FusedKind::DownCombine) CHECK(grp.ids_settled);
  // deepseek2's MLA glue runs in its shared-memory kernel, writing the q slice and rope the
  // k_b product and its concat read (members 7 and 9) and storing the K row (member 6).
  if (name == "tiny-deepseek2" && n_tokens == 1)
    for (const FusedGroup &grp : fp.groups)
      if (grp.label == "fused:slice+rope+slice+rms_norm+mul+concat+kv_store+slice+slice+rope") {
        CHECK(grp.mla_glue);
        CHECK((grp.live_mask & (1u << 6 | 1u << 7 | 1u << 9)) == (1u << 6 | 1u << 7 | 1u << 9));
      }
  std::map<int, int> planned;
  for (const FusedGroup &grp : fp.groups) ++planned[cg.node(grp.last).segment];
  for (size_t i = 0; i < cg.nodes().size(); ++i) {
    const Node &n = cg.node(static_cast<int>(i));
    if (n.op != Op::Leaf && n.op != Op::View && fp.group_of[i] < 0) ++planned[n.segment];
  }
  if (launches) *launches = planned;
  for (const auto &l : by_layer) {
    std::string line;
    for (const auto &lab : l.second) line += " " + lab;
    std::printf("[fusion] %s T=%lld segment %d (%d launches):%s\n", name.c_str(), static_cast<long long>(n_tokens), l.first, planned[l.first],
                line.c_str());
  }
  return by_layer;
}

}  // namespace
#endif

// Runs without a GPU: the decode graph of each tiny model compiled on the host, its arena
// laid out with the CUDA backend's scratch sizes, then planned.
TEST_CASE("cuda fusion plan: groups in the tiny models' decode graphs", "[fusion]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry reg;
  for (const char *preset : {"tiny", "tiny-deepseek2", "tiny-gpt-oss"}) {
    const std::string path = write_tiny(preset, "q8_0");
    {
      auto model = Model::load(path, ModelLoadParams{});
      const Model::Impl &m = model->impl();
      std::map<int, int> launches;
      auto by_layer = plan_by_layer(reg, m, 1, preset, &launches);
      // Row chains and router at any T; the mat-vec groups only at one token, but the MoE gate/up
      // + SwiGLU up to kMaxGateUpTokens (one few-column launch where its products take that
      // kernel, cuda_mcol_swiglu; else its members in order).
      const auto prefill = plan_by_layer(reg, m, 8, preset);
      if (std::string(preset) == "tiny") {
        std::vector<std::string> want8 = {"fused:rms_norm+mul", "fused:rms_norm+mul+rms_norm+mul+rope+rope+kv_store+kv_store",
                                          "fused:rms_norm+mul", "fused:softmax+top_k+gather_cols+norm_sum"};
        if (cuda_fused_matvec_available()) {  // q / k / v (one rounding at a few columns), out-proj + residual, gate/up + SwiGLU
          want8.insert(want8.begin() + 1, "fused:matmul+matmul+matmul");
          want8.insert(want8.begin() + 3, "fused:matmul+add");
          want8.push_back("fused:matmul_id+matmul_id+swiglu");
        }
        want8.push_back("fused:moe_combine+add");  // the residual in the combine's launch (CombineAdd)
        CHECK(prefill.at(1) == want8);  // layer 0 (segment 1): the full qwen3moe pattern
        // One token: the router also takes its mat-vec and the ffn norm in front of it.
        std::vector<std::string> want = {"fused:rms_norm+mul", "fused:rms_norm+mul+rms_norm+mul+rope+rope+kv_store+kv_store",
                                         "fused:rms_norm+mul+matmul+softmax+top_k+gather_cols+norm_sum"};
        if (cuda_fused_matvec_available()) {
          // q / k / v in one launch, out-proj + residual, gate/up + SwiGLU, down + combine + residual.
          want = {"fused:rms_norm+mul", "fused:matmul+matmul+matmul", "fused:rms_norm+mul+rms_norm+mul+rope+rope+kv_store+kv_store",
                  "fused:matmul+add", "fused:rms_norm+mul+matmul+softmax+top_k+gather_cols+norm_sum", "fused:matmul_id+matmul_id+swiglu",
                  "fused:matmul_id+moe_combine+add"};
          for (int l = 1; l <= static_cast<int>(m.hp.n_layer); ++l) {
            INFO("segment " << l);
            CHECK(has_label(by_layer[l], "fused:matmul_id+moe_combine+add"));
          }
        }
        CHECK(by_layer[1] == want);
        CHECK(by_layer[static_cast<int>(m.hp.n_layer) + 1] == std::vector<std::string>{"fused:rms_norm+mul"});  // output norm
      }
      if (std::string(preset) == "tiny-deepseek2") {
        // The MLA glue as one Sequence launch in every layer (dense layer 0 = segment 1, MoE
        // layers after it: the K row, its store and q's slices and rope), the q concat in the k_b
        // product's launch (HeadsConcat), and the sigmoid router's sigmoid + bias (the grouped top-k of
        // this preset ends that sequence; GLM-4.7-Flash's plain top-k joins it, see the
        // [routing] sequence test). q_a and kv_a in one MatVecs launch.
        auto has = [&](int seg, const char *label) { return has_label(by_layer[seg], label); };
        for (int seg : {1, 2, 3}) {
          INFO("segment " << seg);
          CHECK(has(seg, "fused:slice+rope+slice+rms_norm+mul+concat+kv_store+slice+slice+rope"));
          CHECK(has(seg, "fused:matmul_heads+concat"));
          if (cuda_fused_matvec_available()) CHECK(has(seg, "fused:matmul+matmul"));
          if (seg > 1) CHECK(has(seg, "fused:sigmoid+add"));
        }
      }
      if (std::string(preset) == "tiny-gpt-oss") {
        // q, k, v with their biases: one MatVecs launch per layer (match_matvecs_add). The
        // router: ffn norm, F32 mat-vec, bias, top-k, gather, softmax in one launch (TopKRouter;
        // before: a row chain, a MatMul + Add and a Sequence, 3 launches); at 8 tokens the
        // norm stays a row chain and top-k + gather a Sequence (the group only at one row).
        const std::string router = "fused:rms_norm+mul+matmul+add+top_k+gather_cols+softmax";
        for (int seg = 1; seg <= static_cast<int>(m.hp.n_layer); ++seg) {
          INFO("segment " << seg);
          const auto &v = by_layer[seg];
          if (cuda_fused_matvec_available()) CHECK(has_label(v, "fused:matmul+add+matmul+add+matmul+add"));
          CHECK((has_label(v, router) || has_label(v, router + "+scale")));
          CHECK_FALSE(has_label(v, "fused:top_k+gather_cols+softmax"));
          CHECK_FALSE(has_label(v, "fused:top_k+gather_cols+softmax+scale"));
          if (cuda_fused_matvec_available()) CHECK(std::count(v.begin(), v.end(), std::string("fused:matmul+add")) == 1);  // the o-proj's bias only, not the router's
          // (The last layer's FFN runs on the one output row: the group forms there too.)
          const auto &p = prefill.at(seg);
          const bool last = seg == static_cast<int>(m.hp.n_layer);
          CHECK((has_label(p, router) || has_label(p, router + "+scale")) == last);
          if (!last) CHECK(has_label(p, "fused:top_k+gather_cols"));  // (8 softmax rows: past kMaxSequenceRows)
          // The experts with their biases (cuda_fusion.cpp: match_gate_up_oai, match_down's
          // bias_after): gate/up + SwiGLU-OAI in one launch, down + bias + combine + residual in
          // another, and no expert node (MatMulId, AddId, SwiGLU-OAI, MoeCombine) runs alone: 2
          // launches for the layer's 9 MoE nodes, 9 in all (attention norm, q/k/v, rope + KV
          // store, attention, out-proj + bias, residual, the router group, and the two).
          if (cuda_fused_matvec_available()) {
            CHECK(has_label(v, "fused:matmul_id+add_id+matmul_id+add_id+swiglu_oai"));
            CHECK(has_label(v, "fused:matmul_id+add_id+moe_combine+add"));
            if (!last) CHECK(launches[seg] == 9);  // (the last layer also gathers its output rows)
          }
        }
      }
    }
    std::remove(path.c_str());
  }
#endif
}

// The gated DeltaNet layers of both hybrids (cuda_fusion.h: DeltaIn, GatedNorm): at one token
// and at a few, every DeltaNet layer plans its gate chain, conv, slices and L2 norms as ONE
// group and its output norm as another; prompts past kMaxDeltaInTokens keep the conv apart.
// Every layer adds its gated shared expert and residual in one (SharedGate).
// Runs without a GPU.
TEST_CASE("cuda fusion plan: gated DeltaNet layers (qwen3next, qwen35moe) fuse their input chain and output norm", "[fusion]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry reg;
  for (const char *preset : {"tiny-qwen3next", "tiny-qwen35moe"}) {
    const std::string path = write_tiny(preset, "q8_0");
    {
      auto model = Model::load(path, ModelLoadParams{});
      const Model::Impl &m = model->impl();
      const bool next = std::string(preset) == "tiny-qwen3next";
      const std::string in = next ? "fused:slice+slice+add+softplus+mul+sigmoid+concat+ssm_conv+slice+l2_norm+slice+l2_norm+slice"
                                  : "fused:add+softplus+mul+sigmoid+concat+ssm_conv+slice+l2_norm+slice+l2_norm+slice";
      for (int64_t T : {int64_t{1}, int64_t{3}, kMaxDeltaInTokens, kMaxDeltaInTokens + 1}) {
        std::map<int, int> launches;
        auto by_layer = plan_by_layer(reg, m, T, preset, &launches);
        for (uint32_t il = 0; il < m.hp.n_layer; ++il) {
          INFO(preset << " T " << T << " layer " << il);
          const auto &v = by_layer[static_cast<int>(il) + 1];
          // Every layer: the sigmoid-gated shared expert plus residual in one launch.
          CHECK(has_label(v, "fused:sigmoid+moe_combine+add+add"));
          if ((il + 1) % m.hp.full_attn_interval == 0) continue;  // full attention
          const bool has_in = has_label(v, in);
          CHECK(has_in == (T <= kMaxDeltaInTokens));
          // The output norm: in the DeltaNet kernel up to kMaxDeltaInTokens tokens, else its own launch.
          CHECK(has_label(v, T <= kMaxDeltaInTokens ? "fused:delta_net+rms_norm+mul+swiglu" : "fused:rms_norm+mul+swiglu"));
          // One token, a DeltaNet layer between the first and the last (docs/perf/qwen3next-cuda.md,
          // entry 3): attn norm, projections, DeltaIn, DeltaNet + norm, out-proj + residual, ffn norm
          // + router + shared gate logit, experts gate/up, experts down + combine, shared gate/up,
          // shared down, SharedGate = 11 launches.
          if (T == 1 && il > 0 && il + 1 < m.hp.n_layer && cuda_fused_matvec_available()) CHECK(launches[static_cast<int>(il) + 1] == 11);
        }
      }
    }
    std::remove(path.c_str());
  }
#endif
}

// The extra weight types (Q4_1, Q5_0, the i-quants...) join the gate/up + SwiGLU, down +
// combine + residual, MatMul + Add and q / k / v (MatVecs, one type per group) groups (their
// one-launch kernels: quant_extra.h cuda_extra_fused_*). Runs without a GPU; prints each plan
// ("[fusion] tiny q4_1 T=1 segment ..").
TEST_CASE("cuda fusion plan: the extra weight types' decode products join the gate/up, down, matmul+add and q/k/v groups", "[fusion]") {
#ifdef MOEINFER_WITH_CUDA
  BackendRegistry reg;
  struct Mix {
    const char *preset, *mix;
  };
  for (const Mix &m : {Mix{"tiny", "q4_1"}, Mix{"tiny", "q5_0"}, Mix{"small", "iq4_xs"}}) {
    INFO("preset " << m.preset << " mix " << m.mix);
    SynthSpec spec;
    spec.preset = m.preset;
    spec.type_mix = m.mix;
    spec.n_layer = 2;  // (the i-quant search that writes the file stays short)
    const std::string path = moe_test::temp_path(std::string("fusion-extra-") + m.preset + "-" + m.mix + ".gguf");
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      const auto by_layer = plan_by_layer(reg, model->impl(), 1, std::string(m.preset) + " " + m.mix);
      int gate_up = 0, down = 0, mm_add = 0, qkv = 0;
      for (const auto &l : by_layer)
        for (const std::string &lab : l.second) {
          INFO(lab);
          gate_up += lab == "fused:matmul_id+matmul_id+swiglu";
          down += lab == "fused:matmul_id+moe_combine+add";
          mm_add += lab == "fused:matmul+add";
          qkv += lab == "fused:matmul+matmul+matmul";
        }
      CHECK(gate_up == 2);  // one per layer
      CHECK(down == 2);
      CHECK(mm_add >= 1);  // the attention output + residual (the last layer's stays apart in these plans, as with the K-quants)
      if (std::string(m.mix) == "iq4_xs") CHECK(qkv == 2);  // q, k, v of one type (the tiny mixes keep k / v in another type)
    }
    std::remove(path.c_str());
  }
#endif
}

// Hidden: the decode plan of a real-size model file (MOE_FUSION_PLAN_MODEL=path), e.g. one
// written by `moeinfer-cli mkmodel --preset glm-4.7-flash --type q4_k_m` (no GPU needed).
TEST_CASE("cuda fusion plan: a model file's decode graph", "[.][fusion-plan]") {
#ifdef MOEINFER_WITH_CUDA
  const char *path = std::getenv("MOE_FUSION_PLAN_MODEL");
  if (!path) return;
  BackendRegistry reg;
  auto model = Model::load(path, ModelLoadParams{});
  plan_by_layer(reg, model->impl(), 1, path);
#endif
}

TEST_CASE("cuda fusion: row chains (rms_norm, mul, rope, kv_store of q/k/v heads) equal unfused and the CPU", "[ops][cuda][fusion][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Variant {
    int64_t hd;
    int n_rot;
    bool neox, yarn;
    KvType kt;
    int64_t T;
    int64_t nh = 4, nkv = 2;
  };
  // T >= 8 takes the warp-per-row kernel (a block per token); odd head counts, partial
  // rotation, head dim 256 (its largest angle table) and a 512-token prefill with them.
  const Variant variants[] = {{64, 64, true, false, KvType::F32, 1},  {64, 64, true, false, KvType::F16, 5},
                              {64, 32, false, false, KvType::Q8_0, 1}, {96, 64, true, false, KvType::Q8_0, 3},
                              {40, 40, true, true, KvType::F32, 2},   {40, 24, false, true, KvType::F16, 1},
                              {64, 64, true, false, KvType::F32, 8, 5, 1},   {96, 64, true, false, KvType::Q8_0, 37, 7, 1},
                              {40, 24, false, true, KvType::F32, 9, 3, 3},   {256, 256, true, false, KvType::F16, 16, 3, 1},
                              {128, 128, true, false, KvType::F16, 512, 12, 4}, {64, 32, false, false, KvType::Q8_0, 512, 5, 5}};
  for (const Variant &v : variants) {
    const int64_t hd = v.hd, nh = v.nh, nkv = v.nkv, n_res = 300, T = v.T;
    const uint32_t n_cells = static_cast<uint32_t>(std::max<int64_t>(64, T));
    RopeParams rp;
    rp.n_rot = v.n_rot;
    rp.neox = v.neox;
    rp.freq_base = 1e6f;
    if (v.yarn) { rp.freq_scale = 0.25f; rp.ext_factor = 1.0f; rp.n_ctx_orig = 4096; }
    WeightStore ws;
    const GgufTensorInfo *res_w = ws.add("res_w", DType::F32, {n_res}, randn(static_cast<size_t>(n_res), 21));
    const GgufTensorInfo *qn = ws.add("qn", DType::F32, {hd}, randn(static_cast<size_t>(hd), 22));
    const GgufTensorInfo *kn = ws.add("kn", DType::F32, {hd}, randn(static_cast<size_t>(hd), 23));
    int xr, qi, ki, vi, pos, y, qr, att;
    // The layout of a qwen3moe layer: residual norm, then q/k head norms, ropes, stores.
    auto build = [&]() {
      Graph g;
      xr = g.input("xr", DType::F32, {n_res, T});
      qi = g.input("q", DType::F32, {hd * nh, T});
      ki = g.input("k", DType::F32, {hd * nkv, T});
      vi = g.input("v", DType::F32, {hd * nkv, T});
      pos = g.input("pos", DType::I32, {T});
      y = g.rms_norm(xr, 1e-6f);
      y = g.mul(y, g.weight(res_w));
      const int q3 = g.view(qi, {hd, nh, T}), k3 = g.view(ki, {hd, nkv, T}), v3 = g.view(vi, {hd, nkv, T});
      int q = g.rms_norm(q3, 1e-6f);
      q = g.mul(q, g.weight(qn));
      int k = g.rms_norm(k3, 1e-6f);
      k = g.mul(k, g.weight(kn));
      qr = g.rope(q, pos, rp);
      k = g.rope(k, pos, rp);
      const int ks = g.kv_store(k, 0, 0);
      const int vs = g.kv_store(v3, 0, 1);
      att = g.attention(qr, ks, vs, hd, 0.125f);
      g.node(att).ip[1] = static_cast<int32_t>(n_cells);
      g.mark_output(y, "y");
      g.mark_output(qr, "qr");
      g.mark_output(att, "att");
      return g;
    };
    INFO("hd " << hd << " heads " << nh << "/" << nkv << " n_rot " << v.n_rot << " neox " << v.neox << " yarn " << v.yarn << " kv " << kv_type_name(v.kt) << " T " << T);
    const FusionPlan fp = plan_on(*gpu, build());
    REQUIRE(fp.groups.size() == 1);
    CHECK(fp.groups[0].kind == FusedKind::RowChains);
    CHECK(fp.groups[0].members.size() == 10);
    CHECK(fp.groups[0].label == "fused:rms_norm+mul+rms_norm+mul+rms_norm+mul+rope+rope+kv_store+kv_store");

    const ThreeCaches tc(*reg.cpu(), *gpu, n_cells, v.kt, {{hd * nkv, hd * nkv}}, T, 3, 7);
    KvCache &kv_c = *tc.c, &kv_f = *tc.f, &kv_u = *tc.u;
    const UbatchInfo &ub = tc.ub, &ub_f = tc.ub_f, &ub_u = tc.ub_u;
    const std::vector<int32_t> &pv = tc.pos;
    Graph g0 = build();
    const std::vector<Input> ins = {in(xr, randn(static_cast<size_t>(n_res * T), 31)), in(qi, randn(static_cast<size_t>(hd * nh * T), 32)),
                                    in(ki, randn(static_cast<size_t>(hd * nkv * T), 33)), in(vi, randn(static_cast<size_t>(hd * nkv * T), 34)),
                                    in(pos, pv)};
    auto rc = run_on(*reg.cpu(), std::move(g0), ins, {y, qr, att}, ExecEnv{&ub, &kv_c});
    const FusedRun f = run_gpu(*gpu, build(), ins, {y, qr, att}, ExecEnv{&ub_f, &kv_f}, true);
    const FusedRun u = run_gpu(*gpu, build(), ins, {y, qr, att}, ExecEnv{&ub_u, &kv_u}, false);
    CHECK(f.out[0] == u.out[0]);  // bit-identical: same device functions in the same order
    CHECK(f.out[1] == u.out[1]);
    CHECK(f.out[2] == u.out[2]);
    CHECK(rel_err(f.out[0], rc[0]) < 1e-5);
    CHECK(rel_err(f.out[1], rc[1]) < 1e-5);
    CHECK(rel_err(f.out[2], rc[2]) < (v.kt == KvType::F16 ? 2e-3 : 1e-4));
    if (v.kt == KvType::F32) {  // the ubatch's RoPE table and the reference-order attention: the CPU's bits
      CHECK(f.out[1] == rc[1]);
      CHECK(f.out[2] == rc[2]);
    }
    CHECK(f.launches + 9 == u.launches);  // 10 row launches -> 1
  }
#endif
}

TEST_CASE("cuda fusion: softmax router (softmax, top_k, gather_cols, norm_sum) equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (int64_t E : {40, 128, 300})
    for (int64_t T : {1, 7})
      for (int variant = 0; variant < 3; ++variant) {  // 0: + norm_sum, 1: no norm_sum, 2: probs also read outside
        const int64_t k = E == 40 ? 6 : 8;
        int li, probs, ids, w;
        auto build = [&]() {
          Graph g;
          li = g.input("logits", DType::F32, {E, T});
          probs = g.softmax(li);
          ids = g.top_k(probs, static_cast<int>(k));
          w = g.gather_cols(probs, ids);
          if (variant != 1) w = g.norm_sum(w);
          g.mark_output(ids, "ids");
          g.mark_output(w, "w");
          if (variant == 2) g.mark_output(probs, "probs");
          return g;
        };
        INFO("E " << E << " T " << T << " variant " << variant);
        const FusionPlan fp = plan_on(*gpu, build());
        REQUIRE(fp.groups.size() == 1);
        CHECK(fp.groups[0].kind == FusedKind::Router);
        CHECK(fp.groups[0].members.size() == (variant == 1 ? 3u : 4u));
        auto lv = randn(static_cast<size_t>(E * T), static_cast<uint32_t>(40 + E + T));
        lv[3] = lv[7];                                   // a tie: the lower index wins
        if (T > 1) lv[static_cast<size_t>(E) + 1] = lv[static_cast<size_t>(E) + 2];
        std::vector<int> outs = {ids, w};
        if (variant == 2) outs.push_back(probs);
        const std::vector<Input> ins = {in(li, lv)};
        auto rc = run_on(*reg.cpu(), build(), ins, outs);
        const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
        const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
        for (size_t o = 0; o < outs.size(); ++o) CHECK(f.out[o] == u.out[o]);
        CHECK(f.out[0] == rc[0]);  // ids exactly
        CHECK(rel_err(f.out[1], rc[1]) < 1e-5);
        if (variant == 2) CHECK(rel_err(f.out[2], rc[2]) < 1e-5);
        CHECK(f.launches + (variant == 1 ? 2 : 3) == u.launches);
      }
#endif
}

// deepseek2's MLA glue at a few tokens (the layout of its layer: the kv_a output's roped rope
// part and normalised latent, their concat and the K store, q's nope / rope slices and the rope
// of the rope part; after the absorbed q product its concat with q's rope part): one Sequence
// launch (10 ops) and the product with the concat in one launch (HeadsConcat), bit-identical to
// the unfused ops (same device functions in the same order; the product's rows written into
// the concat's). Odd head counts and dims; F32 / F16 / Q8_0 caches (Q8_0 needs rows of 32: 64 + 32).
TEST_CASE("cuda fusion: MLA glue sequences (slice, rope, rms_norm, mul, concat, kv_store) equal unfused and the CPU", "[ops][cuda][fusion][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Variant {
    int64_t H, nope, rot, R, T;
    KvType kt;
    bool yarn;
  };
  const Variant variants[] = {{3, 13, 6, 20, 1, KvType::F32, true},   {4, 32, 16, 32, 1, KvType::F16, true},
                              {5, 24, 32, 64, 3, KvType::Q8_0, false}, {20, 192, 64, 512, 1, KvType::F16, true},
                              {1, 7, 2, 9, 2, KvType::F32, false}};
  for (const Variant &v : variants) {
    const int64_t H = v.H, hd_k = v.nope + v.rot, R = v.R, P = v.rot, T = v.T;
    const uint32_t n_cells = 64;
    RopeParams rp;
    rp.n_rot = static_cast<int>(P);
    rp.neox = false;  // deepseek2: the normal (GPT-J) pairing
    rp.freq_base = 1e4f;
    if (v.yarn) { rp.freq_scale = 0.025f; rp.ext_factor = 1.0f; rp.n_ctx_orig = 4096; rp.attn_factor = 0.8f; }
    WeightStore ws;
    const GgufTensorInfo *kvn = ws.add("kv_norm", DType::F32, {R}, randn(static_cast<size_t>(R), 51));
    const GgufTensorInfo *kb = ws.add("k_b", DType::F32, {v.nope, R, H}, randn(static_cast<size_t>(v.nope * R * H), 52));
    int qi, kvi, pos, qk, latent, att;
    auto build = [&]() {
      Graph g;
      qi = g.input("q", DType::F32, {hd_k * H, T});
      kvi = g.input("kv", DType::F32, {R + P, T});
      pos = g.input("pos", DType::I32, {T});
      const int q = g.view(qi, {hd_k, H, T});
      const int k_pe = g.rope(g.view(g.slice(kvi, R, P), {P, 1, T}), pos, rp);
      latent = g.mul(g.rms_norm(g.slice(kvi, 0, R), 1e-6f), g.weight(kvn));
      const int kk = g.concat(g.view(latent, {R, 1, T}), k_pe);
      const int ks = g.kv_store(kk, 0, 0);
      const int q_nope = g.slice(q, 0, v.nope);
      const int q_pe = g.rope(g.slice(q, v.nope, P), pos, rp);
      const int q_abs = g.matmul_heads(g.weight(kb), q_nope);
      qk = g.concat(q_abs, q_pe);
      AttentionOptions ao;
      ao.v_from_k = true;
      att = g.attention_ext(qk, ks, ks, R, 0.1f, ao);
      g.node(att).ip[1] = static_cast<int32_t>(n_cells);
      g.mark_output(qk, "qk");
      g.mark_output(latent, "latent");
      g.mark_output(att, "att");
      return g;
    };
    INFO("H " << H << " nope " << v.nope << " rot " << P << " R " << R << " T " << T << " kv " << kv_type_name(v.kt) << " yarn " << v.yarn);
    const FusionPlan fp = plan_on(*gpu, build());
    REQUIRE(fp.groups.size() == 2);
    CHECK(fp.groups[0].kind == FusedKind::Sequence);
    CHECK(fp.groups[0].label == "fused:slice+rope+slice+rms_norm+mul+concat+kv_store+slice+slice+rope");
    CHECK(fp.groups[0].mla_glue);
    CHECK(fp.groups[1].kind == FusedKind::HeadsConcat);
    CHECK(fp.groups[1].label == "fused:matmul_heads+concat");

    const ThreeCaches tc(*reg.cpu(), *gpu, n_cells, v.kt, {{R + P, 0}}, T, 5, 3);
    KvCache &kv_c = *tc.c, &kv_f = *tc.f, &kv_u = *tc.u;
    const UbatchInfo &ub = tc.ub, &ub_f = tc.ub_f, &ub_u = tc.ub_u;
    const std::vector<int32_t> &pv = tc.pos;
    const std::vector<Input> ins = {in(qi, randn(static_cast<size_t>(hd_k * H * T), 61)), in(kvi, randn(static_cast<size_t>((R + P) * T), 62)),
                                    in(pos, pv)};
    const std::vector<int> outs = {qk, latent, att};
    auto rc = run_on(*reg.cpu(), build(), ins, outs, ExecEnv{&ub, &kv_c});
    const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{&ub_f, &kv_f}, true);
    const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{&ub_u, &kv_u}, false);
    for (size_t o = 0; o < outs.size(); ++o) CHECK(f.out[o] == u.out[o]);  // bit-identical
    CHECK(rel_err(f.out[0], rc[0]) < 1e-5);
    CHECK(rel_err(f.out[1], rc[1]) < 1e-5);
    CHECK(rel_err(f.out[2], rc[2]) < (v.kt == KvType::F32 ? 1e-4 : 2e-2));
    CHECK(f.launches + 9 + 1 == u.launches);  // 10 ops -> 1, product + concat -> 1
    CHECK(f.mla_glue == 1);                   // the glue's rows in shared memory, not the generic kernel
  }
#endif
}

// deepseek2's sigmoid router tail (GLM-4.7-Flash: no expert groups): sigmoid, selection bias,
// top-k, gather of the unbiased scores, renormalise, scale: one Sequence launch.
TEST_CASE("cuda fusion: sigmoid router tail (sigmoid, add, top_k, gather_cols, norm_sum, scale) equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (int64_t E : {16, 64, 300})
    for (int64_t T : {1, 5}) {
      const int64_t k = E == 16 ? 4 : 8;
      WeightStore ws;
      const GgufTensorInfo *bias = ws.add("bias", DType::F32, {E}, randn(static_cast<size_t>(E), static_cast<uint32_t>(70 + E)));
      int li, ids, w;
      auto build = [&]() {
        Graph g;
        li = g.input("logits", DType::F32, {E, T});
        const int probs = g.sigmoid(li);
        ids = g.top_k(g.add(probs, g.weight(bias)), static_cast<int>(k));
        w = g.scale(g.norm_sum(g.gather_cols(probs, ids)), 1.8f);
        g.mark_output(ids, "ids");
        g.mark_output(w, "w");
        return g;
      };
      INFO("E " << E << " T " << T);
      const FusionPlan fp = plan_on(*gpu, build());
      REQUIRE(fp.groups.size() == 1);
      CHECK(fp.groups[0].kind == FusedKind::Sequence);
      CHECK(fp.groups[0].label == "fused:sigmoid+add+top_k+gather_cols+norm_sum+scale");
      const std::vector<Input> ins = {in(li, randn(static_cast<size_t>(E * T), static_cast<uint32_t>(80 + E + T)))};
      const std::vector<int> outs = {ids, w};
      auto rc = run_on(*reg.cpu(), build(), ins, outs);
      const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
      const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
      CHECK(f.out[0] == u.out[0]);
      CHECK(f.out[1] == u.out[1]);
      CHECK(f.out[0] == rc[0]);  // ids exactly
      CHECK(rel_err(f.out[1], rc[1]) < 1e-5);
      CHECK(f.launches + 5 == u.launches);
    }
#endif
}

// gpt-oss's router tail: top-k of the raw logits, gather of the chosen ones, softmax over
// them [, scale]: one Sequence launch (a block per token), bit-identical to the unfused ops.
// Tied logits (the lower index wins); k past 16 (the softmax's vector chunks and tail).
TEST_CASE("cuda fusion: gpt-oss router tail (top_k, gather_cols, softmax, scale) equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (int64_t E : {32, 128, 300})
    for (int64_t T : {1, 3})
      for (bool scale : {false, true}) {
        const int64_t k = E == 300 ? 20 : 4;
        int li, ids, w;
        auto build = [&]() {
          Graph g;
          li = g.input("logits", DType::F32, {E, T});
          ids = g.top_k(li, static_cast<int>(k));
          w = g.softmax(g.gather_cols(li, ids));
          if (scale) w = g.scale(w, 0.5f);
          g.mark_output(ids, "ids");
          g.mark_output(w, "w");
          return g;
        };
        INFO("E " << E << " T " << T << " scale " << scale);
        const FusionPlan fp = plan_on(*gpu, build());
        REQUIRE(fp.groups.size() == 1);
        CHECK(fp.groups[0].kind == FusedKind::Sequence);
        CHECK(fp.groups[0].label == std::string("fused:top_k+gather_cols+softmax") + (scale ? "+scale" : ""));
        auto lv = randn(static_cast<size_t>(E * T), static_cast<uint32_t>(180 + E + T));
        lv[2] = lv[5];  // a tie
        const std::vector<Input> ins = {in(li, lv)};
        const std::vector<int> outs = {ids, w};
        auto rc = run_on(*reg.cpu(), build(), ins, outs);
        const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
        const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
        CHECK(f.out[0] == u.out[0]);
        CHECK(f.out[1] == u.out[1]);  // bit-identical: softmax_row in both
        CHECK(f.out[0] == rc[0]);     // ids exactly
        CHECK(rel_err(f.out[1], rc[1]) < 1e-6);
        CHECK(f.launches + (scale ? 3 : 2) == u.launches);
      }
#endif
}

// One-token MatMuls of one activation (q, k, v): one launch per run of up to four quantized
// MatMuls whose types round the activation alike (K-quants; Q4_0 / Q8_0 / MXFP4), types
// mixed; bit-identical to their own launches (same device code).
TEST_CASE("cuda fusion: mat-vecs of one activation (q, k, v) equal unfused and the CPU", "[ops][cuda][fusion]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  // The products are the graph's outputs: unfused they would take CUDA's own order (final
  // outputs), the group keeps the CPU's (q, k, v are read by later nodes in a model).
  const GpuTuning cpu_order = moe_test::cpu_order_final_outputs();
  struct Variant {
    int64_t K;
    std::vector<DType> types;
    std::vector<int64_t> rows;
    std::vector<size_t> groups;  // members of each planned group
    bool add_last = false;       // the last MatMul feeds an Add (a MatMul + Add group instead)
  };
  using D = DType;
  const Variant variants[] = {
      {768, {D::Q4_K, D::Q4_K, D::Q6_K}, {301, 37, 129}, {3}},                    // Q4_K_M q, k, v
      {2304, {D::Q4_K, D::Q8_0, D::Q8_0}, {64, 16, 16}, {2}},                    // another activation rounding: a new run
      {2080, {D::Q8_0, D::Q4_0, D::MXFP4}, {5, 300, 33}, {3}},                   // odd rows, long K
      {4352, {D::Q5_K, D::Q2_K, D::Q3_K, D::Q6_K, D::Q4_K}, {40, 17, 1, 90, 9}, {4}},  // at most four per launch
      {512, {D::Q4_K, D::F32, D::Q6_K, D::Q4_K}, {32, 32, 32, 32}, {2}},        // a plain type cuts the run
      {256, {D::Q6_K, D::Q4_K, D::Q4_K}, {48, 24, 24}, {2}, true},               // the last one goes to its Add
      // Enough rows for two logical blocks per thread block on a large GPU (odd counts: a
      // segment's last thread block is half empty).
      {256, {D::Q4_K, D::Q4_K, D::Q6_K}, {4096, 512, 512}, {3}},
      {64, {D::Q8_0, D::Q4_0, D::MXFP4}, {4100, 300, 33}, {3}},
  };
  uint32_t seed = 900;
  for (const Variant &v : variants) {
    const size_t n = v.types.size();
    WeightStore ws;
    std::vector<const GgufTensorInfo *> w;
    for (size_t i = 0; i < n; ++i)
      w.push_back(ws.add("w" + std::to_string(i), v.types[i], {v.K, v.rows[i]}, randn(static_cast<size_t>(v.K * v.rows[i]), seed++, 0.5f)));
    int x = -1, r = -1;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {v.K, 1});
      if (v.add_last) r = g.input("r", DType::F32, {v.rows.back(), 1});
      outs.clear();
      for (size_t i = 0; i < n; ++i) outs.push_back(g.matmul(g.weight(w[i]), x));
      if (v.add_last) outs.back() = g.add(outs.back(), r);
      for (size_t i = 0; i < n; ++i) g.mark_output(outs[i], "y" + std::to_string(i));
      return g;
    };
    std::string name;
    for (DType t : v.types) name += std::string(dtype_name(t)) + " ";
    INFO("K " << v.K << " types " << name);
    const FusionPlan fp = plan_on(*gpu, build());
    std::vector<size_t> matvec_groups;
    for (const FusedGroup &grp : fp.groups)
      if (grp.kind == FusedKind::MatVecs) matvec_groups.push_back(grp.members.size());
    CHECK(matvec_groups == v.groups);
    std::vector<Input> ins = {in(x, randn(static_cast<size_t>(v.K), seed++))};
    if (v.add_last) ins.push_back(in(r, randn(static_cast<size_t>(v.rows.back()), seed++)));
    auto rc = run_on(*reg.cpu(), build(), ins, outs);
    const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true, cpu_order);
    const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false, cpu_order);
    for (size_t i = 0; i < n; ++i) {
      INFO("output " << i);
      if (!v.add_last || i + 1 < n) CHECK(f.out[i] == u.out[i]);  // bit-identical (the MatMul + Add may sum otherwise)
      CHECK(rel_err(f.out[i], rc[i]) < 1e-4);
    }
    uint64_t saved = v.add_last ? 1 : 0;
    for (size_t m : v.groups) saved += m - 1;
    CHECK(f.launches + saved == u.launches);
  }
#endif
}

// gpt-oss's q, k, v: MatMul -> Add(bias) pairs of one activation in one MatVecs launch (each
// bias added to its product in the mat-vec's epilogue), against the unfused MatMul + Add
// launches and the CPU. Odd rows, Q8_0 mixed with MXFP4 / Q4_0 (one activation rounding), five
// pairs (four per launch, the fifth a MatMul + Add group), a bias on the first pair only (no
// group of pairs: a MatMul + Add, then k and v as a plain MatVecs group), and a row from an
// input instead of a weight.
TEST_CASE("cuda fusion: mat-vecs with their bias adds (gpt-oss q, k, v) equal unfused and the CPU", "[ops][cuda][fusion]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  const GpuTuning cpu_order = moe_test::cpu_order_final_outputs();
  struct Variant {
    int64_t K;
    std::vector<DType> types;
    std::vector<int64_t> rows;
    std::vector<bool> bias;             // pair i has an Add
    bool input_row;                     // the added rows are graph inputs, not weights
    std::vector<std::string> labels;    // the planned groups
  };
  using D = DType;
  const Variant variants[] = {
      {512, {D::Q8_0, D::Q8_0, D::Q8_0}, {640, 64, 64}, {true, true, true}, false, {"fused:matmul+add+matmul+add+matmul+add"}},
      {2080, {D::Q8_0, D::MXFP4, D::Q4_0}, {301, 37, 5}, {true, true, true}, true, {"fused:matmul+add+matmul+add+matmul+add"}},
      {256, {D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0}, {96, 32, 32, 64, 7}, {true, true, true, true, true}, false,
       {"fused:matmul+add+matmul+add+matmul+add+matmul+add", "fused:matmul+add"}},
      {256, {D::Q8_0, D::Q8_0, D::Q8_0}, {96, 32, 32}, {true, false, false}, false, {"fused:matmul+add", "fused:matmul+matmul"}},
  };
  uint32_t seed = 1900;
  for (const Variant &v : variants) {
    const size_t n = v.types.size();
    WeightStore ws;
    std::vector<const GgufTensorInfo *> w, b;
    for (size_t i = 0; i < n; ++i) {
      w.push_back(ws.add("w" + std::to_string(i), v.types[i], {v.K, v.rows[i]}, randn(static_cast<size_t>(v.K * v.rows[i]), seed++, 0.5f)));
      b.push_back(ws.add("b" + std::to_string(i), DType::F32, {v.rows[i]}, randn(static_cast<size_t>(v.rows[i]), seed++)));
    }
    int x = -1;
    std::vector<int> outs, rows_in;
    auto build = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {v.K, 1});
      outs.clear();
      rows_in.clear();
      for (size_t i = 0; i < n; ++i) {
        int y = g.matmul(g.weight(w[i]), x);
        if (v.bias[i]) {
          const int r = v.input_row ? g.input("r" + std::to_string(i), DType::F32, {v.rows[i], 1}) : g.weight(b[i]);
          if (v.input_row) rows_in.push_back(r);
          y = g.add(y, r);
        }
        outs.push_back(y);
      }
      for (size_t i = 0; i < n; ++i) g.mark_output(outs[i], "y" + std::to_string(i));
      return g;
    };
    INFO("K " << v.K << " pairs " << n << " input rows " << v.input_row);
    const FusionPlan fp = plan_on(*gpu, build());
    std::vector<std::string> labels;
    for (const FusedGroup &grp : fp.groups) labels.push_back(grp.label);
    CHECK(labels == v.labels);
    std::vector<Input> ins = {in(x, randn(static_cast<size_t>(v.K), seed++))};
    for (size_t i = 0; i < rows_in.size(); ++i) ins.push_back(in(rows_in[i], randn(static_cast<size_t>(v.rows[i]), seed++)));
    auto rc = run_on(*reg.cpu(), build(), ins, outs);
    const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true, cpu_order);
    const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false, cpu_order);
    for (size_t i = 0; i < n; ++i) {
      INFO("output " << i);
      CHECK(rel_err(f.out[i], u.out[i]) < 1e-5);
      CHECK(rel_err(f.out[i], rc[i]) < 1e-4);
    }
    size_t saved = 0;
    for (const FusedGroup &grp : fp.groups) saved += grp.members.size() - 1;
    CHECK(f.launches + saved == u.launches);
  }
#endif
}

// The router's one-token F32 mat-vec in the router's launch, optionally with the RmsNorm ->
// Mul in front of it: many blocks compute the logits in the unfused mat-vec's summation
// order (each normalising the row like the row chains), the last block routes (bit-identical
// to the unfused kernels). Rows 3 and 7 of the weight are equal: tied logits, the lower index
// wins. K not a multiple of 8 keeps the mat-vec (and the norm) apart.
TEST_CASE("cuda fusion: router with its F32 mat-vec (and norm) in one launch equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Case {
    int64_t K, E, k;
  };
  for (const Case &cs : {Case{64, 40, 6}, Case{2048, 128, 8}, Case{768, 300, 8}, Case{2056, 512, 8}, Case{8, 16, 4}, Case{100, 32, 4},
                         Case{4096, 64, 4}})
    for (int variant = 0; variant < 4; ++variant) {  // 0: + norm_sum, 1: probs also read outside, 2/3: + the norm (2: its output read outside)
      const int64_t K = cs.K, E = cs.E, k = cs.k;
      const bool norm = variant >= 2;
      auto wv = randn(static_cast<size_t>(K * E), static_cast<uint32_t>(50 + K + E), 0.05f);
      const auto xv = randn(static_cast<size_t>(K), static_cast<uint32_t>(60 + K));
      auto nv = randn(static_cast<size_t>(K), static_cast<uint32_t>(70 + K), 0.1f);
      for (float &v : nv) v += 1.0f;
      // Rows 3 and 7: x scaled to a logit ~3 sigma above the others, so the tie is selected.
      for (int64_t i = 0; i < K; ++i)
        wv[static_cast<size_t>(3 * K + i)] = wv[static_cast<size_t>(7 * K + i)] = 0.15f * xv[static_cast<size_t>(i)] / std::sqrt(static_cast<float>(K));
      WeightStore ws;
      const GgufTensorInfo *wi = ws.add("router", DType::F32, {K, E}, wv);
      const GgufTensorInfo *ni = ws.add("norm", DType::F32, {K}, nv);
      int xi, xn = -1, probs, ids, w;
      auto build = [&]() {
        Graph g;
        xi = g.input("x", DType::F32, {K, 1});
        int a = xi;
        if (norm) a = xn = g.mul(g.rms_norm(xi, 1e-6f), g.weight(ni));
        const int logits = g.matmul(g.weight(wi), a);
        probs = g.softmax(logits);
        ids = g.top_k(probs, static_cast<int>(k));
        w = g.norm_sum(g.gather_cols(probs, ids));
        g.mark_output(ids, "ids");
        g.mark_output(w, "w");
        if (variant == 1) g.mark_output(probs, "probs");
        if (variant == 2) g.mark_output(xn, "xn");
        return g;
      };
      INFO("K " << K << " E " << E << " variant " << variant);
      const bool with_mm = K % 8 == 0;
      const FusionPlan fp = plan_on(*gpu, build());
      // With the mat-vec apart and the probabilities read outside, the planner may place them
      // in the logits' bytes (softmax in place); a group never writes what it reads from
      // outside, so then no router group forms (seen on the H200 for K 100, E 32).
      // Then the tail (top_k, gather_cols, norm_sum) may still run as one Sequence launch
      // (the gpt-oss router tail's group, 2026-12-03): seen on the H200 for K 100, E 32.
      const bool tail_seq = !with_mm && variant == 1 && fp.groups.size() == 1 && fp.groups.back().kind == FusedKind::Sequence;
      const bool may_skip = !with_mm && variant == 1 && (fp.groups.empty() || tail_seq);
      if (tail_seq) CHECK(fp.groups.back().members.size() == 3u);
      if (!may_skip) {
        REQUIRE(fp.groups.size() == (norm && !with_mm ? 2u : 1u));  // the norm apart: a row chain
        const FusedGroup &rg = fp.groups.back();
        CHECK(rg.kind == FusedKind::Router);
        CHECK(rg.members.size() == (with_mm ? (norm ? 7u : 5u) : 4u));
        if (with_mm) CHECK(rg.label == std::string(norm ? "fused:rms_norm+mul+" : "fused:") + "matmul+softmax+top_k+gather_cols+norm_sum");
      }
      std::vector<int> outs = {ids, w};
      if (variant == 1) outs.push_back(probs);
      if (variant == 2) outs.push_back(xn);
      const std::vector<Input> ins = {in(xi, xv)};
      auto rc = run_on(*reg.cpu(), build(), ins, outs);
      const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
      const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
      for (size_t o = 0; o < outs.size(); ++o) CHECK(f.out[o] == u.out[o]);
      CHECK(f.out[0] == rc[0]);  // ids exactly (random logits are far from ties but for rows 3 and 7)
      CHECK(rel_err(f.out[1], rc[1]) < 1e-4);
      if (variant == 1 || variant == 2) CHECK(rel_err(f.out[2], rc[2]) < 1e-4);
      // Logits in the CPU's F32 order and its Softmax (vector expf on 16-element chunks; a
      // tail of E % 16 uses libm's expf there): the routing weights and probabilities are the
      // CPU's bits when E % 16 == 0.
      if (E % 16 == 0) {
        CHECK(f.out[1] == rc[1]);
        if (variant == 1) CHECK(f.out[2] == rc[2]);
      }
      // Unfused: [rms_norm, mul,] mat-vec, softmax, top_k, gather_cols, norm_sum; fused: 1, or
      // with K % 8 != 0 the mat-vec apart [and the norm as a row chain].
      const uint64_t saved = tail_seq ? 2 : may_skip ? 0 : with_mm ? (norm ? 6 : 4) : (norm ? 4 : 3);
      CHECK(f.launches + saved == u.launches);
      // The same graph again: the last-block counter was left at zero.
      const FusedRun f2 = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
      for (size_t o = 0; o < outs.size(); ++o) CHECK(f2.out[o] == f.out[o]);
    }
#endif
}

// gpt-oss's router at one token in one launch (FusedKind::TopKRouter, ops/router_topk.cu):
// [RmsNorm -> Mul ->] F32 MatMul -> Add(bias) -> TopK of the biased logits -> GatherCols ->
// Softmax over the chosen [-> Scale]. Every output (ids, weights, and the member outputs read
// outside: the normalised row, the biased logits, the gathered logits) the unfused kernels'
// bits; ids the CPU's (rows 3 and 7 and their biases tie: 3 first); K of gpt-oss (2880) and past
// the kernel's preloaded chunks (4104), E not a multiple of 8, k past 16.
TEST_CASE("cuda fusion: gpt-oss router (norm, F32 mat-vec, bias, top_k, gather_cols, softmax) in one launch equals unfused and the CPU",
          "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Case {
    int64_t K, E, k;
  };
  for (const Case &cs : {Case{2880, 32, 4}, Case{2880, 128, 4}, Case{4104, 33, 5}, Case{64, 40, 20}, Case{8, 16, 4}})
    for (int variant = 0; variant < 4; ++variant) {  // 0: plain, 1: + norm (its output read outside), 2: + scale, 3: + norm, logits and gather read outside
      const int64_t K = cs.K, E = cs.E, k = cs.k;
      const bool norm = variant == 1 || variant == 3, scale = variant == 2;
      auto wv = randn(static_cast<size_t>(K * E), static_cast<uint32_t>(150 + K + E), 0.05f);
      const auto xv = randn(static_cast<size_t>(K), static_cast<uint32_t>(160 + K));
      auto nv = randn(static_cast<size_t>(K), static_cast<uint32_t>(170 + K), 0.1f);
      for (float &v : nv) v += 1.0f;
      auto bv = randn(static_cast<size_t>(E), static_cast<uint32_t>(180 + E), 0.1f);
      for (int64_t i = 0; i < K; ++i)  // rows 3 and 7: a tie ~3 sigma above the others
        wv[static_cast<size_t>(3 * K + i)] = wv[static_cast<size_t>(7 * K + i)] = 0.15f * xv[static_cast<size_t>(i)] / std::sqrt(static_cast<float>(K));
      bv[7] = bv[3];
      WeightStore ws;
      const GgufTensorInfo *wi = ws.add("router", DType::F32, {K, E}, wv);
      const GgufTensorInfo *ni = ws.add("norm", DType::F32, {K}, nv);
      const GgufTensorInfo *bi = ws.add("bias", DType::F32, {E}, bv);
      int xi, xn = -1, logits, ids, gathered, w;
      auto build = [&]() {
        Graph g;
        xi = g.input("x", DType::F32, {K, 1});
        int a = xi;
        if (norm) a = xn = g.mul(g.rms_norm(xi, 1e-5f), g.weight(ni));
        logits = g.add(g.matmul(g.weight(wi), a), g.weight(bi));
        ids = g.top_k(logits, static_cast<int>(k));
        gathered = g.gather_cols(logits, ids);
        w = g.softmax(gathered);
        if (scale) w = g.scale(w, 2.5f);
        g.mark_output(ids, "ids");
        g.mark_output(w, "w");
        if (norm) g.mark_output(xn, "xn");  // the experts read the normalised row
        if (variant == 3) {
          g.mark_output(logits, "logits");
          g.mark_output(gathered, "gathered");
        }
        return g;
      };
      INFO("K " << K << " E " << E << " k " << k << " variant " << variant);
      const FusionPlan fp = plan_on(*gpu, build());
      REQUIRE(fp.groups.size() == 1);
      CHECK(fp.groups[0].kind == FusedKind::TopKRouter);
      CHECK(fp.groups[0].label == std::string(norm ? "fused:rms_norm+mul+" : "fused:") + "matmul+add+top_k+gather_cols+softmax" + (scale ? "+scale" : ""));
      std::vector<int> outs = {ids, w};
      if (norm) outs.push_back(xn);
      if (variant == 3) outs.insert(outs.end(), {logits, gathered});
      const std::vector<Input> ins = {in(xi, xv)};
      auto rc = run_on(*reg.cpu(), build(), ins, outs);
      const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
      const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
      for (size_t o = 0; o < outs.size(); ++o) {
        INFO("output " << o);
        CHECK(f.out[o] == u.out[o]);  // bit-identical
        if (o > 0) CHECK(rel_err(f.out[o], rc[o]) < 1e-5);
      }
      CHECK(f.out[0] == rc[0]);  // ids exactly
      std::vector<int32_t> id(static_cast<size_t>(k));
      std::memcpy(id.data(), f.out[0].data(), id.size() * 4);
      CHECK(id[0] == 3);
      CHECK(id[1] == 7);
      // Unfused: [rms_norm, mul,] mat-vec, add, top_k, gather_cols, softmax [, scale]; fused: 1.
      const uint64_t unfused = (norm ? 2 : 0) + 5 + (scale ? 1 : 0);
      CHECK(f.launches + unfused - 1 == u.launches);
      const FusedRun f2 = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);  // the last-block counter was left at zero
      for (size_t o = 0; o < outs.size(); ++o) CHECK(f2.out[o] == f.out[o]);
    }
#endif
}

// qwen3next / qwen35moe: the shared expert's gate logit (an F32 mat-vec of the ffn-normed row,
// 1 row; here also 3) built right before the router's mat-vec joins the router's launch as a side
// product (cuda_fusion.h: kMaxRouterSideRows), read later by a Sigmoid. One token: one launch for
// norm, both mat-vecs and the routing, every output the unfused bits; two tokens: no mat-vec in
// the group (the logits and the side product run unfused), the same values.
TEST_CASE("cuda fusion: a side mat-vec (shared-expert gate logit) in the router's launch equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Case {
    int64_t K, E, k, side, T;
  };
  for (const Case &cs : {Case{2048, 512, 10, 1, 1}, Case{2048, 256, 8, 1, 1}, Case{64, 40, 6, 3, 1}, Case{768, 300, 8, 1, 1},
                         Case{2048, 256, 8, 1, 2}, Case{64, 40, 6, 3, 2}}) {
    const int64_t K = cs.K, E = cs.E, k = cs.k, T = cs.T;
    const auto wv = randn(static_cast<size_t>(K * E), static_cast<uint32_t>(50 + K + E), 0.05f);
    const auto sv = randn(static_cast<size_t>(K * cs.side), static_cast<uint32_t>(55 + K), 0.05f);
    const auto xv = randn(static_cast<size_t>(K * T), static_cast<uint32_t>(60 + K));
    auto nv = randn(static_cast<size_t>(K), static_cast<uint32_t>(70 + K), 0.1f);
    for (float &v : nv) v += 1.0f;
    WeightStore ws;
    const GgufTensorInfo *wi = ws.add("router", DType::F32, {K, E}, wv);
    const GgufTensorInfo *si = ws.add("side", DType::F32, {K, cs.side}, sv);
    const GgufTensorInfo *ni = ws.add("norm", DType::F32, {K}, nv);
    int xi, ids, w, gate;
    auto build = [&]() {
      Graph g;
      xi = g.input("x", DType::F32, {K, T});
      const int y = g.mul(g.rms_norm(xi, 1e-6f), g.weight(ni));
      const int logit = g.matmul(g.weight(si), y);  // as qwen3next.cpp builds it: before the router
      const int probs = g.softmax(g.matmul(g.weight(wi), y));
      ids = g.top_k(probs, static_cast<int>(k));
      w = g.norm_sum(g.gather_cols(probs, ids));
      gate = g.sigmoid(logit);  // the shared gate's reader, after the router
      g.mark_output(ids, "ids");
      g.mark_output(w, "w");
      g.mark_output(gate, "gate");
      return g;
    };
    INFO("K " << K << " E " << E << " side rows " << cs.side << " T " << T);
    const FusionPlan fp = plan_on(*gpu, build());
    const FusedGroup *rg = nullptr;
    for (const FusedGroup &grp : fp.groups)
      if (grp.kind == FusedKind::Router) rg = &grp;
    REQUIRE(rg);
    if (T == 1) CHECK(rg->label == "fused:rms_norm+mul+matmul+matmul+softmax+top_k+gather_cols+norm_sum");
    else CHECK(rg->label == "fused:softmax+top_k+gather_cols+norm_sum");
    const std::vector<int> outs = {ids, w, gate};
    const std::vector<Input> ins = {in(xi, xv)};
    auto rc = run_on(*reg.cpu(), build(), ins, outs);
    const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
    const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
    for (size_t o = 0; o < outs.size(); ++o) CHECK(f.out[o] == u.out[o]);
    CHECK(f.out[0] == rc[0]);
    CHECK(rel_err(f.out[1], rc[1]) < 1e-4);
    CHECK(rel_err(f.out[2], rc[2]) < 1e-5);
    // Unfused: rms_norm, mul, side, router, softmax, top_k, gather_cols, norm_sum, sigmoid = 9;
    // fused at one token: the router launch + the sigmoid = 2.
    if (T == 1) CHECK(f.launches + 7 == u.launches);
    // The same graph again: the last-block counter was left at zero.
    const FusedRun f2 = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
    for (size_t o = 0; o < outs.size(); ++o) CHECK(f2.out[o] == f.out[o]);
  }
#endif
}

// deepseek2's router at one token (GLM-4.7-Flash: sigmoid gating, selection bias, no expert
// groups): the ffn norm, the F32 router mat-vec and the sigmoid tail in the router's launch;
// with K % 8 != 0 the mat-vec and the norm run apart and the tail in the router kernel.
TEST_CASE("cuda fusion: sigmoid router with its F32 mat-vec and norm in one launch equals unfused and the CPU", "[ops][cuda][fusion][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  struct Case {
    int64_t K, E, k;
    bool bias, norm_sum, scale, probs_out;
  };
  const Case cases[] = {{2048, 64, 4, true, true, true, false}, {64, 40, 6, true, false, true, false}, {768, 300, 8, false, true, false, true},
                        {8, 16, 4, true, true, false, false},    {100, 32, 4, true, true, true, false}, {2056, 512, 8, true, false, false, true}};
  for (const Case &cs : cases) {
    const int64_t K = cs.K, E = cs.E, k = cs.k;
    auto wv = randn(static_cast<size_t>(K * E), static_cast<uint32_t>(90 + K + E), 0.05f);
    const auto xv = randn(static_cast<size_t>(K), static_cast<uint32_t>(91 + K));
    auto nv = randn(static_cast<size_t>(K), static_cast<uint32_t>(92 + K), 0.1f);
    for (float &v : nv) v += 1.0f;
    WeightStore ws;
    const GgufTensorInfo *wi = ws.add("router", DType::F32, {K, E}, wv);
    const GgufTensorInfo *ni = ws.add("norm", DType::F32, {K}, nv);
    const GgufTensorInfo *bi = ws.add("bias", DType::F32, {E}, randn(static_cast<size_t>(E), static_cast<uint32_t>(93 + E), 0.1f));
    int xi, xn, probs, ids, w;
    auto build = [&]() {
      Graph g;
      xi = g.input("x", DType::F32, {K, 1});
      xn = g.mul(g.rms_norm(xi, 1e-6f), g.weight(ni));
      probs = g.sigmoid(g.matmul(g.weight(wi), xn));
      ids = g.top_k(cs.bias ? g.add(probs, g.weight(bi)) : probs, static_cast<int>(k));
      w = g.gather_cols(probs, ids);
      if (cs.norm_sum) w = g.norm_sum(w);
      if (cs.scale) w = g.scale(w, 2.5f);
      g.mark_output(ids, "ids");
      g.mark_output(w, "w");
      g.mark_output(xn, "xn");  // the experts read the normalised row
      if (cs.probs_out) g.mark_output(probs, "probs");
      return g;
    };
    INFO("K " << K << " E " << E << " k " << k << " bias " << cs.bias << " norm_sum " << cs.norm_sum << " scale " << cs.scale);
    const bool with_mm = K % 8 == 0;
    const int tail = 3 + (cs.bias ? 1 : 0) + (cs.norm_sum ? 1 : 0) + (cs.scale ? 1 : 0);  // sigmoid .. scale
    const FusionPlan fp = plan_on(*gpu, build());
    if (with_mm) {
      REQUIRE(fp.groups.size() == 1);
      CHECK(fp.groups[0].kind == FusedKind::Router);
      CHECK(fp.groups[0].members.size() == static_cast<size_t>(3 + tail));
    }
    std::vector<int> outs = {ids, w, xn};
    if (cs.probs_out) outs.push_back(probs);
    const std::vector<Input> ins = {in(xi, xv)};
    auto rc = run_on(*reg.cpu(), build(), ins, outs);
    const FusedRun f = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);
    const FusedRun u = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, false);
    for (size_t o = 0; o < outs.size(); ++o) CHECK(f.out[o] == u.out[o]);  // bit-identical
    CHECK(f.out[0] == rc[0]);
    for (size_t o = 1; o < outs.size(); ++o) CHECK(rel_err(f.out[o], rc[o]) < 1e-5);
    // Unfused: rms_norm, mul, mat-vec and the tail, one launch each. Fused: 1; without the
    // mat-vec path: the norm as a row chain, the mat-vec, the tail as a Sequence.
    const uint64_t unfused = 3 + static_cast<uint64_t>(tail);
    CHECK(u.launches - f.launches == (with_mm ? unfused - 1 : unfused - 3));
    const FusedRun f2 = run_gpu(*gpu, build(), ins, outs, ExecEnv{}, true);  // the last-block counter was left at zero
    for (size_t o = 0; o < outs.size(); ++o) CHECK(f2.out[o] == f.out[o]);
  }
#endif
}

TEST_CASE("cuda fusion: tiny models decode alike fused, unfused and on the CPU", "[cuda][fusion][engine]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  const std::pair<const char *, const char *> models[] = {{"tiny", "q8_0"}, {"tiny", "q4_k_m"}, {"tiny-deepseek2", "q8_0"}, {"tiny-gpt-oss", "q8_0"}};
  for (const auto &pm : models) {
    const std::string path = write_tiny(pm.first, pm.second);
    {
      auto model = Model::load(path, ModelLoadParams{});
      std::map<std::string, std::vector<int32_t>> greedy;
      std::map<std::string, std::vector<float>> logits;
      for (const char *mode : {"cpu", "fused", "unfused"}) {
        ContextParams cp;
        cp.n_ctx = 128;
        cp.n_threads = 2;
        cp.device = std::string(mode) == "cpu" ? "cpu" : "cuda";
        cp.kv_type = KvType::F32;  // see the [cuda][engine] test: F16 probabilities differ by design
        cp.gpu_tuning.fusion = std::string(mode) != "unfused";
        auto ctx = Context::create(*model, cp);
        std::vector<BatchToken> prompt;
        const int32_t ids[] = {300, 1, 2, 42, 77, 5, 9, 100};
        for (int32_t i = 0; i < 8; ++i) prompt.push_back({ids[i], i, 0, i == 7});
        ctx->decode(prompt.data(), prompt.size());
        const int32_t nv = ctx->n_vocab();
        std::vector<int32_t> out;
        for (int step = 0; step < 10; ++step) {
          const float *l = ctx->logits(-1);
          if (step == 3) logits[mode].assign(l, l + nv);  // after decode steps (T = 1 paths)
          int32_t best = 0;
          for (int32_t t = 1; t < nv; ++t)
            if (l[t] > l[best]) best = t;
          out.push_back(best);
          BatchToken t{best, 8 + step, 0, true};
          ctx->decode(&t, 1);
        }
        greedy[mode] = out;
      }
      INFO(pm.first << " " << pm.second << " (fused vs unfused isolates fusion; CUDA vs CPU is the backend as a whole)");
      CHECK(greedy["fused"] == greedy["unfused"]);
      CHECK(greedy["fused"] == greedy["cpu"]);
      auto bytes = [](const std::vector<float> &v) {
        std::vector<uint8_t> b(v.size() * 4);
        std::memcpy(b.data(), v.data(), b.size());
        return b;
      };
      // Row chains and router are bit-identical; the fused mat-vec groups may sum in another order.
      CHECK(rel_err(bytes(logits["fused"]), bytes(logits["unfused"])) < 1e-4);
      CHECK(rel_err(bytes(logits["fused"]), bytes(logits["cpu"])) < 1e-3);
    }
    std::remove(path.c_str());
  }
#endif
}

// Kernel launches of one decode step (eager: graphs off). Fused: a qwen3moe layer is one
// row-chain launch for the q/k/v head norms, ropes and stores, one router launch, and (once
// the fused mat-vec launchers exist) one launch each for out-proj + residual, gate/up +
// SwiGLU, down + combine + residual. The count must not depend on the expert counts.
TEST_CASE("cuda engine: kernel launches per decode step (fused / unfused), independent of experts", "[cuda][engine][fusion]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  // Per layer (one-token mat-vecs round their activations inside: 1 launch each): attn norm 1,
  // q/k/v 1, head chains 1, attention 1 (its last blocks merge the cell ranges), out-proj +
  // residual 1, ffn norm + router mat-vec + router 1, gate/up + SwiGLU 1, down + combine +
  // residual 1 = 8; without the fused mat-vec groups: attn norm 1, q 1 + k 1 + v 1, out-proj 1 +
  // add 1, gate 1 + up 1 + swiglu 1, down 1 + combine 1 + add 1 = 15.
  const int64_t per_layer = cuda_fused_matvec_available() ? 8 : 15;
  // Embedding 1, the output norm 1, LM head 1; the last layer selects its output rows (2)
  // between out-proj and the residual add, so there those two stay apart (+1): 6 in the plan
  // (the [fusion] plan test prints it), at most 8 here.
  const int64_t fixed = 8;
  std::map<std::string, uint64_t> counts;
  for (const char *preset : {"tiny", "tiny-e16", "tiny-deepseek2"}) {
    const std::string path = write_tiny(preset, "q8_0");
    {
      auto model = Model::load(path, ModelLoadParams{});
      const int64_t n_layer = static_cast<int64_t>(model->impl().hp.n_layer);
      for (int mode = 0; mode < 2; ++mode) {  // fused, unfused
        ContextParams cp;
        cp.gpu_tuning.fusion = mode != 1;
        cp.n_ctx = 64;
        cp.device = "cuda";
        cp.gpu_graphs = false;
        auto ctx = Context::create(*model, cp);
        std::vector<BatchToken> prompt;
        for (int32_t i = 0; i < 4; ++i) prompt.push_back({10 + i, i, 0, i == 3});
        ctx->decode(prompt.data(), prompt.size());
        uint64_t per_step = 0, glue_per_step = 0;
        for (int step = 0; step < 3; ++step) {
          BatchToken t{20 + step, 4 + step, 0, true};
          const moe_test::CudaCounts before = moe_test::cuda_counts(*ctx);
          ctx->decode(&t, 1);
          const moe_test::CudaCounts d = moe_test::cuda_counts(*ctx) - before;
          per_step = d.launches;
          glue_per_step = d.mla_glue;
        }
        // deepseek2 fused: every layer's MLA glue in the shared-memory kernel (ops/mla_glue.cu), none elsewhere.
        const bool mla = std::string(preset) == "tiny-deepseek2" && mode != 1;
        CHECK(glue_per_step == (mla ? static_cast<uint64_t>(n_layer) : 0u));
        const char *name = mode == 0 ? "fused" : "unfused";
        std::printf("[cuda][engine] %s %s: %llu kernel launches per decode step (%lld layers)\n", preset, name,
                    static_cast<unsigned long long>(per_step), static_cast<long long>(n_layer));
        counts[std::string(preset) + "/" + name] = per_step;
        if (mode == 0 && std::string(preset) != "tiny-deepseek2") CHECK(static_cast<int64_t>(per_step) <= per_layer * n_layer + fixed);
      }
    }
    std::remove(path.c_str());
  }
  // tiny-deepseek2 (1 dense + 2 MoE layers): the MLA glue's Sequence and HeadsConcat launches
  // replace 10 + 2 launches in every layer (-10), the sigmoid router's sigmoid + bias 2 in each MoE
  // layer (-1; its grouped top-k ends the sequence); the other groups save more.
  CHECK(counts["tiny-deepseek2/fused"] + 3 * 8 + 2 <= counts["tiny-deepseek2/unfused"]);
  CHECK(counts["tiny/fused"] == counts["tiny-e16/fused"]);
  CHECK(counts["tiny/unfused"] == counts["tiny-e16/unfused"]);
  CHECK(counts["tiny/fused"] < counts["tiny/unfused"]);
#endif
}
