// F32 weights times many columns (MoE routers at T > 1: 2048 x 128 at 512 tokens took 77 us
// on the one-warp-per-row kernel, 3.5 TFLOP/s). A register-tiled FMA GEMM: a block computes
// 64 weight rows x 64 columns, each thread 4 x 4 outputs from 16-deep shared-memory tiles.
// A router has few output tiles (2 x 8), so K is split over grid.z into partial sums that
// the caller adds in split order. Every partial runs over k in order inside one thread, so
// results are deterministic; they differ from the CPU's lane order only by f32 rounding.
#include "backends/cuda/ops/matmul_f32.h"

namespace moe {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;

// W: M rows of K floats, row_bytes apart. X: N rows of K floats, contiguous. Out: split z
// writes out[z N M + n M + m] for k in [z k_len, (z + 1) k_len).
__global__ void __launch_bounds__(kThreads) sgemm_f32_kernel(const uint8_t *W, int64_t row_bytes, int K, int M,
                                                             const float *X, int N, float *out, int k_len) {
  __shared__ __align__(16) float ws[kBK][kBM + 4];  // + 4: rows stay 16-byte aligned, stores spread over banks
  __shared__ __align__(16) float xs[kBK][kBN + 4];
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  const int k_begin = blockIdx.z * k_len, k_end = min(K, k_begin + k_len);
  const int tid = threadIdx.x, tm = tid % 16, tn = tid / 16;
  const int lr = tid / 4, lk = (tid % 4) * 4;  // this thread's loads: row lr, k lk .. lk + 3 of the tile
  const bool w_in = m0 + lr < M, x_in = n0 + lr < N;
  const float *wrow = reinterpret_cast<const float *>(W + static_cast<int64_t>(w_in ? m0 + lr : 0) * row_bytes);
  const float *xrow = X + static_cast<int64_t>(x_in ? n0 + lr : 0) * K;
  float acc[4][4] = {};
  for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int k = k0 + lk + q;
      ws[lk + q][lr] = w_in && k < k_end ? wrow[k] : 0.0f;
      xs[lk + q][lr] = x_in && k < k_end ? xrow[k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const float4 a = *reinterpret_cast<const float4 *>(&ws[kk][4 * tm]);
      const float4 b = *reinterpret_cast<const float4 *>(&xs[kk][4 * tn]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  float *o = out + static_cast<int64_t>(blockIdx.z) * N * M;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = n0 + 4 * tn + j;
    if (n >= N) break;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (m0 + 4 * tm + i < M) o[static_cast<int64_t>(n) * M + m0 + 4 * tm + i] = acc[i][j];
  }
}

}  // namespace

int sgemm_f32_splits(int64_t K, int64_t M, int64_t N, int n_sm) {
  const int64_t tiles = ((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  int64_t s = (2 * static_cast<int64_t>(n_sm) + tiles - 1) / tiles;  // ~2 blocks per SM
  s = s < K / (8 * kBK) ? s : K / (8 * kBK);                          // >= 8 tiles of K per split
  return static_cast<int>(s < 1 ? 1 : s > 16 ? 16 : s);
}

int launch_sgemm_f32(const uint8_t *W, int64_t row_bytes, int K, int M, const float *X, int N, float *out, int splits,
                     cudaStream_t s) {
  const int k_tiles = (K + kBK - 1) / kBK;
  const int k_len = (k_tiles + splits - 1) / splits * kBK;
  const int nz = K > 0 ? (K + k_len - 1) / k_len : 1;
  const dim3 grid((M + kBM - 1) / kBM, (N + kBN - 1) / kBN, nz);
  sgemm_f32_kernel<<<grid, kThreads, 0, s>>>(W, row_bytes, K, M, X, N, out, k_len);
  MOE_CUDA_LAUNCH_CHECK("sgemm_f32_kernel");
  return nz;
}

}  // namespace moe
