// The tiny synthetic qwen3moe (src/model/synth) written once per test process, under
// $TMPDIR, and removed when the process exits (temp_files.h).
#pragma once
#include <unistd.h>

#include <string>

#include "model/synth/synth_model.h"
#include "support/temp_files.h"

namespace moe_test {

inline std::string tiny_model(const std::string &mix = "f32") {
  const std::string path = temp_name("tiny-" + mix + ".gguf");
  if (access(path.c_str(), R_OK) != 0) {
    moe::SynthSpec s;
    s.preset = "tiny";
    s.type_mix = mix;
    s.seed = 5;
    moe::write_synthetic_model(s, path);
    remove_at_exit(path);
  }
  return path;
}

}  // namespace moe_test
