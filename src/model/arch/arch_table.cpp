#include "model/arch/arch.h"

namespace moe {

static const ArchSpec *const kArchs[] = {
    &kArchQwen3Moe,
    &kArchDeepseek2,
    &kArchGptOss,
    &kArchQwen3Next,
    &kArchQwen35Moe,
};

const ArchSpec *find_arch(const std::string &name) {
  for (const ArchSpec *a : kArchs)
    if (name == a->name) return a;
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const ArchSpec *a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a->name);
  return s;
}

}  // namespace moe
