// CUDA backend vs CPU backend on random inputs: every IR op, every weight type, odd shapes,
// batch 1 and > 1, MoE routing edge cases, the KV cache types, and an engine-level decode
// (greedy ids, logits, at most one host synchronisation per step, graphs on/off).
// Without a CUDA build or device every case WARNs and returns (tag [cuda]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <unistd.h>

#include "backends/backend.h"
#include "engine/engine.h"
#include "engine/weight_upload.h"
#include "graph/compiler.h"
#include "kv/kv_cache.h"
#include "model/synth/synth_model.h"
#include "support/device_graph.h"
#include "support/graph_runner.h"
#include "support/random_data.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#endif

using namespace moe;
using moe_test::as_f32;
using moe_test::gpu_or_skip;
using moe_test::in;
using moe_test::Input;
using moe_test::max_abs_diff;
using moe_test::randn;
using moe_test::rel_err;
using moe_test::run_on;
using moe_test::WeightStore;

namespace {


const DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q2_K,
                           DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4};

int64_t k_for(DType t, bool odd) {
  if (type_traits(t).block_size == 256) return odd ? 768 : 512;
  if (type_traits(t).block_size == 32) return odd ? 96 : 64;
  return odd ? 37 : 64;
}

}  // namespace

TEST_CASE("cuda op: matmul matches the CPU for every weight type, odd shapes, batch 1 and >1", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 1;
  for (DType t : kAllTypes)
    for (bool odd : {false, true})
      for (int64_t N : {1, 3, 17}) {
        const int64_t K = k_for(t, odd), M = odd ? 37 : 64;
        WeightStore ws;
        const GgufTensorInfo *w = ws.add("w", t, {K, M}, randn(static_cast<size_t>(K * M), seed++, 0.5f));
        auto build = [&](int &x, int &y) {
          Graph g;
          x = g.input("x", DType::F32, {K, N});
          y = g.matmul(g.weight(w), x);
          g.mark_output(y, "y");
          return g;
        };
        auto xv = randn(static_cast<size_t>(K * N), seed++);
        int x, y;
        Graph gc = build(x, y), gg = build(x, y);
        auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
        auto r_gpu = run_on(*gpu, std::move(gg), {in(x, xv)}, {y});
        INFO("type " << dtype_name(t) << " K=" << K << " M=" << M << " N=" << N);
        CHECK(rel_err(r_gpu[0], r_cpu[0]) < 1e-4);
      }
}

namespace {

// MoE matmul_id with given ids, compared with the CPU.
double moe_case(BackendRegistry &reg, Backend &gpu, DType t, int64_t K, int64_t M, int64_t E, int64_t k, int64_t T, int64_t X,
                const std::vector<int32_t> &ids, uint32_t seed) {
  WeightStore ws;
  const GgufTensorInfo *w = ws.add("experts", t, {K, M, E}, randn(static_cast<size_t>(K * M * E), seed, 0.3f));
  auto build = [&](int &x, int &id, int &y) {
    Graph g;
    x = g.input("x", DType::F32, {K, X, T});
    id = g.input("ids", DType::I32, {k, T});
    y = g.matmul_id(g.weight(w), x, id);
    g.mark_output(y, "y");
    return g;
  };
  auto xv = randn(static_cast<size_t>(K * X * T), seed + 1);
  int x, id, y;
  Graph gc = build(x, id, y), gg = build(x, id, y);
  auto r_cpu = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(id, ids)}, {y});
  auto r_gpu = run_on(gpu, std::move(gg), {in(x, xv), in(id, ids)}, {y});
  return rel_err(r_gpu[0], r_cpu[0]);
}

}  // namespace

TEST_CASE("cuda op: matmul_id for every weight type (grouped by expert on the device)", "[ops][cuda][moe]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  uint32_t seed = 100;
  for (DType t : kAllTypes)
    for (int64_t T : {1, 4})
      for (int64_t X : {int64_t(1), int64_t(3)}) {
        const int64_t K = k_for(t, true), M = 24, E = 6, k = 3;
        std::vector<int32_t> ids = {0, 5, 2, 5, 5, 5, 1, 0, 3, 2, 2, 0};
        ids.resize(static_cast<size_t>(k * T));
        INFO("type " << dtype_name(t) << " T=" << T << " X=" << X);
        CHECK(moe_case(reg, *gpu, t, K, M, E, k, T, X, ids, seed++) < 1e-4);
      }
}

TEST_CASE("cuda op: MoE routing edge cases match the CPU", "[ops][cuda][moe][routing]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  std::mt19937 rng(5);
  SECTION("all tokens to one expert") {
    std::vector<int32_t> ids(static_cast<size_t>(2 * 40), 3);
    for (size_t i = 1; i < ids.size(); i += 2) ids[i] = 3;
    CHECK(moe_case(reg, *gpu, DType::Q8_0, 64, 32, 8, 2, 40, 1, ids, 7) < 1e-4);
  }
  SECTION("unused experts and duplicate ids for one token") {
    std::vector<int32_t> ids = {1, 1, 1, 1, 6, 6, 6, 1, 1, 6, 1, 6};
    CHECK(moe_case(reg, *gpu, DType::Q4_K, 256, 16, 16, 4, 3, 4, ids, 8) < 1e-4);
  }
  SECTION("batch 512 with 128 experts, 8 per token") {
    std::vector<int32_t> ids(512 * 8);
    for (int t = 0; t < 512; ++t) {
      std::vector<int32_t> e(128);
      for (int i = 0; i < 128; ++i) e[static_cast<size_t>(i)] = i;
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < 8; ++j) ids[static_cast<size_t>(t * 8 + j)] = e[static_cast<size_t>(j)];
    }
    CHECK(moe_case(reg, *gpu, DType::Q8_0, 64, 16, 128, 8, 512, 1, ids, 9) < 1e-4);
    CHECK(moe_case(reg, *gpu, DType::Q4_K, 256, 8, 128, 8, 512, 8, ids, 10) < 1e-4);
  }
}

TEST_CASE("cuda op: elementwise, norms, softmax, routing helpers, rope, get_rows", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t T : {1, 7}) {
    const int64_t n = 300, E = 40, k = 6;
    WeightStore ws;
    const GgufTensorInfo *nw = ws.add("nw", DType::F32, {n}, randn(static_cast<size_t>(n), 3));
    int a, b, r;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      outs.clear();
      a = g.input("a", DType::F32, {n, T});
      b = g.input("b", DType::F32, {n, T});
      r = g.input("r", DType::F32, {E, T});
      int x = g.mul(g.rms_norm(a, 1e-6f), g.weight(nw));
      outs.push_back(g.add(x, b));
      outs.push_back(g.scale(a, 0.5f, 0.25f));
      outs.push_back(g.softmax(a));
      outs.push_back(g.sigmoid(b));
      outs.push_back(g.swiglu(a, b));
      outs.push_back(g.copy(g.view(a, {n * T})));
      int probs = g.softmax(r);
      int ids = g.top_k(probs, static_cast<int>(k));
      int wts = g.norm_sum(g.gather_cols(probs, ids));
      outs.push_back(ids);
      outs.push_back(wts);
      int ex = g.view(g.copy(g.view(g.input("ex", DType::F32, {n * k * T}), {n * k * T})), {n, k, T});
      outs.push_back(g.moe_combine(ex, wts));
      for (int o : outs) g.mark_output(o, "o" + std::to_string(o));
      return g;
    };
    Graph g1 = build();
    const int ex_in = g1.find_input("ex");
    auto av = randn(static_cast<size_t>(n * T), 1), bv = randn(static_cast<size_t>(n * T), 2), rv = randn(static_cast<size_t>(E * T), 3);
    auto exv = randn(static_cast<size_t>(n * k * T), 4);
    rv[5] = rv[9];  // a tie: the lower index wins
    std::vector<Input> ins = {in(a, av), in(b, bv), in(r, rv), in(ex_in, exv)};
    auto outs_c = outs;
    auto rc = run_on(*reg.cpu(), std::move(g1), ins, outs_c);
    Graph g2 = build();
    auto rg = run_on(*gpu, std::move(g2), ins, outs);
    for (size_t i = 0; i < outs.size(); ++i) {
      INFO("output " << i << " T=" << T);
      if (i == 6) CHECK(rc[i] == rg[i]);  // top-k ids exactly
      else CHECK(rel_err(rg[i], rc[i]) < 1e-5);
    }
  }
  // RoPE: NeoX, normal, partial rotation, YaRN.
  for (int variant = 0; variant < 4; ++variant) {
    const int64_t hd = 64, nh = 3, T = 5;
    RopeParams p;
    p.n_rot = variant == 2 ? 32 : 64;
    p.neox = variant != 1;
    p.freq_base = 10000.0f;
    if (variant == 3) { p.freq_scale = 0.25f; p.ext_factor = 1.0f; p.n_ctx_orig = 4096; p.attn_factor = 1.0f; }
    int x, pos, y;
    auto build = [&]() {
      Graph g;
      x = g.input("x", DType::F32, {hd, nh, T});
      pos = g.input("pos", DType::I32, {T});
      y = g.rope(x, pos, p);
      g.mark_output(y, "y");
      return g;
    };
    auto xv = randn(static_cast<size_t>(hd * nh * T), 11);
    std::vector<int32_t> pv = {0, 1, 17, 300, 4000};
    Graph gc = build(), gg = build();
    auto rc = run_on(*reg.cpu(), std::move(gc), {in(x, xv), in(pos, pv)}, {y});
    auto rg = run_on(*gpu, std::move(gg), {in(x, xv), in(pos, pv)}, {y});
    INFO("rope variant " << variant);
    CHECK(rel_err(rg[0], rc[0]) < 1e-5);
  }
  // GetRows for every table type.
  for (DType t : kAllTypes) {
    const int64_t K = k_for(t, true), rows = 9;
    WeightStore ws;
    const GgufTensorInfo *tab = ws.add("tab", t, {K, rows}, randn(static_cast<size_t>(K * rows), 12));
    int ids, y;
    auto build = [&]() {
      Graph g;
      ids = g.input("ids", DType::I32, {4});
      y = g.get_rows(g.weight(tab), ids);
      g.mark_output(y, "y");
      return g;
    };
    std::vector<int32_t> iv = {8, 0, 3, 3};
    Graph gc = build(), gg = build();
    auto rc = run_on(*reg.cpu(), std::move(gc), {in(ids, iv)}, {y});
    auto rg = run_on(*gpu, std::move(gg), {in(ids, iv)}, {y});
    INFO("get_rows " << dtype_name(t));
    CHECK(rel_err(rg[0], rc[0]) < 1e-6);
  }
}

TEST_CASE("cuda op: slice, concat, swiglu_oai, add_id, grouped_top_k, matmul_heads", "[ops][cuda]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int64_t T : {1, 5}) {
    const int64_t n = 96, k = 4, E = 64, H = 3;
    WeightStore ws;
    const GgufTensorInfo *bias = ws.add("bias", DType::F32, {n, E}, randn(static_cast<size_t>(n * E), 21));
    int a, b, r, ids;
    std::vector<int> outs;
    auto build = [&]() {
      Graph g;
      outs.clear();
      a = g.input("a", DType::F32, {n, k, T});
      b = g.input("b", DType::F32, {n, k, T});
      r = g.input("r", DType::F32, {E, T});
      ids = g.input("ids", DType::I32, {k, T});
      outs.push_back(g.slice(a, 5, 40));
      outs.push_back(g.concat(g.slice(a, 0, 30), g.slice(b, 7, 50)));
      outs.push_back(g.swiglu_oai(a, b, 1.702f, 0.8f));
      outs.push_back(g.add_id(a, g.weight(bias), ids));
      outs.push_back(g.grouped_top_k(r, 6, 8, 3));
      for (int o : outs) g.mark_output(o, "o" + std::to_string(o));
      return g;
    };
    Graph g1 = build();
    auto av = randn(static_cast<size_t>(n * k * T), 22), bv = randn(static_cast<size_t>(n * k * T), 23), rv = randn(static_cast<size_t>(E * T), 24);
    std::vector<int32_t> iv(static_cast<size_t>(k * T));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<int32_t>((i * 37) % E);
    std::vector<Input> ins = {in(a, av), in(b, bv), in(r, rv), in(ids, iv)};
    auto outs_c = outs;
    auto rc = run_on(*reg.cpu(), std::move(g1), ins, outs_c);
    Graph g2 = build();
    auto rg = run_on(*gpu, std::move(g2), ins, outs);
    for (size_t i = 0; i < outs.size(); ++i) {
      INFO("output " << i << " T=" << T);
      if (i == 4) CHECK(rc[i] == rg[i]);
      else CHECK(rel_err(rg[i], rc[i]) < 1e-6);
    }
    for (DType t : {DType::F16, DType::Q8_0, DType::Q4_K}) {
      const int64_t K = t == DType::Q4_K ? 256 : 64, M = 40;
      WeightStore hw;
      const GgufTensorInfo *w = hw.add("wh", t, {K, M, H}, randn(static_cast<size_t>(K * M * H), 25, 0.5f));
      int x, y;
      auto bh = [&]() {
        Graph g;
        x = g.input("x", DType::F32, {K, H, T});
        y = g.matmul_heads(g.weight(w), x);
        g.mark_output(y, "y");
        return g;
      };
      Graph gc = bh(), gg = bh();
      auto xv = randn(static_cast<size_t>(K * H * T), 26);
      auto hc = run_on(*reg.cpu(), std::move(gc), {in(x, xv)}, {y});
      auto hg = run_on(*gpu, std::move(gg), {in(x, xv)}, {y});
      INFO("matmul_heads " << dtype_name(t) << " T=" << T);
      CHECK(rel_err(hg[0], hc[0]) < 1e-4);
    }
  }
}

TEST_CASE("cuda op: kv store + attention (F32/F16/Q8_0 cache, GQA, several sequences)", "[ops][cuda][attention]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
  for (int variant = 0; variant < 4; ++variant)  // plain, sliding window, sinks, MLA latent-as-V
  for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0})
    for (int64_t T : {1, 6}) {
      if (variant > 0 && kt == KvType::F16) continue;
      const int64_t hd = 64, nh = 4, nkv = variant == 3 ? 1 : 2, n_cells = 300, hd_v = variant == 3 ? 32 : hd;
      const std::vector<KvLayerDims> dims = {{hd * nkv, variant == 3 ? 0 : hd * nkv}};
      KvCache kv_c(n_cells, 2, kt, dims, *reg.cpu());
      KvCache kv_g(n_cells, 2, kt, dims, *gpu);
      // History: 200 cells of two interleaved sequences, a few freed; then this batch.
      std::mt19937 rng(3);
      for (int step = 0; step < 3; ++step) {
        const int64_t nt = step < 2 ? 100 : T;
        // Build per-step graphs with nt tokens.
        int qq, kk, vv, oo;
        auto b2 = [&]() {
          Graph g;
          qq = g.input("q", DType::F32, {hd, nh, nt});
          kk = g.input("k", DType::F32, {hd, nkv, nt});
          vv = g.input("v", DType::F32, {hd, nkv, nt});
          int ks = g.kv_store(kk, 0, 0);
          int vs = variant == 3 ? ks : g.kv_store(vv, 0, 1);
          AttentionOptions o;
          o.window = variant == 1 ? 37 : 0;
          o.v_from_k = variant == 3;
          if (variant == 2) o.sinks = g.input("sinks", DType::F32, {nh});
          oo = g.attention_ext(qq, ks, vs, hd_v, 0.125f, o);
          g.node(oo).ip[1] = static_cast<int32_t>(n_cells);
          g.mark_output(oo, "o");
          return g;
        };
        std::vector<int32_t> cells(static_cast<size_t>(nt)), pos(static_cast<size_t>(nt)), seq(static_cast<size_t>(nt));
        for (int64_t i = 0; i < nt; ++i) {
          seq[static_cast<size_t>(i)] = static_cast<int32_t>(i % 2);
          pos[static_cast<size_t>(i)] = static_cast<int32_t>(step * 50 + i / 2);
        }
        REQUIRE(kv_c.find_slots(static_cast<uint32_t>(nt), cells.data()));
        kv_c.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(nt));
        kv_g.claim(cells.data(), pos.data(), seq.data(), static_cast<uint32_t>(nt));
        if (step == 1) {  // free some history cells of sequence 0
          kv_c.seq_rm(0, 10, 20);
          kv_g.seq_rm(0, 10, 20);
        }
        auto qv = randn(static_cast<size_t>(hd * nh * nt), static_cast<uint32_t>(rng())), kvv = randn(static_cast<size_t>(hd * nkv * nt), static_cast<uint32_t>(rng())),
             vvv = randn(static_cast<size_t>(hd * nkv * nt), static_cast<uint32_t>(rng()));
        UbatchInfo ub;
        ub.n_tokens = static_cast<int32_t>(nt);
        ub.cells = cells.data();
        ub.pos = pos.data();
        ub.seq = seq.data();
        ub.n_kv = kv_c.n_kv();
        ub.cell_state = kv_c.cells();
        ExecEnv ec{&ub, &kv_c};
        Graph g1 = b2(), g2 = b2();
        std::vector<Input> ins = {in(qq, qv), in(kk, kvv)};
        if (variant != 3) ins.push_back(in(vv, vvv));
        if (variant == 2) ins.push_back(in(g1.find_input("sinks"), std::vector<float>{0.5f, -1.0f, 3.0f, 20.0f}));
        auto rc = run_on(*reg.cpu(), std::move(g1), ins, {oo}, ec);
        UbatchInfo ubg = ub;
        ubg.cell_state = kv_g.cells();
        ExecEnv eg{&ubg, &kv_g};
        auto rg = run_on(*gpu, std::move(g2), ins, {oo}, eg);
        INFO("kv " << kv_type_name(kt) << " T=" << T << " step " << step << " variant " << variant);
        CHECK(rel_err(rg[0], rc[0]) < (kt == KvType::F16 ? 2e-3 : 1e-4));
      }
    }
}

TEST_CASE("cuda engine: tiny model decodes like the CPU, one sync per step, graphs on/off agree", "[cuda][engine]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  for (const char *mix : {"q8_0", "q4_k_m"}) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              (std::string("moe-cuda-engine-") + mix + "-" + std::to_string(::getpid()) + ".gguf")).string();
    SynthSpec spec;
    spec.preset = "tiny";
    spec.type_mix = mix;
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      std::map<std::string, std::vector<int32_t>> greedy;
      std::map<std::string, std::vector<float>> first_logits;
      for (const char *dev : {"cpu", "cuda", "cuda-nograph"}) {
        ContextParams cp;
        cp.n_ctx = 128;
        cp.n_threads = 2;
        cp.device = std::string(dev) == "cpu" ? "cpu" : "cuda";
        cp.gpu_graphs = std::string(dev) != "cuda-nograph";
        // F32 cache: with F16 the CPU rounds attention probabilities to f16 (the reference
        // does), CUDA's online softmax keeps them in f32; that alone moves logits ~1e-2.
        cp.kv_type = KvType::F32;
        auto ctx = Context::create(*model, cp);
        std::vector<BatchToken> prompt;
        const int32_t ids[] = {510, 1, 300, 42, 77, 5, 9, 100};
        for (int32_t i = 0; i < 8; ++i) prompt.push_back({ids[i], i, 0, i == 7});
        ctx->decode(prompt.data(), prompt.size());
        const int32_t nv = ctx->n_vocab();
        first_logits[dev].assign(ctx->logits(-1), ctx->logits(-1) + nv);
        std::vector<int32_t> out;
        for (int step = 0; step < 12; ++step) {
          const float *l = ctx->logits(-1);
          int32_t best = 0;
          for (int32_t v = 1; v < nv; ++v)
            if (l[v] > l[best]) best = v;
          out.push_back(best);
          BatchToken t{best, 8 + step, 0, true};
          const uint64_t before = cuda_sync_count();
          ctx->decode(&t, 1);
          const uint64_t syncs = cuda_sync_count() - before;
          if (cp.device != "cpu" && step >= 3) {
            INFO(dev << " step " << step << ": host synchronisations in one decode step");
            CHECK(syncs <= 1);
          }
        }
        greedy[dev] = out;
      }
      INFO("mix " << mix);
      CHECK(greedy["cuda"] == greedy["cpu"]);
      CHECK(greedy["cuda-nograph"] == greedy["cuda"]);
      std::vector<uint8_t> a(first_logits["cuda"].size() * 4), b(a.size());
      std::memcpy(a.data(), first_logits["cuda"].data(), a.size());
      std::memcpy(b.data(), first_logits["cpu"].data(), b.size());
      CHECK(rel_err(a, b) < 1e-3);
    }
    std::remove(path.c_str());
  }
#endif
}

// Hidden ([.]): per-op kernel time on a big model, run by tests/cuda/device_check.sh after
// it generates /tmp/q3.gguf (moeinfer-cli mkmodel --preset qwen3-30b-a3b --type q4_k_m).
TEST_CASE("cuda profile: per-op time of pp512 and tg on /tmp/q3.gguf", "[.cuda-profile]") {
  BackendRegistry reg;
  Backend *gpu = gpu_or_skip(reg);
  if (!gpu) return;
#ifdef MOEINFER_WITH_CUDA
  if (!std::filesystem::exists("/tmp/q3.gguf")) { WARN("/tmp/q3.gguf missing: skipped"); return; }
  auto model = Model::load("/tmp/q3.gguf", ModelLoadParams{});
  ContextParams cp;
  cp.n_ctx = 1024;
  cp.device = "cuda";
  cp.gpu_graphs = false;
  auto ctx = Context::create(*model, cp);
  std::vector<BatchToken> prompt;
  for (int32_t i = 0; i < 512; ++i) prompt.push_back({(i * 7919) % 1000 + 10, i, 0, i == 511});
  ctx->decode(prompt.data(), prompt.size());  // warm-up
  ctx->kv_clear();
  cuda_profile_enable(true);
  ctx->decode(prompt.data(), prompt.size());
  std::printf("---- pp512 (one ubatch of 512 tokens), eager, per-op kernel time\n%s", cuda_profile_report(true).c_str());
  for (int step = 0; step < 32; ++step) {
    BatchToken t{42 + step, 512 + step, 0, true};
    ctx->decode(&t, 1);
  }
  std::printf("---- 32 decode steps (n_kv 512..544), eager, per-op kernel time\n%s", cuda_profile_report(true).c_str());
  cuda_profile_enable(false);
#endif
}
