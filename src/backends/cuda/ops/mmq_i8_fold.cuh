// The f32 side of the int8 MMQ kernels (matmul_mmq_i8.cu and its Q4_K kernel from raw
// fragments, mmq_q4k_raw.cuh), shared so that both fold the same exact integers with the
// same f32 operations (their outputs are bit-identical): the per-256-block fold of the
// K-quants and the join of the two warp groups of a narrow column tile.
#pragma once
#include "backends/cuda/ops/mma_common.cuh"

namespace moe {
namespace mmq {

// K-quants, after the last sub-block of a 256-block, 8-column group ni of the warp tile:
// acc += (d c) I - (dmin c) ms with ms = sum_g m_g X_g by one f16 mma of the min integers am
// (A fragments of the warp's two 16-row tiles, m per k16 group g) and the activation sums bm
// (the group's B fragment, X per g): exact (|ms| <= 16 * 63 * 2032 < 2^24). Then I = 0.
// dd[mi][h]: (d, dmin) of rows g, g + 8 of tile mi; c[cc]: the Q8_K scale of column
// 2 (lane % 4) + cc. mins = false (or a type without a min): ms = 0. One group at a time
// keeps the registers of the operands few.
template <bool kHasMin>
__device__ __forceinline__ void fold_sums(float (&acc)[2][4][4], int (&I)[2][4][4], int ni, const float2 (&dd)[2][2],
                                          const uint32_t (&am)[2][4], const uint32_t (&bm)[2], const float (&c)[2], bool mins) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    float ms[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kHasMin)
      if (mins) mma_tile::mma16816<false>(ms, am[mi], bm);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 w = dd[mi][e >> 1];
      float v = fmaf(static_cast<float>(I[mi][ni][e]), w.x * c[e & 1], acc[mi][ni][e]);
      if constexpr (kHasMin) v = fmaf(-ms[e], w.y * c[e & 1], v);
      acc[mi][ni][e] = v;
      I[mi][ni][e] = 0;
    }
  }
}

// Narrow tiles: group 1 (warps 4-7) adds its sums into those of group 0 through red (8 KB
// of shared memory free after the main loop), one 16-row half of the warp tile at a time.
// Thread t of group 0 and t + 128 of group 1 hold the same fragment elements. All threads.
__device__ __forceinline__ void add_group_sums(float (&acc)[2][4][4], float *red, const mma_tile::WarpTile &wt) {
  const int grp = threadIdx.x >> 7, slot = threadIdx.x & 127;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    if (mi) __syncthreads();  // group 0 has read the previous half
    if (grp == 1 && wt.live)
#pragma unroll
      for (int j = 0; j < 16; ++j) red[j * 128 + slot] = acc[mi][j >> 2][j & 3];
    __syncthreads();
    if (grp == 0 && wt.live)
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[mi][j >> 2][j & 3] += red[j * 128 + slot];
  }
}

}  // namespace mmq
}  // namespace moe
