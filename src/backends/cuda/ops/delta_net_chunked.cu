// The gated delta rule of DeltaNet for prompts on tensor cores: the chunked (WY) form of
// src/backends/cpu/ops/delta_net.cpp (delta_chunk) with the big products as mma.sync tiles.
// ops/delta_net.cu dispatches here (cuda_delta_net_chunked) and keeps the token-sequential
// kernel for short ubatches, head sizes other than 128 and devices without the path.
//
// Per chunk of L = kC tokens of one sequence and value head, with cumulative log decays c_a
// (c_a - c_b <= 0 for b <= a, so no exponential overflows), start state S0 [d_v x d_k]:
//   A[a][b] = beta_a e^(c_a - c_b) (k_a . k_b)  (b < a)          strictly lower, L x L
//   (I + A) D = diag(beta) (V - diag(e^c) K S0^T)                 deltas D [L x d_v]
//   O = scale (diag(e^c) Q S0^T + (M o Q K^T) D),  M[a][b] = e^(c_a - c_b) (b <= a)
//   S = e^(c_L) S0 + D'^T K,  D'_b = e^(c_L - c_b) D_b
// State rows are independent (row j only meets column j of V, D and O), so a block takes
// kNV = 32 rows of one head: n_v x 4 blocks per sequence (128 for the models' 32 heads, one
// wave on an H200). Each block recomputes the chunk's L x L products (cheap next to the
// S0 products, and it keeps everything in one kernel without scratch).
//
// Precision: every operand is split into bf16 hi + lo (x = hi + lo to ~16 bits) and each
// product takes three mmas (hi.lo + lo.hi + hi.hi, f32 accumulators): ~1e-5 relative, near
// the f32 recurrence (one-pass f16 / bf16 would give 1e-3 / 1e-2 in the state, which carries
// over the whole prompt), and bf16's range keeps any f32 state finite. The state stays f32
// in registers across chunks (mma accumulators) and in global memory between ubatches.
//
// Per block (4 warps), each chunk:
//   gather   warp 0 finds the next chunk's tokens of its sequence (ballots over DevUbatch::seq);
//            every thread then cp.asyncs that chunk's K, Q, V rows and gates into staging
//            while this chunk computes;
//   convert  staged f32 -> bf16 hi/lo tiles (K also transposed), cumulative decays;
//   phase 1  warp 0: K K^T, warp 1: Q K^T, warp 2: K S0^T, warp 3: Q S0^T (32 x 32 each);
//   phase 2  the decays and masks applied: A, the masked Q K^T, the right-hand side;
//   phase 3  warp 0 solves (I + A) D = rhs by forward substitution, one lane per column;
//   phase 4  every warp: its 32 x 32 of the state, S = e^(c_L) S + D'^T K; warp 3 also the
//            outputs O (Q S0^T from phase 1 + the masked Q K^T times D).
// Padding rows of a partial chunk have k = q = v = 0, g = 0 and beta = 0: they add nothing
// and c_L stays the decay of the last real token.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/mma_common.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

constexpr int kD = 128;      // key and value head size of the path (the models' d)
constexpr int kNV = 32;      // state rows (value dims) per block
constexpr int kC = 32;       // tokens per chunk
constexpr int kThreads = 128;
constexpr int kLdD = kD + 8;   // bf16 row strides: rows 4 banks apart, so fragment loads do not conflict
constexpr int kLdC = kC + 8;
// Below this many tokens in the ubatch the token-sequential kernel is as fast (one chunk
// costs about as much as ~10 sequential tokens) and decode keeps its replayed graph shape.
constexpr int64_t kChunkMinTokens = 32;

static_assert(kC == 32 && kNV == 32, "phase 1 gives each warp one 32 x 32 product; the solve takes one lane per column");

// A tile of bf16 pairs: x = hi + lo.
template <int R, int Ld> struct Split {
  uint16_t hi[R][Ld], lo[R][Ld];
};

struct Smem {
  float stage_k[kC][kD], stage_q[kC][kD], stage_v[kC][kNV], stage_g[kC], stage_b[kC];  // cp.async landing
  Split<kC, kLdD> k, q;        // [token][key dim]
  Split<kD, kLdC> kt;          // [key dim][token]
  Split<kNV, kLdD> s;          // [value row][key dim]: the chunk's start state
  Split<kC, kLdC> p;           // masked, decayed Q K^T [a][b]
  Split<kNV, kLdC> dt, dpt;    // D^T and D'^T [value row][token]
  float a[kC][kC + 1];         // the strictly lower A
  float rhs[kC][kNV + 1];      // right-hand side, then nothing (the solve keeps D in registers)
  float v[kC][kNV + 1];        // this chunk's V rows
  float c[kC], beta[kC];       // cumulative log decay, beta
  int idx[2][kC];              // token indices of this chunk and the next
  int n[2];                    // their counts (0: no more chunks)
};

struct ChunkArgs {
  float *o;                     // [d, n_v, T]
  const float *q, *k, *v;       // [d, n_k, T], [d, n_k, T], [d, n_v, T]
  const float *gb;              // [2 n_v, T]: log decay, beta
  int64_t n_k, n_v, T, conv;    // conv: floats of the conv tail before the matrices
  int head_map;                 // 0: key head h / (n_v / n_k), 1: h % n_k
  float scale;
  const int32_t *seq, *rs;
  float *base;
  int64_t per;
  int n_seq_max;
};

#if MOE_CUDA_TENSOR_CORE_CODE

__device__ __forceinline__ void split_bf16(float x, uint16_t &hi, uint16_t &lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(h)));
}
template <int R, int Ld> __device__ __forceinline__ void put(Split<R, Ld> &t, int r, int col, float x) { split_bf16(x, t.hi[r][col], t.lo[r][col]); }

__device__ __forceinline__ uint32_t word(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// A fragment (16 x 16, row-major) of rows r0.., k0.. of a [row][k] tile; lane (g, t) = (l / 4, l % 4).
template <int R, int Ld> struct FragA {
  uint32_t hi[4], lo[4];
  __device__ __forceinline__ FragA(const Split<R, Ld> &t, int r0, int k0, int g, int tq) {
    const int r = r0 + g, k = k0 + 2 * tq;
    hi[0] = word(&t.hi[r][k]), hi[1] = word(&t.hi[r + 8][k]), hi[2] = word(&t.hi[r][k + 8]), hi[3] = word(&t.hi[r + 8][k + 8]);
    lo[0] = word(&t.lo[r][k]), lo[1] = word(&t.lo[r + 8][k]), lo[2] = word(&t.lo[r][k + 8]), lo[3] = word(&t.lo[r + 8][k + 8]);
  }
};
// B fragment (16 x 8, column-major) of columns n0.., k0.. of a [column][k] tile.
template <int R, int Ld> struct FragB {
  uint32_t hi[2], lo[2];
  __device__ __forceinline__ FragB(const Split<R, Ld> &t, int n0, int k0, int g, int tq) {
    const int n = n0 + g, k = k0 + 2 * tq;
    hi[0] = word(&t.hi[n][k]), hi[1] = word(&t.hi[n][k + 8]);
    lo[0] = word(&t.lo[n][k]), lo[1] = word(&t.lo[n][k + 8]);
  }
};
// d += a b with both split: the small cross terms first, lo.lo (~2^-16 relative) dropped.
template <int RA, int LA, int RB, int LB>
__device__ __forceinline__ void mma3(float (&d)[4], const FragA<RA, LA> &a, const FragB<RB, LB> &b) {
  mma_tile::mma16816<true>(d, a.hi, b.lo);
  mma_tile::mma16816<true>(d, a.lo, b.hi);
  mma_tile::mma16816<true>(d, a.hi, b.hi);
}

using Acc = float[2][4][4];  // a warp's 32 x 32: [16-row tile][8-column tile][fragment]

// acc += X Y^T for X rows xr0.. of x [row][k], Y rows yr0.. of y [row][k], K = kk columns.
template <int K, int RX, int LX, int RY, int LY>
__device__ __forceinline__ void gemm_nt(Acc &acc, const Split<RX, LX> &x, int xr0, const Split<RY, LY> &y, int yr0, int g, int tq) {
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    const FragA<RX, LX> a0(x, xr0, k0, g, tq), a1(x, xr0 + 16, k0, g, tq);
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const FragB<RY, LY> b(y, yr0 + 8 * ni, k0, g, tq);
      mma3(acc[0][ni], a0, b);
      mma3(acc[1][ni], a1, b);
    }
  }
}

// Row and column (within the warp's 32 x 32) of accumulator e of tile (mi, ni).
__device__ __forceinline__ int acc_row(int mi, int e, int g) { return 16 * mi + g + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int ni, int e, int tq) { return 8 * ni + 2 * tq + (e & 1); }

// The next up to kC token indices of sequence s from token `cur` on (warp-uniform; cur
// advances past the last one taken). Returns the count.
__device__ int gather_chunk(const int32_t *seq, int64_t T, int32_t s, int64_t &cur, int *idx, int lane) {
  int n = 0;
  while (n < kC && cur < T) {
    const int64_t t = cur + lane;
    const bool m = t < T && seq[t] == s;
    const unsigned bits = __ballot_sync(0xffffffffu, m);
    const int pos = n + __popc(bits & ((1u << lane) - 1u));
    if (m && pos < kC) idx[pos] = static_cast<int>(t);
    const int cnt = __popc(bits);
    if (n + cnt <= kC) {
      n += cnt;
      cur += 32;
    } else {  // the chunk fills inside this window: continue after its last token
      cur += __ffs(__ballot_sync(0xffffffffu, m && pos == kC - 1));
      n = kC;
    }
  }
  return n;
}

// Starts the copies of chunk `which`'s rows into the staging area (rows past its count are
// never read: the conversion zeroes them).
__device__ __forceinline__ void stage_chunk(Smem &sm, int which, const ChunkArgs &a, int64_t h, int64_t kh, int j0, int tid) {
  const int n = sm.n[which];
  const int *idx = sm.idx[which];
#pragma unroll
  for (int r = 0; r < kC * kD / 4 / kThreads; ++r) {
    const int p = tid + kThreads * r, row = p / (kD / 4), col = 4 * (p % (kD / 4));
    if (row < n) {
      const int64_t off = (static_cast<int64_t>(idx[row]) * a.n_k + kh) * kD + col;
      mma_tile::cp_async_16(&sm.stage_k[row][col], a.k + off);
      mma_tile::cp_async_16(&sm.stage_q[row][col], a.q + off);
    }
  }
#pragma unroll
  for (int r = 0; r < kC * kNV / 4 / kThreads; ++r) {
    const int p = tid + kThreads * r, row = p / (kNV / 4), col = 4 * (p % (kNV / 4));
    if (row < n) mma_tile::cp_async_16(&sm.stage_v[row][col], a.v + (static_cast<int64_t>(idx[row]) * a.n_v + h) * kD + j0 + col);
  }
  if (tid < 2 * kC && (tid % kC) < n) {
    const int row = tid % kC;
    const float *g = a.gb + static_cast<int64_t>(idx[row]) * 2 * a.n_v + h;
    mma_tile::cp_async_4(tid < kC ? &sm.stage_g[row] : &sm.stage_b[row], tid < kC ? g : g + a.n_v);
  }
  mma_tile::cp_async_commit();
}

// Staged f32 rows -> split tiles; rows at and past n become zero.
__device__ __forceinline__ void convert_chunk(Smem &sm, int n, int tid) {
#pragma unroll 4
  for (int r = 0; r < kC * kD / 2 / kThreads; ++r) {
    const int p = tid + kThreads * r, row = p / (kD / 2), col = 2 * (p % (kD / 2));
    const bool live = row < n;
    const float k0 = live ? sm.stage_k[row][col] : 0.0f, k1 = live ? sm.stage_k[row][col + 1] : 0.0f;
    const float q0 = live ? sm.stage_q[row][col] : 0.0f, q1 = live ? sm.stage_q[row][col + 1] : 0.0f;
    put(sm.k, row, col, k0);
    put(sm.k, row, col + 1, k1);
    put(sm.kt, col, row, k0);
    put(sm.kt, col + 1, row, k1);
    put(sm.q, row, col, q0);
    put(sm.q, row, col + 1, q1);
  }
#pragma unroll
  for (int r = 0; r < kC * kNV / kThreads; ++r) {
    const int p = tid + kThreads * r, row = p / kNV, col = p % kNV;
    sm.v[row][col] = row < n ? sm.stage_v[row][col] : 0.0f;
  }
  if (tid < kC) {
    float c = 0.0f;  // in token order, as the CPU sums
    for (int b = 0; b <= tid; ++b) c += b < n ? sm.stage_g[b] : 0.0f;
    sm.c[tid] = c;
    sm.beta[tid] = tid < n ? sm.stage_b[tid] : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) delta_chunked_kernel(ChunkArgs a) {
  extern __shared__ __align__(16) uint8_t dn_smem[];
  Smem &sm = *reinterpret_cast<Smem *>(dn_smem);
  pdl_wait();
  pdl_trigger();
  const int slot = blockIdx.y;
  if (slot >= a.rs[0]) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int64_t h = blockIdx.x / (kD / kNV);
  const int j0 = static_cast<int>(blockIdx.x % (kD / kNV)) * kNV;
  const int64_t kh = a.head_map == 0 ? h / (a.n_v / a.n_k) : h % a.n_k;
  const int32_t seq = a.rs[1 + 3 * slot];
  const int64_t off = a.conv + (h * kD + j0) * kD;  // row j0 of head h
  const float *src = a.base + (static_cast<int64_t>(a.rs[2 + 3 * slot]) * a.n_seq_max + seq) * a.per + off;
  float *dst = a.base + (static_cast<int64_t>(a.rs[3 + 3 * slot]) * a.n_seq_max + seq) * a.per + off;

  // This warp's 32 rows x 32 columns (key dims 32 warp ..) of the block's state, f32.
  Acc st;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = acc_row(mi, e, g), i = 32 * warp + acc_col(ni, e, tq);
        st[mi][ni][e] = src[j * kD + i];
        put(sm.s, j, i, st[mi][ni][e]);
      }
  int64_t cursor = 0;  // warp 0's scan position in the ubatch
  if (warp == 0) {
    const int n = gather_chunk(a.seq, a.T, seq, cursor, sm.idx[0], lane);
    if (lane == 0) sm.n[0] = n;
  }
  __syncthreads();
  stage_chunk(sm, 0, a, h, kh, j0, tid);

  for (int cur = 0;; cur ^= 1) {
    const int n = sm.n[cur];
    if (n == 0) break;  // uniform: read after the barrier that follows its write
    mma_tile::cp_async_wait<0>();
    __syncthreads();  // this chunk staged; every warp past the last chunk's phase 4
    convert_chunk(sm, n, tid);
    if (warp == 0) {
      const int nn = gather_chunk(a.seq, a.T, seq, cursor, sm.idx[cur ^ 1], lane);
      if (lane == 0) sm.n[cur ^ 1] = nn;
    }
    __syncthreads();  // tiles written, staging free, next chunk's tokens known
    if (sm.n[cur ^ 1] > 0) stage_chunk(sm, cur ^ 1, a, h, kh, j0, tid);

    // Phase 1: one 32 x 32 product per warp over the key dims.
    Acc x = {};
    gemm_nt<kD>(x, (warp & 1) ? sm.q : sm.k, 0, warp < 2 ? sm.k : sm.s, 0, g, tq);
    // Phase 2: decays and masks (rows a: tokens; columns: tokens or value rows).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = acc_row(mi, e, g), col = acc_col(ni, e, tq);
          const float v = x[mi][ni][e];
          if (warp == 0) sm.a[r][col] = col < r ? sm.beta[r] * expf(sm.c[r] - sm.c[col]) * v : 0.0f;
          else if (warp == 1) put(sm.p, r, col, col <= r ? expf(sm.c[r] - sm.c[col]) * v : 0.0f);
          else if (warp == 2) sm.rhs[r][col] = sm.beta[r] * (sm.v[r][col] - expf(sm.c[r]) * v);
        }
    __syncthreads();
    // Phase 3: (I + A) D = rhs, lane j owns column j (rows in registers, A read as broadcasts).
    if (warp == 0) {
      float dcol[kC];
      const float cL = sm.c[kC - 1];
#pragma unroll
      for (int r = 0; r < kC; ++r) {
        float s0 = sm.rhs[r][lane], s1 = 0.0f;
#pragma unroll
        for (int b = 0; b < r; ++b) {
          if (b & 1) s1 = fmaf(-sm.a[r][b], dcol[b], s1);
          else s0 = fmaf(-sm.a[r][b], dcol[b], s0);
        }
        dcol[r] = s0 + s1;
      }
#pragma unroll
      for (int b = 0; b < kC; ++b) {
        put(sm.dt, lane, b, dcol[b]);
        put(sm.dpt, lane, b, expf(cL - sm.c[b]) * dcol[b]);
      }
    }
    __syncthreads();
    // Phase 4: the state's next value, and (warp 3) the outputs.
    const float eL = expf(sm.c[kC - 1]);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mi][ni][e] *= eL;
    gemm_nt<kC>(st, sm.dpt, 0, sm.kt, 32 * warp, g, tq);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) put(sm.s, acc_row(mi, e, g), 32 * warp + acc_col(ni, e, tq), st[mi][ni][e]);
    if (warp == 3) {
      Acc o = {};
      gemm_nt<kC>(o, sm.p, 0, sm.dt, 0, g, tq);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = acc_row(mi, e, g), j = acc_col(ni, e, tq);
            if (r < n) a.o[(static_cast<int64_t>(sm.idx[cur][r]) * a.n_v + h) * kD + j0 + j] = a.scale * (expf(sm.c[r]) * x[mi][ni][e] + o[mi][ni][e]);
          }
    }
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[acc_row(mi, e, g) * kD + 32 * warp + acc_col(ni, e, tq)] = st[mi][ni][e];
}

#else  // code for an architecture without the path: never launched (cuda_paths.h)

__global__ void delta_chunked_kernel(ChunkArgs) { __trap(); }

#endif

}  // namespace

bool cuda_delta_net_chunked(const CudaOpCtx &c, float *base) {
  const Node &n = c.n, &q = c.src(0), &k = c.src(1), &v = c.src(2), &gb = c.src(3);
  const int64_t d = v.ne[0], n_v = v.ne[1], T = v.ne[2];
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q.data) | reinterpret_cast<uintptr_t>(k.data) | reinterpret_cast<uintptr_t>(v.data);
  constexpr size_t smem = sizeof(Smem);
  if (!c.paths.tensor_cores || d != kD || T < kChunkMinTokens || bits % 16 != 0 || static_cast<size_t>(c.paths.smem_optin) < smem) return false;
  MOE_CUDA_CHECK(cudaFuncSetAttribute(delta_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const KvLayerDims &dims = c.kv->dims(n.kv_layer);
  ChunkArgs a{static_cast<float *>(n.data), static_cast<const float *>(q.data), static_cast<const float *>(k.data),
              static_cast<const float *>(v.data), static_cast<const float *>(gb.data), q.ne[1], n_v, T, dims.conv_state, n.ip[0],
              n.fp[0], c.ub.seq, c.ub.rs, base, dims.recurrent(), static_cast<int>(c.kv->n_seq_max())};
  const dim3 grid(static_cast<unsigned>(n_v * (kD / kNV)), static_cast<unsigned>(std::min<int64_t>(T, c.kv->n_seq_max())));
  launch_pdl(delta_chunked_kernel, grid, dim3(kThreads), smem, c.stream, a);
  return true;
}

}  // namespace moe
