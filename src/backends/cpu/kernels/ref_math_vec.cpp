// Dispatch of the array expf / silu helpers (see ref_math_vec.h): AVX-512 where the CPU
// and build have it, else the scalar mirrors.
#include "backends/cpu/kernels/ref_math_vec.h"

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/vec_dot.h"

namespace moe {

// Defined in ref_math_vec_avx512.cpp (empty stubs on builds without AVX-512 code).
void ref_expf_shift_avx512(int64_t n, const float *src, float mx, float *dst);
void ref_silu_mul_avx512(int64_t n, const float *g, const float *u, float *dst);
void ref_silu_avx512(int64_t n, const float *x, float *dst);
bool ref_math_avx512_built();

namespace {
bool use_avx512() { return active_cpu_isa() == CpuIsa::Avx512 && ref_math_avx512_built(); }
}  // namespace

void ref_expf_shift(int64_t n, const float *src, float mx, float *dst) {
  if (use_avx512()) return ref_expf_shift_avx512(n, src, mx, dst);
  for (int64_t i = 0; i < n; ++i) dst[i] = refmath::expf_v(src[i] - mx);
}

void ref_silu_mul(int64_t n, const float *g, const float *u, float *dst) {
  if (use_avx512()) return ref_silu_mul_avx512(n, g, u, dst);
  for (int64_t i = 0; i < n; ++i) dst[i] = refmath::silu_v(g[i]) * u[i];
}

void ref_silu(int64_t n, const float *x, float *dst) {
  int64_t i = 0;
  if (use_avx512()) {
    i = n & ~int64_t{15};
    ref_silu_avx512(i, x, dst);
  }
  for (; i < n; ++i) dst[i] = refmath::silu_v(x[i]);
}

}  // namespace moe
