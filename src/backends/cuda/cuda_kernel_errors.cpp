// Host side of kernel error reporting (cuda_kernel_errors.h).
#include "backends/cuda/cuda_kernel_errors.h"

#include <cstring>

#include "backends/cuda/cuda_alloc.h"
#include "backends/cuda/cuda_common.h"

namespace moe {

namespace {

struct KindText {
  unsigned kind;
  const char *op;    // the op kind that met it
  const char *what;  // what was out of range
};
constexpr KindText kKinds[] = {
    {kKernelErrGetRows, "GetRows", "row id (token id) outside the table"},
    {kKernelErrExpertId, "MatMulId", "expert id outside the experts"},
    {kKernelErrKvCell, "KvStore", "KV cell outside the cache"},
    {kKernelErrRouteId, "GatherCols/AddId", "expert id outside the router's row"},
};

}  // namespace

std::string cuda_kernel_error_message(const unsigned *w) {
  std::string kinds;
  for (const KindText &k : kKinds)
    if (w[0] & k.kind) kinds += strfmt("%s%s: %s", kinds.empty() ? "" : "; ", k.op, k.what);
  if (kinds.empty()) kinds = strfmt("unknown kinds 0x%x", w[0]);
  const char *first = "?";
  for (const KindText &k : kKinds)
    if (w[1] == k.kind) first = k.op;
  return strfmt("CUDA kernels met out-of-range indices (%s); first: %s index %d outside [0, %u); outputs for them were "
                "zeroed or skipped, so this step's results are wrong",
                kinds.c_str(), first, static_cast<int>(w[2]), w[3]);
}

CudaKernelErrors::~CudaKernelErrors() {
  if (copied_) (void)cudaEventDestroy(copied_);
  if (dev_) (void)cudaFree(dev_);  // synchronises the device: no copy into host_ is still pending
  if (host_) (void)cudaFreeHost(host_);
}

void CudaKernelErrors::allocate(cudaStream_t s) {
  if (dev_) return;
  constexpr size_t bytes = kKernelErrorWords * sizeof(unsigned);
  // dev_ marks the words as ready, so it is set last (a failure leaves nothing half made).
  if (!host_) host_ = static_cast<unsigned *>(cuda_host_alloc_checked(bytes, cudaHostAllocDefault, "kernel error words"));
  std::memset(host_, 0, bytes);
  if (!copied_) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  auto *dev = static_cast<unsigned *>(cuda_malloc_checked(bytes, "kernel error words"));
  const cudaError_t e = cudaMemsetAsync(dev, 0, bytes, s);
  if (e != cudaSuccess) {
    (void)cudaFree(dev);
    cuda_fail(e, "cudaMemsetAsync(kernel error words)", __FILE__, __LINE__);
  }
  dev_ = dev;
}

void CudaKernelErrors::enqueue_readback(cudaStream_t s) {
  if (!dev_) return;
  MOE_CUDA_CHECK(cudaMemcpyAsync(host_, dev_, kKernelErrorWords * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  MOE_CUDA_CHECK(cudaEventRecord(copied_, s));
  pending_ = true;
}

void CudaKernelErrors::check(cudaStream_t s) {
  if (!pending_) return;
  const cudaError_t q = cudaEventQuery(copied_);
  if (q == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is no error: keep it from the next launch check's cudaPeekAtLastError
    return;
  }
  MOE_CUDA_CHECK(q);
  pending_ = false;
  if (host_[0] == 0) return;
  unsigned w[kKernelErrorWords];
  std::memcpy(w, host_, sizeof(w));
  std::memset(host_, 0, sizeof(w));
  // Cleared for whoever runs on this executor next (the context itself is marked unusable).
  MOE_CUDA_CHECK(cudaMemsetAsync(dev_, 0, sizeof(w), s));
  fail(Status::DeviceError, "%s", cuda_kernel_error_message(w).c_str());
}

}  // namespace moe
