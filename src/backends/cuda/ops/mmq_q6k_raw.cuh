// The int8 MMQ GEMM for Q6_K with A fragments built from the raw quant bytes (included by
// matmul_mmq_i8.cu, which dispatches Q6_K weights here). Same integers (the codes q - 32
// times the int8 scales per 16, two m16n8k16 products per 32) and the same f32 folds as
// mmq_i8_kernel<Q6_K>: outputs bit-identical (tools/cuda_emu/run_mmq.sh). What differs:
// - warps of 16 rows x 64 columns (8 along the rows), so each weight is decoded by exactly
//   one lane (32 x 32 warps would decode every row twice, once per column half);
// - a K step is a whole 256-block: per row its 210 bytes as the (<= 14) aligned 16-byte
//   cp.async chunks holding them, each byte copied once, in a 2-stage pipeline with the
//   columns' 256 activation integers and their Q8_K scale (48 KB a stage: 2 blocks per SM);
// - no decoded tile: element i of sub-block j (n = j / 4, g = j % 4) is nibble g / 2 of ql
//   byte 64 n + 32 (g % 2) + i and bit pair g of qh byte 128 + 32 n + i, so the fragment
//   word of lane l (k = 4 (l % 4) + 0..3, +16) comes from one ql and one qh word; blocks
//   are only 2-byte aligned, so each word is two aligned shared loads and a funnel shift.
//   One qh word serves 4 sub-blocks, one ql word 2;
// - narrow column tiles (<= 32 columns): the accumulators of columns 32-63 are free, and
//   hold the odd sub-blocks' sums (mmq_i8_kernel's second warp group), added at the end.
#pragma once
#include <cstdint>

#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/mmq_i8_weights.cuh"
#include "backends/cuda/ops/mmq_q4k_raw.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "quant/dtype.h"

namespace moe {
namespace mmq {

// One pipeline stage in dynamic shared memory (each part a multiple of 16 bytes):
//   W[row][240]: the chunks holding the row's 256-block, the block at (its address % 16)
//     (<= 14 + 210 = 224 bytes; 15 chunks a row: an odd count spreads the lanes' rows over
//     the banks);
//   B[col][256 + 16]: the columns' activation integers (as Q4kRawSmem);
//   X[col][16]: (c, X) of the 256-block's k16 groups 0 and 1 (c: the Q8_K scale, the same
//     in all its groups).
// Two stages (three would take 144 KB: one block per SM).
struct Q6kRawSmem {
  static constexpr int kChunks = 14, kRowW = 15 * 16, kRowB = 256 + 16, kRowX = 16;
  static constexpr int kLdB = kRowB / 2;  // in 16-bit units (load_b_frags)
  static constexpr int kW = 0;
  static constexpr int kB = kW + mma_tile::kBM * kRowW;
  static constexpr int kX = kB + mma_tile::kBN * kRowB;
  static constexpr int kStage = kX + mma_tile::kBN * kRowX;
  static constexpr int kStages = 2;
  static constexpr int kBytes = kStages * kStage;
  static_assert(kChunks * 16 >= 14 + 210, "a 2-byte aligned block in its chunks");
  static_assert(kB % 16 == 0 && kX % 16 == 0 && kStage % 16 == 0, "16-byte aligned parts (cp.async, ldmatrix rows)");
  static_assert(kBytes <= 112 * 1024, "shared memory for two blocks per SM");
};

// Where the 256-block kb of a row starts in its stage row: the block's address modulo 16
// (row16: the row's address modulo 16).
__device__ __forceinline__ int q6k_offset(int row16, int kb) { return (row16 + kb * 210) & 15; }

// Issues the copies of the 256-block at k0 into stage st (this thread's share: chunks tid,
// tid + 256, ... of the 128 x 14). Only the chunks that hold block bytes are copied (no read
// past the tensor); rows past M and columns past the tile's count (xrow < 0) are zeroed.
__device__ __forceinline__ void q6k_issue_copies(uint8_t *st, const uint8_t *We, int64_t row_bytes, int row0, int M, const int8_t *Xq,
                                                 const float2 *Xs, const int *s_xrow, int K, int k0) {
  using L = Q6kRawSmem;
  using namespace mma_tile;
  const int tid = threadIdx.x, kb = k0 / 256;
  static_assert(kBN <= kThreads, "one (c, X) chunk per column");
#pragma unroll
  for (int i = 0; i < (kBM * L::kChunks + kThreads - 1) / kThreads; ++i) {
    const int c = tid + i * kThreads;
    if (c >= kBM * L::kChunks) break;
    const int r = c / L::kChunks, q = c - L::kChunks * r;
    uint8_t *dst = st + L::kW + r * L::kRowW + 16 * q;
    if (row0 + r < M) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(We + static_cast<int64_t>(row0 + r) * row_bytes) + static_cast<uintptr_t>(kb) * 210u;
      const uintptr_t a0 = a & ~uintptr_t(15);
      if (a0 + 16u * static_cast<uintptr_t>(q) < a + 210u) cp_async_16(dst, reinterpret_cast<const void *>(a0 + 16u * q));
    } else {
      zero16(dst);
    }
  }
  issue_act_copies<L::kRowB>(st + L::kB, Xq, s_xrow, K, k0);
  if (tid < kBN) {
    const int xrow = s_xrow[tid];
    uint8_t *dst = st + L::kX + tid * L::kRowX;
    if (xrow >= 0)
      cp_async_16(dst, Xs + static_cast<int64_t>(xrow) * (K / 16) + k0 / 16);  // K / 16 even: aligned
    else
      zero16(dst);
  }
}

// The 32-bit word of the bytes [p, p + 4) of a stage row, p 2-byte aligned: the aligned words
// at and after it, funnel-shifted (p 4-byte aligned: the first one). Both lie inside the
// row's copied chunks for every word of a block's qs / qh (see q6k_block_sums).
__device__ __forceinline__ uint32_t q6k_word(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint8_t *q = reinterpret_cast<const uint8_t *>(a & ~uintptr_t(3));
  return __funnelshift_r(u32_at(q), u32_at(q + 4), static_cast<uint32_t>(a & 3u) * 8u);
}

// Four Q6_K codes c = ql nibble | qh bit pair << 4 (0..63, one per byte) -> the int8 bytes of
// c - 32: c + 96 <= 159 needs no carry, then -128 modulo 256 per byte is an XOR of its top bit.
__device__ __forceinline__ uint32_t q6k_fragment(uint32_t ql, uint32_t qh, int nib, int pair) {
  const uint32_t lo = (ql >> (4 * nib)) & 0x0F0F0F0Fu;
  const uint32_t hi = ((qh >> (2 * pair)) & 0x03030303u) << 4;
  return (lo + hi + 0x60606060u) ^ 0x80808080u;
}

__device__ __forceinline__ int s8_at(const uint8_t *p) { return static_cast<int8_t>(*p); }

// The integer sums of one 256-block: I[q] += sc0 S0 + sc1 S1 (the two k16 halves of each
// sub-block j with their int8 scales), for the warp's rows wm + g, wm + g + 8 (blk[h]: the
// block's first byte in the stage row). Accumulator slot q = 4 ch + ni: column group q
// (wide tiles), or in narrow tiles column group ni of the sub-blocks of parity ch (one code
// path for both: the slots are compile-time, only the columns read and the skips differ).
__device__ __forceinline__ void q6k_block_sums(int (&I)[8][4], const uint8_t *st, const uint8_t *const (&blk)[2], int n_live, bool narrow,
                                               int lane) {
  using L = Q6kRawSmem;
  using namespace mma_tile;
  const int t = lane & 3;
  const uint16_t(*sB)[L::kLdB] = reinterpret_cast<const uint16_t(*)[L::kLdB]>(st + L::kB);
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    uint32_t qh[2][2];  // [row h][k half]: qh bytes 128 + 32 n + 4 t (+16)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) qh[h][kh] = q6k_word(blk[h] + 128 + 32 * n + 4 * t + 16 * kh);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      uint32_t ql[2][2];  // ql bytes 64 n + 32 p + 4 t (+16): sub-blocks g = p (low nibbles), p + 2 (high)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) ql[h][kh] = q6k_word(blk[h] + 64 * n + 32 * p + 4 * t + 16 * kh);
#pragma unroll
      for (int nib = 0; nib < 2; ++nib) {
        const int g = p + 2 * nib, j = 4 * n + g;
        // a[0], a[1]: rows g, g + 8 of k 0-15; a[2], a[3]: of k 16-31 (mma_s8_k16 halves).
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = q6k_fragment(ql[r & 1][r >> 1], qh[r & 1][r >> 1], nib, g);
        int sc[2][2];  // [row h][k half]
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int k = 0; k < 2; ++k) sc[h][k] = s8_at(blk[h] + 192 + 2 * j + k);
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
          const int c0 = narrow ? 0 : 32 * ch;  // the slots' first column
          if (narrow ? (j & 1) != ch : c0 >= n_live) continue;  // block-uniform
          uint32_t b[4][2];
          load_b_frags<L::kLdB>(b, sB, c0, 16 * j, lane);  // bytes 32 j ..: 16-bit column 16 j
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            if (c0 + 8 * ni >= n_live) continue;  // block-uniform; padding columns only
            int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
            mma_s8_k16(s0, a[0], a[1], b[ni][0]);
            mma_s8_k16(s1, a[2], a[3], b[ni][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) I[4 * ch + ni][e] += sc[e >> 1][0] * s0[e] + sc[e >> 1][1] * s1[e];
          }
        }
      }
    }
  }
}

// The first column of accumulator slot q (q6k_block_sums).
__device__ __forceinline__ int q6k_slot_col(int q, bool narrow) { return 8 * (narrow ? q & 3 : q); }

// After q6k_block_sums: acc[q] += (d c) I[q] (fold_sums<false>'s operations), then I = 0.
__device__ __forceinline__ void q6k_fold(float (&acc)[8][4], int (&I)[8][4], const uint8_t *st, const uint8_t *const (&blk)[2], int n_live,
                                         bool narrow, int lane) {
  using L = Q6kRawSmem;
  const int t = lane & 3;
  float d[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) d[h] = i8_d_dmin<DType::Q6_K>(u16_at(blk[h] + 208)).x;  // 2-byte aligned
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const int col = q6k_slot_col(q, narrow);
    if (col >= n_live) continue;  // block-uniform; padding columns only
    float c[2];  // the Q8_K scale of this thread's columns col + 2 t, +1
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) c[cc] = reinterpret_cast<const float2 *>(st + L::kX + (col + 2 * t + cc) * L::kRowX)->x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[q][e] = fmaf(static_cast<float>(I[q][e]), d[e >> 1] * c[e & 1], acc[q][e]);
      I[q][e] = 0;
    }
  }
}

// grid: (ceil(M / 128), column tiles, K splits), kThreads threads, Q6kRawSmem::kBytes of
// dynamic shared memory; the arguments and results of mmq_i8_kernel<Q6_K> (W 2-byte
// aligned: the launcher checks). Split z sums the 256-blocks of [z k_len, (z + 1) k_len).
template <DType T>
__global__ void __launch_bounds__(mma_tile::kThreads, 2)
    mmq_q6k_raw_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq, const float2 *Xs, float *Y,
                       int ncols, const int4 *tiles, const int2 *entries, int k_len, int64_t y_split) {
#if MOE_CUDA_TENSOR_CORE_CODE
  static_assert(T == DType::Q6_K, "Q6_K only");
  using L = Q6kRawSmem;
  using namespace mma_tile;
  extern __shared__ __align__(128) uint8_t mmq_q6k_smem[];
  __shared__ int s_xrow[kBN], s_yrow[kBN];
  uint8_t *smem = mmq_q6k_smem;

  // (The trigger waits for the end of the K loop.)
  const int row0 = blockIdx.x * kBM, kz0 = blockIdx.z * k_len, kz1 = min(K, kz0 + k_len);
  const ColTile ct = raw_begin<210, Q6kRawSmem::kStages>(W, row_bytes, row0, M, kz0 / 256, ncols, tiles, entries, s_xrow, s_yrow);
  const int cnt = ct.cnt;
  if (cnt <= 0) return;
  const uint8_t *We = W + ct.expert * expert_bytes;

  const int lane = threadIdx.x & 31, wm = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
  const bool live = row0 + wm < M;    // warp-uniform
  const bool narrow = cnt <= kBN / 2;  // block-uniform
  // This lane's rows g, g + 8: their addresses modulo 16 (a row past M is never read from
  // global memory: its stage row is zeros).
  int row16[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    row16[h] = static_cast<int>((reinterpret_cast<uintptr_t>(We) + static_cast<uintptr_t>((row0 + wm + g + 8 * h) * row_bytes)) & 15u);
  float acc[8][4];
#pragma unroll
  for (int q = 0; q < 8; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[q][e] = 0.0f;

  const int n_steps = (kz1 - kz0) / 256;  // K and k_len: multiples of 256
  raw_k_loop<L::kStages, 210>(
      smem, L::kStage, n_steps, We, row_bytes, row0, M, kz0 / 256,
      [&](uint8_t *stage, int i) { q6k_issue_copies(stage, We, row_bytes, row0, M, Xq, Xs, s_xrow, K, kz0 + 256 * i); },
      [](uint8_t *, int) {},
      [&](const uint8_t *st, int i) {
        if (!live) return;
        // The 256-block's integer sums, live only within the step (as mmq_q4k_raw_kernel's).
        int I[8][4] = {};
        const int kb = kz0 / 256 + i;
        const uint8_t *blk[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) blk[h] = st + L::kW + (wm + g + 8 * h) * L::kRowW + q6k_offset(row16[h], kb);
        q6k_block_sums(I, st, blk, cnt, narrow, lane);
        q6k_fold(acc, I, st, blk, cnt, narrow, lane);
      });
  pdl_trigger();
  if (!live) return;

  // Narrow: the even sub-blocks' sums plus the odd ones' (mmq_i8_kernel's add_group_sums).
  if (narrow)
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][e] += acc[q + 4][e];
  float *Yz = Y + blockIdx.z * y_split;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    if (narrow && q >= 4) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = row0 + wm + g + 8 * (e >> 1), n = 8 * q + 2 * t + (e & 1);
      if (m < M && n < cnt) Yz[static_cast<int64_t>(s_yrow[n]) * M + m] = acc[q][e];
    }
  }
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

}  // namespace mmq
}  // namespace moe
