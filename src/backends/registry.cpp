#include "backends/backend.h"
#include "core/status.h"

#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#endif

namespace moe {

BackendRegistry::BackendRegistry(const std::string &twin, const GpuEmulation &emulate) {
  backends_.push_back(make_cpu_backend());
#ifdef MOEINFER_WITH_CUDA
  append_cuda_backends(backends_, emulate);
#else
  (void)emulate;
#endif
  if (twin.empty()) return;
  const Backend *of = find(twin);
  if (!of) fail(Status::InvalidArgument, "twin device '%s' is not available", twin.c_str());
  const std::string name = of->info().name + "_twin";
  if (!of->info().is_gpu) {
    // The CPU's twin stands in for a GPU in placement (layers, experts, splits, fit go to it
    // as they would to a GPU) while running the CPU kernels on its own buffers.
    backends_.push_back(make_cpu_backend(name, true));
    return;
  }
#ifdef MOEINFER_WITH_CUDA
  backends_.push_back(make_cuda_twin(*of, name));
#endif
}

BackendRegistry::~BackendRegistry() = default;

std::string gpu_unavailable_reason() {
#ifdef MOEINFER_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  (void)cudaGetLastError();
  return std::string("CUDA is compiled in but no GPU is usable (") +
         (e == cudaSuccess ? "no CUDA device found" : cudaGetErrorString(e)) +
         "); check the GPU and its driver with nvidia-smi";
#else
  return "this build has no CUDA backend: CUDA was not compiled in (configure with -DMOEINFER_CUDA=ON)";
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
