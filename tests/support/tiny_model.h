// The tiny synthetic qwen3moe (src/model/synth) written once per test process.
#pragma once
#include <cstdio>
#include <string>
#include <unistd.h>

#include "model/synth/synth_model.h"

namespace moe_test {

inline std::string tiny_model(const std::string &mix = "f32") {
  const std::string path = "/tmp/moeinfer-test-tiny-" + mix + "-" + std::to_string(getpid()) + ".gguf";
  if (access(path.c_str(), R_OK) != 0) {
    moe::SynthSpec s;
    s.preset = "tiny";
    s.type_mix = mix;
    s.seed = 5;
    moe::write_synthetic_model(s, path);
  }
  return path;
}

}  // namespace moe_test
