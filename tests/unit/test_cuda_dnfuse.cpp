// The fused launches of the gated DeltaNet layer (cuda_fusion.h: DeltaIn, GatedNorm;
// ops/delta_net_fused.cu): the layer's section from the projections' outputs to the gated
// output norm, built as qwen3next / qwen35moe build it, run on the CPU, on CUDA fused and on
// CUDA unfused with their own state caches over the same calls (interleaved sequences in one
// ubatch, one-token steps eager / captured / replayed, 2 sequences of one token, a few tokens
// of one sequence, a prompt past kMaxDeltaInTokens that stays unfused). Fused must equal
// unfused bit for bit (the kernels share the unfused expressions and reduction orders) and the
// CPU within the DeltaNet op tests' bounds. Plan cases (no GPU needed): the groups form on this
// graph and not where a reader outside needs an intermediate.
// Without a CUDA build or device the GPU cases WARN and return (tags [cuda][dnfuse]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unistd.h>

#include "backends/backend.h"
#include "engine/engine.h"
#include "model/synth/synth_model.h"
#include "kv/kv_cache.h"
#include "support/cuda_counts.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_fusion.h"
#endif

using namespace moe;
using moe_test::BoundGraph;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::scaled_diff;
using moe_test::randn;

namespace {

struct Shape {
  int64_t d, n_k, n_v, K;
  bool next;  // qwen3next's fused ba projection (gates through two Slices) vs qwen35moe's beta / alpha
};

}  // namespace

#ifdef MOEINFER_WITH_CUDA
namespace {

struct Section {
  int qkv = -1, z = -1, ba = -1, beta = -1, alpha = -1;  // inputs
  int gates = -1, o = -1, y = -1, sp = -1, conv = -1;
};

struct Weights {
  moe_test::WeightStore ws;
  const GgufTensorInfo *conv, *dt, *a, *norm;
  explicit Weights(const Shape &s) {
    const int64_t C = 2 * s.d * s.n_k + s.d * s.n_v;
    conv = ws.add("conv", DType::F32, {s.K, C}, randn(static_cast<size_t>(C * s.K), 91, 0.5f));
    dt = ws.add("dt", DType::F32, {s.n_v}, randn(static_cast<size_t>(s.n_v), 92, 1.0f));
    std::vector<float> a = randn(static_cast<size_t>(s.n_v), 93, 1.0f);
    for (float &v : a) v = -std::exp(v);  // ssm_a = -exp(A_log)
    this->a = ws.add("a", DType::F32, {s.n_v}, a);
    std::vector<float> nw = randn(static_cast<size_t>(s.d), 94, 0.3f);
    for (float &v : nw) v += 1.0f;
    norm = ws.add("norm", DType::F32, {s.d}, nw);
  }
};

// The builder's DeltaNet section (src/model/arch/qwen3next.cpp), from the projections on.
// extra: 1 = the softplus output is also a graph output, 2 = another node reads the conv output.
Graph build(const Shape &s, const Weights &w, int64_t T, Section &x, int extra = 0) {
  Graph g;
  const int64_t key_dim = s.d * s.n_k, value_dim = s.d * s.n_v, C = 2 * key_dim + value_dim, r = s.n_v / s.n_k;
  x.qkv = g.input("qkv", DType::F32, {C, T});
  x.z = g.input("z", DType::F32, {value_dim, T});
  int beta, alpha;
  if (s.next) {
    x.ba = g.input("ba", DType::F32, {2 * r * s.n_k, T});
    const int ba = g.view(x.ba, {2 * r, s.n_k, T});
    beta = g.view(g.slice(ba, 0, r), {s.n_v, T});
    alpha = g.view(g.slice(ba, r, r), {s.n_v, T});
  } else {
    beta = x.beta = g.input("beta", DType::F32, {s.n_v, T});
    alpha = x.alpha = g.input("alpha", DType::F32, {s.n_v, T});
  }
  x.sp = g.softplus(g.add(alpha, g.weight(w.dt)));
  const int decay = g.mul(x.sp, g.weight(w.a));
  x.gates = g.concat(decay, g.sigmoid(beta));
  x.conv = g.ssm_conv(x.qkv, g.weight(w.conv), 0);
  const int q = g.l2_norm(g.view(g.slice(x.conv, 0, key_dim), {s.d, s.n_k, T}), 1e-6f);
  const int k = g.l2_norm(g.view(g.slice(x.conv, key_dim, key_dim), {s.d, s.n_k, T}), 1e-6f);
  const int v = g.view(g.slice(x.conv, 2 * key_dim, value_dim), {s.d, s.n_v, T});
  x.o = g.delta_net(q, k, v, x.gates, 0, s.next ? 0 : 1, 1.0f / std::sqrt(static_cast<float>(s.d)));
  x.y = g.swiglu(g.view(x.z, {s.d, s.n_v, T}), g.mul(g.rms_norm(x.o, 1e-6f), g.weight(w.norm)));
  g.mark_output(x.o, "o");
  g.mark_output(x.y, "y");
  if (extra == 1) g.mark_output(x.sp, "sp");
  if (extra == 2) g.mark_output(g.scale(x.conv, 2.0f), "conv2");
  return g;
}

}  // namespace


namespace {

// The fusion labels of the section's graph for T tokens, compiled on the host and its arena laid
// out as the CUDA backend lays it out (its scratch sizes, the lifetimes it extends).
std::vector<std::string> labels(const Shape &s, int64_t T, int extra) {
  BackendRegistry reg;
  Weights w(s);
  Section x;
  CompileOptions o;
  o.devices = {reg.cpu()};
  auto plan = compile_graph(build(s, w, T, x, extra), o);
  const Graph &cg = plan->graph;
  const CudaPaths paths = cuda_select_paths(90, 90, 232448);
  std::vector<int> keep;
  cuda_fusion_keep_live(cg, 0, keep);
  plan_memory(plan->graph, [&](int id) { return cuda_work_size(cg, id, GpuTuning{}, paths); }, keep);
  std::vector<std::string> out;
  for (const FusedGroup &grp : plan_fusion(plan->graph, 0).groups) out.push_back(grp.label);
  return out;
}

bool has(const std::vector<std::string> &v, const std::string &l) { return std::find(v.begin(), v.end(), l) != v.end(); }

}  // namespace
#endif  // MOEINFER_WITH_CUDA

TEST_CASE("cuda dnfuse plan: the DeltaNet section fuses, and stays apart where a reader outside needs an intermediate", "[fusion][dnfuse]") {
#ifdef MOEINFER_WITH_CUDA
  const std::string next_in = "fused:slice+slice+add+softplus+mul+sigmoid+concat+ssm_conv+slice+l2_norm+slice+l2_norm+slice";
  const std::string q35_in = "fused:add+softplus+mul+sigmoid+concat+ssm_conv+slice+l2_norm+slice+l2_norm+slice";
  const std::string norm = "fused:rms_norm+mul+swiglu";
  for (const Shape &s : {Shape{16, 2, 4, 4, true}, Shape{16, 2, 4, 4, false}}) {
    const std::string &in_label = s.next ? next_in : q35_in;
    INFO((s.next ? "qwen3next" : "qwen35moe"));
    for (int64_t T : {int64_t{1}, int64_t{5}, kMaxDeltaInTokens}) {
      INFO("T " << T);
      const auto l = labels(s, T, 0);
      CHECK(has(l, in_label));
      CHECK(has(l, norm));
    }
    CHECK_FALSE(has(labels(s, kMaxDeltaInTokens + 1, 0), in_label));  // prompts: the unfused kernels
    for (int extra : {1, 2}) {
      INFO("extra reader " << extra);
      const auto l = labels(s, 1, extra);
      for (const std::string &lab : l) CHECK(lab.find("ssm_conv") == std::string::npos);
      CHECK(has(l, norm));
    }
  }
#endif
}

#ifdef MOEINFER_WITH_CUDA
namespace {


struct Tok {
  int32_t seq, pos;
};

// CPU, CUDA fused and CUDA unfused, each with its own cache and per-T graphs, fed the same calls.
struct Sides {
  Shape s;
  Weights w;
  Backend *be[3];
  std::unique_ptr<KvCache> kv[3];
  std::map<int64_t, std::pair<Section, std::unique_ptr<BoundGraph>>> graphs[3];
  uint32_t seed = 7;
  double worst_cpu = 0;
  bool bits_equal = true;
  int fused_steps = 0;

  Sides(const Shape &shape, Backend &cpu, Backend &gpu) : s(shape), w(shape), be{&cpu, &gpu, &gpu} {
    KvLayerDims l;
    const int64_t C = 2 * s.d * s.n_k + s.d * s.n_v;
    l.conv_state = (s.K - 1) * C;
    l.ssm_state = s.n_v * s.d * s.d;
    for (int k = 0; k < 3; ++k) kv[k] = std::make_unique<KvCache>(256, 4, KvType::F32, std::vector<KvLayerDims>{l}, *be[k]);
  }

  std::pair<Section, std::unique_ptr<BoundGraph>> &graph(int side, int64_t T) {
    auto &e = graphs[side][T];
    if (!e.second) {
      GpuTuning t;
      t.fusion = side == 1;
      e.second = std::make_unique<BoundGraph>(*be[side], build(s, w, T, e.first), t);
      if (side == 1 && T <= kMaxDeltaInTokens) {  // the GPU's own plan has both groups
        int kinds = 0;
        for (const FusedGroup &grp : plan_fusion(e.second->plan->graph, 0).groups)
          kinds |= grp.kind == FusedKind::DeltaIn ? 1 : grp.kind == FusedKind::GatedNorm ? 2 : 0;
        CHECK(kinds == 3);
      }
    }
    return e;
  }

  void ubatch(const std::vector<Tok> &toks) {
    const int64_t T = static_cast<int64_t>(toks.size()), C = 2 * s.d * s.n_k + s.d * s.n_v;
    std::mt19937 rng(seed++);
    auto r = [&](int64_t n, float sc) { return randn(static_cast<size_t>(n), static_cast<uint32_t>(rng()), sc); };
    const std::vector<float> qkv = r(C * T, 1.0f), z = r(s.d * s.n_v * T, 1.0f), ba = r(2 * s.n_v * T, 1.5f), beta = r(s.n_v * T, 1.5f),
                             alpha = r(s.n_v * T, 1.5f);
    std::vector<int32_t> pos, seq, cells(static_cast<size_t>(T));
    for (const Tok &t : toks) { pos.push_back(t.pos); seq.push_back(t.seq); }
    REQUIRE(kv[0]->find_slots(static_cast<uint32_t>(T), cells.data()));
    for (auto &c : kv) c->claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(T));
    std::vector<float> out[3][2];
    for (int side = 0; side < 3; ++side) {
      auto &[x, bg] = graph(side, T);
      UbatchInfo ub;
      ub.n_tokens = static_cast<int32_t>(T);
      ub.cells = cells.data();
      ub.pos = pos.data();
      ub.seq = seq.data();
      ub.n_kv = kv[side]->n_kv();
      ub.cell_state = kv[side]->cells();
      ExecEnv env{&ub, kv[side].get()};
      std::vector<moe_test::Input> ins = {in(x.qkv, qkv), in(x.z, z)};
      if (s.next) ins.push_back(in(x.ba, ba));
      else ins.insert(ins.end(), {in(x.beta, beta), in(x.alpha, alpha)});
      bg->run(ins, env);
      out[side][0] = moe_test::as_f32(bg->read(x.o));
      out[side][1] = moe_test::as_f32(bg->read(x.y));
    }
    for (auto &c : kv) c->end_ubatch();
    for (auto &c : kv) c->commit_recurrent();
    for (int k = 0; k < 2; ++k) {
      worst_cpu = std::max(worst_cpu, scaled_diff(out[1][k], out[0][k]));
      if (out[1][k] != out[2][k]) bits_equal = false;
    }
    if (T <= kMaxDeltaInTokens) ++fused_steps;
  }

  // The committed states of every sequence: fused vs unfused (bits), fused vs CPU.
  void check_states() {
    const size_t n = static_cast<size_t>(kv[0]->dims(0).recurrent());
    std::vector<float> st[3];
    for (int32_t q = 0; q < 4; ++q) {
      for (int k = 0; k < 3; ++k) {
        st[k].resize(n);
        kv[k]->read_recurrent(0, q, st[k].data());
      }
      INFO("sequence " << q);
      CHECK(std::memcmp(st[1].data(), st[2].data(), n * 4) == 0);
      CHECK(scaled_diff(st[1], st[0]) < 2e-4);
    }
  }
};

}  // namespace
#endif

namespace {

void run_plan(const Shape &s) {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  INFO("d " << s.d << " heads " << s.n_k << "/" << s.n_v << " K " << s.K << (s.next ? " qwen3next" : " qwen35moe"));
  Sides p(s, *reg.cpu(), *gpu);
  int32_t next[4] = {0, 0, 0, 0};
  auto tok = [&](int32_t q) { return Tok{q, next[q]++}; };
  std::vector<Tok> u;
  for (int i = 0; i < 12; ++i) u.push_back(tok(i % 3 == 1 ? 2 : 0));  // two sequences interleaved
  p.ubatch(u);
  for (int step = 0; step < 4; ++step) p.ubatch({tok(step % 2 ? 2 : 0)});  // one token: eager, captured, replayed
  for (int step = 0; step < 3; ++step) p.ubatch({tok(0), tok(2)});          // two sequences, one token each
  p.ubatch({tok(1), tok(1), tok(1)});                                        // a few tokens of a new sequence
  u.clear();
  for (int i = 0; i < 20; ++i) u.push_back(tok(0));  // past kMaxDeltaInTokens: unfused on both GPU sides
  p.ubatch(u);
  p.ubatch({tok(0)});
  CHECK(p.fused_steps == 10);
  CHECK(p.bits_equal);
  CHECK(p.worst_cpu < 2e-4);
  p.check_states();
#endif
}

}  // namespace

TEST_CASE("cuda dnfuse: fused DeltaNet input chain and output norm equal unfused (bits) and the CPU", "[cuda][dnfuse]") {
  run_plan({128, 2, 4, 4, true});   // the models' head size, qwen3next's gates
  run_plan({128, 2, 4, 4, false});  // qwen35moe's gates and head map
}

TEST_CASE("cuda dnfuse: odd shapes (head sizes 48, 5 and 200, conv widths 3 and 2, one key head)", "[cuda][dnfuse]") {
  run_plan({48, 2, 6, 4, false});
  run_plan({5, 1, 3, 3, true});
  run_plan({200, 1, 2, 2, false});
}

#ifdef MOEINFER_WITH_CUDA
namespace {

// Both hybrids' shared-expert tail: y = (routed + shared * sigmoid(logit)) + res, the adds'
// operands in either order; extra = true: the gated value is also read outside (no group).
struct Tail {
  int logit, shared, routed, res, y;
};
Graph build_tail(int64_t M, int64_t T, bool swapped, bool extra, Tail &x) {
  Graph g;
  x.logit = g.input("logit", DType::F32, {1, T});
  x.shared = g.input("shared", DType::F32, {M, T});
  x.routed = g.input("routed", DType::F32, {M, T});
  x.res = g.input("res", DType::F32, {M, T});
  const int gated = g.moe_combine(g.view(x.shared, {M, 1, T}), g.sigmoid(x.logit));
  const int a = swapped ? g.add(gated, x.routed) : g.add(x.routed, gated);
  x.y = swapped ? g.add(x.res, a) : g.add(a, x.res);
  g.mark_output(x.y, "y");
  if (extra) g.mark_output(g.scale(gated, 3.0f), "extra");
  return g;
}

}  // namespace
#endif

TEST_CASE("cuda dnfuse: the gated shared expert plus residual in one launch equals unfused (bits) and the CPU", "[cuda][dnfuse]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
#ifdef MOEINFER_WITH_CUDA
  for (int64_t M : {int64_t{2048}, int64_t{37}})
    for (int64_t T : {int64_t{1}, int64_t{3}})
      for (bool swapped : {false, true})
        for (bool extra : {false, true}) {
          INFO("M " << M << " T " << T << " swapped " << swapped << " extra reader " << extra);
          Tail x;
          {  // the plan (host): one SharedGate group unless the gated value is read outside
            CompileOptions o;
            o.devices = {reg.cpu()};
            auto plan = compile_graph(build_tail(M, T, swapped, extra, x), o);
            int n = 0;
            for (const FusedGroup &grp : plan_fusion(plan->graph, 0).groups) n += grp.kind == FusedKind::SharedGate;
            CHECK(n == (extra ? 0 : 1));
          }
          if (!gpu) continue;
          const std::vector<moe_test::Input> ins = {in(x.logit, randn(static_cast<size_t>(T), 3, 2.0f)),
                                                     in(x.shared, randn(static_cast<size_t>(M * T), 4)),
                                                     in(x.routed, randn(static_cast<size_t>(M * T), 5)),
                                                     in(x.res, randn(static_cast<size_t>(M * T), 6))};
          std::vector<float> out[3];
          for (int side = 0; side < 3; ++side) {
            GpuTuning t;
            t.fusion = side == 1;
            Graph g = build_tail(M, T, swapped, extra, x);
            out[side] = moe_test::as_f32(moe_test::run_on(side ? *gpu : *reg.cpu(), std::move(g), ins, {x.y}, ExecEnv{}, 1, t)[0]);
          }
          CHECK(out[1] == out[2]);
          CHECK(scaled_diff(out[1], out[0]) < 1e-6);  // the CPU's sigmoid may differ from CUDA's expf in the last bit
        }
#else
  (void)gpu;
#endif
}

// Engine level: both tiny hybrids decode a prompt and one-token steps alike fused and unfused
// (the fused mat-vec groups may sum in another order: logits within 1e-4, the same tokens);
// prints the kernel launches per decode step (eager) for the record.
TEST_CASE("cuda dnfuse: tiny hybrids decode alike fused and unfused", "[cuda][dnfuse][engine]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (const char *preset : {"tiny-qwen3next", "tiny-qwen35moe"}) {
    const std::string path = (std::filesystem::temp_directory_path() / (std::string("moe-dnfuse-") + preset + "-" + std::to_string(::getpid()) + ".gguf")).string();
    SynthSpec spec;
    spec.preset = preset;
    spec.type_mix = "q8_0";
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      std::map<bool, std::vector<int32_t>> greedy;
      std::map<bool, std::vector<float>> logits;
      for (bool fused : {true, false}) {
        ContextParams cp;
        cp.n_ctx = 128;
        cp.device = "cuda";
        cp.kv_type = KvType::F32;
        cp.gpu_tuning.fusion = fused;
        cp.gpu_graphs = false;  // launches counted one by one
        auto ctx = Context::create(*model, cp);
        std::vector<BatchToken> prompt;
        const int32_t ids[] = {300, 1, 2, 42, 77, 5, 9, 100};
        for (int32_t i = 0; i < 8; ++i) prompt.push_back({ids[i], i, 0, i == 7});
        ctx->decode(prompt.data(), prompt.size());
        const int32_t nv = ctx->n_vocab();
        uint64_t per_step = 0;
        for (int step = 0; step < 6; ++step) {
          const float *l = ctx->logits(-1);
          if (step == 3) logits[fused].assign(l, l + nv);
          int32_t best = 0;
          for (int32_t t = 1; t < nv; ++t)
            if (l[t] > l[best]) best = t;
          greedy[fused].push_back(best);
          BatchToken t{best, 8 + step, 0, true};
          const uint64_t before = moe_test::cuda_counts(*ctx).launches;
          ctx->decode(&t, 1);
          per_step = moe_test::cuda_counts(*ctx).launches - before;
        }
        std::printf("[cuda][dnfuse] %s %s: %llu kernel launches per decode step\n", preset, fused ? "fused" : "unfused",
                    static_cast<unsigned long long>(per_step));
      }
      INFO(preset);
      CHECK(greedy[true] == greedy[false]);
      CHECK(scaled_diff(logits[true], logits[false]) < 1e-4);
    }
    std::remove(path.c_str());
  }
#endif
}
