// The f16 conversions of the cuBLAS prompt path (matmul_blas.h). Both launch with PDL:
// every load and store after pdl_wait.
#include "backends/cuda/ops/matmul_blas.h"

#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"

namespace moe {

namespace {

using mma_tile::pack2;

// A thread per 32-weight sub-block (unit u = row * K / 32 + sub-block): 64 bytes of f16 out.
template <DType T> __global__ void dequant_f16_kernel(const uint8_t *W, int64_t row_bytes, int K, int64_t units, __half *W16) {
  pdl_wait();
  pdl_trigger();
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int per_row = K / 32;
  const int64_t m = u / per_row;
  const int sb = static_cast<int>(u - m * per_row);
  float w[32];
  dequant32<T>(W + m * row_bytes, sb, w);
  uint4 *o = reinterpret_cast<uint4 *>(W16 + m * K + 32 * sb);
#pragma unroll
  for (int v = 0; v < 4; ++v)
    o[v] = make_uint4(pack2<false>(w[8 * v], w[8 * v + 1]), pack2<false>(w[8 * v + 2], w[8 * v + 3]), pack2<false>(w[8 * v + 4], w[8 * v + 5]),
                      pack2<false>(w[8 * v + 6], w[8 * v + 7]));
}

}  // namespace

// Every type of cuda_mmq_type_supported: the cuBLAS path takes only products the MMQ would.
#define MOE_BLAS_TYPES(X) X(DType::Q4_0) X(DType::Q8_0) X(DType::MXFP4) X(DType::Q2_K) X(DType::Q3_K) X(DType::Q4_K) X(DType::Q5_K) X(DType::Q6_K)

void launch_dequant_f16(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int K, int M, __half *W16) {
  const int64_t units = static_cast<int64_t>(M) * (K / 32);
  const dim3 grid(static_cast<unsigned>((units + 255) / 256));
  switch (t) {
#define MOE_BLAS_CASE(TY)                                                               \
  case TY: launch_pdl(dequant_f16_kernel<TY>, grid, dim3(256), 0, s, W, row_bytes, K, units, W16); break;
    MOE_BLAS_TYPES(MOE_BLAS_CASE)
#undef MOE_BLAS_CASE
    default: fail(Status::Internal, "CUDA f16 dequantization: type %s not dispatched", dtype_name(t));
  }
}

}  // namespace moe
