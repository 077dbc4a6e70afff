// Reference-order dot products: the path rule, and dispatch between the portable build of
// the kernels and the AVX2/FMA one (same bits; see ref_order_dot_impl.h).
#include "backends/cpu/kernels/ref_order_dot.h"

#include "backends/cpu/kernels/vec_dot.h"

#define REFDOT_NS refdot_generic
#include "backends/cpu/kernels/ref_order_dot_impl.h"
#undef REFDOT_NS

namespace moe {

#if defined(MOEINFER_X86)
namespace refdot_avx2 {
void rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path);
}
#endif

bool ref_order_dot_supported(DType t) {
  return t == DType::F32 || t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

RefPath ref_order_path(DType t, int64_t n, int64_t m, int64_t n_cols, int64_t col, bool moe) {
  // F32: the reference hands multi-token products to its GEMM when k % 16 == 0 and the
  // row count % 4 == 0 (else, and for one token, its vec_dot). Experts are not F32.
  if (t == DType::F32) return !moe && n_cols >= 2 && n % 16 == 0 && m % 4 == 0 ? RefPath::F32Gemm : RefPath::VecDot;
  if (t == DType::Q4_K && m % 8 == 0) {
    // Dense products quantize and multiply activation rows in groups of 4; the remainder
    // and every MoE row go one at a time.
    const bool grouped = !moe && n_cols >= 4 && col < n_cols - n_cols % 4;
    return grouped ? RefPath::RepackGemm : RefPath::RepackGemv;
  }
  return RefPath::VecDot;
}

void ref_order_dot_rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path) {
#if defined(MOEINFER_X86)
  static const bool have_fma = detect_cpu_isa() != CpuIsa::Scalar;  // AVX2 implies FMA here
  if (have_fma) {
    refdot_avx2::rows(t, n, nrows, out, w, ws, x, path);
    return;
  }
#endif
  refdot_generic::rows(t, n, nrows, out, w, ws, x, path);
}

float ref_order_dot(DType t, int n, const void *w, const void *x) {
  float out = 0.f;
  ref_order_dot_rows(t, n, 1, &out, w, 0, x, RefPath::VecDot);
  return out;
}

}  // namespace moe
