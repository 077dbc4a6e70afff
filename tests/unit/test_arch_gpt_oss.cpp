// gpt-oss in the engine against a naive float64 forward (tests/support/reference_gpt_oss.h)
// on the conformance model: every teacher-forced context of the logits records.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "support/reference_gpt_oss.h"

using namespace moe;

namespace {
std::string conf_dir() { return MOEINFER_CONFORMANCE_DIR; }
bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
}  // namespace

// The float64 forward with the reference engine's activation rounding (F16 activations for
// F16 weights, Q8_0 blocks for MXFP4/Q8_0 weights) is the expectation; the plain float64
// forward shows how much that rounding alone moves these logits (a few units: the fixture
// amplifies activation noise on purpose).
TEST_CASE("gpt-oss: engine logits follow the float64 reference forward", "[arch][gpt-oss][reference]") {
  const std::string model = conf_dir() + "/models/gpt-oss-f16.gguf";
  if (!exists(model)) { WARN("SKIPPED: " << model << " not found"); return; }
  auto m = Model::load(model, ModelLoadParams{});
  ContextParams cp;
  cp.n_ctx = 256;
  cp.n_threads = 2;
  cp.device = "cpu";
  cp.kv_type = KvType::F32;
  auto ctx = Context::create(*m, cp);
  std::ifstream f(conf_dir() + "/expect/gpt-oss-f16.logits.jsonl");
  std::string line;
  int n = 0, engine_exact = 0, step0 = 0, step0_exact = 0;
  double worst_engine = 0, worst_plain = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    std::vector<int32_t> ids = j["prompt_ids"].get<std::vector<int32_t>>();
    for (int32_t t : j["gen_ids_fed"].get<std::vector<int32_t>>()) ids.push_back(t);
    ctx->kv_clear();
    std::vector<BatchToken> b;
    for (size_t i = 0; i < ids.size(); ++i) b.push_back({ids[i], static_cast<int32_t>(i), 0, i + 1 == ids.size()});
    ctx->decode(b.data(), b.size());
    const float *l = ctx->logits(-1);
    auto plain = moe_ref::gpt_oss_last_logits(m->gguf(), ids, false);
    auto refq = moe_ref::gpt_oss_last_logits(m->gguf(), ids, true);
    double d_engine = 0, d_plain = 0, d_llama = 0;
    for (auto &p : j["top"]) {
      const size_t id = p[0].get<size_t>();
      d_engine = std::max(d_engine, std::fabs(l[id] - refq[id]));
      d_plain = std::max(d_plain, std::fabs(plain[id] - refq[id]));
      d_llama = std::max(d_llama, std::fabs(p[1].get<double>() - refq[id]));
    }
    INFO("n_past " << j["n_past"] << " step " << j["step"] << ": |engine - ref| " << d_engine << ", |llama - ref| " << d_llama);
    CHECK(d_engine < 1.0);
    engine_exact += d_engine < 1e-3;
    worst_engine = std::max(worst_engine, d_engine);
    worst_plain = std::max(worst_plain, d_plain);
    if (j["step"].get<int>() == 0) {  // prompts the reference engine also ran as one batch
      ++step0;
      step0_exact += d_llama < 1e-3;
    }
    ++n;
  }
  INFO(engine_exact << "/" << n << " records within 1e-3, worst " << worst_engine << "; unrounded float64 differs by up to " << worst_plain);
  CHECK(n == 36);
  CHECK(engine_exact >= 33);
  CHECK(step0 == 4);
  CHECK(step0_exact == 4);
  CHECK(worst_plain > 1.0);  // the rounding emulation is what makes the two agree
}
