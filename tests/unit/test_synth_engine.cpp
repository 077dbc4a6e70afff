// Generated small models of each architecture load in the engine and decode to finite,
// non-constant logits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "engine/engine.h"
#include "model/synth/synth_model.h"

using namespace moe;

TEST_CASE("synth: small presets run in the engine with finite, varying logits", "[synth][engine]") {
  const std::pair<const char *, const char *> cases[] = {{"tiny", "f16"},           {"tiny", "q8_0"},
                                                         {"small", "q4_k_m"},       {"tiny-deepseek2", "f16"},
                                                         {"tiny-deepseek2", "q8_0"}, {"tiny-gpt-oss", "f16"},
                                                         {"tiny-gpt-oss-hd64", "q8_0"}};
  for (const auto &c : cases) {
    const std::string preset = c.first, mix = c.second;
    INFO(preset << " " << mix);
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("moe-synth-engine-" + preset + "-" + mix + "-" + std::to_string(::getpid()) + ".gguf"))
                                 .string();
    SynthSpec spec;
    spec.preset = preset;
    spec.type_mix = mix;
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      CHECK(model->n_vocab() == 512);
      ContextParams cp;
      cp.n_ctx = 64;
      cp.n_threads = 1;
      cp.device = "cpu";
      auto ctx = Context::create(*model, cp);
      std::vector<BatchToken> prompt;
      const int32_t ids[] = {500, 1, 300, 42, 77, 5};
      for (int32_t i = 0; i < 6; ++i) prompt.push_back({ids[i], i, 0, i == 5});
      ctx->decode(prompt.data(), prompt.size());
      for (int step = 0; step < 4; ++step) {
        const float *l = ctx->logits(-1);
        float lo = l[0], hi = l[0];
        int32_t best = 0;
        for (int32_t v = 0; v < 512; ++v) {
          REQUIRE(std::isfinite(l[v]));
          lo = std::min(lo, l[v]);
          if (l[v] > hi) { hi = l[v]; best = v; }
        }
        CHECK(hi - lo > 1.0f);  // logits vary: random weights, not a degenerate model
        BatchToken t{best, 6 + step, 0, true};
        ctx->decode(&t, 1);
      }
      CHECK(ctx->kv_seq_pos_max(0) == 9);
    }
    std::remove(path.c_str());
  }
}
