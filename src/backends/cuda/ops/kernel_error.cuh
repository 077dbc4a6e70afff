// Device side of kernel error reporting (cuda_kernel_errors.h): a kernel that meets a bad
// index reports it here and then keeps its defined behaviour (zeros / skip).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_kernel_errors.h"

namespace moe {

// err: DevUbatch::err (null: not reported). Callers report from one thread per bad index
// where they can; every report costs one atomic. The first report (the one that turns the
// word set from zero to non-zero) also leaves its index and bound for the message.
__device__ __forceinline__ void report_bad_index(unsigned *err, unsigned kind, int64_t index, int64_t bound) {
  if (!err) return;
  if (atomicOr(&err[0], kind) == 0u) {
    err[1] = kind;
    err[2] = static_cast<unsigned>(static_cast<int32_t>(index));
    err[3] = static_cast<unsigned>(bound);
  }
}

}  // namespace moe
