#include "backends/backend.h"
#include "core/status.h"

#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/matmul_ref_order.h"
#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/matvec.h"
#endif

namespace moe {

BackendRegistry::BackendRegistry(const std::string &twin) {
  backends_.push_back(make_cpu_backend());
#ifdef MOEINFER_WITH_CUDA
  append_cuda_backends(backends_);
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

void set_gpu_dependent_launch(bool on) {
#ifdef MOEINFER_WITH_CUDA
  cuda_pdl_enable(on);
#else
  (void)on;
#endif
}

void set_gpu_own_order_head(bool on) {
#ifdef MOEINFER_WITH_CUDA
  cuda_set_final_outputs_own_order(on);
#else
  (void)on;
#endif
}

void set_gpu_lean_groups(bool on) {
#ifdef MOEINFER_WITH_CUDA
  cuda_matvec_lean_groups(on);
#else
  (void)on;
#endif
}

void set_gpu_norm_tails(unsigned kinds) {
#ifdef MOEINFER_WITH_CUDA
  cuda_fusion_set_norm_tails(kinds);
#else
  (void)kinds;
#endif
}

void set_gpu_decode_split(int max_ranges, int min_chunk) {
#ifdef MOEINFER_WITH_CUDA
  cuda_set_decode_split(max_ranges, min_chunk);
#else
  (void)max_ranges;
  (void)min_chunk;
#endif
}

void set_gpu_prefill_attn_blocks(int per_sm) {
#ifdef MOEINFER_WITH_CUDA
  cuda_set_prefill_attn_blocks(per_sm);
#else
  (void)per_sm;
#endif
}

void set_gpu_blas_min_tokens(int tokens) {
#ifdef MOEINFER_WITH_CUDA
  cuda_set_blas_min_tokens(tokens);
#else
  (void)tokens;
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
