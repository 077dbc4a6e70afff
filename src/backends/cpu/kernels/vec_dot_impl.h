// Internal to the CPU kernels: per-ISA kernel tables that vec_dot.cpp assembles.
// Each returns the vec_dot for a weight type, or nullptr when that ISA has no specialised
// kernel for it (the dispatcher then falls back to the next lower ISA, ending at scalar).
//
//   VecDotFn f = vec_dot_kernel_avx512(DType::Q4_K);   // may be nullptr
#pragma once
#include "backends/cpu/kernels/vec_dot.h"

namespace moe {

VecDotFn vec_dot_kernel_scalar(DType t);
VecDotFn vec_dot_kernel_avx2(DType t);    // nullptr everywhere on non-x86 builds
VecDotFn vec_dot_kernel_avx512(DType t);  // nullptr everywhere on non-x86 builds
VecDotFn vec_dot_kernel_neon(DType t);    // nullptr everywhere on non-aarch64 builds
// Q4_1, Q5_0, Q5_1 and the i-quants (vec_dot_extra_*.cpp); each ISA table above ends in these.
VecDotFn vec_dot_extra_kernel_scalar(DType t);
VecDotFn vec_dot_extra_kernel_avx2(DType t);
VecDotFn vec_dot_extra_kernel_avx512(DType t);  // ends in vec_dot_iq_grid_kernel_avx512
VecDotFn vec_dot_extra_kernel_neon(DType t);
// AVX-512 1-3 bit i-quants (vec_dot_iq_grid_avx512.cpp), decoded in registers.
VecDotFn vec_dot_iq_grid_kernel_avx512(DType t);

// e8m0_to_fp32_half(e) for every e: one L1 load instead of the branchy bit construction
// in the MXFP4 inner loops.
struct E8m0HalfTable {
  float v[256];
  E8m0HalfTable();
};
extern const E8m0HalfTable kE8m0Half;

// Optional 4-row kernels: s[r] = (row r of w, rows stride bytes apart) . x for r = 0..3.
// They share the activation loads and scales across rows and must give results
// bit-identical to four vec_dot calls (so output never depends on how rows are grouped).
using VecDot4Fn = void (*)(int n, float *s, const void *w, size_t stride, const void *x);
VecDot4Fn vec_dot4_kernel_avx2(DType t);    // nullptr when none
VecDot4Fn vec_dot4_kernel_avx512(DType t);  // nullptr when none

// SIMD activation quantizers; same bytes as the reference ones (tests check it).
FromFloatFn from_float_kernel_avx2(DType act_type);    // nullptr when none
FromFloatFn from_float_kernel_avx512(DType act_type);  // nullptr when none

}  // namespace moe
