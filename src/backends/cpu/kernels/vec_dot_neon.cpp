// NEON kernels (placeholder).
#include "backends/cpu/kernels/vec_dot_impl.h"

namespace moe {
VecDotFn vec_dot_kernel_neon(DType) { return nullptr; }
}  // namespace moe
