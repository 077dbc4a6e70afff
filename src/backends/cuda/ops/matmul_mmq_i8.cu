// Exact-product tensor-core GEMM on int8 mma (prefill MatMul / MatMulId) for Q4_0, Q8_0,
// MXFP4, Q4_K, Q5_K, Q6_K and the twelve extra types (mmq_i8_extra.cuh: the 256-block ones
// fold as the K-quants, the 32-block ones as Q4_0, Q4_1 / Q5_1 with their min): the weights' integers (mmq_i8_weights.cuh) meet the activations' Q8_0 /
// Q8_K integers (act_round_kernel, int8, with per-16 (c, X = sum qx)) in
// mma.sync.m16n8k32.s8 with s32 results, exact, at twice the f16 rate of matmul_mmq.cu and
// half its shared-memory bytes per K. The folds follow the CPU's dot products:
// - K-quants: per 32 (Q6_K per 16) the integer sum S times the integer group scale sc is
//   accumulated in int32 over the 256-block, then once per block in f32:
//   acc += (d c) I - (dmin c) sum_g m_g X_g (the min term by one exact f16 mma, as in
//   matmul_mmq.cu). Bounds of I per 256-block (|qx| <= 127):
//     Q4_K: 8 * 63 * 32 * 15 * 127  =  30.7e6 < 2^31
//     Q5_K: 8 * 63 * 32 * 31 * 127  =  63.5e6 < 2^31
//     Q6_K: 16 * 128 * 16 * 32 * 127 = 133.2e6 < 2^31 (16-wide int8 scales: two
//           m16n8k16 s8 mmas per 32 on the k16 halves of the same fragments, rather than
//           two masked k32 ones: the same tensor work, no masking)
// - Q4_0 / Q8_0 / MXFP4: per 32, acc += S (d c) (|S| <= 32 * 128 * 127 < 2^24: exact in
//   f32), the CPU's sumi * (c d); for MXFP4 the f16 MMQ's S and fold (its results, except
//   where narrow tiles or K splits here add partial sums in another order).
// Tiling, column tiles, L2 prefetch and the output scatter are those of matmul_mma.cu
// (mma_common.cuh): 128 rows x 64 columns, K steps of 64, 8 warps of 32 x 32. Here the
// loads are a cp.async pipeline (kStages): each K step's raw weight bytes (per row, the
// 16-byte chunks holding what the step's decode reads, I8Raw) and activation integers and
// scales are copied into shared memory kStages - 1 steps ahead, then the weights are
// decoded from there into the step tiles, which the mma reads with the activation integers
// in place. Also a K split over several blocks for dense grids that would leave SMs idle,
// and narrow column tiles (<= 32) shared by the two warp groups along K (SubRange).
// Host-checked by tools/cuda_emu/run_mmq.sh (bit for bit against the register-staged
// kernel of 5993875, which this one reproduces: same integers, same folds).
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/mmq_i8_fold.cuh"
#include "backends/cuda/ops/mmq_i8_weights.cuh"
#include "backends/cuda/ops/mmq_q4k_raw.cuh"
#include "backends/cuda/ops/mmq_q6k_raw.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"

#include <algorithm>

namespace moe {

namespace {

using namespace mma_tile;
using namespace mmq;

constexpr int kSubs = kBK / 32;    // weight sub-blocks per K step
constexpr int kGroups = kBK / 16;  // k16 groups per K step
// Byte tiles of a K step, rows of 64 + 16 bytes (the 8 rows of an ldmatrix phase on distinct
// bank quads), addressed as 16-bit pairs by load_frags_k16.
constexpr int kLd8 = (kBK + 16) / 2;
// Activation scales padded to 5 per column (the 4 columns a warp reads at once on distinct
// banks).
constexpr int kSld = kGroups + 1;
// Min integers m and activation sums X of the 16 k16 groups of a 256-block, f16 (48-byte rows).
constexpr int kMinLd = 16 + 8;
// Weights are asked of L2 this many K steps ahead: a few steps before their cp.async copies
// (kStages - 1 ahead), so those mostly find them in L2.
constexpr int kPrefetchSteps = 7;

// Stages of the cp.async pipeline: while one K step is decoded and multiplied, the copies of
// the next kStages - 1 are in flight (3 stages for Q6_K, whose raw copies are the largest,
// to keep 2 blocks per SM within the shared memory: 100 KB each; Q4_K 74 KB, Q5_K 90 KB).
template <DType T> constexpr int kStages = T == DType::Q6_K ? 3 : 4;

// The dynamic shared memory of the kernel, in this order (each part a multiple of 16 bytes):
//   raw[stage][row][kRawRow]: the 16-byte chunk covers of the weight bytes a K step reads
//     (I8Raw), per row, region after region; rows of an odd number of chunks, so that the
//     decode's loads (a row per thread pair) fall on distinct banks (4-byte loads: at most
//     2 rows of a warp per bank);
//   sB[stage][col][kLd8]: the step's activation integers (the mma reads them there);
//   sXs[stage][col][kGroups]: their (c, X) per k16 group;
//   the decoded step tiles (one buffer, I8Tiles): sA, sSc, sD, sC, sMA, sMB, sX.
template <DType T> struct I8Smem {
  static constexpr int kRawRow = (i8_raw_chunks<T> | 1) * 16;
  static constexpr int kRaw = 0;
  static constexpr int kB = kRaw + kStages<T> * kBM * kRawRow;
  static constexpr int kXs = kB + kStages<T> * kBN * kLd8 * 2;
  static constexpr int kA = kXs + kStages<T> * kBN * kGroups * 8;
  static constexpr int kSc = kA + kBM * kLd8 * 2;
  static constexpr int kD = kSc + kBM * kGroups;
  static constexpr int kC = kD + kBM * kSubs * 4;
  static constexpr int kMA = kC + kBN * kSld * 4;
  static constexpr int kMB = kMA + (has_min<T> ? kBM : 0) * kMinLd * 2;
  static constexpr int kX = kMB + (has_min<T> ? kBN : 0) * kMinLd * 2;
  static constexpr int kBytes = kX + (i8_min32<T> ? kBN : 0) * kSld * 4;
  static_assert(kRawRow % 16 == 0 && kB % 16 == 0 && kXs % 16 == 0 && kA % 16 == 0 && kSc % 16 == 0 && kD % 16 == 0 &&
                    kC % 16 == 0 && kMA % 16 == 0 && kMB % 16 == 0 && kX % 16 == 0,
                "16-byte aligned parts (cp.async, uint4 stores, ldmatrix rows)");
  // Two blocks per SM on sm_90 (228 KB per SM, 1 KB of it reserved per block, + the static
  // row tables), as the registers allow.
  static_assert(kBytes <= 112 * 1024, "shared memory for two blocks per SM");
};

// Issues the copies of K step k0 into pipeline stage st: thread -> (row tid / 2, chunks of
// parity tid % 2 of the row's covers) and (column tid / 4, 16 integers of k16 group tid % 4;
// for tid % 4 < 2 also the (c, X) of groups 2 (tid % 4), +1). Rows past M, columns past the
// tile's count (xrow < 0) and groups past K are not copied: their decode gives zero weights,
// and their activation bytes are stored as zeros here.
template <DType T>
__device__ __forceinline__ void issue_step_copies(uint8_t *smem, int st, const uint8_t *We, int64_t row_bytes, int row0, int M,
                                                  const int8_t *Xq, const float2 *Xs, int xrow, int K, int k0) {
  using L = I8Smem<T>;
  const int tid = threadIdx.x, r = tid >> 1, h = tid & 1;
  if (row0 + r < M) {
    const uint8_t *grow = We + static_cast<int64_t>(row0 + r) * row_bytes;
    uint8_t *raw = smem + L::kRaw + (st * kBM + r) * L::kRawRow;
    int q0 = 0;  // first chunk of the region
#pragma unroll
    for (int rg = 0; rg < kI8Regions; ++rg) {
      const int nc = I8Raw<T>::chunks(rg);
      if (nc == 0) continue;
      const int2 reg = I8Raw<T>::region(rg, k0, K);
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(grow + reg.x) & ~uintptr_t(15);
      const int n = static_cast<int>(((reinterpret_cast<uintptr_t>(grow + reg.x) + reg.y + 15) & ~uintptr_t(15)) - a0) / 16;
#pragma unroll
      for (int c = 0; c < nc; ++c)
        if (((q0 + c) & 1) == h && c < n) cp_async_16(raw + 16 * (q0 + c), reinterpret_cast<const void *>(a0 + 16 * c));
      q0 += nc;
    }
  }
  const int c = tid >> 2, g = tid & 3;
  const bool live = xrow >= 0 && k0 + 16 * g < K;
  uint16_t *b = reinterpret_cast<uint16_t *>(smem + L::kB) + (st * kBN + c) * kLd8 + g * 8;
  if (live)
    cp_async_16(b, Xq + static_cast<int64_t>(xrow) * K + k0 + 16 * g);  // K % 32 == 0: aligned
  else
    *reinterpret_cast<uint4 *>(b) = make_uint4(0u, 0u, 0u, 0u);
  if (g < 2) {
    float2 *xs = reinterpret_cast<float2 *>(smem + L::kXs) + (st * kBN + c) * kGroups + 2 * g;
    if (xrow >= 0 && k0 + 32 * g < K)  // both groups (K % 32 == 0); 16-byte aligned: K / 16 is even
      cp_async_16(xs, Xs + static_cast<int64_t>(xrow) * (K / 16) + k0 / 16 + 2 * g);
    else
      *reinterpret_cast<uint4 *>(xs) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The shared tiles of one K step. sA[row][k] / sB[col][k]: int8 weights / activations.
// sSc[row][g]: integer scale of k16 group g; sD[row][s]: f16 pair (d, dmin) of sub-block s;
// sC[col][g]: c. sMA[row][g] / sMB[col][g]: m / X of k16 group g of the 256-block (f16).
// sX[col][g]: Q4_1 / Q5_1: the activations' Q8_1 s of the 32-block at group g = 2 s (quant_extra.cu).
struct I8Tiles {
  uint16_t (*sA)[kLd8];
  uint16_t (*sB)[kLd8];
  int8_t (*sSc)[kGroups];
  uint32_t (*sD)[kSubs];
  float (*sC)[kSld];
  uint16_t (*sMA)[kMinLd];
  uint16_t (*sMB)[kMinLd];
  float (*sX)[kSld];
};

template <DType T> __device__ __forceinline__ I8Tiles i8_tiles(uint8_t *smem, int st) {
  using L = I8Smem<T>;
  return I8Tiles{reinterpret_cast<uint16_t(*)[kLd8]>(smem + L::kA),
                 reinterpret_cast<uint16_t(*)[kLd8]>(smem + L::kB) + st * kBN,
                 reinterpret_cast<int8_t(*)[kGroups]>(smem + L::kSc),
                 reinterpret_cast<uint32_t(*)[kSubs]>(smem + L::kD),
                 reinterpret_cast<float(*)[kSld]>(smem + L::kC),
                 reinterpret_cast<uint16_t(*)[kMinLd]>(smem + L::kMA),
                 reinterpret_cast<uint16_t(*)[kMinLd]>(smem + L::kMB),
                 reinterpret_cast<float(*)[kSld]>(smem + L::kX)};
}

// Decodes stage st of K step k0 (s4: its place in its 256-block) into the step tiles:
// thread -> (row tid / 2, sub-block tid % 2) of the weights (zero past M and K, as the
// Q4_0 / Q8_0 K tail), (column tid / 4, group tid % 4) of the activation scales (the min
// integers and sums go to the step's 4 groups of the 256-block tiles).
template <DType T> __device__ __forceinline__ void decode_step(uint8_t *smem, int st, const I8Tiles &t, const uint8_t *We,
                                                               int64_t row_bytes, int row0, int M, int K, int k0, int s4) {
  using L = I8Smem<T>;
  const int tid = threadIdx.x, r = tid >> 1, h = tid & 1, c = tid >> 2, g = tid & 3;
  I8Weights w;
  if (row0 + r < M && k0 + 32 * h < K) {
    // Region rg's first byte: its chunks' slot plus its global address modulo 16.
    const uintptr_t grow = reinterpret_cast<uintptr_t>(We + static_cast<int64_t>(row0 + r) * row_bytes);
    const uint8_t *raw = smem + L::kRaw + (st * kBM + r) * L::kRawRow;
    const uint8_t *p[kI8Regions];
    int q0 = 0;
#pragma unroll
    for (int rg = 0; rg < kI8Regions; ++rg) {
      const int2 reg = I8Raw<T>::chunks(rg) ? I8Raw<T>::region(rg, k0, K) : make_int2(0, 0);
      p[rg] = raw + 16 * q0 + ((grow + static_cast<uintptr_t>(reg.x)) & 15u);
      q0 += I8Raw<T>::chunks(rg);
    }
    stage_i8_regions<T>(p, k0, h, w);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w.w[i] = 0;
    w.scm = w.dm = 0;
  }
  uint4 *a = reinterpret_cast<uint4 *>(&t.sA[r][h * 16]);
  a[0] = make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
  a[1] = make_uint4(w.w[4], w.w[5], w.w[6], w.w[7]);
  *reinterpret_cast<uint16_t *>(&t.sSc[r][2 * h]) = static_cast<uint16_t>(w.scm);  // the two int8 scales
  t.sD[r][h] = w.dm;
  const float2 xs = reinterpret_cast<const float2 *>(smem + L::kXs)[(st * kBN + c) * kGroups + g];
  t.sC[c][g] = xs.x;
  if constexpr (i8_min32<T>) t.sX[c][g] = xs.y;
  if constexpr (has_min<T>) {
    const float m = static_cast<float>((w.scm >> 16) & 0xFFu);  // m <= 63, |X| <= 2032: exact in f16
    *reinterpret_cast<uint32_t *>(&t.sMA[r][4 * s4 + 2 * h]) = pack2<false>(m, m);
    t.sMB[c][4 * s4 + g] = __half_as_ushort(__float2half_rn(xs.y));
  }
}

// The sub-blocks [s0, s1) of every K step a warp multiplies, and whether it adds the min
// terms: all of them, except in narrow column tiles (<= 32 columns), where both warp
// groups take columns 0-31, group 0 the first sub-block of each step (and the min terms),
// group 1 the second, and add_group_sums joins them at the end.
struct SubRange {
  int s0, s1;
  bool mins;
};

// K-quants, sub-block s of a K step: I[mi][ni] += sc S (Q6_K: sc0 S0 + sc1 S1 per two k16
// halves). One 16-row A fragment at a time keeps the registers of the integer sums affordable.
template <DType T> __device__ __forceinline__ void block_sum_sub(int (&I)[2][4][4], const I8Tiles &t, const WarpTile &wt, int s) {
  const int lane = wt.lane, g = lane >> 2;
  constexpr bool per16 = i8_per16<T>;
  {
    uint32_t b[4][2];
    load_b_frags<kLd8>(b, t.sB, wt.wn, s * 16, lane);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      uint32_t a[4];
      load_a_frag<kLd8>(a, t.sA, wt.wm + 16 * mi, s * 16, lane);
      int sc[2][2];  // [rows g, g + 8][k16 half]
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 2; ++k) sc[h][k] = t.sSc[wt.wm + 16 * mi + g + 8 * h][2 * s + k];  // sign-extending load
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        if (ni * 8 >= wt.n_live) continue;  // warp-uniform; padding columns only
        if constexpr (per16) {
          int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
          mma_s8_k16(s0, a[0], a[1], b[ni][0]);
          mma_s8_k16(s1, a[2], a[3], b[ni][1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) I[mi][ni][e] += sc[e >> 1][0] * s0[e] + sc[e >> 1][1] * s1[e];
        } else {
          int sum[4] = {0, 0, 0, 0};
          mma_s8_k32(sum, a, b[ni]);
#pragma unroll
          for (int e = 0; e < 4; ++e) I[mi][ni][e] += sc[e >> 1][0] * sum[e];
        }
      }
    }
  }
}

template <DType T>
__device__ __forceinline__ void block_sum_step(int (&I)[2][4][4], const I8Tiles &t, const WarpTile &wt, const SubRange &sr) {
  if constexpr (i8_per16<T>) {
#pragma unroll 1  // one sub-block after the other: Q6_K's two sums and scales would spill
    for (int s = sr.s0; s < sr.s1; ++s) block_sum_sub<T>(I, t, wt, s);
  } else {
#pragma unroll
    for (int s = 0; s < kSubs; ++s)
      if (s >= sr.s0 && s < sr.s1) block_sum_sub<T>(I, t, wt, s);  // warp-uniform
  }
}

// K-quants, after the last K step of a 256-block: fold_sums with the operands from the step
// tiles. c is the Q8_K block's (the same in every group of the step).
template <DType T>
__device__ __forceinline__ void fold_block(float (&acc)[2][4][4], int (&I)[2][4][4], const I8Tiles &t, const WarpTile &wt, bool mins) {
  const int lane = wt.lane, g = lane >> 2, tq = lane & 3;
  float2 dd[2][2];  // (d, dmin) of rows g, g + 8 of each 16-row tile
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) dd[mi][h] = i8_d_dmin<T>(t.sD[wt.wm + 16 * mi + g + 8 * h][0]);
  uint32_t am[2][4] = {}, bm[4][2] = {};
  if constexpr (has_min<T>)
    if (mins) load_frags_k16<kMinLd>(am, bm, t.sMA, t.sMB, wt.wm, wt.wn, 0, lane);
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    if (ni * 8 >= wt.n_live) continue;  // warp-uniform; padding columns only
    float c[2];  // of this thread's columns 2 tq, 2 tq + 1
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) c[cc] = t.sC[wt.wn + ni * 8 + 2 * tq + cc][0];
    fold_sums<has_min<T>>(acc, I, ni, dd, am, bm[ni], c, mins);
  }
}

// Q4_0 / Q8_0 / MXFP4 and the extra 32-block types, one K step: per sub-block acc += S (d c)
// (weight and Q8_0 scales per 32), Q4_1 / Q5_1 then + m s (the CPU's m * Q8_1 s).
template <DType T>
__device__ __forceinline__ void fold_per_sub(float (&acc)[2][4][4], const I8Tiles &t, const WarpTile &wt, const SubRange &sr) {
  const int lane = wt.lane, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int s = 0; s < kSubs; ++s) {
    if (s < sr.s0 || s >= sr.s1) continue;  // warp-uniform
    uint32_t a[2][4], b[4][2];
    load_frags_k16<kLd8>(a, b, t.sA, t.sB, wt.wm, wt.wn, s * 16, lane);
    float2 d[2][2];  // (d, m)
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) d[mi][h] = i8_d_dmin<T>(t.sD[wt.wm + 16 * mi + g + 8 * h][s]);
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      if (ni * 8 >= wt.n_live) continue;
      float c[2], xs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        c[cc] = t.sC[wt.wn + ni * 8 + 2 * tq + cc][2 * s];
        if constexpr (i8_min32<T>) xs[cc] = t.sX[wt.wn + ni * 8 + 2 * tq + cc][2 * s];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        int sum[4] = {0, 0, 0, 0};
        mma_s8_k32(sum, a[mi], b[ni]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = fmaf(static_cast<float>(sum[e]), d[mi][e >> 1].x * c[e & 1], acc[mi][ni][e]);
          if constexpr (i8_min32<T>) v = fmaf(d[mi][e >> 1].y, xs[e & 1], v);
          acc[mi][ni][e] = v;
        }
      }
    }
  }
}

// grid: (ceil(M / 128), column tiles, K splits). Split z sums K range [z k_len, (z + 1)
// k_len) (k_len a multiple of 256, K without a split) into Y + z y_split. Dynamic shared
// memory: I8Smem<T>::kBytes.
template <DType T>
__global__ void __launch_bounds__(kThreads, 2) mmq_i8_kernel(const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                                                             const int8_t *Xq, const float2 *Xs, float *Y, int ncols, const int4 *tiles,
                                                             const int2 *entries, int k_len, int64_t y_split) {
#if MOE_CUDA_TENSOR_CORE_CODE
  extern __shared__ __align__(128) uint8_t mmq_i8_smem[];
  __shared__ int s_xrow[kBN], s_yrow[kBN];
  uint8_t *smem = mmq_i8_smem;
  constexpr int S = kStages<T>;

  // Launched with launch_pdl: before pdl_wait only the dense product's first weights are
  // asked of L2 (a MatMulId's expert comes from the routing tables, written earlier). The
  // trigger waits for the end of the K loop: MoE grids run several waves, and a dependent
  // grid scheduled early would hold SM slots while it waits.
  const int row0 = blockIdx.x * kBM, kz0 = blockIdx.z * k_len, kz1 = min(K, kz0 + k_len);
  if (tiles == nullptr)
#pragma unroll
    for (int j = 0; j < kPrefetchSteps; ++j) prefetch_weights_l2(W, row_bytes, row0, M, K, kz0 + j * kBK);
  pdl_wait();

  const ColTile ct = begin_col_tile(ncols, tiles, entries, s_xrow, s_yrow);
  const int cnt = ct.cnt, tid = threadIdx.x;
  if (cnt <= 0) return;

  const uint8_t *We = W + ct.expert * expert_bytes;
  const int xrow = s_xrow[tid >> 2];

  WarpTile wt = warp_tile(cnt, row0, M);
  const bool narrow = cnt <= kBN / 2;  // block-uniform
  const int grp = tid >> 7;             // warp group: column half, or sub-block in narrow tiles
  if (narrow) {
    wt.wn = 0;
    wt.n_live = cnt;
    wt.live = row0 + wt.wm < M;
  }
  const SubRange sr = narrow ? SubRange{grp, grp + 1, grp == 0} : SubRange{0, kSubs, true};
  float acc[2][4][4];
  zero_tile(acc);
  int I[2][4][4];  // K-quants: integer sums of the current 256-block
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) I[mi][ni][e] = 0;

  // cp.async pipeline: step i's raw weight bytes and activations land in stage i % S, S - 1
  // steps ahead (one commit group per step, empty past the end). Per step: wait for this
  // thread's copies of step i, barrier A (everyone's have landed; everyone is done with step
  // i - 1, whose stage the next copies overwrite, and with the decoded tiles), issue step
  // i + S - 1, decode stage i into the step tiles, barrier B, mma.
  const int n_steps = (kz1 - kz0 + kBK - 1) / kBK;
  auto issue = [&](int i) {
    if (i < n_steps)
      issue_step_copies<T>(smem, i % S, We, row_bytes, row0, M, Xq, Xs, xrow, K, kz0 + i * kBK);
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);
  for (int i = 0; i < n_steps; ++i) {
    const int k0 = kz0 + i * kBK, s4 = (k0 / kBK) & 3;  // K step within its 256-block
    const I8Tiles tl = i8_tiles<T>(smem, i % S);
    cp_async_wait<S - 2>();
    __syncthreads();  // A
    issue(i + S - 1);
    prefetch_weights_l2(We, row_bytes, row0, M, K, k0 + kPrefetchSteps * kBK);
    decode_step<T>(smem, i % S, tl, We, row_bytes, row0, M, K, k0, s4);
    __syncthreads();  // B
    if (wt.live) {
      if constexpr (i8_block_sum<T>) {
        block_sum_step<T>(I, tl, wt, sr);
        if (s4 == 3) fold_block<T>(acc, I, tl, wt, sr.mins);  // K and k_len are multiples of 256
      } else {
        fold_per_sub<T>(acc, tl, wt, sr);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups are left
  pdl_trigger();

  static_assert(kBM * kLd8 * 2 >= 16 * kThreads / 2 * sizeof(float), "add_group_sums: 16 floats per thread of group 1 in sA");
  if (narrow) {
    __syncthreads();  // every warp is done with the tiles
    add_group_sums(acc, reinterpret_cast<float *>(smem + I8Smem<T>::kA), wt);
  }
  if (!wt.live || (narrow && grp == 1)) return;
  store_warp_tile(acc, Y + blockIdx.z * y_split, s_yrow, M, cnt, row0 + wt.wm, wt.wn, wt.lane);
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

// Y[i] = the sum of the n_split partial results part[z n + i] in the order of z (launch_pdl).
__global__ void sum_k_splits_kernel(const float *part, int64_t n, int n_split, float *Y) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = part[i];
    for (int z = 1; z < n_split; ++z) s += part[z * n + i];
    Y[i] = s;
  }
}

// K range of a split: whole 256-blocks (a K-quant block folds inside one split).
int split_len(int K, int k_splits) { return (K / 256 + k_splits - 1) / k_splits * 256; }

// Test hook: sub-block s of `row` three ways, dequant32 into w[32 s ..], unpack32 into
// q[32 s ..] and ab[4 s ..] = (a0, a1, b0, b1), and the kernel's int8 staging decoded back
// to weights into staged[32 s ..] (with the kernel's f32 operations: (d sc) q - dmin m).
// The extra types: w from dequant_sub (quant_extra_decode.cuh), q and ab untouched, and the
// staged weights (d k) sc q + m.
template <DType T> __global__ void i8_unpack_check_kernel(const uint8_t *row, int n_sub, float *w, int *q, float *ab, float *staged) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n_sub) return;
  if constexpr (i8_extra<T>) {
    dequant_sub<T>(row, s, w + 32 * s);
  } else {
    dequant32<T>(row, s, w + 32 * s);
    unpack32<T>(row, s, q + 32 * s, ab + 4 * s, ab + 4 * s + 2);
  }
  I8Weights o;
  stage_i8<T>(row, s, o);
  const float2 dm = i8_d_dmin<T>(o.dm);
  const float d = dm.x, dmin = dm.y, m = static_cast<float>((o.scm >> 16) & 0xFFu);
  for (int l = 0; l < 32; ++l) {
    const float v = static_cast<float>(i8_byte(o.w[l / 4], l % 4));
    const float ds = d * static_cast<float>(i8_byte(o.scm, l / 16));
    staged[32 * s + l] = i8_extra<T> ? ds * v + dmin : ds * v - dmin * m;
  }
}

}  // namespace

namespace {

// Shared memory a launch of the kernels takes beyond their dynamic part: the static row tables
// (s_xrow, s_yrow: 512 B), with room to spare.
constexpr int kI8SmemStatic = 2 * 1024;
constexpr bool i8_fits(int dynamic_bytes, int optin) { return dynamic_bytes + kI8SmemStatic <= optin; }

// The kernels for T in the order launch_i8 prefers them, with their dynamic shared memory.
// Q4_K from raw fragments (mmq_q4k_raw.cuh; 16-byte aligned weights, true of every device
// tensor) needs more than the 99 KB of sm_86 / sm_89 / sm_120: there the generic kernel.
template <DType T> constexpr int i8_raw_bytes() {
  if constexpr (T == DType::Q4_K) return Q4kRawSmem<kQ4kRawStages>::kBytes;
  else if constexpr (T == DType::Q6_K) return Q6kRawSmem::kBytes;
  else return 0;  // none
}
template <DType T> constexpr bool i8_any_fits(int optin) {
  return (i8_raw_bytes<T>() > 0 && i8_fits(i8_raw_bytes<T>(), optin)) || i8_fits(I8Smem<T>::kBytes, optin);
}

// The kernel needs more than the 48 KB of shared memory a launch gets by default: raised on
// every launch (cheap, and allowed while a CUDA graph is captured).
// Q4_K takes the kernel from raw fragments where it fits (mmq_q4k_raw.cuh; its copies need 16-byte
// aligned weights, true of every device tensor), and
// Q6_K its own (mmq_q6k_raw.cuh; 2-byte aligned weights). Two blocks of the Q4_K raw kernel
// (114,432 B each + 1.5 KB static and reserved) fit an sm_90 SM only in its largest
// shared-memory carveout (228 KB; the next, 196 KB, holds one; Q6_K's 2 x 99,840 B fit it):
// asked for explicitly (a hint the driver may also reach by itself).
template <DType T>
void launch_i8(dim3 grid, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M, const int8_t *Xq,
               const float2 *Xs, float *Y, int ncols, const int4 *tiles, const int2 *entries, int k_len, int64_t y_split) {
  auto go = [&](auto kernel, int bytes, bool max_shared) {
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (max_shared)
      MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    launch_pdl(kernel, grid, dim3(kThreads), bytes, s, W, row_bytes, expert_bytes, K, M, Xq, Xs, Y, ncols, tiles, entries, k_len, y_split);
  };
  const int optin = s.smem_optin;  // the backend's (an emulated device's where it emulates one)
  if constexpr (T == DType::Q4_K)
    if ((reinterpret_cast<uintptr_t>(W) & 15u) == 0 && i8_fits(i8_raw_bytes<T>(), optin))
      return go(mmq_q4k_raw_kernel<T, kQ4kRawStages>, i8_raw_bytes<T>(), true);
  if constexpr (T == DType::Q6_K)
    if ((reinterpret_cast<uintptr_t>(W) & 1u) == 0 && i8_fits(i8_raw_bytes<T>(), optin)) return go(mmq_q6k_raw_kernel<T>, i8_raw_bytes<T>(), false);
  // mmq_i8_kernel reads Q4_K / Q5_K nibbles as 16-byte vectors too (mmq_i8_weights.cuh): a
  // tensor placed otherwise (a test at a 2-byte offset, 2026-12-01) would fault the context.
  if constexpr (T == DType::Q4_K || T == DType::Q5_K)
    if ((reinterpret_cast<uintptr_t>(W) & 15u) != 0) fail(Status::Internal, "CUDA int8 MMQ: %s weights at %p are not 16-byte aligned", dtype_name(T), static_cast<const void *>(W));
  // cuda_tensor_core_gemm keeps products off this GEMM where no kernel fits; a misaligned
  // Q6_K tensor on a 99 KB device would need the generic one, which does not.
  if (!i8_fits(I8Smem<T>::kBytes, optin))
    fail(Status::Unsupported, "CUDA int8 MMQ: the %s kernel needs %d bytes of shared memory per block, the device grants %d", dtype_name(T),
         I8Smem<T>::kBytes + kI8SmemStatic, optin);
  go(mmq_i8_kernel<T>, I8Smem<T>::kBytes, false);
}

}  // namespace

bool cuda_mmq_int8_type(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q8_0: case DType::MXFP4: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

#define MOE_MMQ_I8_BASE_TYPES(X) X(DType::Q4_0) X(DType::Q8_0) X(DType::MXFP4) X(DType::Q4_K) X(DType::Q5_K) X(DType::Q6_K)
#define MOE_MMQ_I8_EXTRA_TYPES(X)                                                                                        \
  X(DType::Q4_1) X(DType::Q5_0) X(DType::Q5_1) X(DType::IQ4_NL) X(DType::IQ4_XS) X(DType::IQ3_S) X(DType::IQ3_XXS) \
  X(DType::IQ2_S) X(DType::IQ2_XS) X(DType::IQ2_XXS) X(DType::IQ1_S) X(DType::IQ1_M)
#define MOE_MMQ_I8_TYPES(X) MOE_MMQ_I8_BASE_TYPES(X) MOE_MMQ_I8_EXTRA_TYPES(X)

bool cuda_mmq_i8_extra_gemm(DType t, const CudaPaths &paths) {
  if (!paths.tensor_cores) return false;
#define MOE_MMQ_I8_EXTRA_FITS(TY) \
  case TY: return i8_fits(I8Smem<TY>::kBytes, paths.smem_optin);
  switch (t) {
    MOE_MMQ_I8_EXTRA_TYPES(MOE_MMQ_I8_EXTRA_FITS)
    default: return false;
  }
#undef MOE_MMQ_I8_EXTRA_FITS
}

bool cuda_tensor_core_gemm(DType t, const CudaPaths &paths) {
  if (!paths.tensor_cores || !(cuda_mma_type_supported(t) || cuda_mmq_type_supported(t))) return false;
  if (!cuda_mmq_int8_type(t)) return true;  // the f16 MMA / MMQ kernels: static shared memory within 48 KB
#define MOE_MMQ_I8_FITS(TY) \
  case TY: return i8_any_fits<TY>(paths.smem_optin);
  switch (t) {
    MOE_MMQ_I8_BASE_TYPES(MOE_MMQ_I8_FITS)
    default: return false;
  }
#undef MOE_MMQ_I8_FITS
}

int mmq_i8_k_splits(int64_t K, int64_t M, int64_t ncols, int n_sm) {
  if (K % 256 != 0) return 1;
  const int64_t blocks = (M + kBM - 1) / kBM * ((ncols + kBN - 1) / kBN);
  const int64_t want = 2 * static_cast<int64_t>(n_sm) / std::max<int64_t>(1, blocks);  // 2 blocks per SM
  const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({kMaxKSplits, K / 256, want})));
  return (static_cast<int>(K) + split_len(static_cast<int>(K), splits) - 1) / split_len(static_cast<int>(K), splits);  // none empty
}

void launch_mmq_i8_matmul(DType t, const LaunchStream &s, const uint8_t *W, int64_t row_bytes, int64_t expert_bytes, int K, int M,
                          const int8_t *Xq, const float2 *Xs, float *Y, int ncols, const int4 *tiles, const int2 *entries,
                          int n_col_tiles, float *part, int k_splits) {
  if (n_col_tiles <= 0 || M <= 0) return;
  const bool split = k_splits > 1 && part != nullptr && tiles == nullptr && K % 256 == 0;
  const int k_len = split ? split_len(K, k_splits) : K;
  const int nz = split ? (K + k_len - 1) / k_len : 1;
  const int64_t y_split = split ? static_cast<int64_t>(ncols) * M : 0;
  float *out = split ? part : Y;
  const dim3 grid(static_cast<unsigned>((M + kBM - 1) / kBM), static_cast<unsigned>(n_col_tiles), static_cast<unsigned>(nz));
#define MOE_MMQ_I8_CASE(TY)                                                                                                  \
  case TY:                                                                                                                   \
    launch_i8<TY>(grid, s, W, row_bytes, expert_bytes, K, M, Xq, Xs, out, ncols, tiles, entries, k_len, y_split);            \
    break;
  switch (t) {
    MOE_MMQ_I8_TYPES(MOE_MMQ_I8_CASE)
    default: fail(Status::Internal, "CUDA int8 MMQ matmul: type %s not dispatched", dtype_name(t));
  }
#undef MOE_MMQ_I8_CASE
  if (split) launch_sum_k_splits(part, y_split, nz, Y, s);
}

void launch_sum_k_splits(const float *part, int64_t n, int n_split, float *Y, const LaunchStream &s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  launch_pdl(sum_k_splits_kernel, dim3(blocks), dim3(256), 0, s, part, n, n_split, Y);
}

void cuda_i8_unpack_check_launch(DType t, const uint8_t *d_row, int n_sub, float *d_w, int *d_q, float *d_ab, float *d_staged,
                                 cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((n_sub + 63) / 64);
#define MOE_I8_CHECK_CASE(TY) \
  case TY: i8_unpack_check_kernel<TY><<<blocks, 64, 0, s>>>(d_row, n_sub, d_w, d_q, d_ab, d_staged); break;
  switch (t) {
    MOE_MMQ_I8_TYPES(MOE_I8_CHECK_CASE)
    default: fail(Status::Internal, "int8 unpack check: type %s not dispatched", dtype_name(t));
  }
#undef MOE_I8_CHECK_CASE
  MOE_CUDA_LAUNCH_CHECK("i8_unpack_check_kernel");
}
#undef MOE_MMQ_I8_TYPES
#undef MOE_MMQ_I8_EXTRA_TYPES
#undef MOE_MMQ_I8_BASE_TYPES

}  // namespace moe
