#include "backends/backend.h"

#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#endif

namespace moe {

BackendRegistry::BackendRegistry() {
  backends_.push_back(make_cpu_backend());
#ifdef MOEINFER_WITH_CUDA
  append_cuda_backends(backends_);
#endif
}

BackendRegistry::~BackendRegistry() = default;

void set_gpu_dependent_launch(bool on) {
#ifdef MOEINFER_WITH_CUDA
  cuda_pdl_enable(on);
#else
  (void)on;
#endif
}

Backend *BackendRegistry::find(const std::string &name) const {
  for (auto &b : backends_)
    if (b->info().name == name) return b.get();
  if (name == "cuda" || name == "gpu")
    for (auto &b : backends_)
      if (b->info().is_gpu) return b.get();
  return nullptr;
}

}  // namespace moe
