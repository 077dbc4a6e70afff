// CPU dot-product kernels: weight row (any supported DType) x activation row already
// converted to that weight type's vec_dot_type (F32 for F32, F16 for F16, BF16 for BF16,
// Q8_0 for Q4_0/Q8_0/MXFP4, Q8_K for the K-quants). This is what the reference engine does,
// and matching it is required for logit conformance.
//
//   const CpuTypeKernels &k = cpu_type_kernels(DType::Q4_K);
//   k.from_float(x, xq, n);              // quantize activations once per row of input
//   float s; k.vec_dot(n, &s, wrow, xq); // one output element
//   cpu_vec_dot_rows(DType::Q4_K, n, 64, out, w, row_size(DType::Q4_K, n), xq);  // 64 rows
//
// The implementation is chosen once at first use from the CPU's features (x86: AVX-512 >
// AVX2 > scalar; aarch64: NEON), overridable for tests with set_cpu_isa().
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace moe {

using VecDotFn = void (*)(int n, float *s, const void *w, const void *x);
using FromFloatFn = void (*)(const float *x, void *y, int64_t n);

struct CpuTypeKernels {
  VecDotFn vec_dot = nullptr;      // null: type unsupported on CPU
  FromFloatFn from_float = nullptr;  // quantizer for vec_dot_type (activations)
  DType vec_dot_type = DType::F32;
};

enum class CpuIsa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };

CpuIsa detect_cpu_isa();                 // best ISA this CPU and build support
CpuIsa active_cpu_isa();                 // what cpu_type_kernels() currently returns
void set_cpu_isa(CpuIsa isa);            // tests/bench: force an ISA (clamped to detected)
const char *cpu_isa_name(CpuIsa isa);
const CpuTypeKernels &cpu_type_kernels(DType weight_type);

// nrows dot products of consecutive weight rows (w_row_stride bytes apart) against one
// activation row xq already in the weight type's vec_dot_type: out[r] = w[r] . xq.
// Throws Status::Unsupported for a weight type without a CPU kernel.
void cpu_vec_dot_rows(DType wtype, int n, int nrows, float *out, const void *w,
                      size_t w_row_stride, const void *xq);

}  // namespace moe
