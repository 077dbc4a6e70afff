// How fast the device streams its own memory: a read of a buffer far larger than L2, timed
// with events; the denominator of the decode roofline that `moeinfer-cli bench` reports.
// Reads only (a copy would also count writes), 16-byte loads, four in flight per thread.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>

namespace moe {

namespace {

__global__ void read_stream_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // a data-dependent store keeps the loads
}

// Two timing events, destroyed on every path (a failed call throws).
struct EventPair {
  cudaEvent_t e[2] = {nullptr, nullptr};
  EventPair() {
    MOE_CUDA_CHECK(cudaEventCreate(&e[0]));
    MOE_CUDA_CHECK(cudaEventCreate(&e[1]));
  }
  ~EventPair() {
    for (cudaEvent_t x : e)
      if (x) (void)cudaEventDestroy(x);
  }
};

}  // namespace

double CudaBackend::read_bandwidth() {
  if (read_bw_ > 0) return read_bw_;
  set_current();
  size_t free_b = 0, total_b = 0;
  MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  // 1 GiB (20x the largest L2 of these GPUs), less where memory is short (Jetson).
  const size_t bytes = std::min<size_t>(size_t(1) << 30, free_b / 4) & ~size_t(255);
  if (bytes < (size_t(64) << 20)) return 0.0;
  auto buf = alloc(bytes + 256, "bandwidth probe");
  auto *p = static_cast<uint8_t *>(buf->data());
  MOE_CUDA_CHECK(cudaMemsetAsync(p, 1, bytes + 256, stream()));
  EventPair events;
  cudaEvent_t *ev = events.e;
  float best_ms = 0.0f;
  for (int rep = 0; rep < 6; ++rep) {  // the first run warms up; the fastest of the rest counts
    MOE_CUDA_CHECK(cudaEventRecord(ev[0], stream()));
    read_stream_kernel<<<n_sm_ * 8, 256, 0, stream()>>>(reinterpret_cast<const uint4 *>(p), bytes / 16,
                                                         reinterpret_cast<unsigned *>(p + bytes));
    MOE_CUDA_CHECK(cudaGetLastError());
    MOE_CUDA_CHECK(cudaEventRecord(ev[1], stream()));
    cuda_sync_event(ev[1], SyncWhy::Setup, counters_);
    float ms = 0.0f;
    MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (rep > 0 && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
  }
  read_bw_ = best_ms > 0.0f ? double(bytes) / (double(best_ms) * 1e-3) : 0.0;
  return read_bw_;
}

}  // namespace moe
