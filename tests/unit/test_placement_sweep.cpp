// Placement sweep: the same prompt and greedy continuation under 30+ placements (experts on
// the CPU, layer splits at every boundary, 3-way splits, per-layer overrides, head and
// embedding elsewhere, the seed report's pattern) must give the CPU's greedy ids and logits
// within the conformance rule. A device is presented twice (BackendRegistry's twin), so
// multi-device plans run with one device: on this machine the CPU and its twin (which stands
// in for a GPU); where CUDA is present, the CPU plus cuda0 and cuda0_twin.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/context_impl.h"
#include "engine/engine.h"
#include "model/hparams.h"
#include "support/tiny_model.h"

using namespace moe;

namespace {

constexpr float kTie = 0.5f, kNear = 0.5f;  // ../shared/conformance/check.py

struct Run {
  std::vector<int32_t> ids;                 // greedy continuation
  std::vector<std::vector<float>> logits;   // per computed position (last prompt position first)
  std::vector<float> margins;               // top-1 minus top-2 of each step
  int n_transfers = 0;                      // in the one-token plan
};

Run greedy(const Model &model, const std::vector<int32_t> &prompt, int n, const std::string &device) {
  ContextParams cp;
  cp.n_ctx = 64;
  cp.n_threads = 2;
  cp.kv_type = KvType::F32;
  cp.device = device;
  cp.cpu_float_order = true;  // GPU placements sum in the CPU's order: any placement bug shows as a big difference
  auto ctx = Context::create(model, cp);
  Run r;
  std::vector<BatchToken> b;
  for (size_t i = 0; i < prompt.size(); ++i) b.push_back({prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size()});
  ctx->decode(b.data(), b.size());
  const int32_t nv = ctx->n_vocab();
  for (int s = 0; s < n; ++s) {
    const float *l = ctx->logits(-1);
    r.logits.emplace_back(l, l + nv);
    int32_t best = 0;
    for (int32_t v = 1; v < nv; ++v)
      if (l[v] > l[best]) best = v;
    float second = -INFINITY;
    for (int32_t v = 0; v < nv; ++v)
      if (v != best) second = std::max(second, l[v]);
    r.margins.push_back(l[best] - second);
    r.ids.push_back(best);
    BatchToken t{best, static_cast<int32_t>(prompt.size()) + s, 0, true};
    ctx->decode(&t, 1);
  }
  r.n_transfers = ctx->impl().plan_for(1, 1).n_transfers;
  return r;
}

struct Case {
  std::string name;
  PlacementParams p;
  std::vector<std::string> devices;  // empty = all
};

std::string alt(int L, int parity) {  // "blk\.(0|2|4)\." for the layers of one parity
  std::string s = "blk\\.(";
  bool first = true;
  for (int l = parity; l < L; l += 2) { s += (first ? "" : "|") + std::to_string(l); first = false; }
  return s + ")\\.";
}
std::string upto(int k) {  // layers [0, k)
  std::string s = "blk\\.(";
  for (int l = 0; l < k; ++l) s += (l ? "|" : "") + std::to_string(l);
  return s + ")\\.";
}

// gpus: the GPU-like devices (the CPU's twin, or cuda0 and its twin); host: "cpu".
std::vector<Case> placements(int L, const std::vector<std::string> &gpus) {
  const std::string g0 = gpus[0], g1 = gpus.size() > 1 ? gpus[1] : "cpu";
  std::vector<Case> v;
  auto add = [&](const std::string &n, PlacementParams p, std::vector<std::string> d = {}) { v.push_back({n, std::move(p), std::move(d)}); };
  PlacementParams p;
  add("cpu only", p, {"cpu"});
  add("gpu only", p, {g0});
  add("default (all devices)", p);
  p.cpu_moe = true; add("all experts on the CPU", p); p = {};
  for (int k = 1; k <= L; ++k) { p.n_cpu_moe = k; add("n_cpu_moe " + std::to_string(k), p); }
  p = {};
  for (int k = 0; k < L; ++k) { p.n_gpu_layers = k; add("n_gpu_layers " + std::to_string(k), p); }
  p = {};
  p.overrides = {alt(L, 0) + "=cpu"}; add("even layers on the CPU", p);
  p.overrides = {alt(L, 1) + "=cpu"}; add("odd layers on the CPU", p);
  p.overrides = {"ffn_=cpu"}; add("attention only on the GPU", p);
  p.overrides = {"attn_=cpu"}; add("attention on the CPU, FFN on the GPU", p);
  for (int k = 1; k < L; ++k) { p.overrides = {upto(k) + "=" + g1}; add("split after layer " + std::to_string(k - 1) + " (overrides)", p); }
  p.overrides = {upto(1) + "=cpu", "blk\\.1\\.=" + g1}; add("3-way: cpu, " + g1 + ", " + g0, p);
  p.overrides = {"blk\\.0\\.ffn=cpu", "blk\\.1\\.=" + g1}; add("3-way with layer 0 experts on the CPU", p);
  p = {};
  p.main_device = "cpu"; add("output head on the CPU", p);
  p.main_device = "cpu"; p.n_cpu_moe = 1; add("output head on the CPU, n_cpu_moe 1", p);
  p = {};
  p.overrides = {"token_embd=cpu"}; add("embedding on the CPU", p);
  p.overrides = {"norm=cpu"}; add("norm weights on the CPU (weights read across devices)", p);
  p.overrides = {"ffn_gate_inp=cpu"}; add("router on the CPU", p);
  p.overrides = {alt(L, 0) + "ffn_.*_exps=cpu"}; add("even layers' experts on the CPU", p);
  p.overrides = {"exps=CPU"}; add("-ot exps=CPU", p);
  // The seed report: experts on the CPU first, then per-layer overrides to two devices.
  p.overrides = {"exps=CPU", upto(1) + "=" + g0, "blk\\.[1-9][0-9]*\\.=" + g1}; add("seed: exps=CPU + per-layer to two devices", p);
  p.overrides = {"blk\\.1\\.ffn_(up|down|gate)_exps=CPU", "blk\\.[0-1]\\.=" + g1}; add("seed: layer 1 experts on the CPU, layers 0-1 on " + g1, p);
  p = {};
  p.n_cpu_moe = 1; p.n_gpu_layers = L - 1; add("n_cpu_moe 1 + n_gpu_layers L-1", p); p = {};
  p.cpu_moe = true; p.main_device = "cpu"; add("all experts and the head on the CPU", p); p = {};
  p.cpu_moe = true; p.n_gpu_layers = 1; add("all experts on the CPU, one GPU layer", p); p = {};
  p.overrides = {"ffn_down_exps=cpu"}; add("only the down experts on the CPU", p); p = {};
  if (gpus.size() > 1) {
    p.tensor_split = {1, 1}; add("tensor split 1,1", p);
    p.tensor_split = {1, 2}; p.n_cpu_moe = 1; add("tensor split 1,2 + n_cpu_moe 1", p);
    p = {};
    p.n_gpu_layers = L - 1; p.tensor_split = {1, 1}; add("3-way: cpu + two GPUs", p);
  }
  return v;
}

void check_against(const Run &ref, const Run &got, const std::string &tag) {
  INFO(tag);
  REQUIRE(got.ids.size() == ref.ids.size());
  for (size_t k = 0; k < ref.ids.size(); ++k) {
    if (ref.margins[k] < kTie) break;  // near-tie: either continuation is accepted from here
    CHECK(got.ids[k] == ref.ids[k]);
    if (got.ids[k] != ref.ids[k]) break;
  }
  float worst = 0;
  for (size_t k = 0; k < ref.logits.size() && (k == 0 || got.ids[k - 1] == ref.ids[k - 1]); ++k)
    for (size_t v = 0; v < ref.logits[k].size(); ++v) worst = std::max(worst, std::fabs(got.logits[k][v] - ref.logits[k][v]));
  CHECK(worst <= kNear);
}

std::vector<std::string> sweep_models(bool all) {
  std::vector<std::string> out;
  const std::string dir = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/";
  const char *names[] = {"qwen3moe-q4_k_m.gguf", "deepseek2-f16.gguf", "gpt-oss-f16.gguf", "qwen3moe-q8_0.gguf", "qwen3moe-f16.gguf",
                         "qwen3moe-q5_k_m.gguf", "qwen3next-f16.gguf", "qwen35moe-f16.gguf"};
  for (const char *n : names)
    if (std::filesystem::exists(dir + n) && (all || out.empty())) out.push_back(dir + n);
  out.push_back(moe_test::tiny_model("q8_0"));  // the suite stands alone without the conformance set
  return out;
}

void sweep(bool all_models) {
  // The twin: cuda0's where CUDA is present, else the CPU's.
  BackendRegistry probe;
  const Backend *gpu = probe.find("cuda0");
  const std::string twin = gpu ? "cuda0" : "cpu";
  const std::vector<std::string> gpus = gpu ? std::vector<std::string>{"cuda0", "cuda0_twin"} : std::vector<std::string>{"cpu_twin"};
  const std::vector<int32_t> prompt = {1, 17, 42, 7, 300, 5, 99, 250, 3, 11};
  for (const std::string &path : sweep_models(all_models)) {
    ModelLoadParams ref_mp;
    ref_mp.devices = {"cpu"};
    auto ref_model = Model::load(path, ref_mp);
    const int L = static_cast<int>(ref_model->hparams().n_layer);
    std::vector<int32_t> pr = prompt;
    for (int32_t &t : pr) t %= ref_model->n_vocab();
    const Run ref = greedy(*ref_model, pr, 8, "cpu");
    int n_cases = 0, n_multi = 0;
    for (const Case &c : placements(L, gpus)) {
      const std::string tag = std::filesystem::path(path).filename().string() + ": " + c.name;
      ModelLoadParams mp;
      mp.placement = c.p;
      mp.placement.twin_device = twin;
      mp.devices = c.devices;
      try {
        auto model = Model::load(path, mp);
        const Run got = greedy(*model, pr, 8, "auto");
        check_against(ref, got, tag);
        n_multi += got.n_transfers > 0;
      } catch (const Error &e) {
        FAIL(tag << ": " << e.what());
      }
      ++n_cases;
    }
    if (L >= 3) CHECK(n_cases >= 30);  // the conformance models (the tiny stand-alone one has 2 layers: 28)
    CHECK(n_multi >= n_cases - 5);     // the sweep really crossed devices (single-device cases: cpu only, gpu only, ...)
  }
}

}  // namespace

TEST_CASE("placement sweep: 30+ placements give the CPU's greedy ids and logits (one model)", "[placement]") { sweep(false); }

TEST_CASE("placement sweep: every conformance model", "[placement][slow]") { sweep(true); }
