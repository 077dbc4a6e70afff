// Tiled prefill attention on f16 tensor cores (mma.sync m16n8k16, f32 accumulators) for an
// F16 cache: a block of 4 warps owns 64 (token, head) rows of one KV head, 16 per warp; the
// q rows (rounded to f16, as the reference does for an F16 cache) stay in registers as mma A
// fragments. Per tile of 64 cells: K and V tiles to shared memory (16-byte cp.async, zeros
// for free cells; V lands while S and the softmax are computed), S = q K^T on the tensor cores, scale and mask in f32, online softmax (running
// max and sum in f32), P rounded to f16 straight from the S fragments (their layout is the A
// layout of the next mma), O += P V. Tiles no row can see are skipped before any load.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16, g = lane / 4, q = lane % 4):
//   A 16x16 (rows x k): reg 0 = (g, 2q..2q+1), 1 = (g+8, 2q..), 2 = (g, 2q+8..), 3 = (g+8, 2q+8..)
//   B 16x8  (k x cols): reg 0 = (2q..2q+1, g), 1 = (2q+8..2q+9, g)
//   C 16x8  f32       : c0, c1 = (g, 2q..2q+1), c2, c3 = (g+8, 2q..2q+1)
// B fragments come from shared memory with ldmatrix.x4 (lanes 8m..8m+7 address the 8 rows of
// matrix m; register m of a lane holds row g, columns 2q..2q+1 of matrix m, or with .trans
// rows 2q..2q+1 of column g): K rows are cells, so q K^T needs K as stored; V rows are cells
// too, so P V needs the transpose.
#include <climits>

#include "backends/cuda/ops/arch_guard.cuh"
#include "backends/cuda/ops/attention.cuh"

namespace moe {

namespace {

constexpr int kRows = kAttnTiledRowsMma;  // 16 per warp
constexpr int kThreads = 128;

// Per head dim: cells per tile and output dims per block. Head dim 256 (Qwen3-Next / Qwen3.5)
// keeps q in registers (64) like the others, so its 256 output dims are split over two blocks
// (each computes the same scores; 64 accumulator registers each) and its tiles hold 32 cells:
// 64 x 264 halves of K would not fit the 48 KB of static shared memory with V beside them.
template <int HD> struct MmaTile {
  static constexpr int kCells = HD <= 128 ? 64 : 32;
  static constexpr int kDv = HD <= 128 ? HD : 128;  // output dims per block
  static constexpr int kHalves = HD / kDv;          // blocks per row tile
};

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half *row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half *row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats rounded to f16 (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts copying HD dims of one head's cells [c0, c0 + kCells) into s[cell][.] (16-byte
// asynchronous copies, one commit group); unused cells (free, or past this split) are stored
// as zeros so nothing uninitialised meets a zero probability.
template <int HD, int LDH, int kCells>
__device__ __forceinline__ void load_tile_async(__half (*s)[LDH], const uint8_t *base, size_t rb, int c0, const int *s_cpos) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  static_assert(kCells * kChunks % kThreads == 0, "tile copy must divide evenly");
#pragma unroll
  for (int i = 0; i < kCells * kChunks / kThreads; ++i) {
    const int e = threadIdx.x + i * kThreads, j = e / kChunks, ch = e % kChunks;
    if (s_cpos[j] >= 0) cp_async16(&s[j][ch * 8], base + static_cast<size_t>(c0 + j) * rb + ch * 16);
    else *reinterpret_cast<uint4 *>(&s[j][ch * 8]) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();
}

// What a block's rows are, for testing whole tiles: the least and greatest position of its
// used rows and the union of their sequence bits (rows past the batch: none).
struct RowSpan {
  int pmin, pmax;
  unsigned long long seqs;
};

// Cell c of the split [.., c_end) for the tile tests (a thread per cell): whether some row
// of the block may see it (conservative: true for every cell a row sees) and whether every
// row sees it (then the tile needs no per-element mask).
__device__ __forceinline__ void cell_tests(int cp, unsigned long long cs, const RowSpan &r, int window, bool &maybe, bool &all) {
  maybe = cp >= 0 && (cs & r.seqs) != 0 && cp <= r.pmax && (window <= 0 || r.pmin - cp < window);
  all = cp >= 0 && (cs & r.seqs) == r.seqs && cp <= r.pmin && (window <= 0 || r.pmax - cp < window);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attn_tiled_mma_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, int T, int n_split,
                                                                  float *part) {
#if MOE_CUDA_TENSOR_CORE_CODE
  constexpr int kCells = MmaTile<HD>::kCells, DV = MmaTile<HD>::kDv, kHalves = MmaTile<HD>::kHalves;
  constexpr int LDH = HD + 8;     // halves per shared row (16-byte aligned): the 8 rows of an ldmatrix phase hit distinct banks
  constexpr int LDV = DV + 8;
  constexpr int KS = HD / 16;     // k-steps of q K^T
  constexpr int NB = kCells / 8;  // score column blocks (8 cells)
  constexpr int ND = DV / 8;      // output column blocks (8 dims) of this block
  static_assert(KS % 2 == 0 && ND % 2 == 0 && kCells % 16 == 0, "ldmatrix.x4 serves two k-steps / two output blocks");
  static_assert(kRows == 2 * 32 && kCells <= kThreads, "two warps reduce the rows; a thread per cell");
  __shared__ __align__(16) __half s_k[kCells][LDH];
  __shared__ __align__(16) __half s_v[kCells][LDV];
  // Cell positions and sequences of the tile being computed and of the next one (two stages:
  // the next tile is tested and its K requested while this one's softmax still reads its own).
  __shared__ int s_cpos[2][kCells];
  __shared__ unsigned long long s_cseq[2][kCells];
  __shared__ RowSpan s_span[2];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int group = a.group, hk = blockIdx.y, z = blockIdx.z;
  const int n_head = gridDim.y * group;
  const int rows = T * group;
  const int r0 = static_cast<int>(blockIdx.x / kHalves) * kRows;
  const int dv0 = static_cast<int>(blockIdx.x % kHalves) * DV;  // this block's output dims [dv0, dv0 + DV)

  // Row r of the tile is (token (r0 + r) / group, head hk * group + (r0 + r) % group).
  // Warps 0 and 1 fold their 32 rows each into a RowSpan.
  if (tid < kRows) {
    const int gr = r0 + tid;
    const bool ok = gr < rows;
    int pmin = ok ? ub.pos[gr / group] : INT_MAX, pmax = ok ? pmin : INT_MIN;
    unsigned long long seqs = ok ? 1ull << ub.seq[gr / group] : 0ull;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
      pmin = min(pmin, __shfl_xor_sync(0xffffffffu, pmin, m));
      pmax = max(pmax, __shfl_xor_sync(0xffffffffu, pmax, m));
      seqs |= __shfl_xor_sync(0xffffffffu, seqs, m);
    }
    if (lane == 0) s_span[warp] = RowSpan{pmin, pmax, seqs};
  }
  // This thread's fragment rows: g and g + 8 of its warp's 16.
  int rpos[2];
  unsigned long long rbit[2];
  const float *qrow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int gr = r0 + warp * 16 + g + 8 * i;
    const bool ok = gr < rows;
    rpos[i] = ok ? ub.pos[gr / group] : -1;
    rbit[i] = ok ? 1ull << ub.seq[gr / group] : 0ull;
    qrow[i] = ok ? reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (hk * group + gr % group) * q.nb[1] +
                                                   (gr / group) * q.nb[2])
                 : nullptr;
  }
  auto qat = [&](int i, int d) { return qrow[i] ? qrow[i][d] : 0.0f; };
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const int d = 16 * ks + 2 * tq;
    qa[ks][0] = pack_f16(qat(0, d), qat(0, d + 1));
    qa[ks][1] = pack_f16(qat(1, d), qat(1, d + 1));
    qa[ks][2] = pack_f16(qat(0, d + 8), qat(0, d + 9));
    qa[ks][3] = pack_f16(qat(1, d + 8), qat(1, d + 9));
  }
  __syncthreads();  // s_span
  const RowSpan span{min(s_span[0].pmin, s_span[1].pmin), max(s_span[0].pmax, s_span[1].pmax), s_span[0].seqs | s_span[1].seqs};

  float o[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;
  // Running max and this thread's share of the row sums (its 2 columns per block). expf, not
  // exp2 of prescaled scores: the probabilities are rounded to f16 for P V, and the default
  // float order's conformance greedy checks moved (2026-12-01) when their last bits changed.
  float M[2] = {-INFINITY, -INFINITY};
  float S[2] = {0.0f, 0.0f};

  const uint8_t *kbase = a.kbase + hk * a.khb, *vbase = a.vbase + hk * a.vhb + dv0 * sizeof(__half);
  int c_begin, c_end;
  attn_split_range(*ub.n_kv, n_split, z, kCells, c_begin, c_end);
  // The first tile from `from` on that some row may see, its cells in stage st (block-wide;
  // c_end when none). `full`: every row sees every cell.
  auto next_tile = [&](int from, int st, bool &full) {
    for (int c0 = from; c0 < c_end; c0 += kCells) {
      bool maybe = false, all = false;
      if (tid < kCells) {
        const int c = c0 + tid;
        const int cp = c < c_end ? ub.cell_pos[c] : -1;
        const unsigned long long cs = c < c_end ? ub.cell_seq[c] : 0ull;
        s_cpos[st][tid] = cp;
        s_cseq[st][tid] = cs;
        cell_tests(cp, cs, span, a.window, maybe, all);
      }
      full = __syncthreads_and(all || tid >= kCells);
      if (__syncthreads_or(maybe)) return c0;
    }
    return c_end;
  };

  // Loads overlap compute: the next tile's K is requested once this tile's scores are done
  // (s_k free), its V once this tile's P V is done (s_v free). Every step commits one group
  // (empty when there is nothing to load), so cp_async_wait<1> always means "all but the
  // newest": K of this tile at the top, V of this tile before P V.
  int st = 0;
  bool full;
  int cur = next_tile(c_begin, 0, full);
  if (cur < c_end) load_tile_async<HD, LDH, kCells>(s_k, kbase, a.krb, cur, s_cpos[0]);
  if (cur < c_end) load_tile_async<DV, LDV, kCells>(s_v, vbase, a.vrb, cur, s_cpos[0]);
  while (cur < c_end) {
    cp_async_wait<1>();  // this thread's K copies are done
    __syncthreads();     // ... and everyone's

    float s[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
    // Matrix m of the ldmatrix: cells nb*8.., dims 16 ks + 8 m.. -> B of k-steps ks and ks + 1.
#pragma unroll
    for (int ks = 0; ks < KS; ks += 2)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        uint32_t b[4];
        ldsm_x4(b, &s_k[nb * 8 + (lane & 7)][ks * 16 + 8 * (lane >> 3)]);
        mma_f16(s[nb], qa[ks], b[0], b[1]);
        mma_f16(s[nb], qa[ks + 1], b[2], b[3]);
      }

    // The next tile (its barriers also mean every warp is done reading s_k).
    bool full_next = false;
    const int nxt = next_tile(cur + kCells, st ^ 1, full_next);
    if (nxt < c_end) load_tile_async<HD, LDH, kCells>(s_k, kbase, a.krb, nxt, s_cpos[st ^ 1]);
    else cp_async_commit();

    // Scale and mask (f32), then the online softmax of rows g (i = 0) and g + 8 (i = 1);
    // the 4 lanes of a quad hold the same two rows. A tile every row sees needs no mask.
    float mx[2] = {-INFINITY, -INFINITY};
    if (full) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nb][e] *= a.scale;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[nb][e]);
        }
    } else {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, j = nb * 8 + 2 * tq + (e & 1);
          const float v = attn_visible(s_cpos[st][j], s_cseq[st][j], rbit[i], rpos[i], a.window) ? s[nb][e] * a.scale : -INFINITY;
          s[nb][e] = v;
          mx[i] = fmaxf(mx[i], v);
        }
    }
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float newM = fmaxf(M[i], mx[i]);
      corr[i] = newM == -INFINITY ? 1.0f : expf(M[i] - newM);  // 0 when M was -inf
      M[i] = newM;
      S[i] *= corr[i];
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const float p = s[nb][e] == -INFINITY ? 0.0f : expf(s[nb][e] - M[i]);
        s[nb][e] = p;
        S[i] += p;
      }
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      o[nd][0] *= corr[0];
      o[nd][1] *= corr[0];
      o[nd][2] *= corr[1];
      o[nd][3] *= corr[1];
    }

    cp_async_wait<1>();  // this thread's V copies are done
    __syncthreads();     // ... and everyone's
    // O += P V: the S fragments of cell blocks 2kc and 2kc + 1 are the A fragment of k-step kc.
#pragma unroll
    for (int kc = 0; kc < kCells / 16; ++kc) {
      const uint32_t pa[4] = {pack_f16(s[2 * kc][0], s[2 * kc][1]), pack_f16(s[2 * kc][2], s[2 * kc][3]),
                              pack_f16(s[2 * kc + 1][0], s[2 * kc + 1][1]), pack_f16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
      // Matrix m of the transposing ldmatrix: cells 16 kc + 8 (m & 1).., dims 8 (nd + m / 2)..
      // -> B of output blocks nd and nd + 1.
#pragma unroll
      for (int nd = 0; nd < ND; nd += 2) {
        uint32_t b[4];
        ldsm_x4_trans(b, &s_v[16 * kc + (lane & 7) + 8 * ((lane >> 3) & 1)][nd * 8 + 8 * (lane >> 4)]);
        mma_f16(o[nd], pa, b[0], b[1]);
        mma_f16(o[nd + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done reading s_v
    if (nxt < c_end) load_tile_async<DV, LDV, kCells>(s_v, vbase, a.vrb, nxt, s_cpos[st ^ 1]);
    else cp_async_commit();
    cur = nxt;
    full = full_next;
    st ^= 1;
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 1);
    S[i] += __shfl_xor_sync(0xffffffffu, S[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int gr = r0 + warp * 16 + g + 8 * i;
    if (gr >= rows) continue;
    const int t = gr / group, h = hk * group + gr % group;
    float f;
    // Both halves of a 256-dim row compute the same M and S and may both write the header.
    float *dst = attn_row_dst(out, part, a.sinks, t, h, z, n_head, n_split, HD, M[i], S[i], tq == 0, f);
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      const int d = dv0 + nd * 8 + 2 * tq;
      dst[d] = o[nd][2 * i] * f;
      dst[d + 1] = o[nd][2 * i + 1] * f;
    }
  }
#else
  __trap();  // sm_75 code: never launched (cuda_paths.h)
#endif
}

}  // namespace

void attn_tiled_mma_launch(const AttnTiledLaunch &l) {
  const unsigned tiles = static_cast<unsigned>((l.T * l.a.group + kRows - 1) / kRows);
  const dim3 grid(tiles * (l.a.hd_k == 256 ? MmaTile<256>::kHalves : 1), static_cast<unsigned>(l.n_head_kv), static_cast<unsigned>(l.n_split));
  float *part = l.n_split > 1 ? l.part : nullptr;
  if (l.a.hd_k == 64) attn_tiled_mma_kernel<64><<<grid, kThreads, 0, l.stream>>>(l.q, l.out, l.a, l.ub, l.T, l.n_split, part);
  else if (l.a.hd_k == 128) attn_tiled_mma_kernel<128><<<grid, kThreads, 0, l.stream>>>(l.q, l.out, l.a, l.ub, l.T, l.n_split, part);
  else attn_tiled_mma_kernel<256><<<grid, kThreads, 0, l.stream>>>(l.q, l.out, l.a, l.ub, l.T, l.n_split, part);
  MOE_CUDA_LAUNCH_CHECK("attn_tiled_mma_kernel");
}

}  // namespace moe
