// Attention over an F32 cache in the CPU's reference order (attend_f32_reference_order in
// src/backends/cpu/ops/attention.cpp), bit for bit, so that CUDA reproduces the K-quant
// conformance files token by token. One block per (head, token), three phases over the
// cells [0, n_kv) at their cache index (the lane a cell folds into is fixed by its index):
//  1. scores: the reference's vec_dot_f32 (ref_dot_f32_row's order; a warp dots 8 cells at
//     once) times scale; hidden cells -inf; the block's max;
//  2. the reference's vector expf of (score - max) per 16-cell chunk, each chunk's 16-lane
//     tree, the chunk sums added in double in chunk order (one thread), one float
//     reciprocal, every probability times it;
//  3. KQV: four threads per output dim share the reference's accumulators: one token, 64 lanes
//     (lane c % 64) folded ((l, l+32) + (l+16, l+48)) then the 16-lane tree; several
//     tokens (the reference's batched GEMM), 16 lanes (c % 16) and the tree. Zero
//     probabilities are skipped (fma(v, 0, a) == a).
// Scores and chunk sums live in the node's planned scratch (a row of n_cells + n_cells / 16
// floats per (head, token)), written and read by the same block.
#include "backends/cuda/ops/attention_ref_order.cuh"
#include "backends/cuda/ops/matmul_ref_order.h"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/ref_math.cuh"

#include <algorithm>

namespace moe {

namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;
constexpr int kBatch = 8;                          // K rows a warp loads before reducing any
constexpr int kDims = kThreads / 4;                // KQV: output dims per pass, 4 threads each
// Decode and prompt batches of <= cuda_ref_order_tokens(g, tuning) (at least 16), where the
// products are in the CPU's order too (matmul_ref_order.cu); longer batches take the tiled
// kernels (far faster).
int64_t max_tokens(const Graph &g, const GpuTuning &tuning) { return std::max(16, cuda_ref_order_tokens(g, tuning)); }
constexpr size_t kMaxWork = size_t{64} << 20;      // larger contexts x batches take the fast kernels

__host__ __device__ __forceinline__ int64_t row_floats(int64_t n_cells) { return n_cells + (n_cells + 15) / 16; }

// nr <= R dots of F32 rows with x (shared), each in ref_dot_f32_row's order (ops/ref_math.cuh:
// lanes l and 32 + l of the 4 x 16 accumulators, the fold, the 16-lane tree, a serial tail),
// the loads of all rows in flight together. nr is warp-uniform; every lane gets every result.
template <int R>
__device__ __forceinline__ void ref_dot_f32_rows(const float *const (&rows)[R], int nr, const float *x, int n, float (&out)[R]) {
  const int lane = threadIdx.x & 31, np = n & ~63;
  float a0[R], a1[R];
#pragma unroll
  for (int u = 0; u < R; ++u) a0[u] = a1[u] = 0.0f;
  for (int i = 0; i < np; i += 64) {
    const float xa = x[i + lane], xb = x[i + 32 + lane];
#pragma unroll
    for (int u = 0; u < R; ++u)
      if (u < nr) {
        a0[u] = fmaf(__ldg(rows[u] + i + lane), xa, a0[u]);
        a1[u] = fmaf(__ldg(rows[u] + i + 32 + lane), xb, a1[u]);
      }
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    float v = __fadd_rn(a0[u], a1[u]);                         // lanes < 16: s0 + s2; else s1 + s3
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16));     // (s0 + s2) + (s1 + s3)
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (u < nr)
      for (int e = np; e < n; ++e) v = fmaf(__ldg(rows[u] + e), x[e], v);
    out[u] = v;
  }
}

template <int LANES>
__global__ void __launch_bounds__(kThreads, 1) attn_ref_order_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, float *scratch, int n_cells) {
  static_assert(LANES == 16 || LANES == 64, "the reference's one-token (64) or batched (16) accumulators");
  constexpr int kLanesPerThread = LANES / 4;
  __shared__ float s_q[kCudaMaxHeadDim];
  __shared__ float s_max[kWarps];
  __shared__ double s_sum;
  __shared__ float s_acc[LANES][kDims];
  const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
  const int hk = h / a.group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The ubatch (cell count, mask, this token's position) is uploaded before the pass.
  const int n_kv = min(*ub.n_kv, n_cells);
  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  pdl_wait();
  pdl_trigger();
  float *p = scratch + (static_cast<int64_t>(t) * n_head + h) * row_floats(n_cells);
  float *chunk_sum = p + n_cells;
  const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + h * q.nb[1] + t * q.nb[2]);
  for (int i = tid; i < a.hd_k; i += kThreads) s_q[i] = qrow[i];
  __syncthreads();

  // 1. Scores: a warp reads the mask of 32 cells (a lane each), then dots kBatch visible
  //    cells at a time; lane u stores the score of the batch's cell u.
  float mx = -INFINITY;
  for (int base = warp * 32; base < n_kv; base += kWarps * 32) {
    const int cl = base + lane;
    const bool vis = cl < n_kv && attn_visible(ub.cell_pos[cl], ub.cell_seq[cl], bit, pos, a.window);
    if (cl < n_kv && !vis) p[cl] = -INFINITY;
    unsigned todo = __ballot_sync(0xffffffffu, vis);
    while (todo) {  // warp-uniform
      const float *rows[kBatch];
      int cs[kBatch], nr = 0;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        cs[u] = -1;
        rows[u] = nullptr;
        if (todo) {
          cs[u] = base + __ffs(todo) - 1;
          todo &= todo - 1;
          rows[u] = reinterpret_cast<const float *>(a.kbase + cs[u] * a.krb + hk * a.khb);
          nr = u + 1;
        }
      }
      float d[kBatch];
      ref_dot_f32_rows<kBatch>(rows, nr, s_q, a.hd_k, d);
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < nr) {
          const float sc = __fmul_rn(d[u], a.scale);
          if (lane == u) p[cs[u]] = sc;
          mx = fmaxf(mx, sc);
        }
    }
  }
  if (lane == 0) s_max[warp] = mx;
  __syncthreads();  // also publishes p
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_max[w]);

  // 2. Softmax: exps per 16-cell chunk (cells past n_kv are zero lanes), chunk trees, double sum.
  const int n_chunks = (n_kv + 15) / 16;
  for (int ch = tid; ch < n_chunks; ch += kThreads) {
    float e[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int c = ch * 16 + k;
      float v = 0.0f;
      if (c < n_kv) {
        const float sc = p[c];
        v = sc == -INFINITY ? 0.0f : ref_expf_v(__fsub_rn(sc, M));
        p[c] = v;
      }
      e[k] = v;
    }
    chunk_sum[ch] = ref_hsum16(e);
  }
  __syncthreads();
  if (tid == 0) {
    double sum = 0.0;
    for (int ch = 0; ch < n_chunks; ++ch) sum += static_cast<double>(chunk_sum[ch]);
    s_sum = sum;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / s_sum);
  for (int c = tid; c < n_kv; c += kThreads) p[c] = __fmul_rn(p[c], inv);
  __syncthreads();

  // 3. KQV: accumulator lane j of a dim folds the cells c with c % LANES == j in cell order.
  //    kDims dims per pass; the 4 threads of a dim (quarter qq) own lanes
  //    [qq * LANES / 4, (qq + 1) * LANES / 4), then one folds the dim's lanes from s_acc.
  float *o = attn_out_row(out, t, h);
  const int di = tid % kDims, qq = tid / kDims;
  for (int d0 = 0; d0 < a.hd_v; d0 += kDims) {
    const int i = d0 + di;
    float acc[kLanesPerThread];
#pragma unroll
    for (int j = 0; j < kLanesPerThread; ++j) acc[j] = 0.0f;
    if (i < a.hd_v)
      for (int c0 = qq * kLanesPerThread; c0 < n_kv; c0 += LANES) {
#pragma unroll
        for (int j = 0; j < kLanesPerThread; ++j) {
          const int c = c0 + j;
          if (c < n_kv) {
            const float pc = p[c];
            const float v = reinterpret_cast<const float *>(a.vbase + c * a.vrb + hk * a.vhb)[i];
            acc[j] = pc != 0.0f ? fmaf(v, pc, acc[j]) : acc[j];  // hidden cells: their V is never used
          }
        }
      }
#pragma unroll
    for (int j = 0; j < kLanesPerThread; ++j) s_acc[qq * kLanesPerThread + j][di] = acc[j];
    __syncthreads();
    if (qq == 0 && i < a.hd_v) {
      float f[16];
      if constexpr (LANES == 64) {
#pragma unroll
        for (int l = 0; l < 16; ++l) f[l] = __fadd_rn(__fadd_rn(s_acc[l][di], s_acc[32 + l][di]), __fadd_rn(s_acc[16 + l][di], s_acc[48 + l][di]));
      } else {
#pragma unroll
        for (int l = 0; l < 16; ++l) f[l] = s_acc[l][di];
      }
      o[i] = ref_hsum16(f);
    }
    __syncthreads();  // s_acc is rewritten by the next pass
  }
}

}  // namespace

size_t attn_ref_order_work_size(const Graph &g, const Node &n, const GpuTuning &tuning) {
  const int64_t T = n.ne[2], n_head = n.ne[1], n_cells = n.ip[1];
  const bool sinks = n.src[3] >= 0, v_from_k = (n.ip[2] & 1) != 0;
  if (T < 1 || T > max_tokens(g, tuning) || n_cells <= 0 || sinks || v_from_k) return 0;
  if (n.kv_type && *n.kv_type != DType::F32) return 0;  // the kernel reads F32 caches only
  if (g.node(n.src[0]).ne[0] > kCudaMaxHeadDim || n.ne[0] > kCudaMaxHeadDim) return 0;
  const size_t bytes = static_cast<size_t>(T * n_head * row_floats(n_cells)) * 4;
  return bytes <= kMaxWork ? bytes : 0;
}

bool attn_ref_order_launch(const CudaOpCtx &c, TView q, TView out, const AttnArgs &a) {
  const Node &n = c.n;
  const DevUbatch &ub = c.ub;
  const size_t need = attn_ref_order_work_size(c.g, n, c.tuning);
  if (!need || !n.work || n.work_size < need || a.kt != static_cast<int>(DType::F32) || a.sinks) return false;
  const int n_head = static_cast<int>(q.ne[1]), T = static_cast<int>(q.ne[2]);
  const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>(T));
  float *scratch = static_cast<float *>(n.work);
  if (T == 1) launch_pdl(attn_ref_order_kernel<64>, grid, dim3(kThreads), 0, c.stream, q, out, a, ub, scratch, static_cast<int>(n.ip[1]));
  else launch_pdl(attn_ref_order_kernel<16>, grid, dim3(kThreads), 0, c.stream, q, out, a, ub, scratch, static_cast<int>(n.ip[1]));
  return true;
}

}  // namespace moe
