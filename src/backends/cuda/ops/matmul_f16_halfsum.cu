// F16 weights where the reference engine runs its one-row F16 dot product: products with a
// single activation column and every MoE expert product (the CPU's f16_halfsum_path, see
// src/backends/cpu/kernels/f16_halfsum_dot.h for the order). That kernel accumulates in
// HALF precision: 4 accumulators x 32 lanes, one FP16 fused multiply-add per element of
// each 128-element step, then lane-wise FP16 adds (offset 64, then 32) and a 16/8/4/2/1
// FP16 reduction tree; the K % 128 tail is added in double. A warp owns a weight row and
// its lanes are exactly those 32 lanes, so __hfma/__hadd reproduce every rounding and CUDA
// matches the CPU (and the conformance expectations) bit for bit.
#include <cuda_fp16.h>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/kernel_error.cuh"

namespace moe {

namespace {

constexpr int kRowsPerBlock = 4;  // one warp per weight row

// grid: (row tiles, products). Product p is (token t = p / n_used, slot j = p % n_used);
// dense MatMul has n_used = 1 and no ids.
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    f16_halfsum_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, TView x, float *Y,
                       const int32_t *ids, int64_t ids_stride, int n_used, int E, unsigned *err) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int p = blockIdx.y;
  const int t = p / n_used, j = p % n_used;
  int expert = 0;
  if (ids) {
    expert = ids[t * ids_stride + j];
    if (expert < 0 || expert >= E) {  // nothing to compute; the output rows keep what they held
      if (blockIdx.x == 0 && threadIdx.x == 0) report_bad_index(err, kKernelErrExpertId, expert, E);
      return;
    }
  }
  if (row >= M) return;
  const int64_t xr = x.ne[1] == 1 ? 0 : j;  // the activation is shared by the slots or per slot
  const float *xv = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + xr * x.nb[1] + t * x.nb[2]);
  const __half *w = reinterpret_cast<const __half *>(W + expert * expert_bytes + static_cast<int64_t>(row) * row_bytes);
  const int np = K - K % 128;
  __half acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = __float2half_rn(0.0f);
  for (int i = 0; i < np; i += 128) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = i + 32 * k + lane;
      acc[k] = __hfma(w[idx], __float2half_rn(xv[idx]), acc[k]);
    }
  }
  acc[0] = __hadd(acc[0], acc[2]);
  acc[1] = __hadd(acc[1], acc[3]);
  acc[0] = __hadd(acc[0], acc[1]);
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) acc[0] = __hadd(acc[0], __shfl_down_sync(0xffffffffu, acc[0], o));
  if (lane != 0) return;
  double sum = np > 0 ? static_cast<double>(__half2float(acc[0])) : 0.0;
  for (int i = np; i < K; ++i) sum += static_cast<double>(__half2float(w[i]) * __half2float(__float2half_rn(xv[i])));
  Y[static_cast<int64_t>(p) * M + row] = static_cast<float>(sum);
}

}  // namespace

bool cuda_f16_halfsum_applies(const Graph &g, const Node &n) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  if (w.type != DType::F16) return false;
  return n.op == Op::MatMulId || x.ne[1] * x.ne[2] * x.ne[3] == 1;
}

void cuda_op_matmul_f16_halfsum(const CudaOpCtx &c) {
  const Node &w = c.src(0), &x = c.src(1);
  const int64_t K = w.ne[0], M = w.ne[1];
  const bool moe = c.n.op == Op::MatMulId;
  const int n_used = moe ? static_cast<int>(c.src(2).ne[0]) : 1;
  const int64_t n_prod = moe ? static_cast<int64_t>(n_used) * c.src(2).ne[1] : 1;
  if (M == 0 || n_prod == 0) return;
  if (n_prod > 65535) fail(Status::Unsupported, "CUDA F16 matmul: %lld products in one launch (max 65535)", (long long)n_prod);
  const dim3 grid(static_cast<unsigned>((M + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(n_prod));
  const int32_t *ids = moe ? static_cast<const int32_t *>(c.src(2).data) : nullptr;
  const int64_t ids_stride = moe ? static_cast<int64_t>(c.src(2).nb[1] / 4) : 0;
  f16_halfsum_kernel<<<grid, kRowsPerBlock * 32, 0, c.stream>>>(static_cast<const uint8_t *>(w.data), w.nb[1], moe ? w.nb[2] : 0,
                                                                static_cast<int>(K), static_cast<int>(M), tview(x),
                                                                static_cast<float *>(c.n.data), ids, ids_stride, n_used,
                                                                moe ? static_cast<int>(w.ne[2]) : 1, c.ub.err);
  MOE_CUDA_LAUNCH_CHECK("f16_halfsum_kernel");
}

}  // namespace moe
