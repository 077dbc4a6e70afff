// The int8 MMQ GEMM for Q4_K with A fragments built from the raw quant bytes (included by
// matmul_mmq_i8.cu, which dispatches Q4_K weights here; its other types keep mmq_i8_kernel).
// Same tiling (128 rows x 64 columns, 8 warps of 32 x 32, narrow tiles, K splits), same
// integers and the same f32 folds (mmq_i8_fold.cuh) as mmq_i8_kernel: outputs bit-identical
// (tools/cuda_emu/run_mmq.sh). What differs is the K step and the weight path:
// - a K step is a whole 256-block: per row its 144 bytes as 9 aligned 16-byte cp.async
//   chunks (each byte copied once), in a 3-stage pipeline with the activations' 256
//   integers and their Q8_K scale c per column (37.25 KB a stage, 111.75 KB: 2 blocks per
//   SM on sm_90, 1 on sm_87). The 16 sums X per column (the min terms' operand) are not
//   copied: the thread that copied a 16-integer group adds it up once its copy has landed
//   (exactly act_round_kernel's X, an integer), into the stage as f16 (exact);
// - no decoded tile: sub-block j of a row is the low (j even) or high (j odd) nibbles of
//   qs bytes [32 (j / 2), +32) (unpack32<Q4_K>), so the m16n8k32 A fragment word of lane l
//   (k = 4 (l % 4) + 0..3 of row l / 4; +8 rows, +16 k) is one 32-bit shared load at qs
//   offset 32 (j / 2) + 4 (l % 4) (+16), and one load serves sub-blocks j and j + 1: an AND,
//   or a shift and an AND;
// - the 6-bit scales and mins come from the header's 12 bytes with whole-word masks (four
//   sub-blocks a word), per lane for its 4 rows.
#pragma once
#include <cstdint>

#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/mmq_i8_fold.cuh"
#include "backends/cuda/ops/mmq_i8_weights.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "quant/dtype.h"

namespace moe {
namespace mmq {

// Stages of the Q4_K pipeline (the launcher's; the host emulation also checks 2). Three
// keep two 256-blocks in flight while one is multiplied: a copy has two steps to land.
constexpr int kQ4kRawStages = 3;

// One pipeline stage in dynamic shared memory (each part a multiple of 16 bytes):
//   W[row][144]: the rows' 256-block (9 chunks: an odd count puts the 8 rows of the lanes'
//     fragment loads 36 words apart, every lane on its own bank);
//   B[col][256 + 16]: the columns' activation integers (16 bytes of padding put the 8 rows
//     of an ldmatrix phase on distinct bank quads);
//   C[col]: their Q8_K scale c (f32, copied);
//   Xh[col][16]: X = the sum of the 16 integers of each k16 group (f16, computed in place).
// S stages of 38,144 bytes: S = 3 is 114,432 (2 blocks per SM on sm_90: 2 x (114,432 + 512
// static + 1 KB reserved) <= 228 KB); the old (c, X) f32 pairs (8 KB a stage) did not fit 3.
template <int S> struct Q4kRawSmem {
  static constexpr int kRowW = 144, kRowB = 256 + 16, kRowXh = 16 * 2;
  static constexpr int kLdB = kRowB / 2;  // in 16-bit units (load_b_frags)
  static constexpr int kW = 0;
  static constexpr int kB = kW + mma_tile::kBM * kRowW;
  static constexpr int kC = kB + mma_tile::kBN * kRowB;
  static constexpr int kXh = kC + mma_tile::kBN * 4;
  static constexpr int kStage = kXh + mma_tile::kBN * kRowXh;
  static constexpr int kStages = S;
  static constexpr int kBytes = kStages * kStage;
  static_assert(kB % 16 == 0 && kC % 16 == 0 && kXh % 16 == 0 && kStage % 16 == 0, "16-byte aligned parts (cp.async, ldmatrix rows)");
  static_assert(kBytes <= 112 * 1024, "shared memory for two blocks per SM");
  static_assert(kBytes >= 16 * mma_tile::kThreads / 2 * 4, "add_group_sums: 16 floats per thread of group 1");
};

__device__ __forceinline__ void zero16(uint8_t *p) { *reinterpret_cast<uint4 *>(p) = make_uint4(0u, 0u, 0u, 0u); }

// This thread's i-th activation chunk of a 256-block (i < kActChunks): (column, k16 group).
// Chunks tid, tid + 256, ...: a warp's copies cover two whole column rows.
constexpr int kActChunks = mma_tile::kBN * 16 / mma_tile::kThreads;
__device__ __forceinline__ int2 act_chunk(int i) {
  const int c = threadIdx.x + i * mma_tile::kThreads;
  return make_int2(c >> 4, c & 15);
}

// Issues the copies of the columns' 256 activation integers of the 256-block at k0 into
// B[col][RowB] (this thread's share: act_chunk(0 .. kActChunks - 1)); columns past the
// tile's count (xrow < 0) are zeroed instead. Shared by the raw-fragment kernels (Q4_K, Q6_K).
template <int RowB> __device__ __forceinline__ void issue_act_copies(uint8_t *B, const int8_t *Xq, const int *s_xrow, int K, int k0) {
  using namespace mma_tile;
  static_assert(kBN * 16 % kThreads == 0 && RowB % 16 == 0, "whole activation chunk rounds, aligned rows");
#pragma unroll
  for (int i = 0; i < kActChunks; ++i) {
    const int col = act_chunk(i).x, q = act_chunk(i).y, xrow = s_xrow[col];
    uint8_t *dst = B + col * RowB + 16 * q;
    if (xrow >= 0)
      cp_async_16(dst, Xq + static_cast<int64_t>(xrow) * K + k0 + 16 * q);  // K % 256 == 0: aligned
    else
      zero16(dst);
  }
}

// Issues the copies of the 256-block at k0 into stage st (this thread's share: chunks tid,
// tid + 256, ...). Rows past M and columns past the tile's count (xrow < 0) are zeroed by
// plain stores instead (the stage is free: after the barrier that ends its last reads).
template <int S>
__device__ __forceinline__ void q4k_issue_copies(uint8_t *st, const uint8_t *We, int64_t row_bytes, int row0, int M, const int8_t *Xq,
                                                 const float2 *Xs, const int *s_xrow, int K, int k0) {
  using L = Q4kRawSmem<S>;
  using namespace mma_tile;
  const int tid = threadIdx.x;
  const int64_t blk = static_cast<int64_t>(k0 / 256) * 144;
  static_assert(kBN <= kThreads, "one scale copy per column");
#pragma unroll
  for (int i = 0; i < (kBM * 9 + kThreads - 1) / kThreads; ++i) {
    const int c = tid + i * kThreads;
    if (c >= kBM * 9) break;
    const int r = c / 9, q = c - 9 * r;
    uint8_t *dst = st + L::kW + r * L::kRowW + 16 * q;
    if (row0 + r < M)
      cp_async_16(dst, We + static_cast<int64_t>(row0 + r) * row_bytes + blk + 16 * q);  // rows: multiples of 144 bytes
    else
      zero16(dst);
  }
  issue_act_copies<L::kRowB>(st + L::kB, Xq, s_xrow, K, k0);
  if (tid < kBN) {  // c of the 256-block (the same in its 16 groups): the first group's
    const int xrow = s_xrow[tid];
    float *dst = reinterpret_cast<float *>(st + L::kC) + tid;
    if (xrow >= 0)
      cp_async_4(dst, &Xs[static_cast<int64_t>(xrow) * (K / 16) + k0 / 16].x);
    else
      *dst = 0.0f;
  }
}

// Once this thread's copies of stage st have landed (before the barrier that shows them to
// the block): X of the groups it copied (act_chunk), the integer sum of their 16 int8, as
// f16 into Xh (exact: |X| <= 16 * 127 < 2048). act_round_kernel's X is the same sum (of the
// same integers, in f32: exact), so the min terms are mmq_i8_kernel's bit for bit. Zeroed
// columns (plain stores of this thread) give 0, as their zeroed (c, X) did.
template <int S> __device__ __forceinline__ void q4k_group_sums(uint8_t *st) {
  using L = Q4kRawSmem<S>;
#pragma unroll
  for (int i = 0; i < kActChunks; ++i) {
    const int col = act_chunk(i).x, q = act_chunk(i).y;
    const uint4 v = *reinterpret_cast<const uint4 *>(st + L::kB + col * L::kRowB + 16 * q);
    constexpr int kOnes = 0x01010101;
    const int x = __dp4a(static_cast<int>(v.x), kOnes, 0) + __dp4a(static_cast<int>(v.y), kOnes, 0) +
                  __dp4a(static_cast<int>(v.z), kOnes, 0) + __dp4a(static_cast<int>(v.w), kOnes, 0);
    reinterpret_cast<__half *>(st + L::kXh + col * L::kRowXh)[q] = __float2half_rn(static_cast<float>(x));
  }
}

// Asks L2 for the 256-block kb (B bytes) of this thread's row (thread -> row tid / 2): bytes
// 0 and B / 2 (tid even) or B - 1 (odd), at most B / 2 <= 128 apart, so every 128-byte line
// of the block is asked for (Q4_K 144, Q6_K 210).
template <int B> __device__ __forceinline__ void block_prefetch_l2(const uint8_t *We, int64_t row_bytes, int row0, int M, int kb) {
  static_assert(B <= 256, "consecutive points less than a line apart");
  const int row = row0 + (threadIdx.x >> 1), odd = threadIdx.x & 1;
  const int64_t off = static_cast<int64_t>(kb) * B;
  if (row >= M || off >= row_bytes) return;
  const uint8_t *p = We + static_cast<int64_t>(row) * row_bytes + off;
  mma_tile::prefetch_l2(p + (odd ? B - 1 : 0));
  if (!odd) mma_tile::prefetch_l2(p + B / 2);
}

// The raw kernels' start, as mmq_i8_kernel's: before pdl_wait only a dense product's first
// S 256-blocks of weights (B bytes each; S: the pipeline's stages) are asked of L2; then the
// block's column tile.
template <int B, int S>
__device__ __forceinline__ mma_tile::ColTile raw_begin(const uint8_t *W, int64_t row_bytes, int row0, int M, int kb0, int ncols,
                                                       const int4 *tiles, const int2 *entries, int *s_xrow, int *s_yrow) {
  if (tiles == nullptr)
#pragma unroll
    for (int j = 0; j < S; ++j) block_prefetch_l2<B>(W, row_bytes, row0, M, kb0 + j);
  pdl_wait();
  return mma_tile::begin_col_tile(ncols, tiles, entries, s_xrow, s_yrow);
}

// The raw kernels' K loop over n_steps 256-blocks from kb0, an S-stage pipeline: step i
// lands in stage i % S (of stage_bytes each), issued S - 1 steps ahead (one commit group per
// step, empty past the end). Per step: wait for this thread's copies of step i (at most
// S - 2 younger groups pending), landed(stage, i) (this thread's own copies are visible to
// it), barrier (everyone's have landed and their landed() writes show; everyone is done
// with step i - 1, whose stage the next copies overwrite), issue step i + S - 1
// (copies(stage, i)), ask L2 for step i + S's weights, multiply step i (step(stage, i)).
// Ends with every copy landed (only empty groups are left).
template <int S, int B, class Copies, class Landed, class Step>
__device__ __forceinline__ void raw_k_loop(uint8_t *smem, int stage_bytes, int n_steps, const uint8_t *We, int64_t row_bytes, int row0,
                                           int M, int kb0, Copies copies, Landed landed, Step step) {
  static_assert(S >= 2, "a pipeline");
  auto issue = [&](int i) {
    if (i < n_steps) copies(smem + (i % S) * stage_bytes, i);
    mma_tile::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);
  for (int i = 0; i < n_steps; ++i) {
    uint8_t *st = smem + (i % S) * stage_bytes;
    mma_tile::cp_async_wait<S - 2>();
    landed(st, i);
    __syncthreads();
    issue(i + S - 1);
    block_prefetch_l2<B>(We, row_bytes, row0, M, kb0 + i + S);
    step(st, i);
  }
  mma_tile::cp_async_wait<0>();
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// The 6-bit scales (kMins = false) or mins (true) of sub-blocks 4 half .. 4 half + 3, one
// per byte, from a block header (scale_min_k4 on whole words): the 12 bytes q at hdr + 4
// hold sc_j = q[j] & 63, m_j = q[j + 4] & 63 for j < 4, and for j >= 4
// sc_j = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m_j = (q[j + 4] >> 4) | (q[j] >> 6) << 4.
template <bool kMins> __device__ __forceinline__ uint32_t q4k_scales(const uint8_t *hdr, int half) {
  const uint32_t w0 = u32_at(hdr + 4), w1 = u32_at(hdr + 8);
  if (half == 0) return (kMins ? w1 : w0) & 0x3F3F3F3Fu;
  const uint32_t w2 = u32_at(hdr + 12);
  return kMins ? ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u) : (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
}

// Byte i (0..3) of v.
__device__ __forceinline__ int byte_of(uint32_t v, int i) { return static_cast<int>((v >> (8 * i)) & 0xFFu); }

// The integer sums of one 256-block of stage st: I[mi][ni] += sc_j S_j over the warp's
// sub-blocks j (all 8, or in narrow tiles those with j % 2 == grp: mmq_i8_kernel's split,
// which gives group 0 the first sub-block of every 64-wide step).
template <int S>
__device__ __forceinline__ void q4k_block_sums(int (&I)[2][4][4], const uint8_t *st, const mma_tile::WarpTile &wt, bool narrow, int grp) {
  using L = Q4kRawSmem<S>;
  using namespace mma_tile;
  const int lane = wt.lane, g = lane >> 2, t = lane & 3;
  const uint16_t(*sB)[L::kLdB] = reinterpret_cast<const uint16_t(*)[L::kLdB]>(st + L::kB);
  const uint8_t *row[2][2];  // rows g, g + 8 of each 16-row tile
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) row[mi][h] = st + L::kW + (wt.wm + 16 * mi + g + 8 * h) * L::kRowW;
  uint32_t sc[2][2];  // [mi][h]: the scales of sub-blocks 0-3, then (p >= 2) of 4-7
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    if (p % 2 == 0) {  // unrolled: only the half in use is live
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) sc[mi][h] = q4k_scales<false>(row[mi][h], p / 2);
    }
    // Fragment words of sub-blocks 2p, 2p + 1: [mi][register], registers as mma_s8_k32's a
    // (rows g / g + 8 of k 0-15, then of k 16-31).
    uint32_t q[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int r = 0; r < 4; ++r) q[mi][r] = u32_at(row[mi][r & 1] + 16 + 32 * p + 4 * t + 16 * (r >> 1));
#pragma unroll
    for (int hs = 0; hs < 2; ++hs) {
      const int j = 2 * p + hs;
      if (narrow && hs != grp) continue;  // warp-uniform
      uint32_t b[4][2];
      load_b_frags<L::kLdB>(b, sB, wt.wn, 16 * j, lane);  // bytes 32 j ..: 16-bit column 16 j
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = (q[mi][r] >> (4 * hs)) & 0x0F0F0F0Fu;
        const int s0 = byte_of(sc[mi][0], j & 3), s1 = byte_of(sc[mi][1], j & 3);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          if (ni * 8 >= wt.n_live) continue;  // warp-uniform; padding columns only
          int sum[4] = {0, 0, 0, 0};
          mma_s8_k32(sum, a, b[ni]);
          I[mi][ni][0] += s0 * sum[0];
          I[mi][ni][1] += s0 * sum[1];
          I[mi][ni][2] += s1 * sum[2];
          I[mi][ni][3] += s1 * sum[3];
        }
      }
    }
  }
}

// After q4k_block_sums: fold_sums with operands from stage st. The min mma's A fragment
// (k = k16 group 2s, 2s + 1 of sub-block s; m16n8k16 f16: a0 rows g k 2t, 2t + 1, a1 rows
// g + 8, a2 / a3 k + 8) is m_t, m_t (a0, a1) and m_{t+4} (a2, a3); its B fragment is X of
// groups 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of column g, f16 (exact: |X| <= 2032):
// two consecutive halves of Xh each, low half the lower group.
template <int S>
__device__ __forceinline__ void q4k_fold(float (&acc)[2][4][4], int (&I)[2][4][4], const uint8_t *st, const mma_tile::WarpTile &wt,
                                         bool mins) {
  using L = Q4kRawSmem<S>;
  using namespace mma_tile;
  const int lane = wt.lane, g = lane >> 2, t = lane & 3;
  const float *sC = reinterpret_cast<const float *>(st + L::kC);
  float2 dd[2][2];
  uint32_t am[2][4] = {};
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t *hdr = st + L::kW + (wt.wm + 16 * mi + g + 8 * h) * L::kRowW;
      dd[mi][h] = i8_d_dmin<DType::Q4_K>(u32_at(hdr));
      if (mins) {
        const float lo = static_cast<float>(byte_of(q4k_scales<true>(hdr, 0), t));
        const float hi = static_cast<float>(byte_of(q4k_scales<true>(hdr, 1), t));
        am[mi][h] = pack2<false>(lo, lo);
        am[mi][2 + h] = pack2<false>(hi, hi);
      }
    }
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    if (ni * 8 >= wt.n_live) continue;  // warp-uniform; padding columns only
    float c[2];  // the Q8_K scale of this thread's columns 2t, 2t + 1 (the same in all 16 groups)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) c[cc] = sC[wt.wn + ni * 8 + 2 * t + cc];
    uint32_t bm[2] = {0u, 0u};
    if (mins) {
      const uint8_t *xh = st + L::kXh + (wt.wn + ni * 8 + g) * L::kRowXh;
      bm[0] = u32_at(xh + 4 * t);
      bm[1] = u32_at(xh + 16 + 4 * t);
    }
    fold_sums<true>(acc, I, ni, dd, am, bm, c, mins);
  }
}

// grid: (ceil(M / 128), column tiles, K splits), kThreads threads, Q4kRawSmem<S>::kBytes of
// dynamic shared memory; the arguments and results of mmq_i8_kernel<Q4_K> (W 16-byte
// aligned: the launcher checks; Xs's X the sums of Xq's groups, as act_round_kernel
// writes them: only its c is read). Split z sums the 256-blocks of [z k_len, (z + 1) k_len).
template <DType T, int S>
__global__ void __launch_bounds__(mma_tile::kThreads, 2)
    mmq_q4k_raw_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq, const float2 *Xs, float *Y,
                       int ncols, const int4 *tiles, const int2 *entries, int k_len, int64_t y_split) {
#if MOE_CUDA_TENSOR_CORE_CODE
  static_assert(T == DType::Q4_K, "Q4_K only");
  using L = Q4kRawSmem<S>;
  using namespace mma_tile;
  extern __shared__ __align__(128) uint8_t mmq_q4k_smem[];
  __shared__ int s_xrow[kBN], s_yrow[kBN];
  uint8_t *smem = mmq_q4k_smem;

  // (The trigger waits for the end of the K loop.)
  const int row0 = blockIdx.x * kBM, kz0 = blockIdx.z * k_len, kz1 = min(K, kz0 + k_len);
  const ColTile ct = raw_begin<144, S>(W, row_bytes, row0, M, kz0 / 256, ncols, tiles, entries, s_xrow, s_yrow);
  const int cnt = ct.cnt;
  if (cnt <= 0) return;
  const uint8_t *We = W + ct.expert * expert_bytes;

  WarpTile wt = warp_tile(cnt, row0, M);
  const bool narrow = cnt <= kBN / 2;  // block-uniform
  const int grp = threadIdx.x >> 7;    // warp group: column half, or sub-block parity in narrow tiles
  if (narrow) {
    wt.wn = 0;
    wt.n_live = cnt;
    wt.live = row0 + wt.wm < M;
  }
  float acc[2][4][4];
  zero_tile(acc);

  const int n_steps = (kz1 - kz0) / 256;  // K and k_len: multiples of 256
  raw_k_loop<S, 144>(
      smem, L::kStage, n_steps, We, row_bytes, row0, M, kz0 / 256,
      [&](uint8_t *stage, int i) { q4k_issue_copies<S>(stage, We, row_bytes, row0, M, Xq, Xs, s_xrow, K, kz0 + 256 * i); },
      [&](uint8_t *stage, int) { q4k_group_sums<S>(stage); },
      [&](const uint8_t *st, int) {
        if (!wt.live) return;
        // The 256-block's integer sums, live only within the step (not across the copies'
        // issue), and their first products are plain multiplies.
        int I[2][4][4] = {};
        q4k_block_sums<S>(I, st, wt, narrow, grp);
        q4k_fold<S>(acc, I, st, wt, !narrow || grp == 0);
      });
  pdl_trigger();

  if (narrow) {
    __syncthreads();  // every warp is done with the stages
    add_group_sums(acc, reinterpret_cast<float *>(smem), wt);
  }
  if (!wt.live || (narrow && grp == 1)) return;
  store_warp_tile(acc, Y + blockIdx.z * y_split, s_yrow, M, cnt, row0 + wt.wm, wt.wn, wt.lane);
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

}  // namespace mmq
}  // namespace moe
