// A generated tiny model loads in the engine and decodes to finite, non-constant logits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "engine/engine.h"
#include "model/synth/synth_model.h"

using namespace moe;

TEST_CASE("synth: tiny model runs in the engine with finite, varying logits", "[synth][engine]") {
  for (const char *mix : {"f16", "q8_0"}) {
    INFO(mix);
    const std::string path =
        (std::filesystem::temp_directory_path() / (std::string("moe-synth-engine-") + mix + "-" + std::to_string(::getpid()) + ".gguf")).string();
    SynthSpec spec;
    spec.preset = "tiny";
    spec.type_mix = mix;
    write_synthetic_model(spec, path);
    {
      auto model = Model::load(path, ModelLoadParams{});
      CHECK(model->arch_name() == "qwen3moe");
      CHECK(model->n_vocab() == 512);
      ContextParams cp;
      cp.n_ctx = 64;
      cp.n_threads = 1;
      cp.device = "cpu";
      auto ctx = Context::create(*model, cp);
      std::vector<BatchToken> prompt;
      const int32_t ids[] = {510, 1, 300, 42, 77, 5};
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
