#include "cli/demo_model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/synth/synth_model.h"

std::string demo_model_path() {
  const char *tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/moeinfer-demo-tiny-v1.gguf";
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && st.st_size > 0) return path;
  moe::SynthSpec spec;
  spec.preset = "tiny";
  spec.type_mix = "f16";
  spec.seed = 1;
  // A name of its own per process, then an atomic rename: concurrent first runs cannot
  // write into one file.
  const std::string part = path + "." + std::to_string(getpid()) + ".part";
  moe::write_synthetic_model(spec, part);
  std::rename(part.c_str(), path.c_str());
  return path;
}
