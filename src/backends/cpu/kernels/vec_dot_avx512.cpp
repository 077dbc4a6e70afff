// avx512 kernels (placeholder until the SIMD kernels land; dispatcher falls back).
#include "backends/cpu/kernels/vec_dot_impl.h"

namespace moe {
VecDotFn vec_dot_kernel_avx512(DType) { return nullptr; }
FromFloatFn from_float_kernel_avx512(DType) { return nullptr; }
}  // namespace moe
