// Fused kernels of the CUDA fusion plan (cuda_fusion.h): per-row chains RmsNorm -> Mul(row
// weight) -> Rope -> KvStore (a block per row of each chain, the row staged in shared
// memory; q, k and v heads of a layer in one launch; from 8 tokens on a block per token and a
// warp per row, with the same bits), and the softmax router Softmax ->
// TopK -> GatherCols [-> NormSum] (a block per token), optionally behind its one-token F32
// MatMul and that MatMul's input RmsNorm -> Mul (many blocks compute the logits, the last
// one to finish selects; a side product of the same row, qwen3next's shared-expert gate
// logit, in the warps after the logits'). They call the same device functions as the unfused kernels
// (row_ops.cuh, rope.cuh, kv_store.cuh, top_k.cuh) and sum the logits in the unfused
// mat-vec's order, so fused and unfused results are bit-identical. All launch with PDL
// (ops/pdl.cuh): before pdl_wait they read only weights and graph inputs (the rope
// positions: uploaded before the pass by stream-ordered copies, which PDL does not overlap).
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/last_block.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/rope.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "backends/cuda/ops/top_k.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

struct ChainDesc {
  TView in;                // chain input: rows of in.ne[0] F32 values
  TView out;               // the chain's tail output; out.data == nullptr when the tail is a KvStore
  const float *w;          // Mul row weight, or null
  const int32_t *pos;      // Rope positions [T], or null (no Rope)
  int pos_early;           // pos is a graph input (uploaded before the pass): read before pdl_wait
  uint8_t *kv;             // KvStore: the cache tensor, or null (no store)
  size_t kv_rb;            // bytes per cache cell row
  int kv_type;             // DType of the cache
  int rms;                 // RmsNorm first
  int rms_threads;         // block size of the unfused RmsNorm kernel (its reduction order)
  float eps;
  RopeArgs ra;
  int64_t rows;            // in.ne[1] * in.ne[2] * in.ne[3]
};

struct ChainsArgs {
  ChainDesc ch[kMaxFusedChains];
  int n;
  const int32_t *cells;    // token -> cache cell
  int n_cells;             // cells in the cache (a cell outside is reported, not stored)
  unsigned *err;           // DevUbatch::err
};

__device__ __forceinline__ const float *row_in(const TView &v, int64_t i1, int64_t i2, int64_t i3) {
  return reinterpret_cast<const float *>(static_cast<const uint8_t *>(v.data) + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3]);
}

// Row r of a chain's [n, ne1, ne2, ne3] input as (i1, i2, i3), in 32-bit math (rows are a grid
// index); ne2 == 1 (one token's rows) skips a division.
struct RowIdx {
  int i1, i2, i3;
};
__device__ __forceinline__ RowIdx split_row(int r, int ne1, int ne2) {
  const int r2 = r / ne1;
  return {r - r2 * ne1, ne2 == 1 ? 0 : r2 % ne2, ne2 == 1 ? r2 : r2 / ne2};
}

// __grid_constant__: the chain is picked by a run-time index into the parameters, which
// must not make each thread copy them to local memory.
__global__ void row_chains_kernel(const __grid_constant__ ChainsArgs a) {
  extern __shared__ float s_row[];
  __shared__ double s_red[32];
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  // 32-bit index math (rows are a grid index, a row fits shared memory): this one-block-per-row
  // kernel is a single latency chain, and 64-bit divisions and loop counters were half its instructions.
  int r = static_cast<int>(blockIdx.x);
  int c = 0;
  while (c + 1 < a.n && r >= static_cast<int>(a.ch[c].rows)) { r -= static_cast<int>(a.ch[c].rows); ++c; }
  const ChainDesc &d = a.ch[c];
  const int n = static_cast<int>(d.in.ne[0]);
  const auto [i1, i2, i3] = split_row(r, static_cast<int>(d.in.ne[1]), static_cast<int>(d.in.ne[2]));
  // The Mul weight (a weight, so before pdl_wait): its load overlaps the previous kernel.
  float wr[kWeightRegs];
  load_row_weights(d.w, n, blockDim.x, wr);
  // The angle table too when no kernel writes the positions (block-uniform condition).
  const bool table_early = d.pos && d.pos_early;
  if (table_early) rope_angle_table(d.pos, i2, d.ra, s_theta, s_cs);
  pdl_wait();
  pdl_trigger();
  stage_normed_row(s_row, row_in(d.in, i1, i2, i3), n, blockDim.x, d.rms, d.eps, d.rms_threads, d.w, wr, s_red);
  if (d.pos) {  // rows are [head_dim, n_head, T]: i2 is the token
    if (!table_early) rope_angle_table(d.pos, i2, d.ra, s_theta, s_cs);
    for (int k = threadIdx.x; k < d.ra.n_rot / 2; k += blockDim.x) rope_rotate_pair(s_row, s_row, k, d.ra, s_cs);
    __syncthreads();
  }
  if (d.out.data) {
    float *dst = const_cast<float *>(row_in(d.out, i1, i2, i3));
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = s_row[i];
  }
  if (d.kv) {  // head i1 of token i2 is elements [i1 * n, (i1 + 1) * n) of the token's cache row
    const int32_t cell = a.cells[i2];
    if (kv_cell_in_cache(cell, a.n_cells, a.err, threadIdx.x == 0))
      kv_store_values(s_row, n, d.kv + static_cast<size_t>(cell) * d.kv_rb, i1 * n, d.kv_type);
  }
}

// Many tokens (prefill): a block per token group b (the rows of token b in every chain:
// chain c's rows [rows_c b / G, rows_c (b + 1) / G), G = gridDim.x, which for a chain with a
// Rope are exactly its heads of token b), a warp per row. The angle table of each Rope chain
// is built once per block by rope_angle_table; a warp stages its row in its own shared slice
// and reproduces the block kernel's arithmetic (rms_row_scale_warp: the same bits as
// rms_row_scale), so both kernels give the same results (tests [cuda][fusion]).
constexpr int kRcWarps = 8, kRcThreads = 32 * kRcWarps;
constexpr int64_t kRcMaxRow = 512;  // values per row: 8 warps x 2 KB of shared memory
constexpr int kRcMaxRot = 256;      // rotated dims of a Rope chain (angle table per chain)

__global__ void __launch_bounds__(kRcThreads) row_chains_warp_kernel(const __grid_constant__ ChainsArgs a) {
  extern __shared__ float s_rows[];  // [kRcWarps][row stride]
  __shared__ float s_theta[kRcMaxRot / 2];
  __shared__ float s_cs[kMaxFusedChains][kRcMaxRot];
  __shared__ float s_w[kMaxFusedChains][kRcMaxRow];  // the Mul weights, shared by the block's rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x, G = gridDim.x;
  for (int c = 0; c < a.n; ++c)  // weights: before pdl_wait (made visible by the tables' barriers or the one below)
    if (a.ch[c].w) stage_row<kRcMaxRow / kRcThreads>(s_w[c], a.ch[c].w, a.ch[c].in.ne[0], threadIdx.x, kRcThreads);
  // Block-uniform: every thread builds each table (rope_angle_table has barriers). Chains
  // whose positions are graph inputs build theirs before pdl_wait.
  for (int c = 0; c < a.n; ++c)
    if (a.ch[c].pos && a.ch[c].pos_early) rope_angle_table(a.ch[c].pos, b % a.ch[c].in.ne[2], a.ch[c].ra, s_theta, s_cs[c]);
  pdl_wait();
  pdl_trigger();
  for (int c = 0; c < a.n; ++c)
    if (a.ch[c].pos && !a.ch[c].pos_early) rope_angle_table(a.ch[c].pos, b % a.ch[c].in.ne[2], a.ch[c].ra, s_theta, s_cs[c]);
  __syncthreads();  // s_w and the tables are complete
  int64_t stride = 1;
  for (int c = 0; c < a.n; ++c) stride = a.ch[c].in.ne[0] > stride ? a.ch[c].in.ne[0] : stride;
  float *row = s_rows + warp * stride;
  // The block's rows, chain after chain, dealt to the warps in turn. 32-bit index math and a
  // 4-deep staging loop (rows are a grid index; a row fits shared memory): ncu counted (2026-11-30)
  // ~920 warp instructions per row here, mostly 64-bit divisions, loop control and the
  // predicated slots of a 16-deep staging batch sized for 512-value rows.
  int item = warp;
  for (int c = 0; c < a.n; ++c) {
    const ChainDesc &d = a.ch[c];
    const int r0 = static_cast<int>(d.rows * b / G), r1 = static_cast<int>(d.rows * (b + 1) / G);
    const int n = static_cast<int>(d.in.ne[0]), ne1 = static_cast<int>(d.in.ne[1]), ne2 = static_cast<int>(d.in.ne[2]);
    for (; item < r1 - r0; item += kRcWarps) {
      const auto [i1, i2, i3] = split_row(r0 + item, ne1, ne2);
      __syncwarp();  // the previous row's last reads of `row` are done
      const float *src = row_in(d.in, i1, i2, i3);
      stage_row<4>(row, src, n, lane, 32);
      __syncwarp();
      if (d.rms) {
        const float scale = rms_row_scale_warp(row, n, d.eps, d.rms_threads);
        for (int i = lane; i < n; i += 32) {
          float v = row[i] * scale;  // the RmsNorm output, rounded to float as it would be stored
          if (d.w) v = v * s_w[c][i];
          row[i] = v;
        }
        __syncwarp();
      }
      if (d.pos) {  // rows are [head_dim, n_head, T]: this block's token is i2 == b
        for (int k = lane; k < d.ra.n_rot / 2; k += 32) rope_rotate_pair(row, row, k, d.ra, s_cs[c]);
        __syncwarp();
      }
      if (d.out.data) {
        float *dst = const_cast<float *>(row_in(d.out, i1, i2, i3));
        for (int i = lane; i < n; i += 32) dst[i] = row[i];
      }
      if (d.kv && kv_cell_in_cache(a.cells[i2], a.n_cells, a.err, lane == 0))
        kv_store_values(row, n, d.kv + static_cast<size_t>(a.cells[i2]) * d.kv_rb, i1 * n, d.kv_type, lane, 32);
    }
    item -= r1 - r0;
  }
}

// The token groups of row_chains_warp_kernel, or 0 where the block-per-row kernel runs: few
// tokens (decode: a block per row spreads 40 rows over 40 SMs), rows longer than kRcMaxRow,
// no Rope or KvStore chain to define the tokens, or a Rope chain that is not [n, heads, G].
constexpr int64_t kRcMinGroups = 8;
int64_t warp_kernel_groups(const ChainsArgs &a, int64_t widest) {
  if (widest > kRcMaxRow) return 0;
  int64_t groups = 0;
  for (int c = 0; c < a.n && groups == 0; ++c)
    if (a.ch[c].pos || a.ch[c].kv) groups = a.ch[c].in.ne[2] * a.ch[c].in.ne[3];
  if (groups < kRcMinGroups || groups > 0x7fffffff) return 0;
  for (int c = 0; c < a.n; ++c) {
    const ChainDesc &d = a.ch[c];
    if (d.pos && (d.in.ne[2] != groups || d.in.ne[3] != 1 || d.ra.n_rot > kRcMaxRot)) return 0;
    if (d.rows > 0x7fffffff / 2) return 0;  // the kernel's 32-bit row indices (r0 + item, i1 * n)
  }
  return groups;
}

struct RouterArgs {
  TView logits;      // [E, T]
  TView probs;       // softmax / sigmoid output (data null: not read outside the group, not written)
  TView ids;         // top-k ids [k, T]
  TView gathered;    // gathered probabilities (data null: not written)
  TView weights;     // renormalised weights (data null: no NormSum; sigmoid: not written)
  int k;
  // Sigmoid gating (deepseek2; route_row_sigmoid): probs = sigmoid(logits), the top-k of
  // probs + bias, the gathered (unbiased) probs [renormalised] [scaled: w * sc0 + sc1].
  int sigmoid;
  const float *bias;  // [E], or null (no Add)
  TView selected;     // probs + bias (data null: not written)
  int norm;           // a NormSum follows the gather
  TView scaled;       // the Scale's output (data null: no Scale)
  float sc0, sc1;
};

// Row t of v: n values of src by threads [0, nthr) from tid (the whole block, or one thread).
__device__ __forceinline__ void store_row(const TView &v, int64_t t, const float *src, int n, int tid = threadIdx.x, int nthr = blockDim.x) {
  float *o = const_cast<float *>(row_in(v, t, 0, 0));
  for (int i = tid; i < n; i += nthr) o[i] = src[i];
}

// Warp 0 (all lanes), after its top-k into s_ids: lane j < k writes token t's id j and the
// probability of that expert into g[j] (shared; the gathered row, written when read outside
// the group).
__device__ __forceinline__ void store_selection(const float *s_p, const int32_t *s_ids, const RouterArgs &a, int64_t t, int E, float *g) {
  int32_t *ids = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(a.ids.data) + t * a.ids.nb[1]);
  const int j = threadIdx.x & 31;
  if (j < a.k) {
    const int32_t e = s_ids[j];
    ids[j] = e;
    g[j] = (e >= 0 && e < E) ? s_p[e] : 0.0f;
  }
  __syncwarp();
  if (a.gathered.data) store_row(a.gathered, t, g, a.k, j, 32);
}

// NormSum of g[0..k) (shared) in place by warp 0 (all lanes): the serial float sum (every
// lane alike), then lane j's division of g[j].
__device__ __forceinline__ void norm_sum_values(float *g, int k) {
  float s = 0.0f;
  for (int j = 0; j < k; ++j) s += g[j];
  __syncwarp();  // every lane has read g
  const int j = threadIdx.x & 31;
  if (j < k) g[j] = g[j] / s;
  __syncwarp();
}

// Softmax, top-k, gather [, norm] of token t's logits row (may be shared memory) over
// threads [0, nthr) of the block (the unfused Softmax kernel's block size); warp 0 selects.
// Block-wide: every thread calls it.
__device__ void route_row(const float *logits, const RouterArgs &a, int64_t t, int nthr) {
  __shared__ float s_p[kCudaMaxExperts];
  __shared__ float s_max[32];
  __shared__ double s_sum[32];
  __shared__ int32_t s_ids[32];
  const int E = static_cast<int>(a.logits.ne[0]);
  softmax_row(logits, s_p, E, s_max, s_sum, nthr);
  __syncthreads();
  if (a.probs.data) store_row(a.probs, t, s_p, E);
  if (threadIdx.x >= 32) return;
  __shared__ float g[32];
  warp_top_k(s_p, E, a.k, s_ids);
  __syncwarp();
  store_selection(s_p, s_ids, a, t, E, g);
  if (a.weights.data) {
    norm_sum_values(g, a.k);
    store_row(a.weights, t, g, a.k, threadIdx.x, 32);
  }
}

// Sigmoid, [+ bias,] top-k, gather [, norm] [, scale] of token t's logits row (may be shared
// memory), each value by the unfused op's expression (ew_value; NormSum's serial float sum).
// Block-wide: every thread calls it.
__device__ void route_row_sigmoid(const float *logits, const RouterArgs &a, int64_t t) {
  __shared__ float s_p[kCudaMaxExperts];
  __shared__ float s_sel[kCudaMaxExperts];
  __shared__ int32_t s_ids[32];
  const int E = static_cast<int>(a.logits.ne[0]);
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float p = ew_value(kSigmoid, logits[i], 0.0f, i, E, 0.0f, 0.0f);
    s_p[i] = p;
    s_sel[i] = a.bias ? ew_value(kAdd, p, a.bias[i], i, E, 0.0f, 0.0f) : p;
  }
  __syncthreads();
  if (a.probs.data) store_row(a.probs, t, s_p, E);
  if (a.selected.data) store_row(a.selected, t, s_sel, E);
  if (threadIdx.x >= 32) return;
  __shared__ float g[32];
  warp_top_k(s_sel, E, a.k, s_ids);
  __syncwarp();
  store_selection(s_p, s_ids, a, t, E, g);
  const int j = threadIdx.x;  // (warp 0)
  if (a.norm) {
    norm_sum_values(g, a.k);
    if (a.weights.data) store_row(a.weights, t, g, a.k, j, 32);
  }
  if (a.scaled.data && j < a.k) {
    const float v = ew_value(kScale, g[j], 0.0f, j, a.k, a.sc0, a.sc1);
    float *o = const_cast<float *>(row_in(a.scaled, t, 0, 0));
    o[j] = v;
  }
}

// A block per token (the block size of the unfused Softmax kernel).
__global__ void router_kernel(RouterArgs a) {
  pdl_wait();
  pdl_trigger();
  if (a.sigmoid) route_row_sigmoid(row_in(a.logits, blockIdx.x, 0, 0), a, blockIdx.x);
  else route_row(row_in(a.logits, blockIdx.x, 0, 0), a, blockIdx.x, static_cast<int>(blockDim.x));
}

// The router's one-token F32 mat-vec in the same launch, optionally behind the RmsNorm -> Mul
// of its input. Each block stages the activation row in shared memory (normalised there by
// the row chains' arithmetic when the norm is fused: rms_row_scale over the unfused RmsNorm
// kernel's block size, then (x * scale) * w; block 0 writes the row for its other readers)
// and computes a logit per warp exactly as the unfused F32 mat-vec does (ops/matvec.cu:
// ref_dot_f32_row, the CPU's reference order over the whole row; the row is prefetched into
// L2 before pdl_wait). The last block to finish (DevUbatch::sync counter) reads the logits
// back and routes. A side product of the same row (cuda_fusion.h: kMaxRouterSideRows; the
// shared expert's gate logit) takes the warps after the logits' rows, the same dot.
constexpr int kRmWarps = 8, kRmThreads = kRmWarps * 32, kRmRows = kRmWarps;
constexpr int kRmMaxK = 8192;  // the staged row: 32 KB of shared memory

struct RouterMv {
  const float *w;    // [K, E] rows of K floats, 16-byte aligned, row stride w_rs floats
  int64_t w_rs;
  const float *x;    // [K] (the norm's input when nw is set)
  const float *nw;   // RmsNorm -> Mul: the Mul's row weight [K], or null (no norm)
  float *normed;     // the Mul's output [K] when read outside the group, or null
  float eps;
  int rms_nthr;      // the unfused RmsNorm kernel's block size (its reduction order)
  float *logits;     // [E] (the MatMul's output)
  const float *side_w;  // the side MatMul's weight [K, side_rows] (row stride side_rs floats), or null
  int64_t side_rs;
  int side_rows;     // 0: no side product
  float *side_out;   // [side_rows]
  unsigned *sync;    // one counter
  int K, nthr;       // nthr: the unfused Softmax kernel's block size
};

__global__ void __launch_bounds__(kRmThreads) router_mv_kernel(RouterArgs a, RouterMv m) {
  __shared__ __align__(16) float s_x[kRmMaxK];  // the activation row [K]
  __shared__ double s_red[32];
  __shared__ float s_l[kCudaMaxExperts];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int E = static_cast<int>(a.logits.ne[0]);
  const int row = blockIdx.x * kRmRows + warp;  // this warp's logit (E and on: a side row)
  const bool has_row = row < E + m.side_rows;
  const float *wrow = !has_row ? nullptr : row < E ? m.w + row * m.w_rs : m.side_w + (row - E) * m.side_rs;
  // Weights before pdl_wait: this warp's row into L2, and the norm's row weight.
#ifdef __CUDA_ARCH__  // (host emulation: tools/cuda_emu)
  if (has_row)
    for (int64_t o = lane * 32; o < m.K; o += 32 * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + o));
#endif
  float nwr[kWeightRegs];
  load_row_weights(m.nw, m.K, kRmThreads, nwr);
  pdl_wait();
  pdl_trigger();
  // All of a thread's loads in flight before its stores (one L2 round trip, not K / 256), then
  // RmsNorm -> Mul as the row chains compute them.
  stage_normed_row(s_x, m.x, m.K, kRmThreads, m.nw != nullptr, m.eps, m.rms_nthr, m.nw, nwr, s_red, m.normed);
  if (has_row) {
    const float v = ref_dot_f32_row(wrow, s_x, m.K);
    if (lane == 0) {
      *(row < E ? m.logits + row : m.side_out + (row - E)) = v;
      __threadfence();  // visible device-wide before the block is counted
    }
  }
  if (!last_block_arrives(m.sync, gridDim.x)) return;
  for (int i = threadIdx.x; i < E; i += blockDim.x) s_l[i] = __ldcg(m.logits + i);
  __syncthreads();
  if (a.sigmoid) route_row_sigmoid(s_l, a, 0);
  else route_row(s_l, a, 0, m.nthr);
}

bool is_written(const FusedGroup &grp, int id) { return std::find(grp.written.begin(), grp.written.end(), id) != grp.written.end(); }

// A graph input (or a view of one): uploaded by the host before the pass, written by no kernel.
bool is_graph_input(const Graph &g, int id) {
  const Node *p = &g.node(id);
  while (p->op == Op::View) p = &g.node(p->src[0]);
  return p->op == Op::Leaf && p->leaf == LeafKind::Input;
}

bool kv_type_fusable(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::Q8_0; }

}  // namespace

bool cuda_fused_row_chains_fit(const CudaOpCtx &c, const FusedGroup &grp) {
  for (int m : grp.members) {
    const Node &n = c.g.node(m);
    if (n.op != Op::KvStore) continue;
    if (!c.kv || !kv_type_fusable(c.kv->dtype())) return false;
    if (c.kv->dtype() == DType::Q8_0 && c.g.node(n.src[0]).ne[0] % 32 != 0) return false;
  }
  return true;
}

void cuda_fused_row_chains(const CudaOpCtx &c, const FusedGroup &grp) {
  const auto chains = row_chains(c.g, grp.members);
  ChainsArgs a{};
  a.n = static_cast<int>(chains.size());
  a.cells = c.ub.cells;
  a.n_cells = c.kv ? static_cast<int>(c.kv->n_cells()) : 0;
  a.err = c.ub.err;
  int64_t total = 0, widest = 1;
  for (size_t k = 0; k < chains.size(); ++k) {
    ChainDesc &d = a.ch[k];
    const Node &x = c.g.node(c.g.node(chains[k].front()).src[0]);
    d.in = tview(x);
    d.rows = x.ne[1] * x.ne[2] * x.ne[3];
    d.rms_threads = row_threads(x.ne[0]);
    for (int m : chains[k]) {
      const Node &n = c.g.node(m);
      switch (n.op) {
        case Op::RmsNorm: d.rms = 1; d.eps = n.fp[0]; break;
        case Op::Mul: d.w = static_cast<const float *>(c.g.node(n.src[1]).data); break;
        case Op::Rope:
          d.ra = make_rope_args(n.rope, c.ub, n.ne[2]);
          d.pos = static_cast<const int32_t *>(c.g.node(n.src[1]).data);
          d.pos_early = is_graph_input(c.g, n.src[1]) ? 1 : 0;
          break;
        case Op::KvStore:
          d.kv = static_cast<uint8_t *>(n.kv_which == 0 ? c.kv->k_data(n.kv_layer) : c.kv->v_data(n.kv_layer));
          d.kv_rb = n.kv_which == 0 ? c.kv->k_row_bytes(n.kv_layer) : c.kv->v_row_bytes(n.kv_layer);
          d.kv_type = static_cast<int>(c.kv->dtype());
          break;
        default: break;
      }
    }
    if (is_written(grp, chains[k].back())) d.out = tview(c.g.node(chains[k].back()));
    else d.out.data = nullptr;
    total += d.rows;
    widest = std::max(widest, x.ne[0]);
  }
  if (total == 0) return;
  const int64_t groups = warp_kernel_groups(a, widest);
  if (groups > 0) {
    launch_pdl(row_chains_warp_kernel, dim3(static_cast<unsigned>(groups)), dim3(kRcThreads), static_cast<size_t>(kRcWarps * widest) * 4,
               c.stream, a);
    return;
  }
  const int threads = row_threads(widest);
  launch_pdl(row_chains_kernel, dim3(static_cast<unsigned>(total)), dim3(static_cast<unsigned>(threads)), static_cast<size_t>(widest) * 4,
             c.stream, a);
}

namespace {

// The fused router mat-vec applies where the unfused mat-vec would take its split path with
// 16-byte loads (its summation order): contiguous aligned F32 rows (weights and the MatMul's
// input, the Mul output when the norm is fused), K a multiple of 8, few rows.
bool router_mv_fits(const CudaOpCtx &c, const Node &mm) {
  const Node &w = c.g.node(mm.src[0]), &x = c.g.node(mm.src[1]);
  auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t K = w.ne[0], E = w.ne[1];
  return c.ub.sync && w.type == DType::F32 && w.nb[0] == 4 && w.nb[1] % 16 == 0 && aligned(w.data) && K % 8 == 0 && K <= kRmMaxK &&
         x.type == DType::F32 && x.nb[0] == 4 && x.ne[0] == K && aligned(x.data) && mm.ne[0] == E && E <= kCudaMaxExperts;
}

// A side MatMul (cuda_fusion.h: kMaxRouterSideRows) in the router's launch: as router_mv_fits,
// and the router's activation and K.
bool side_mv_fits(const CudaOpCtx &c, const Node &side, const Node &mm) {
  const Node &w = c.g.node(side.src[0]);
  return side.src[1] == mm.src[1] && router_mv_fits(c, side) && w.ne[0] == c.g.node(mm.src[0]).ne[0] && w.ne[1] <= kMaxRouterSideRows;
}

// The members after a sigmoid router's Sigmoid (from index p): [Add (bias),] TopK,
// GatherCols [, NormSum] [, Scale] (cuda_fusion.cpp: match_sigmoid_router).
void sigmoid_router_args(const CudaOpCtx &c, const FusedGroup &grp, size_t p, RouterArgs &a) {
  const std::vector<int> &mb = grp.members;
  auto node = [&](size_t k) -> const Node & { return c.g.node(mb[k]); };
  auto written_view = [&](size_t k) {
    TView v = tview(node(k));
    if (!is_written(grp, mb[k])) v.data = nullptr;
    return v;
  };
  a.sigmoid = 1;
  a.selected.data = nullptr;
  if (node(p).op == Op::Add) {
    a.bias = static_cast<const float *>(c.g.node(node(p).src[1]).data);
    a.selected = written_view(p);
    ++p;
  }
  a.ids = tview(node(p));
  a.k = static_cast<int>(node(p).ne[0]);
  a.gathered = written_view(p + 1);
  p += 2;
  a.weights.data = nullptr;
  a.scaled.data = nullptr;
  if (p < mb.size() && node(p).op == Op::NormSum) {
    a.norm = 1;
    a.weights = written_view(p);
    ++p;
  }
  if (p < mb.size() && node(p).op == Op::Scale) {
    a.scaled = tview(node(p));
    a.sc0 = node(p).fp[0];
    a.sc1 = node(p).fp[1];
  }
}

void run_nodes(const CudaOpCtx &c, const FusedGroup &grp, size_t n) {
  for (size_t k = 0; k < n; ++k) cuda_run_node(c.with_node(c.g.node(grp.members[k])));
}

}  // namespace

// Members: [RmsNorm, Mul,] [[side MatMul,] MatMul,] Softmax, TopK, GatherCols [, NormSum]; or
// [RmsNorm, Mul,] [side MatMul,] MatMul, Sigmoid, [Add,] TopK, GatherCols [, NormSum] [, Scale].
void cuda_fused_router(const CudaOpCtx &c, const FusedGroup &grp) {
  const bool with_norm = c.g.node(grp.members[0]).op == Op::RmsNorm;
  const size_t i_side = with_norm ? 2 : 0;
  const bool with_side = c.g.node(grp.members[i_side]).op == Op::MatMul && c.g.node(grp.members[i_side + 1]).op == Op::MatMul;
  const size_t i_mm = i_side + (with_side ? 1 : 0);
  const bool with_mm = c.g.node(grp.members[i_mm]).op == Op::MatMul;
  const size_t m0 = with_mm ? i_mm + 1 : 0;  // the Softmax
  const Node &sm = c.g.node(grp.members[m0]);
  const int64_t T = sm.ne[1];
  if (T == 0) return;
  RouterArgs a{};
  a.logits = tview(c.g.node(sm.src[0]));
  a.probs = tview(sm);
  if (!is_written(grp, grp.members[m0])) a.probs.data = nullptr;
  if (sm.op == Op::Sigmoid) {
    sigmoid_router_args(c, grp, m0 + 1, a);
  } else {
    const Node &tk = c.g.node(grp.members[m0 + 1]), &gc = c.g.node(grp.members[m0 + 2]);
    a.ids = tview(tk);
    a.gathered = tview(gc);
    if (!is_written(grp, grp.members[m0 + 2])) a.gathered.data = nullptr;
    a.weights.data = nullptr;
    if (grp.members.size() > m0 + 3) a.weights = tview(c.g.node(grp.members[m0 + 3]));
    a.k = static_cast<int>(tk.ne[0]);
  }
  const int nthr = row_threads(sm.ne[0]);
  if (with_mm) {
    const Node &mm = c.g.node(grp.members[i_mm]);
    const Node *side = with_side ? &c.g.node(grp.members[i_side]) : nullptr;
    if (T == 1 && router_mv_fits(c, mm) && (!side || side_mv_fits(c, *side, mm))) {
      const Node &w = c.g.node(mm.src[0]);
      RouterMv m{};
      m.w = static_cast<const float *>(w.data);
      m.w_rs = static_cast<int64_t>(w.nb[1] / 4);
      m.x = static_cast<const float *>(c.g.node(mm.src[1]).data);
      if (with_norm) {
        const Node &rms = c.g.node(grp.members[0]), &mul = c.g.node(grp.members[1]);
        m.x = static_cast<const float *>(c.g.node(rms.src[0]).data);
        m.nw = static_cast<const float *>(c.g.node(mul.src[1]).data);
        m.normed = is_written(grp, grp.members[1]) ? static_cast<float *>(mul.data) : nullptr;
        m.eps = rms.fp[0];
        m.rms_nthr = row_threads(rms.ne[0]);
      }
      m.logits = static_cast<float *>(mm.data);
      if (side) {
        const Node &sw = c.g.node(side->src[0]);
        m.side_w = static_cast<const float *>(sw.data);
        m.side_rs = static_cast<int64_t>(sw.nb[1] / 4);
        m.side_rows = static_cast<int>(sw.ne[1]);
        m.side_out = static_cast<float *>(side->data);
      }
      m.sync = c.ub.sync;
      m.K = static_cast<int>(w.ne[0]);
      m.nthr = nthr;
      const unsigned blocks = static_cast<unsigned>((sm.ne[0] + m.side_rows + kRmRows - 1) / kRmRows);
      launch_pdl(router_mv_kernel, dim3(blocks), dim3(kRmThreads), 0, c.stream, a, m);
      return;
    }
    run_nodes(c, grp, i_mm + 1);  // the norm and the mat-vec(s) on their own
  }
  launch_pdl(router_kernel, dim3(static_cast<unsigned>(T)), dim3(static_cast<unsigned>(nthr)), 0, c.stream, a);
}

}  // namespace moe
