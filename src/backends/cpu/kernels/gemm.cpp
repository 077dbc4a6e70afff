// Dispatch of the multi-row x multi-column kernels (see gemm.h).
#include "backends/cpu/kernels/gemm.h"

#include "backends/cpu/kernels/vec_dot.h"

namespace moe {

// Defined in gemm_avx512.cpp (an empty stub on builds without AVX-512 code).
void cpu_gemm_q4_K_avx512(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                          const void *const *x, Q4kOrder order);
bool cpu_gemm_q4_K_avx512_built();
void cpu_gemm_q6_K_avx512(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                          const void *const *x);

bool cpu_gemm_q4_K_supported() {
  // Follows the active ISA so tests and benches that force a lower one get the old path.
  return active_cpu_isa() == CpuIsa::Avx512 && cpu_gemm_q4_K_avx512_built();
}

void cpu_gemm_q4_K(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                   const void *const *x, Q4kOrder order) {
  cpu_gemm_q4_K_avx512(n, nrows, ncols, out, w, w_stride, x, order);
}

bool cpu_gemm_q6_K_supported() { return cpu_gemm_q4_K_supported(); }

void cpu_gemm_q6_K(int n, int nrows, int ncols, float *const *out, const void *w, size_t w_stride,
                   const void *const *x) {
  cpu_gemm_q6_K_avx512(n, nrows, ncols, out, w, w_stride, x);
}

}  // namespace moe
