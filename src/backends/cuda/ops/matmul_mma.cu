// Tensor-core GEMM for MatMul / MatMulId with many columns (prefill), F16 / BF16 weights
// (quantized ones take the exact-product variant in matmul_mmq.cu). A block of 8 warps
// computes a 128 (weight rows) x 64 (columns) output tile: per 64-wide K step it copies
// the weight tile into shared memory, converts the pre-rounded f32 activations of its
// columns to the weight type beside it, and runs mma.sync m16n8k16 with f32 accumulators
// (each warp a 32 x 32 sub-tile). The activations were already rounded to the weight type
// (bf16 mma for BF16), so the products are exact.
// MatMulId: a block's columns are one routing tile (one expert, <= 64 entries), gathered
// through entries[].x and scattered through entries[].y; all experts in one launch.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"

namespace moe {

namespace {

using namespace mma_tile;

// The per-thread share of one K step, staged in registers: 32 weights and 16 activations
// as 16-bit pairs.
struct Stage {
  uint32_t w[16];
  uint32_t x[8];
};

// Thread -> (row tid / 2, elements k0 + 32 * (tid % 2) .. +31) of the weight tile. Rows past
// M and elements past K are zero.
template <DType T>
__device__ __forceinline__ void fetch_weights(uint32_t *p, const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k0,
                                              bool vec_ok) {
  const int row = row0 + (threadIdx.x >> 1);
  const int kb = k0 + (threadIdx.x & 1) * 32;
  if (row >= M || kb >= K) {
#pragma unroll
    for (int i = 0; i < 16; ++i) p[i] = 0;
    return;
  }
  const uint8_t *wrow = W + static_cast<int64_t>(row) * row_bytes;
  static_assert(T == DType::F16 || T == DType::BF16, "F32 weights stay on the exact f32 kernel, quantized ones go to MMQ");
  const uint16_t *src = reinterpret_cast<const uint16_t *>(wrow) + kb;
  if (vec_ok && kb + 32 <= K) {
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = __ldg(s4 + q);
      p[4 * q] = v.x; p[4 * q + 1] = v.y; p[4 * q + 2] = v.z; p[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t lo = kb + 2 * i < K ? src[2 * i] : 0u, hi = kb + 2 * i + 1 < K ? src[2 * i + 1] : 0u;
      p[i] = lo | (hi << 16);
    }
  }
}

// Thread -> (column tid / 4, elements k0 + 16 * (tid % 4) .. +15) of the activation tile.
// xrow < 0 (a column past the tile's count) and elements past K are zero.
template <bool BF>
__device__ __forceinline__ void fetch_acts(uint32_t *p, const float *X, int xrow, int K, int k0, bool vec_ok) {
  const int kb = k0 + (threadIdx.x & 3) * 16;
  if (xrow < 0 || kb >= K) {
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = 0;
    return;
  }
  const float *src = X + static_cast<int64_t>(xrow) * K + kb;
  if (vec_ok && kb + 16 <= K) {
    const float4 *s4 = reinterpret_cast<const float4 *>(src);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(s4 + q);
      p[2 * q] = pack2<BF>(v.x, v.y);
      p[2 * q + 1] = pack2<BF>(v.z, v.w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float lo = kb + 2 * i < K ? __ldg(src + 2 * i) : 0.0f, hi = kb + 2 * i + 1 < K ? __ldg(src + 2 * i + 1) : 0.0f;
      p[i] = pack2<BF>(lo, hi);
    }
  }
}

__device__ __forceinline__ void store_stage(const Stage &st, uint16_t (*sA)[kLd], uint16_t (*sB)[kLd]) {
  uint4 *a = reinterpret_cast<uint4 *>(&sA[threadIdx.x >> 1][(threadIdx.x & 1) * 32]);
#pragma unroll
  for (int q = 0; q < 4; ++q) a[q] = make_uint4(st.w[4 * q], st.w[4 * q + 1], st.w[4 * q + 2], st.w[4 * q + 3]);
  uint4 *b = reinterpret_cast<uint4 *>(&sB[threadIdx.x >> 2][(threadIdx.x & 3) * 16]);
  b[0] = make_uint4(st.x[0], st.x[1], st.x[2], st.x[3]);
  b[1] = make_uint4(st.x[4], st.x[5], st.x[6], st.x[7]);
}

// grid: (ceil(M / 128), column tiles). See launch_mma_matmul for the column tiles.
template <DType T>
__global__ void __launch_bounds__(kThreads, 2) mma_matmul_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                                  const float *X, float *Y, int ncols, const int4 *tiles,
                                                                  const int2 *entries) {
#if MOE_CUDA_TENSOR_CORE_CODE
  constexpr bool BF = T == DType::BF16;
  // sA[row][k]: weights (mma A, row-major). sB[col][k]: activations (mma B, column-major).
  __shared__ __align__(16) uint16_t sA[kBM][kLd];
  __shared__ __align__(16) uint16_t sB[kBN][kLd];
  __shared__ int s_xrow[kBN], s_yrow[kBN];

  const ColTile ct = begin_col_tile(ncols, tiles, entries, s_xrow, s_yrow);
  const int cnt = ct.cnt, tid = threadIdx.x;
  if (cnt <= 0) return;

  const int row0 = blockIdx.x * kBM;
  const uint8_t *We = W + ct.expert * expert_bytes;
  const bool w_vec = ((reinterpret_cast<uintptr_t>(W) | static_cast<uintptr_t>(row_bytes) | static_cast<uintptr_t>(expert_bytes)) & 15) == 0;
  const bool x_vec = (K & 3) == 0;
  const int xrow = s_xrow[tid >> 2];

  const WarpTile wt = warp_tile(cnt, row0, M);
  float acc[2][4][4];
  zero_tile(acc);

  // Register-staged pipeline: the next step's loads and dequantization are issued before
  // this step's mma, so they can overlap (the last fetch re-reads the last step, unused).
  Stage st;
  fetch_weights<T>(st.w, We, row_bytes, row0, M, K, 0, w_vec);
  fetch_acts<BF>(st.x, X, xrow, K, 0, x_vec);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    store_stage(st, sA, sB);
    __syncthreads();
    const int kn = k0 + kBK < K ? k0 + kBK : k0;
    fetch_weights<T>(st.w, We, row_bytes, row0, M, K, kn, w_vec);
    fetch_acts<BF>(st.x, X, xrow, K, kn, x_vec);
    prefetch_weights_l2(We, row_bytes, row0, M, K, k0 + 3 * kBK);
    if (wt.live) mma_k_step<BF>(acc, sA, sB, wt);
    __syncthreads();
  }

  if (!wt.live) return;
  store_warp_tile(acc, Y, s_yrow, M, cnt, row0 + wt.wm, wt.wn, wt.lane);
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

}  // namespace

bool cuda_mma_type_supported(DType t) { return t == DType::F16 || t == DType::BF16; }

void launch_mma_matmul(DType t, cudaStream_t s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                       const float *X, float *Y, int ncols, const int4 *tiles, const int2 *entries, int n_col_tiles) {
  if (n_col_tiles <= 0 || M <= 0) return;
  const dim3 grid(static_cast<unsigned>((M + kBM - 1) / kBM), static_cast<unsigned>(n_col_tiles));
#define MOE_MMA_CASE(TY) \
  case TY: mma_matmul_kernel<TY><<<grid, kThreads, 0, s>>>(W, row_bytes, expert_bytes, K, M, X, Y, ncols, tiles, entries); break;
  switch (t) {
    MOE_MMA_CASE(DType::F16)
    MOE_MMA_CASE(DType::BF16)
    default: fail(Status::Internal, "CUDA tensor-core matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMA_CASE
  MOE_CUDA_LAUNCH_CHECK("mma_matmul_kernel");
}

}  // namespace moe
