// Multi-column mat-vec: MatMul with 2..15 activation columns and MatMulId with 2+ tokens below
// the tensor-core thresholds (several sequences decoding together). Memory-bound like the
// one-token mat-vec (matvec.cu): each weight row is read once per tile of up to kMcolCols
// columns and dotted with every column of the tile; for MatMulId a tile is a route tile
// (matmul_route.h), so an expert's rows are read once for the (token, slot) entries routed to
// it (up to 8 per tile). Why not the tensor-core GEMMs: at 2..15 columns their 64-column tiles
// are mostly empty and the reference-order kernels fold column after column (2026-12-03:
// dense Q4_K 25 us per call at 4 columns; docs/perf/cuda.md).
//
// Quantized weights: a warp owns rpc x groups weight rows (rows_per_chunk, groups_per_warp: one
// row where rows are long and few). Per chunk of kMcChunk elements (of one row, or of rpc
// short packed rows, a lane group per row) its lanes issue
// coalesced 16-byte loads of the chunk's GGUF blocks (aligned down and up to 16 bytes: up to
// 15 bytes past a row's end are read, which weight tensors have as padding), store them to
// the warp's shared staging buffer and decode one 32-weight sub-block each with the one-token
// kernels' integer units (matvec_units.cuh) against every column's int8 activations, which
// launch_act_round wrote with the one-token kernels' rounding (the same Q8_0 / Q8_K values).
// The next chunk's loads are in flight during the current chunk's dots.
// Plain weights (F32 / F16 / BF16): a row's K is split over `split` warps of a block (more
// rows per block where the rows are many), activations read and rounded elementwise on the
// fly (no rounding launch), the warps' partial sums added in shared memory in warp order.
//
// PDL (pdl.cuh): MatMul blocks issue their first weight loads (quantized) or an L2 prefetch
// (plain) before pdl_wait; MatMulId blocks wait first (their tiles are the route kernel's).
#include "backends/cuda/ops/matvec_cols.h"

#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/matvec_common.cuh"
#include "backends/cuda/ops/matvec_units.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/quant.cuh"
#include "backends/cuda/ops/ref_math.cuh"

#include <algorithm>

namespace moe {

namespace {

constexpr int kMcWarps = 4;       // quantized: warps per block (small M still spreads over the SMs)
constexpr int kMcChunk = 2048;    // quantized: elements of a row staged at a time (a 2048-long row in one round trip)
constexpr int kMcPlainWarps = 8;  // plain: warps per block
constexpr int kMcMaxGroups = 4;    // quantized: chunk groups per warp at most (groups_per_warp)
constexpr int kMcWarpsPerSm = 32;  // quantized: warps per multiprocessor worth giving one group each

// 16-byte loads per lane for one chunk: its blocks plus <= 30 bytes of alignment cover.
template <DType T> constexpr int mc_loads() { return (kMcChunk / BlockInfo<T>::qk * BlockInfo<T>::bytes + 30 + 511) / 512; }

__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

struct McTile {
  int expert, first, cnt;  // expert (0 for MatMul), first column / route entry, columns
};
__device__ __forceinline__ McTile tile_of(const McolArgs &a) {
  if (a.tiles) {
    const int4 t = a.tiles[blockIdx.y];
    return McTile{t.x, t.y, t.z};
  }
  const int first = static_cast<int>(blockIdx.y) * kMcolCols;
  return McTile{0, first, min(kMcolCols, a.ncols - first)};
}

// Activation row of the tile's column k (columns past cnt repeat the first: valid addresses).
__device__ __forceinline__ int x_row_of(const McolArgs &a, const McTile &t, int k) {
  const int i = t.first + (k < t.cnt ? k : 0);
  return a.entries ? a.entries[i].x : i;
}
__device__ __forceinline__ int y_row_of(const McolArgs &a, const McTile &t, int k) {
  return a.entries ? a.entries[t.first + k].y : t.first + k;
}
// y[o] = v [+ the residual's o]: the product launch's value, or the Add launch's (v + r: one
// float addition, the same bits in either operand order).
__device__ __forceinline__ void store_y(const McolArgs &a, int64_t o, float v) { a.y[o] = a.add ? v + a.add[o] : v; }

// ---- quantized weights ---------------------------------------------------------------------

// The rounded activations of row r's sub-block from element e (a multiple of 32).
__device__ __forceinline__ XSub xsub_at(const McolArgs &a, int r, int e) {
  const int64_t r64 = r;
  const float4 s = __ldg(reinterpret_cast<const float4 *>(a.xs + r64 * (a.K / 16) + e / 16));  // (d, sum_lo, d, sum_hi)
  return XSub{a.xq + r64 * a.K + e, s.x, static_cast<int>(s.y), static_cast<int>(s.w)};
}

// Q2_K / Q3_K have no integer unit (unit_dot's generic form dequantizes to floats): the
// sub-block is dequantized once here for all the columns.
template <DType T> constexpr bool float_unit = T == DType::Q2_K || T == DType::Q3_K;

// acc[k] += the dot of sub-block j of the staged block blk with column k's activations from
// element e, for the tile's cnt columns.
template <DType T, int NC>
__device__ __forceinline__ void sub_dots(const uint8_t *blk, int j, const McolArgs &a, const int (&xr)[NC], int e, int cnt,
                                         float (&acc)[NC]) {
  if constexpr (float_unit<T>) {
    float w[32];
    dequant32<T>(blk, j, w);
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      if (k >= cnt) break;
      const XSub x = xsub_at(a, xr[k], e);
      int xv[8];
      ld_x8(x.q, xv);
      float s = 0.0f;
#pragma unroll
      for (int l = 0; l < 32; ++l) s += w[l] * small_i2f(static_cast<int8_t>(xv[l >> 2] >> (8 * (l & 3))));
      acc[k] += x.d * s;
    }
  } else {
    // (unit_dot's weight words come from shared memory with no store in between: the
    // compiler loads them once for all the columns.)
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      if (k >= cnt) break;
      acc[k] += unit_dot<T>(blk, j, xsub_at(a, xr[k], e));
    }
  }
}

// The sum of v over the warp's aligned groups of n lanes (n a power of two; 32: warp_sum's order).
__device__ __forceinline__ float group_sum(float v, int n) {
  for (int o = n >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// rpc: rows per chunk (1..8; > 1 only for packed rows that fit the staging buffer rpc at a
// time), a group of lpr lanes per row (a power of two, lpr rpc <= 32; lanes past rpc lpr idle
// in the dots); groups: chunk groups of rpc rows per warp, run one after another with the next
// one's loads in flight (a warp owns rpc groups rows).
// NC: columns dotted per pass (kMcolCols, or 4 where tiles hold at most 4: fewer registers for
// the accumulators and activation rows, no spills); a tile of more columns (only from repeated
// ids in a token's slots) runs in passes of NC, re-reading its rows.
template <DType T, int NC>
__global__ void __launch_bounds__(kMcWarps * 32) mcol_quant_kernel(McolArgs a, int rpc, int lpr, int groups) {
  constexpr int QK = BlockInfo<T>::qk, BS = BlockInfo<T>::bytes, NL = mc_loads<T>(), UPB = QK / 32;
  __shared__ __align__(16) uint8_t s_stage[kMcWarps][NL * 512 + 16];  // + 16: ld_words reads a word past its span
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (static_cast<int>(blockIdx.x) * kMcWarps + warp) * rpc * groups;
  const bool dense = a.tiles == nullptr;
  if (!dense) pdl_enter();
  const McTile whole = tile_of(a);
  if (whole.cnt <= 0 || row0 >= a.M) {  // warp-uniform; no block barrier follows
    if (dense) pdl_enter();
    return;
  }
  for (int cg = 0; cg < whole.cnt; cg += NC) {
  const McTile t{whole.expert, whole.first + cg, min(NC, whole.cnt - cg)};
  const int nrows = min(rpc * groups, a.M - row0), sub = lane / lpr, part = lane % lpr;
  const int cpr = rpc > 1 ? 1 : (a.K + kMcChunk - 1) / kMcChunk;  // chunks per group
  const int nchunks = (nrows + rpc - 1) / rpc * cpr;
  const uint8_t *wbase = a.w + static_cast<int64_t>(t.expert) * a.eb + static_cast<int64_t>(row0) * a.rb;
  uint4 buf[NL];
  int head = 0;
  // Chunk c (group c / cpr, elements from (c % cpr) kMcChunk) into buf: its covering 16-byte
  // pieces (unconditional loads, so all issue at once; lanes past the cover re-read its last
  // piece). A group of rpc > 1 rows is one span: the rows are packed.
  auto load = [&](int c) {
    const int g = c / cpr, cs = (c - g * cpr) * kMcChunk;
    const int nbytes = min(rpc, nrows - g * rpc) * (min(kMcChunk, a.K - cs) / QK * BS);
    const uint8_t *p = wbase + static_cast<int64_t>(g * rpc) * a.rb + static_cast<int64_t>(cs / QK) * BS;
    const uint4 *p16 = reinterpret_cast<const uint4 *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
    head = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15);
    const int np = (head + nbytes + 15) >> 4;
#pragma unroll
    for (int i = 0; i < NL; ++i) buf[i] = __ldg(p16 + min(lane + 32 * i, np - 1));
  };
  load(0);  // K > 0 (shape_of)
  if (dense && cg == 0) pdl_enter();
  int xr[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) xr[k] = x_row_of(a, t, k);
  float acc[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) acc[k] = 0.0f;
  uint8_t *stage = s_stage[warp];
  for (int c = 0; c < nchunks; ++c) {
    const int g = c / cpr, cs = (c - g * cpr) * kMcChunk;
    const int h = head, ne = min(kMcChunk, a.K - cs), row = row0 + g * rpc + sub;  // this lane's row
    const bool mine = sub < rpc && row < row0 + nrows;  // (a short last group's missing rows idle)
    __syncwarp();  // the previous chunk's reads of the staging buffer are done
#pragma unroll
    for (int i = 0; i < NL; ++i) reinterpret_cast<uint4 *>(stage)[lane + 32 * i] = buf[i];
    __syncwarp();
    if (c + 1 < nchunks) load(c + 1);
    if (mine) {
      const uint8_t *cb = stage + h + sub * (ne / QK * BS);
      for (int u = part; u < ne / 32; u += lpr) sub_dots<T, NC>(cb + (u / UPB) * BS, u % UPB, a, xr, cs + 32 * u, t.cnt, acc);
    }
    if (c - g * cpr == cpr - 1) {  // the group's rows are done
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        if (k >= t.cnt) break;
        const float v = group_sum(acc[k], lpr);
        if (part == 0 && mine) store_y(a, static_cast<int64_t>(y_row_of(a, t, k)) * a.M + row, v);
        acc[k] = 0.0f;
      }
    }
  }
  }
}

// ---- Q4_K on the int8 tensor cores ---------------------------------------------------------
//
// The dp4a kernel above decodes every 32 weights once per column and loads each column's
// activations per sub-block: ~5 thread instructions per weight and column, issue- and
// latency-bound at 4 columns (2026-12-04, ncu: dense Q4_K 4096 x 2048 in 15.2 us, 5.8 M warp
// instructions, ~300 GB/s). Here a warp takes 16 weight rows (an m16 tile) against the tile's
// <= 8 columns (n8) over a range of 256-blocks, and per block:
// - the 8 sub-blocks' integer dot products are 8 mma.m16n8k32.s8 (exact). The k slots of A
//   and B are permuted alike: lane quad q holds weights 8q .. 8q + 7 of a sub-block (slots 4q..,
//   16 + 4q..), so one 8-byte load per row gives a lane both sub-blocks of a 32-byte qs pair
//   (low nibbles: sub-block 2j, high: 2j + 1) and one 8-byte load per column its activations;
// - I = sum_s sc_s S_s in int32 (|I| <= 8 * 63 * 32 * 15 * 127 < 2^31), the mins' term
//   Mn = sum_g m_g X_g by one f16 mma on the per-16 activation sums (exact: m <= 63, |X| <= 2032);
// - one f32 fold: acc += dx (d I - dmin Mn), the CPU's w = d sc q - dmin m per sub-block.
// A row's K may be split over S warps of a block (few rows: the dense projections), whose
// partial sums are added in warp order in shared memory. Weights 16-byte aligned (host-checked).

constexpr int kMmWarps = 4;  // warps per block: kMmWarps / S row tiles x S K parts

// A lane's bytes of one row's 256-block: the header (d, dmin, 12 scale bytes) and, of each
// 32-byte qs pair j, the 8 bytes at 8q.
struct Q4kLane {
  uint4 h;
  uint2 p[4];
};
__device__ __forceinline__ Q4kLane q4k_lane(const uint8_t *blk, int q) {
  Q4kLane v;
  v.h = __ldg(reinterpret_cast<const uint4 *>(blk));
#pragma unroll
  for (int j = 0; j < 4; ++j) v.p[j] = __ldg(reinterpret_cast<const uint2 *>(blk + 16 + 32 * j + 8 * q));
  return v;
}
// The 6-bit scales (m: mins) of sub-blocks 0..3 (lo) and 4..7 (hi), a byte each.
struct Q4kScales {
  uint32_t sc_lo, sc_hi, m_lo, m_hi;
};
__device__ __forceinline__ Q4kScales q4k_scales(const uint4 &h) {
  return Q4kScales{h.y & 0x3F3F3F3Fu, (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u), h.z & 0x3F3F3F3Fu,
                   ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u)};
}
__device__ __forceinline__ int byte_of(uint32_t w, int i) { return static_cast<int>((w >> (8 * i)) & 0xFFu); }
__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
// (d, dmin) of a block header's first word.
__device__ __forceinline__ float2 q4k_d(uint32_t w) {
  __half2 v;
  memcpy(&v, &w, 4);
  return __half22float2(v);
}

// One 256-block of rows (r0, r1) = (row g, row g + 8) of the tile against column g's activations
// of that block (xq: its 256 integers, xs: its 16 (scale, sum) pairs); I / Mn per C fragment.
__device__ __forceinline__ void q4k_block_mma(const Q4kLane &c0, const Q4kLane &c1, const int8_t *xq, const float2 *xs, int q,
                                              int (&I)[4], float (&Mn)[4]) {
  const Q4kScales s0 = q4k_scales(c0.h), s1 = q4k_scales(c1.h);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint2 xl = __ldg(reinterpret_cast<const uint2 *>(xq + 64 * j + 8 * q));
    const uint2 xh = __ldg(reinterpret_cast<const uint2 *>(xq + 64 * j + 32 + 8 * q));
    const uint32_t bl[2] = {xl.x, xl.y}, bh[2] = {xh.x, xh.y};
    const uint32_t al[4] = {c0.p[j].x & 0x0F0F0F0Fu, c1.p[j].x & 0x0F0F0F0Fu, c0.p[j].y & 0x0F0F0F0Fu, c1.p[j].y & 0x0F0F0F0Fu};
    const uint32_t ah[4] = {(c0.p[j].x >> 4) & 0x0F0F0F0Fu, (c1.p[j].x >> 4) & 0x0F0F0F0Fu, (c0.p[j].y >> 4) & 0x0F0F0F0Fu,
                            (c1.p[j].y >> 4) & 0x0F0F0F0Fu};
    int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
    mma_tile::mma_s8_k32(dl, al, bl);
    mma_tile::mma_s8_k32(dh, ah, bh);
    // sub-blocks 2j (dl) and 2j + 1 (dh); rows g (c0: d[0], d[1]) and g + 8 (c1: d[2], d[3])
    const int sl0 = byte_of(j < 2 ? s0.sc_lo : s0.sc_hi, (2 * j) & 3), sh0 = byte_of(j < 2 ? s0.sc_lo : s0.sc_hi, (2 * j + 1) & 3);
    const int sl1 = byte_of(j < 2 ? s1.sc_lo : s1.sc_hi, (2 * j) & 3), sh1 = byte_of(j < 2 ? s1.sc_lo : s1.sc_hi, (2 * j + 1) & 3);
    I[0] += sl0 * dl[0] + sh0 * dh[0];
    I[1] += sl0 * dl[1] + sh0 * dh[1];
    I[2] += sl1 * dl[2] + sh1 * dh[2];
    I[3] += sl1 * dl[3] + sh1 * dh[3];
  }
  // Mins: A[row][k] = m of sub-block k / 2 (k: the block's 16-groups), B[k][col] = X of group k.
  const float4 xa = __ldg(reinterpret_cast<const float4 *>(xs + 2 * q)), xb = __ldg(reinterpret_cast<const float4 *>(xs + 2 * q + 8));
  const uint32_t bm[2] = {half2_bits(xa.y, xa.w), half2_bits(xb.y, xb.w)};
  const float m0a = static_cast<float>(byte_of(s0.m_lo, q)), m0b = static_cast<float>(byte_of(s0.m_hi, q));
  const float m1a = static_cast<float>(byte_of(s1.m_lo, q)), m1b = static_cast<float>(byte_of(s1.m_hi, q));
  const uint32_t am[4] = {half2_bits(m0a, m0a), half2_bits(m1a, m1a), half2_bits(m0b, m0b), half2_bits(m1b, m1b)};
  mma_tile::mma16816<false>(Mn, am, bm);
}

// Block policies of mcol_mma_kernel: a lane's bytes of one row's 256-block (Lane, load) and the
// block's value per C fragment before the columns' activation scale (value).
struct Q4kMma {
  static constexpr int kBytes = 144;
  using Lane = Q4kLane;
  static __device__ __forceinline__ Lane load(const uint8_t *blk, int q) { return q4k_lane(blk, q); }
  static __device__ __forceinline__ void value(const Lane &c0, const Lane &c1, const int8_t *xq, const float2 *xs, int q, float (&v)[4]) {
    int I[4] = {0, 0, 0, 0};
    float Mn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    q4k_block_mma(c0, c1, xq, xs, q, I, Mn);
    const float2 f0 = q4k_d(c0.h.x), f1 = q4k_d(c1.h.x);
    v[0] = f0.x * static_cast<float>(I[0]) - f0.y * Mn[0];
    v[1] = f0.x * static_cast<float>(I[1]) - f0.y * Mn[1];
    v[2] = f1.x * static_cast<float>(I[2]) - f1.y * Mn[2];
    v[3] = f1.x * static_cast<float>(I[3]) - f1.y * Mn[3];
  }
};

// Q6_K: 210-byte blocks, so words start 2-byte aligned: 4 bytes from the two aligned words
// around them. One scale per 16 weights: a sub-block is two m16n8k16 products (its k16 halves;
// lane quad q holds weights 4q..4q+3 and 16+4q.., of ql (low 4 bits) and qh (high 2 bits) at the
// same offsets), the 6-bit values less 32 as int8, the signed scales applied in int32
// (|I| <= 16 * 128 * 16 * 32 * 127 < 2^31), then v = d I.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  return __funnelshift_r(__ldg(w), __ldg(w + 1), static_cast<uint32_t>(a & 3) * 8);
}
struct Q6kLane {
  uint32_t ql[4][2];  // [64-byte half h, 32-byte quarter]: bytes 4q, 16 + 4q
  uint32_t qh[2][2];  // [half h]: bytes 4q, 16 + 4q of its 32
  uint32_t sc[4];     // the 16 int8 scales
  uint32_t d;         // f16 bits
};
struct Q6kMma {
  static constexpr int kBytes = 210;
  using Lane = Q6kLane;
  static __device__ __forceinline__ Lane load(const uint8_t *blk, int q) {
    Lane v;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v.ql[i][0] = ld_u32_a2(blk + 32 * i + 4 * q);
      v.ql[i][1] = ld_u32_a2(blk + 32 * i + 16 + 4 * q);
      v.sc[i] = ld_u32_a2(blk + 192 + 4 * i);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v.qh[h][0] = ld_u32_a2(blk + 128 + 32 * h + 4 * q);
      v.qh[h][1] = ld_u32_a2(blk + 128 + 32 * h + 16 + 4 * q);
    }
    v.d = __ldg(reinterpret_cast<const uint16_t *>(blk + 208));
    return v;
  }
  // Sub-block (h, g)'s weights less 32, 4 int8 of word w (0: k 0..15 half, 1: 16..31).
  static __device__ __forceinline__ uint32_t weights(const Lane &c, int h, int g, int w) {
    const uint32_t v = ((c.ql[2 * h + (g & 1)][w] >> (4 * (g >> 1))) & 0x0F0F0F0Fu) | (((c.qh[h][w] >> (2 * g)) & 0x03030303u) << 4);
    return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;  // per byte v - 32, no borrow across bytes
  }
  static __device__ __forceinline__ int scale(const Lane &c, int i) { return static_cast<int8_t>(c.sc[i >> 2] >> (8 * (i & 3))); }
  static __device__ __forceinline__ void value(const Lane &c0, const Lane &c1, const int8_t *xq, const float2 *, int q, float (&v)[4]) {
    int I[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int h = s >> 2, g = s & 3;
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      const uint32_t x0 = __ldg(reinterpret_cast<const uint32_t *>(xq + 32 * s + 4 * q));
      const uint32_t x1 = __ldg(reinterpret_cast<const uint32_t *>(xq + 32 * s + 16 + 4 * q));
      mma_tile::mma_s8_k16(lo, weights(c0, h, g, 0), weights(c1, h, g, 0), x0);
      mma_tile::mma_s8_k16(hi, weights(c0, h, g, 1), weights(c1, h, g, 1), x1);
      const int a0 = scale(c0, 2 * s), b0 = scale(c0, 2 * s + 1), a1 = scale(c1, 2 * s), b1 = scale(c1, 2 * s + 1);
      I[0] += a0 * lo[0] + b0 * hi[0];
      I[1] += a0 * lo[1] + b0 * hi[1];
      I[2] += a1 * lo[2] + b1 * hi[2];
      I[3] += a1 * lo[3] + b1 * hi[3];
    }
    const float d0 = __half2float(__ushort_as_half(static_cast<unsigned short>(c0.d)));
    const float d1 = __half2float(__ushort_as_half(static_cast<unsigned short>(c1.d)));
    v[0] = d0 * static_cast<float>(I[0]);
    v[1] = d0 * static_cast<float>(I[1]);
    v[2] = d1 * static_cast<float>(I[2]);
    v[3] = d1 * static_cast<float>(I[3]);
  }
};

// P (pair): gate and up of a SwiGLU (a.w, a.w2: same shape and strides) in one launch, each
// tile's gate and up rows in warps of one block (twice the warps), whose sums meet in shared
// memory; the gate warp of K part 0 writes silu(gate) * up (ref_swiglu: the SwiGLU launch's
// bits). Each matrix's sums are those of its own launch (same S, same order).
template <class B, int S, bool P>
__global__ void __launch_bounds__(kMmWarps * 32 * (P ? 2 : 1), P ? 2 : 4) mcol_mma_kernel(McolArgs a) {
#if MOE_CUDA_TENSOR_CORE_CODE
  constexpr int NM = P ? 2 : 1;  // matrices per block
  __shared__ float s_part[S > 1 || P ? kMmWarps * NM : 1][4][32];  // K parts' (and up's) sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, part = warp % S, mat = (warp / S) % NM;
  const int row0 = (static_cast<int>(blockIdx.x) * (kMmWarps / S) + warp / (S * NM)) * 16;
  const bool dense = a.tiles == nullptr;
  if (!dense) pdl_enter();
  const McTile t = tile_of(a);
  if (t.cnt <= 0) {  // block-uniform, before the barrier
    if (dense) pdl_enter();
    return;
  }
  constexpr int BS = B::kBytes;
  const int nblk = a.K / 256, per = (nblk + S - 1) / S, b0 = min(nblk, part * per), b1 = min(nblk, b0 + per);
  const uint8_t *wb = (mat ? a.w2 : a.w) + static_cast<int64_t>(t.expert) * a.eb;
  // Rows past M load the last row (valid bytes) and write nothing.
  const uint8_t *w0 = wb + static_cast<int64_t>(min(row0 + g, a.M - 1)) * a.rb + static_cast<int64_t>(b0) * BS;
  const uint8_t *w1 = wb + static_cast<int64_t>(min(row0 + g + 8, a.M - 1)) * a.rb + static_cast<int64_t>(b0) * BS;
  typename B::Lane c0{}, c1{};
  if (b0 < b1) {
    c0 = B::load(w0, q);
    c1 = B::load(w1, q);
  }
  if (dense) pdl_enter();
  const int xg = x_row_of(a, t, g);
  const int8_t *xq = a.xq + static_cast<int64_t>(xg) * a.K;
  const float2 *xs = a.xs + static_cast<int64_t>(xg) * (a.K / 16);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int b = b0; b < b1; ++b) {
    // The next block's weights in flight during this one's products (the last block re-reads itself).
    const int nb = min(b + 1, b1 - 1) - b0;
    const typename B::Lane n0 = B::load(w0 + static_cast<int64_t>(nb) * BS, q), n1 = B::load(w1 + static_cast<int64_t>(nb) * BS, q);
    float v[4];
    B::value(c0, c1, xq + b * 256, xs + b * 16, q, v);
    // Column c's activation scale from the lanes holding column c's B fragments (lane 4c).
    const float dxg = __ldg(&xs[b * 16].x);
    const float dxa = __shfl_sync(0xffffffffu, dxg, 8 * q), dxb = __shfl_sync(0xffffffffu, dxg, 8 * q + 4);
    acc[0] += dxa * v[0];
    acc[1] += dxb * v[1];
    acc[2] += dxa * v[2];
    acc[3] += dxb * v[3];
    c0 = n0;
    c1 = n1;
  }
  float up[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (S > 1 || P) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s_part[warp][i][lane] = acc[i];
    __syncthreads();
    if (part != 0 || mat != 0) return;
    for (int p = 1; p < S; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += s_part[warp + p][i][lane];
    if constexpr (P) {
#pragma unroll
      for (int i = 0; i < 4; ++i) up[i] = s_part[warp + S][i][lane];
      for (int p = 1; p < S; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) up[i] += s_part[warp + S + p][i][lane];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 2 * q + (i & 1), row = row0 + g + (i >= 2 ? 8 : 0);
    if (col < t.cnt && row < a.M)
      store_y(a, static_cast<int64_t>(y_row_of(a, t, col)) * a.M + row, P ? ref_swiglu(acc[i], up[i], row, a.M) : acc[i]);
  }
#endif
}

// ---- plain weights -------------------------------------------------------------------------

__device__ __forceinline__ const float *x_row_ptr(const TView &x, int r) {
  const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
  return reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
}

// split: warps per row (1, 2, 4, 8); vec: weights and activation rows 16-byte aligned, K % 8 == 0.
template <DType T>
__global__ void __launch_bounds__(kMcPlainWarps * 32) mcol_plain_kernel(McolArgs a, int split, bool vec) {
  __shared__ float s_part[kMcPlainWarps][kMcolCols];
  constexpr int elem = T == DType::F32 ? 4 : 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rows_per_block = kMcPlainWarps / split, part = warp % split;
  const int row = static_cast<int>(blockIdx.x) * rows_per_block + warp / split;
  const bool dense = a.tiles == nullptr, row_ok = row < a.M;
  // This warp's share [kb, kb + kn) of K: multiples of 8 elements (keeps 16-byte alignment).
  const int kw = ((a.K + split - 1) / split + 7) / 8 * 8;
  const int kb = min(a.K, part * kw), kn = min(a.K - kb, kw);
  if (dense && row_ok) prefetch_l2(a.w + static_cast<int64_t>(row) * a.rb + static_cast<int64_t>(kb) * elem, static_cast<int64_t>(kn) * elem);
  pdl_enter();
  const McTile t = tile_of(a);
  if (t.cnt <= 0) return;  // block-uniform, before the barrier
  const float *xp[kMcolCols];
#pragma unroll
  for (int k = 0; k < kMcolCols; ++k) xp[k] = x_row_ptr(a.x, x_row_of(a, t, k));
  const uint8_t *wrow = a.w + static_cast<int64_t>(t.expert) * a.eb + static_cast<int64_t>(row_ok ? row : 0) * a.rb;
  float acc[kMcolCols];
#pragma unroll
  for (int k = 0; k < kMcolCols; ++k) acc[k] = 0.0f;
  if (row_ok && vec) {
#pragma unroll 2
    for (int i = kb + 8 * lane; i < kb + kn; i += 256) {
      float w[8];
      load8<T>(wrow, i, w);
#pragma unroll
      for (int k = 0; k < kMcolCols; ++k) {
        if (k >= t.cnt) break;
        const float4 p = __ldg(reinterpret_cast<const float4 *>(xp[k] + i)), q = __ldg(reinterpret_cast<const float4 *>(xp[k] + i) + 1);
        const float x[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
        for (int l = 0; l < 8; ++l) acc[k] += w[l] * round_plain<T>(x[l]);
      }
    }
  } else if (row_ok) {
    for (int i = kb + lane; i < kb + kn; i += 32) {
      const float w = plain_at<T>(wrow, i);
#pragma unroll
      for (int k = 0; k < kMcolCols; ++k) {
        if (k >= t.cnt) break;
        acc[k] += w * round_plain<T>(__ldg(xp[k] + i));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kMcolCols; ++k) {
    if (k >= t.cnt) break;
    const float v = warp_sum(acc[k]);
    if (lane == 0) s_part[warp][k] = v;
  }
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x) / kMcolCols, k = static_cast<int>(threadIdx.x) % kMcolCols;
  const int orow = static_cast<int>(blockIdx.x) * rows_per_block + r;
  if (r < rows_per_block && k < t.cnt && orow < a.M) {
    float v = 0.0f;
    for (int p = 0; p < split; ++p) v += s_part[r * split + p][k];
    store_y(a, static_cast<int64_t>(y_row_of(a, t, k)) * a.M + orow, v);
  }
}

unsigned blocks_of(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

// Warps per row of the plain kernel: the fewest that still give two blocks per multiprocessor
// (a router of 128 rows: 8, a block per row; 4096 rows: 1, eight rows per block).
int plain_split(int64_t M, int n_tiles, int n_sm) {
  for (int split = 1; split < kMcPlainWarps; split *= 2)
    if (static_cast<int64_t>(blocks_of(M, kMcPlainWarps / split)) * n_tiles >= 2 * static_cast<int64_t>(n_sm)) return split;
  return kMcPlainWarps;
}

// Quantized: rows per chunk. Short packed rows share a warp's chunk, as many as its staging
// buffer holds (MoE down Q4_K / Q6_K at K = 768: 3 rows of 24 sub-blocks, 8 lanes each, 1296 /
// 1890 of 1536 / 2048 bytes, instead of a warp with 8 idle lanes per 432 / 630-byte row).
template <DType T> int rows_per_chunk(const McolArgs &a) {
  if (a.K > kMcChunk || a.rb != static_cast<int64_t>(a.K / BlockInfo<T>::qk * BlockInfo<T>::bytes)) return 1;
  return static_cast<int>(std::clamp<int64_t>((mc_loads<T>() * 512 - 15) / a.rb, 1, 8));
}
// Lanes per row for rpc rows per chunk: the largest power of two with lpr rpc <= 32.
int lanes_per_row(int rpc) {
  int l = 32;
  while (l * rpc > 32) l >>= 1;
  return l;
}

// Quantized: chunk groups per warp. Where the warps are many (MoE: an expert's rows per tile),
// a warp takes up to kMcMaxGroups groups in turn, the next one's loads in flight during the
// current one's dots: fewer, longer-lived warps instead of many one-round-trip ones.
int groups_per_warp(int64_t units, int n_tiles, int n_sm) {
  const int64_t g = units * n_tiles / (static_cast<int64_t>(n_sm) * kMcWarpsPerSm);
  return static_cast<int>(std::clamp<int64_t>(g, 1, kMcMaxGroups));
}

bool aligned16(const void *p, int64_t stride) { return ((reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride)) & 15) == 0; }

// The tensor-core kernel of block policy B: K parts per 16-row tile, doubled (up to 4, at most
// one part per 256-block) while the grid holds fewer than 16 warps per multiprocessor.
template <class B, bool P = false> void launch_mcol_mma(const LaunchStream &s, const McolArgs &a, int n_tiles, int n_sm) {
  const int64_t units = (a.M + 15) / 16;
  const int nblk = a.K / 256;
  int S = 1;
  while (S < kMmWarps && 2 * S <= nblk && units * n_tiles * S < 16 * static_cast<int64_t>(n_sm)) S *= 2;
  const dim3 grid(blocks_of(units, kMmWarps / S), static_cast<unsigned>(n_tiles)), block(kMmWarps * 32 * (P ? 2 : 1));
  if (S == 1) launch_pdl(mcol_mma_kernel<B, 1, P>, grid, block, 0, s, a);
  else if (S == 2) launch_pdl(mcol_mma_kernel<B, 2, P>, grid, block, 0, s, a);
  else launch_pdl(mcol_mma_kernel<B, 4, P>, grid, block, 0, s, a);
}

// Whether launch_mcol with this kMcolTc* mask takes the tensor-core kernel for these weights.
bool cuda_mcol_tensor_cores(DType t, const McolArgs &a, unsigned types) {
  if (a.K % 256 != 0) return false;
  if (t == DType::Q4_K) return (types & kMcolTcQ4K) && aligned16(a.w, a.rb | a.eb);
  const bool even = ((reinterpret_cast<uintptr_t>(a.w) | static_cast<uintptr_t>(a.rb | a.eb)) & 1) == 0;
  return t == DType::Q6_K && (types & kMcolTcQ6K) && even;
}

}  // namespace

bool cuda_mcol_swiglu_takes(DType t, const McolArgs &a, unsigned tensor_cores) {
  McolArgs up = a;
  up.w = a.w2;
  return a.w2 != nullptr && cuda_mcol_tensor_cores(t, a, tensor_cores) && cuda_mcol_tensor_cores(t, up, tensor_cores);
}

bool launch_mcol_swiglu(DType t, const LaunchStream &s, const McolArgs &a, int n_tiles, int n_sm, unsigned tensor_cores) {
  if (!cuda_mcol_swiglu_takes(t, a, tensor_cores)) return false;
  if (a.M == 0 || n_tiles == 0) return true;
  if (t == DType::Q4_K) launch_mcol_mma<Q4kMma, true>(s, a, n_tiles, n_sm);
  else launch_mcol_mma<Q6kMma, true>(s, a, n_tiles, n_sm);
  return true;
}

bool cuda_mcol_type(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q8_0: case DType::MXFP4:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}


void launch_mcol(DType t, const LaunchStream &s, const McolArgs &a, int n_tiles, int n_sm, int max_cols, unsigned tensor_cores) {
  if (a.M == 0 || n_tiles == 0) return;
  if (cuda_mcol_tensor_cores(t, a, tensor_cores))
    return t == DType::Q4_K ? launch_mcol_mma<Q4kMma>(s, a, n_tiles, n_sm) : launch_mcol_mma<Q6kMma>(s, a, n_tiles, n_sm);
  if (is_plain(t)) {
    const int split = plain_split(a.M, n_tiles, n_sm);
    const dim3 grid(blocks_of(a.M, kMcPlainWarps / split), static_cast<unsigned>(n_tiles)), block(kMcPlainWarps * 32);
    const bool vec = a.K % 8 == 0 && aligned16(a.w, a.rb | a.eb) && aligned16(a.x.data, a.x.nb[1] | a.x.nb[2] | a.x.nb[3]);
    switch (t) {
      case DType::F32: launch_pdl(mcol_plain_kernel<DType::F32>, grid, block, 0, s, a, split, vec); break;
      case DType::F16: launch_pdl(mcol_plain_kernel<DType::F16>, grid, block, 0, s, a, split, vec); break;
      case DType::BF16: launch_pdl(mcol_plain_kernel<DType::BF16>, grid, block, 0, s, a, split, vec); break;
      default: fail(Status::Internal, "CUDA multi-column mat-vec: type %s not dispatched", dtype_name(t));
    }
    return;
  }
  switch (t) {
#define MOE_MCOL_CASE(TY)                                                                                        \
  case TY: {                                                                                                     \
    const int rpc = rows_per_chunk<TY>(a), groups = groups_per_warp(blocks_of(a.M, rpc), n_tiles, n_sm);         \
    const dim3 grid(blocks_of(a.M, kMcWarps * rpc * groups), static_cast<unsigned>(n_tiles)), block(kMcWarps * 32); \
    if (max_cols <= 4) launch_pdl(mcol_quant_kernel<TY, 4>, grid, block, 0, s, a, rpc, lanes_per_row(rpc), groups); \
    else launch_pdl(mcol_quant_kernel<TY, kMcolCols>, grid, block, 0, s, a, rpc, lanes_per_row(rpc), groups);     \
    break;                                                                                                       \
  }
    MOE_MCOL_CASE(DType::Q4_0)
    MOE_MCOL_CASE(DType::Q8_0)
    MOE_MCOL_CASE(DType::MXFP4)
    MOE_MCOL_CASE(DType::Q2_K)
    MOE_MCOL_CASE(DType::Q3_K)
    MOE_MCOL_CASE(DType::Q4_K)
    MOE_MCOL_CASE(DType::Q5_K)
    MOE_MCOL_CASE(DType::Q6_K)
#undef MOE_MCOL_CASE
    default: fail(Status::Internal, "CUDA multi-column mat-vec: type %s not dispatched", dtype_name(t));
  }
}

}  // namespace moe
