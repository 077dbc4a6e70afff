// gpt-oss's router in one launch (FusedKind::TopKRouter, cuda_fusion.h): [RmsNorm -> Mul ->]
// the one-token F32 MatMul, + bias (Add), TopK of the biased logits, GatherCols of the chosen
// ones, Softmax over them [, Scale]. The unfused schedule is three to five launches of a few
// hundred bytes each (docs/perf/cuda.md, 2026-12-03 "gpt-oss's router in one launch").
//
// Layout: a warp per logit row, kTrWarps rows per block (32 experts: 4 blocks). Each block
// stages the activation row in shared memory (normalised there as the row chains do:
// rms_mul_staged with the unfused RmsNorm kernel's block size; block 0 writes it for the
// experts), each warp folds its weight row in ref_dot_f32_row's order (the unfused F32
// mat-vec's, the CPU's) from registers loaded before pdl_wait, adds the bias as the Add kernel
// does (one rounded float add) and writes the biased logit. The last block to arrive
// (last_block.cuh) reads the E logits back, warp 0 takes the top k (warp_top_k: the TopK
// kernel's device code and tie order) and gathers them, then the block runs softmax_row over
// the k values with the unfused Softmax kernel's block size: every output has the unfused bits.
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/last_block.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "backends/cuda/ops/top_k.cuh"

namespace moe {

namespace {

constexpr int kTrWarps = 8, kTrThreads = 32 * kTrWarps;  // >= the RmsNorm kernel's 256 threads (rms_row_scale)
constexpr int kTrMaxK = 8192;                            // the staged row: 32 KB of shared memory
constexpr int kTrMaxTopK = 32;                           // one warp's lanes hold the chosen values
// The weight row in registers: chunks of 64 kTrU values (a lane holds 2 kTrU of each), the
// first kTrPre chunks loaded before pdl_wait (gpt-oss's K = 2880: all of it, 96 registers).
constexpr int kTrU = 16, kTrChunk = 64 * kTrU, kTrPre = 3;

struct TopKRouterArgs {
  const float *w;      // [K, E] router weight, rows of K floats, row stride w_rs floats
  int64_t w_rs;
  const float *bias;   // [E] the Add's row
  const float *x;      // [K] the MatMul's input (the RmsNorm's input when nw is set)
  const float *nw;     // RmsNorm -> Mul: the Mul's row weight [K], or null (no norm in the group)
  float *normed;       // the Mul's output [K] when read outside the group, or null
  float eps;           // the RmsNorm's
  int rms_nthr;        // the unfused RmsNorm kernel's block size (its reduction order)
  float *logits;       // [E] the Add's output (the biased logits): always written, the last block reads them
  int32_t *ids;        // [k] the TopK's output
  float *gathered;     // [k] the GatherCols' output when read outside the group, or null
  float *probs;        // [k] the Softmax's output when read outside the group, or null
  float *scaled;       // [k] the Scale's output, or null (no Scale)
  float sc0, sc1;      // the Scale's factor and offset
  unsigned *sync;      // one DevUbatch::sync counter
  int K, E, k;
  int sm_nthr;         // the unfused Softmax kernel's block size over k values
};

// Lane's share of a weight chunk at element i0: w0[u] = w[i0 + 64 u + lane], w1[u] the one 32
// after, for the 64-value steps below np (warp-uniform bound; the rest are never folded).
__device__ __forceinline__ void load_chunk(const float *w, int i0, int np, int lane, float (&w0)[kTrU], float (&w1)[kTrU]) {
#pragma unroll
  for (int u = 0; u < kTrU; ++u) {
    const int e = i0 + 64 * u;
    w0[u] = e < np ? __ldg(w + e + lane) : 0.0f;
    w1[u] = e < np ? __ldg(w + e + 32 + lane) : 0.0f;
  }
}

// ref_dot_f32_row's per-lane chains over one chunk: the same fmas in the same order (a0 takes
// the first 32 of every 64 values, a1 the second), only the loads are batched differently.
__device__ __forceinline__ void fold_chunk(const float *x, int i0, int np, int lane, const float (&w0)[kTrU], const float (&w1)[kTrU], float &a0,
                                           float &a1) {
#pragma unroll
  for (int u = 0; u < kTrU; ++u) {
    const int e = i0 + 64 * u;
    if (e < np) {
      a0 = fmaf(w0[u], x[e + lane], a0);
      a1 = fmaf(w1[u], x[e + 32 + lane], a1);
    }
  }
}

// (One block per multiprocessor: ptxas then keeps the 96 weight registers without spilling,
// 148 registers; the launch has a handful of blocks.)
__global__ void __launch_bounds__(kTrThreads, 1) topk_router_kernel(const __grid_constant__ TopKRouterArgs a) {
  __shared__ __align__(16) float s_x[kTrMaxK];
  __shared__ double s_red[32];
  __shared__ float s_l[kCudaMaxExperts];
  __shared__ float s_g[kTrMaxTopK], s_p[kTrMaxTopK];
  __shared__ int32_t s_ids[kTrMaxTopK];
  __shared__ float s_max[32];
  __shared__ double s_sum[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * kTrWarps + warp;  // this warp's logit
  const bool has_row = row < a.E;
  const float *wrow = a.w + static_cast<int64_t>(has_row ? row : 0) * a.w_rs;
  const int np = has_row ? a.K & ~63 : 0;  // (no row: nothing loaded or folded)
  // Weights (topk_router_fits: weight tensors) before pdl_wait: the first chunks of this warp's
  // row into registers, the rest into L2, the norm's row weight.
  float w0[kTrPre][kTrU], w1[kTrPre][kTrU];
#pragma unroll
  for (int c = 0; c < kTrPre; ++c) load_chunk(wrow, c * kTrChunk, np, lane, w0[c], w1[c]);
#ifdef __CUDA_ARCH__  // (host emulation: tools/cuda_emu)
  for (int o = kTrPre * kTrChunk + lane * 32; o < np; o += 32 * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + o));
#endif
  float nwr[kWeightRegs];
  load_row_weights(a.nw, a.K, kTrThreads, nwr);
  pdl_wait();
  pdl_trigger();
  const float b = has_row ? a.bias[row] : 0.0f;  // (any Add operand: possibly written by an earlier kernel)
  // RmsNorm -> Mul as the row chains compute them.
  stage_normed_row(s_x, a.x, a.K, kTrThreads, a.nw != nullptr, a.eps, a.rms_nthr, a.nw, nwr, s_red, a.normed);
  if (has_row) {
    float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
    for (int c = 0; c < kTrPre; ++c) fold_chunk(s_x, c * kTrChunk, np, lane, w0[c], w1[c], a0, a1);
    for (int i0 = kTrPre * kTrChunk; i0 < np; i0 += kTrChunk) {
      float v0[kTrU], v1[kTrU];
      load_chunk(wrow, i0, np, lane, v0, v1);
      fold_chunk(s_x, i0, np, lane, v0, v1, a0, a1);
    }
    // ref_dot_f32_row's reduction and tail.
    float v = __fadd_rn(a0, a1);
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    for (int e = np; e < a.K; ++e) v = fmaf(__ldg(wrow + e), s_x[e], v);
    if (lane == 0) {
      a.logits[row] = __fadd_rn(v, b);  // the Add kernel's x + y: one rounding, never contracted into the dot
      __threadfence();  // visible device-wide before the block is counted
    }
  }
  if (!last_block_arrives(a.sync, gridDim.x)) return;
  for (int i = threadIdx.x; i < a.E; i += kTrThreads) s_l[i] = __ldcg(a.logits + i);
  __syncthreads();
  if (warp == 0) {
    warp_top_k(s_l, a.E, a.k, s_ids);
    __syncwarp();
    if (lane < a.k) {
      const int32_t e = s_ids[lane];
      a.ids[lane] = e;
      s_g[lane] = e >= 0 && e < a.E ? s_l[e] : 0.0f;  // (gather_cols_kernel's value for a bad id; top-k gives none)
      if (a.gathered) a.gathered[lane] = s_g[lane];
    }
  }
  __syncthreads();
  softmax_row(s_g, s_p, a.k, s_max, s_sum, a.sm_nthr);  // block-wide; thread j < k wrote and rescaled s_p[j]
  const int j = threadIdx.x;
  if (j < a.k) {
    if (a.probs) a.probs[j] = s_p[j];
    if (a.scaled) a.scaled[j] = ew_value(kScale, s_p[j], 0.0f, j, a.k, a.sc0, a.sc1);
  }
}

bool written(const FusedGroup &grp, int id) { return std::find(grp.written.begin(), grp.written.end(), id) != grp.written.end(); }

// A weight tensor (or a view of one): written by no kernel, so read before pdl_wait.
bool is_weight(const Graph &g, int id) {
  const Node *p = &g.node(id);
  while (p->op == Op::View) p = &g.node(p->src[0]);
  return p->op == Op::Leaf && p->leaf == LeafKind::Weight;
}

// Where the kernel applies: the unfused F32 mat-vec's 16-byte path (contiguous aligned rows,
// K a multiple of 8, as router_mv_fits in fused.cu), K within the staged row, a counter, the
// router matrix (and the norm's row weight: nw) weight tensors.
bool topk_router_fits(const CudaOpCtx &c, const Node &mm, const Node &sm, int nw) {
  if (!is_weight(c.g, mm.src[0]) || (nw >= 0 && !is_weight(c.g, nw))) return false;
  const Node &w = c.g.node(mm.src[0]), &x = c.g.node(mm.src[1]);
  auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t K = w.ne[0], E = w.ne[1];
  return c.ub.sync && w.type == DType::F32 && w.nb[0] == 4 && w.nb[1] % 16 == 0 && aligned(w.data) && K % 8 == 0 && K <= kTrMaxK &&
         x.type == DType::F32 && x.nb[0] == 4 && x.ne[0] == K && aligned(x.data) && mm.ne[0] == E && E <= kCudaMaxExperts &&
         sm.ne[0] <= kTrMaxTopK && sm.ne[0] <= E && mm.ne[1] * mm.ne[2] * mm.ne[3] == 1;
}

}  // namespace

// Members: [RmsNorm, Mul,] MatMul, Add, TopK, GatherCols, Softmax [, Scale] (cuda_fusion.cpp:
// match_topk_router).
void cuda_fused_topk_router(const CudaOpCtx &c, const FusedGroup &grp) {
  const std::vector<int> &mb = grp.members;
  auto node = [&](size_t k) -> const Node & { return c.g.node(mb[k]); };
  const size_t i_mm = node(0).op == Op::RmsNorm ? 2 : 0;
  const Node &mm = node(i_mm), &add = node(i_mm + 1), &tk = node(i_mm + 2), &gc = node(i_mm + 3), &sm = node(i_mm + 4);
  if (!topk_router_fits(c, mm, sm, i_mm == 2 ? node(1).src[1] : -1)) {
    for (int m : mb) cuda_run_node(c.with_node(c.g.node(m)));  // the members in their order (the unfused schedule)
    return;
  }
  const Node &w = c.g.node(mm.src[0]);
  TopKRouterArgs a{};
  a.w = static_cast<const float *>(w.data);
  a.w_rs = static_cast<int64_t>(w.nb[1] / 4);
  a.bias = static_cast<const float *>(c.g.node(add.src[1]).data);
  a.x = static_cast<const float *>(c.g.node(mm.src[1]).data);
  if (i_mm == 2) {
    const Node &rms = node(0), &mul = node(1);
    a.x = static_cast<const float *>(c.g.node(rms.src[0]).data);
    a.nw = static_cast<const float *>(c.g.node(mul.src[1]).data);
    a.normed = written(grp, mb[1]) ? static_cast<float *>(mul.data) : nullptr;
    a.eps = rms.fp[0];
    a.rms_nthr = row_threads(rms.ne[0]);
  }
  a.logits = static_cast<float *>(add.data);
  a.ids = static_cast<int32_t *>(tk.data);
  a.gathered = written(grp, mb[i_mm + 3]) ? static_cast<float *>(gc.data) : nullptr;
  a.probs = written(grp, mb[i_mm + 4]) ? static_cast<float *>(sm.data) : nullptr;
  if (mb.size() > i_mm + 5) {
    const Node &sc = node(i_mm + 5);
    a.scaled = static_cast<float *>(sc.data);
    a.sc0 = sc.fp[0];
    a.sc1 = sc.fp[1];
  }
  a.sync = c.ub.sync;
  a.K = static_cast<int>(w.ne[0]);
  a.E = static_cast<int>(w.ne[1]);
  a.k = static_cast<int>(tk.ne[0]);
  a.sm_nthr = row_threads(sm.ne[0]);
  const unsigned blocks = static_cast<unsigned>((a.E + kTrWarps - 1) / kTrWarps);
  launch_pdl(topk_router_kernel, dim3(blocks), dim3(kTrThreads), 0, c.stream, a);
}

}  // namespace moe
