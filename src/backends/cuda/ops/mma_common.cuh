// Pieces shared by the two tensor-core GEMMs of MatMul / MatMulId (matmul_mma.cu: weights
// dequantized to f16 / bf16; matmul_mmq.cu: quantized weights as exact integers): the block
// tiling, the column tile of a block (dense range or one routing tile), the mma.sync and
// ldmatrix wrappers, and the output scatter.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "backends/cuda/ops/matmul_mma.h"

namespace moe {
namespace mma_tile {

constexpr int kBM = 128;       // weight rows per block
constexpr int kBN = kMmaCols;  // columns per block
constexpr int kBK = 64;        // K per step: two 32-wide sub-blocks per weight row
constexpr int kThreads = 256;  // 8 warps: 4 along the rows x 2 along the columns
// Shared-memory row stride in 16-bit elements. The 16 extra bytes put the 8 rows an
// ldmatrix phase reads (and the rows a quarter-warp stores) on distinct bank quads.
constexpr int kLd = kBK + 8;

static_assert(kThreads == 2 * kBM, "weight loader: one thread per (row, 32-wide half of the K step)");
static_assert(kThreads * 16 == kBN * kBK, "activation loader: 16 elements per thread");

// Two values as one 32-bit operand register, the lower k index in the low half (one
// cvt.rn.{f16,bf16}x2.f32).
template <bool BF> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (BF) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Four 8x8 16-bit matrices; lane l gives the row address of matrix l / 8, row l % 8, and
// receives in r[j] the elements (row l / 4, columns 2 (l % 4), +1) of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t *p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// (ldmatrix_x4_trans and cp_async_commit_wait_all below serve attention_mla.cu.)
// The same with .trans: r[j] holds the elements (rows 2 (l % 4), +1, column l / 4) of
// matrix j, i.e. the B fragment of a row-major [k][n] tile.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t *p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// 16 bytes global -> shared without a register round trip (cp.async.cg: L2 only); complete
// after cp_async_commit_wait_all() (this thread's copies) and a block barrier (everyone's).
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
// 4 bytes likewise (cp.async.ca: 4-byte copies take no .cg), both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void *smem, const void *gmem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory"); }
// The pipelined form (matmul_mmq_i8.cu): close this thread's copies issued since the last
// commit into a group; wait until at most N of its groups are pending (then a barrier).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// d += a (16x16, row-major) * b (16x8, column-major); f32 accumulators.
template <bool BF> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (BF) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Integer products of int8 operands (matmul_mmq_i8.cu), s32 accumulators d += a b, exact.
// m16n8k32: a = 16 x 32 row-major (a[0] rows 0-7 / a[1] rows 8-15 of k 0-15, a[2] / a[3]
// of k 16-31: byte 4 (l % 4) + i of row l / 4 in lane l), b = 32 x 8 column-major (b[0]
// k 0-15, b[1] k 16-31), d as mma16816's. Those are the ldmatrix fragments of load_frags_k16
// on tiles of bytes viewed as 16-bit pairs (kk = byte offset / 2).
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// m16n8k16 on one k16 half of those fragments: (a0, a1, b) = (a[0], a[1], b[0]) for k 0-15,
// (a[2], a[3], b[1]) for k 16-31.
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// This warp's 32 x 32 sub-tile of the block (4 warps along the rows x 2 along the columns):
// rows wm .., columns wn ..; n_live its real columns (if > 0); live is warp-uniform
// (padding-only sub-tiles skip the mma).
struct WarpTile {
  int lane, wm, wn, n_live;
  bool live;
};
__device__ __forceinline__ WarpTile warp_tile(int cnt, int row0, int M) {
  const int warp = threadIdx.x >> 5;
  WarpTile w;
  w.lane = threadIdx.x & 31;
  w.wm = (warp & 3) * 32;
  w.wn = (warp >> 2) * 32;
  w.n_live = cnt - w.wn;
  w.live = w.n_live > 0 && row0 + w.wm < M;
  return w;
}

// A warp's 2 x 4 accumulator fragments (16 x 8 each) set to zero.
__device__ __forceinline__ void zero_tile(float (&acc)[2][4][4]) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;
}

// The A fragment of the 16 x 16 tile at (row r0, column kk) of sA[row][k] (row-major):
// matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) = a0..a3. Ld: the row stride (16-byte multiple).
template <int Ld> __device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const uint16_t (*sA)[Ld], int r0, int kk, int lane) {
  ldmatrix_x4(a, &sA[r0 + (lane & 15)][kk + (lane >> 4) * 8]);
}

// B fragments of four 8-column groups from column wn of sB[col][k] (column-major), two
// groups per ldmatrix: matrices (cols 0-7, k 0-7), (cols 0-7, k 8-15), (cols 8-15, k 0-7),
// (cols 8-15, k 8-15) = b0, b1 of group 2np, then of 2np + 1.
template <int Ld> __device__ __forceinline__ void load_b_frags(uint32_t (&b)[4][2], const uint16_t (*sB)[Ld], int wn, int kk, int lane) {
#pragma unroll
  for (int np = 0; np < 2; ++np) {
    uint32_t r[4];
    ldmatrix_x4(r, &sB[wn + np * 16 + (lane >> 4) * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
    b[2 * np][0] = r[0];
    b[2 * np][1] = r[1];
    b[2 * np + 1][0] = r[2];
    b[2 * np + 1][1] = r[3];
  }
}

// A warp's operands of one k16 step at column kk of the shared tiles: A fragments of its
// two 16-row tiles and B fragments of its four 8-column groups.
template <int Ld>
__device__ __forceinline__ void load_frags_k16(uint32_t (&a)[2][4], uint32_t (&b)[4][2], const uint16_t (*sA)[Ld], const uint16_t (*sB)[Ld],
                                               int wm, int wn, int kk, int lane) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) load_a_frag<Ld>(a[mi], sA, wm + mi * 16, kk, lane);
  load_b_frags<Ld>(b, sB, wn, kk, lane);
}

// d[mi][ni] += the warp's share of one K step (4 k16 mmas) of the shared tiles, skipping
// 8-column groups past n_live.
template <bool BF, int Ld>
__device__ __forceinline__ void mma_k_step(float (&d)[2][4][4], const uint16_t (*sA)[Ld], const uint16_t (*sB)[Ld], const WarpTile &wt) {
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    uint32_t a[2][4], b[4][2];
    load_frags_k16(a, b, sA, sB, wt.wm, wt.wn, kk, wt.lane);
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      if (ni * 8 >= wt.n_live) continue;  // warp-uniform; padding columns only
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) mma16816<BF>(d[mi][ni], a[mi], b[ni]);
    }
  }
}

// Asks L2 for the line holding p (a hint: no fault, nothing waits for it).
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.L2 [%0];\n" : : "l"(p)); }

// Asks L2 for this thread's weight bytes at element k of its row (thread -> row tid / 2,
// half tid % 2 of the K step; row bytes are proportional to K in every layout, so
// k * row_bytes / K lies in the block holding element k). Clamped inside the row.
__device__ __forceinline__ void prefetch_weights_l2(const uint8_t *W, int64_t row_bytes, int row0, int M, int K, int k) {
  const int row = row0 + (threadIdx.x >> 1);
  const int64_t off = static_cast<int64_t>(k + (threadIdx.x & 1) * 32) * row_bytes / K;
  if (row < M && off < row_bytes) asm volatile("prefetch.L2 [%0];\n" : : "l"(W + static_cast<int64_t>(row) * row_bytes + off));
}

// The columns of this block: dense, columns blockIdx.y * kBN ..; MatMulId, routing tile
// blockIdx.y (expert, first entry, count). count <= 0: nothing to do.
struct ColTile {
  int expert, first, cnt;
};
__device__ __forceinline__ ColTile col_tile(int ncols, const int4 *tiles) {
  if (tiles) {
    const int4 tl = tiles[blockIdx.y];
    return {tl.x, tl.y, tl.z};
  }
  const int first = blockIdx.y * kBN;
  return {0, first, min(kBN, ncols - first)};
}

// The block's column tile, and the activation and output row of each of its columns in
// s_xrow / s_yrow (-1 past the count). cnt <= 0 (uniform over the block): nothing loaded,
// no barrier; the kernel returns.
__device__ __forceinline__ ColTile begin_col_tile(int ncols, const int4 *tiles, const int2 *entries, int *s_xrow, int *s_yrow) {
  const ColTile ct = col_tile(ncols, tiles);
  if (ct.cnt <= 0) return ct;
  const int tid = threadIdx.x;
  if (tid < kBN) {
    int2 e = make_int2(-1, -1);
    if (tid < ct.cnt) e = entries ? entries[ct.first + tid] : make_int2(ct.first + tid, ct.first + tid);
    s_xrow[tid] = e.x;
    s_yrow[tid] = e.y;
  }
  __syncthreads();
  return ct;
}

// A warp's 32 x 32 results: accumulator c of (mi, ni) is row g + 8 (c / 2), column
// 2 t + (c % 2) of the 16x8 tile (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void store_warp_tile(const float (&acc)[2][4][4], float *Y, const int *s_yrow, int M, int cnt, int m0, int n0,
                                                int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + mi * 16 + g + 8 * (c >> 1);
        const int n = n0 + ni * 8 + 2 * t + (c & 1);
        if (m < M && n < cnt) Y[static_cast<int64_t>(s_yrow[n]) * M + m] = acc[mi][ni][c];
      }
}

}  // namespace mma_tile
}  // namespace moe
