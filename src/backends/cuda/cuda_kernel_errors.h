// Bad indices met inside kernels (a token id outside the embedding table, an expert id from a
// corrupt router, a KV cell outside the cache) reach the host as a Status. Kernels keep their
// defined outputs (zeros, or the row skipped) and set a kind bit in a per-executor device
// word (ops/kernel_error.cuh); the executor copies the words to pinned memory after each pass
// and checks them after the step's one host synchronisation (the logits download), so no
// wait is added and a captured graph replays unchanged (its kernels hold the word's address).
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace moe {

// Word layout: [0] OR of the kinds seen, [1] the first report's kind, [2] its index, [3] the
// bound it broke (index outside [0, bound)).
constexpr int kKernelErrorWords = 4;
enum KernelErrorKind : unsigned {
  kKernelErrGetRows = 1u << 0,   // GetRows: row id outside the table (token id, embedding lookup)
  kKernelErrExpertId = 1u << 1,  // MatMulId: expert id outside the experts
  kKernelErrKvCell = 1u << 2,    // KvStore: cache cell outside the cache
  kKernelErrRouteId = 1u << 3,   // GatherCols / AddId: expert id outside the router's row
};

// The DeviceError text for a non-zero word set, naming every kind and the first bad index.
std::string cuda_kernel_error_message(const unsigned *words);

// One executor's words: device side zeroed once, pinned host copy, and the event that says
// the latest copy has landed.
class CudaKernelErrors {
public:
  CudaKernelErrors() = default;
  ~CudaKernelErrors();
  CudaKernelErrors(const CudaKernelErrors &) = delete;
  CudaKernelErrors &operator=(const CudaKernelErrors &) = delete;

  void allocate(cudaStream_t s);  // once, before the first pass (the device's current)
  unsigned *device_words() const { return dev_; }
  // After a pass: copy the words to the host on s. The device words are not cleared, so an
  // unread copy overwritten by a later one loses nothing (the later holds every bit).
  void enqueue_readback(cudaStream_t s);
  // Never waits: when the latest copy has landed and shows a report, clears the words (on s)
  // and throws Status::DeviceError; when it has not landed, a later check sees it.
  void check(cudaStream_t s);

private:
  unsigned *dev_ = nullptr;
  unsigned *host_ = nullptr;  // pinned
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;      // a copy was enqueued and not checked yet
};

}  // namespace moe
