// Fused kernels of the CUDA fusion plan (cuda_fusion.h): per-row chains RmsNorm -> Mul(row
// weight) -> Rope -> KvStore (a block per row of each chain, the row staged in shared
// memory; q, k and v heads of a layer in one launch), and the softmax router Softmax ->
// TopK -> GatherCols [-> NormSum] (a block per token). They call the same device functions
// as the unfused kernels (row_ops.cuh, rope.cuh, kv_store.cuh, top_k.cuh), in the same
// order, so fused and unfused results are bit-identical.
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/kv_store.cuh"
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
};

__device__ __forceinline__ const float *row_in(const TView &v, int64_t i1, int64_t i2, int64_t i3) {
  return reinterpret_cast<const float *>(static_cast<const uint8_t *>(v.data) + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3]);
}

// __grid_constant__: the chain is picked by a run-time index into the parameters, which
// must not make each thread copy them to local memory.
__global__ void row_chains_kernel(const __grid_constant__ ChainsArgs a) {
  extern __shared__ float s_row[];
  __shared__ double s_red[32];
  __shared__ float s_theta[kMaxRopeDims / 2];
  __shared__ float s_cs[kMaxRopeDims];
  int64_t r = blockIdx.x;
  int c = 0;
  while (c + 1 < a.n && r >= a.ch[c].rows) { r -= a.ch[c].rows; ++c; }
  const ChainDesc &d = a.ch[c];
  const int64_t n = d.in.ne[0], ne1 = d.in.ne[1], ne2 = d.in.ne[2];
  const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
  const float *src = row_in(d.in, i1, i2, i3);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s_row[i] = src[i];
  __syncthreads();
  if (d.rms) {
    const float scale = rms_row_scale(s_row, n, d.eps, d.rms_threads, s_red);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = s_row[i] * scale;  // the RmsNorm output, rounded to float as it would be stored
      if (d.w) v = v * d.w[i];
      s_row[i] = v;
    }
    __syncthreads();
  }
  if (d.pos) {  // rows are [head_dim, n_head, T]: i2 is the token
    rope_angle_table(d.pos[i2], d.ra, s_theta, s_cs);
    for (int k = threadIdx.x; k < d.ra.n_rot / 2; k += blockDim.x) rope_rotate_pair(s_row, s_row, k, d.ra, s_cs);
    __syncthreads();
  }
  if (d.out.data) {
    float *dst = const_cast<float *>(row_in(d.out, i1, i2, i3));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = s_row[i];
  }
  if (d.kv) {  // head i1 of token i2 is elements [i1 * n, (i1 + 1) * n) of the token's cache row
    kv_store_values(s_row, n, d.kv + static_cast<size_t>(a.cells[i2]) * d.kv_rb, i1 * n, d.kv_type);
  }
}

struct RouterArgs {
  TView logits;      // [E, T]
  TView probs;       // softmax output (data null: not read outside the group, not written)
  TView ids;         // top-k ids [k, T]
  TView gathered;    // gathered probabilities (data null: not written)
  TView weights;     // renormalised weights (data null: no NormSum)
  int k;
};

// A block per token (the block size of the unfused Softmax kernel); warp 0 selects.
__global__ void router_kernel(RouterArgs a) {
  __shared__ float s_p[kCudaMaxExperts];
  __shared__ float s_max[32];
  __shared__ double s_sum[32];
  __shared__ int32_t s_ids[32];
  const int64_t t = blockIdx.x;
  const int E = static_cast<int>(a.logits.ne[0]);
  softmax_row(row_in(a.logits, t, 0, 0), s_p, E, s_max, s_sum);
  __syncthreads();
  if (a.probs.data) {
    float *p = const_cast<float *>(row_in(a.probs, t, 0, 0));
    for (int i = threadIdx.x; i < E; i += blockDim.x) p[i] = s_p[i];
  }
  if (threadIdx.x >= 32) return;
  warp_top_k(s_p, E, a.k, s_ids);
  __syncwarp();
  if (threadIdx.x != 0) return;
  int32_t *ids = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(a.ids.data) + t * a.ids.nb[1]);
  float g[32];
  for (int j = 0; j < a.k; ++j) {
    const int32_t e = s_ids[j];
    ids[j] = e;
    g[j] = (e >= 0 && e < E) ? s_p[e] : 0.0f;
  }
  if (a.gathered.data) {
    float *o = const_cast<float *>(row_in(a.gathered, t, 0, 0));
    for (int j = 0; j < a.k; ++j) o[j] = g[j];
  }
  if (a.weights.data) {  // NormSum: serial float sum, then one division per value
    float s = 0.0f;
    for (int j = 0; j < a.k; ++j) s += g[j];
    float *o = const_cast<float *>(row_in(a.weights, t, 0, 0));
    for (int j = 0; j < a.k; ++j) o[j] = g[j] / s;
  }
}

bool is_written(const FusedGroup &grp, int id) { return std::find(grp.written.begin(), grp.written.end(), id) != grp.written.end(); }

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
          d.ra = make_rope_args(n.rope);
          d.pos = static_cast<const int32_t *>(c.g.node(n.src[1]).data);
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
  const int threads = row_threads(widest);
  row_chains_kernel<<<static_cast<unsigned>(total), threads, static_cast<size_t>(widest) * 4, c.stream>>>(a);
  MOE_CUDA_LAUNCH_CHECK("row_chains_kernel");
}

void cuda_fused_router(const CudaOpCtx &c, const FusedGroup &grp) {
  const Node &sm = c.g.node(grp.members[0]), &tk = c.g.node(grp.members[1]), &gc = c.g.node(grp.members[2]);
  const int64_t T = sm.ne[1];
  if (T == 0) return;
  RouterArgs a{};
  a.logits = tview(c.g.node(sm.src[0]));
  a.probs = tview(sm);
  if (!is_written(grp, grp.members[0])) a.probs.data = nullptr;
  a.ids = tview(tk);
  a.gathered = tview(gc);
  if (!is_written(grp, grp.members[2])) a.gathered.data = nullptr;
  a.weights.data = nullptr;
  if (grp.members.size() > 3) a.weights = tview(c.g.node(grp.members[3]));
  a.k = static_cast<int>(tk.ne[0]);
  router_kernel<<<static_cast<unsigned>(T), row_threads(sm.ne[0]), 0, c.stream>>>(a);
  MOE_CUDA_LAUNCH_CHECK("router_kernel");
}

}  // namespace moe
