// Tiled prefill attention on f32 FMA, any cache type (F32 / F16 / Q8_0): a block owns 32
// (token, head) rows of one KV head (the q heads of a GQA group share every K/V load) and
// walks its share of the cells in tiles of 32: K tile -> scores -> mask -> online softmax
// (running max and sum in f32) -> V tile (same buffer) -> P*V. K and V are dequantized to
// f32 in shared memory, q is rounded to the cache's type once, so every dot is the one the
// per-token kernel computes. Tiles no row can see (the causal future, other sequences,
// outside the window) are skipped before any K/V load.
#include "backends/cuda/ops/attention.cuh"

namespace moe {

namespace {

constexpr int kRows = kAttnTiledRowsFma;
constexpr int kCells = 32;
constexpr int kThreads = 128;

// Cells [c0, c0 + kCells) of one head into s[cell][d] as f32; unused cells (free, or past
// this split) are zeros so nothing uninitialised meets a zero probability.
template <int HD, int LD>
__device__ __forceinline__ void load_tile(float (*s)[LD], const uint8_t *base, size_t rb, int c0, const int *s_cpos, int kt) {
  for (int e = threadIdx.x; e < kCells * HD; e += kThreads) {
    const int j = e / HD, d = e % HD;
    s[j][d] = s_cpos[j] >= 0 ? attn_elem(base + static_cast<size_t>(c0 + j) * rb, d, kt) : 0.0f;
  }
}

// Thread roles (128 threads):
//  scores  : rows sr0 = tid / 8 and sr0 + 16, cells tid % 8 + 8j (j < 4)
//  softmax : row tid / 4, cells 8 (tid % 4) .. + 7; the 4 threads of a row are adjacent lanes
//  P*V     : rows tid / 16 + 8i (i < 4), dims 4 (tid % 16) + 64j (j < HD / 64), 4 each
template <int HD>
__global__ void __launch_bounds__(kThreads) attn_tiled_fma_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, int T, int n_split,
                                                                  float *part) {
  constexpr int LD = HD + 4;  // rows start 4 banks apart: float4 reads of 8 rows are conflict-free
  constexpr int NJ = HD / 64;
  __shared__ __align__(16) float s_q[kRows][LD];
  __shared__ __align__(16) float s_kv[kCells][LD];  // K, then V of the same tile
  __shared__ float s_p[kRows][kCells + 1];
  __shared__ int s_cpos[kCells];
  __shared__ unsigned long long s_cseq[kCells];
  __shared__ int s_rpos[kRows];
  __shared__ unsigned long long s_rbit[kRows];
  __shared__ float s_corr[kRows], s_m[kRows], s_s[kRows];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = a.group, hk = blockIdx.y, z = blockIdx.z;
  const int n_head = gridDim.y * group;
  const int rows = T * group;
  const int r0 = blockIdx.x * kRows;

  // Row r of the tile is (token (r0 + r) / group, head hk * group + (r0 + r) % group).
  if (tid < kRows) {
    const int gr = r0 + tid;
    const bool ok = gr < rows;
    s_rpos[tid] = ok ? ub.pos[gr / group] : -1;
    s_rbit[tid] = ok ? 1ull << ub.seq[gr / group] : 0ull;  // 0: sees nothing
  }
  for (int r = warp; r < kRows; r += kThreads / 32) {
    const int gr = r0 + r;
    const bool ok = gr < rows;
    const float *qrow = ok ? reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (hk * group + gr % group) * q.nb[1] +
                                                             (gr / group) * q.nb[2])
                           : nullptr;
    for (int d0 = 0; d0 < HD; d0 += 32) s_q[r][d0 + lane] = attn_round_q(ok ? qrow[d0 + lane] : 0.0f, a.kt);
  }

  const int sr0 = tid >> 3, sc = tid & 7;     // scores
  const int xr = tid >> 2, xq = tid & 3;      // softmax
  const int pr = tid >> 4, pd = (tid & 15) * 4;  // P*V
  float M = -INFINITY, S = 0.0f;              // of softmax row xr
  float acc[4][NJ][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const uint8_t *kbase = a.kbase + hk * a.khb, *vbase = a.vbase + hk * a.vhb;
  int c_begin, c_end;
  attn_split_range(*ub.n_kv, n_split, z, kCells, c_begin, c_end);
  for (int c0 = c_begin; c0 < c_end; c0 += kCells) {
    __syncthreads();  // the previous tile's readers are done (first pass: publishes s_q, s_rpos, s_rbit)
    if (tid < kCells) {
      const int c = c0 + tid;
      s_cpos[tid] = c < c_end ? ub.cell_pos[c] : -1;
      s_cseq[tid] = c < c_end ? ub.cell_seq[c] : 0ull;
    }
    __syncthreads();
    bool any = false;
    for (int e = tid; e < kRows * kCells && !any; e += kThreads) {
      const int r = e / kCells, j = e % kCells;
      any = attn_visible(s_cpos[j], s_cseq[j], s_rbit[r], s_rpos[r], a.window);
    }
    if (!__syncthreads_or(any)) continue;  // uniform: no row sees this tile

    load_tile<HD, LD>(s_kv, kbase, a.krb, c0, s_cpos, a.kt);
    __syncthreads();
    float sv[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) sv[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
      float4 qv[2];
      qv[0] = *reinterpret_cast<const float4 *>(&s_q[sr0][d]);
      qv[1] = *reinterpret_cast<const float4 *>(&s_q[sr0 + 16][d]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 kv = *reinterpret_cast<const float4 *>(&s_kv[sc + 8 * j][d]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          sv[i][j] = fmaf(qv[i].x, kv.x, sv[i][j]);
          sv[i][j] = fmaf(qv[i].y, kv.y, sv[i][j]);
          sv[i][j] = fmaf(qv[i].z, kv.z, sv[i][j]);
          sv[i][j] = fmaf(qv[i].w, kv.w, sv[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = sr0 + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int cj = sc + 8 * j;
        s_p[r][cj] = attn_visible(s_cpos[cj], s_cseq[cj], s_rbit[r], s_rpos[r], a.window) ? sv[i][j] * a.scale : -INFINITY;
      }
    }
    __syncthreads();  // scores published, K no longer read

    load_tile<HD, LD>(s_kv, vbase, a.vrb, c0, s_cpos, a.kt);
    {
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < 8; ++k) mx = fmaxf(mx, s_p[xr][8 * xq + k]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float newM = fmaxf(M, mx);
      const float corr = newM == -INFINITY ? 1.0f : expf(M - newM);  // 0 when M was -inf
      float psum = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float s = s_p[xr][8 * xq + k];
        const float p = s == -INFINITY ? 0.0f : expf(s - newM);
        s_p[xr][8 * xq + k] = p;
        psum += p;
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      psum += __shfl_xor_sync(0xffffffffu, psum, 2);
      S = S * corr + psum;
      M = newM;
      if (xq == 0) s_corr[xr] = corr;
    }
    __syncthreads();  // V tile, probabilities and corrections published

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float cr = s_corr[pr + 8 * i];
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] *= cr;
    }
#pragma unroll 4
    for (int c = 0; c < kCells; ++c) {
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = s_p[pr + 8 * i][c];
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float4 v = *reinterpret_cast<const float4 *>(&s_kv[c][pd + 64 * j]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[i][j][0] = fmaf(p[i], v.x, acc[i][j][0]);
          acc[i][j][1] = fmaf(p[i], v.y, acc[i][j][1]);
          acc[i][j][2] = fmaf(p[i], v.z, acc[i][j][2]);
          acc[i][j][3] = fmaf(p[i], v.w, acc[i][j][3]);
        }
      }
    }
  }
  if (xq == 0) {  // the P*V threads of a row are not its softmax threads
    s_m[xr] = M;
    s_s[xr] = S;
  }
  __syncthreads();

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = pr + 8 * i, gr = r0 + r;
    if (gr >= rows) continue;
    const int t = gr / group, h = hk * group + gr % group;
    float f;
    float *dst = attn_row_dst(out, part, a.sinks, t, h, z, n_head, n_split, HD, s_m[r], s_s[r], pd == 0, f);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int d = pd + 64 * j;
      dst[d + 0] = acc[i][j][0] * f;
      dst[d + 1] = acc[i][j][1] * f;
      dst[d + 2] = acc[i][j][2] * f;
      dst[d + 3] = acc[i][j][3] * f;
    }
  }
}

}  // namespace

void attn_tiled_fma_launch(const AttnTiledLaunch &l) {
  const dim3 grid(static_cast<unsigned>((l.T * l.a.group + kRows - 1) / kRows), static_cast<unsigned>(l.n_head_kv),
                  static_cast<unsigned>(l.n_split));
  float *part = l.n_split > 1 ? l.part : nullptr;
  if (l.a.hd_k == 64) attn_tiled_fma_kernel<64><<<grid, kThreads, 0, l.stream>>>(l.q, l.out, l.a, l.ub, l.T, l.n_split, part);
  else attn_tiled_fma_kernel<128><<<grid, kThreads, 0, l.stream>>>(l.q, l.out, l.a, l.ub, l.T, l.n_split, part);
  MOE_CUDA_LAUNCH_CHECK("attn_tiled_fma_kernel");
}

}  // namespace moe
