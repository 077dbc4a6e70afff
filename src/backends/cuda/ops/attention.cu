// KV cache writes (F32 / F16 / Q8_0 rows at the batch's cells) and causal GQA attention
// over the cache. An F32 cache without sinks (T <= kRefOrderMaxTokens) takes the CPU's reference order
// (attention_ref_order.cu, bit-exact); otherwise three paths by the number of query tokens T:
//  * T <= 4 (decode), and up to 64 tokens of as many sequences (several sequences decoding):
//    head dims 64/128/256 take the grouped kernel of attention_decode.cu;
//    others split the cells over 16 blocks per (head, token), partials merged by the last
//    block of each (attn_combine_row); one launch either way;
//  * T >= 8 with head dims 64 / 128 (prefill): the tiled kernels (attention_mma.cu on f16
//    tensor cores for an F16 cache, also head dim 256; attention_tiled.cu on f32 FMA for the
//    others), a block
//    per tile of (token, head) rows of one KV head, the cells split when a chunk has too
//    few rows to fill the device;
//  * otherwise one block per (head, token) streaming the cache in tiles of 128 cells.
// All use an online softmax with f32 accumulators; the mask (free cell, other sequence,
// future position, sliding window) comes from the device copy of the cell state, and the
// number of cells from device memory, so a captured graph stays valid as the cache fills.
// q meets the cache in its type like the reference: rounded to f16 for an F16 cache,
// quantized to Q8_0 for a Q8_0 cache. The decode kernels and the KV store launch with PDL
// (ops/pdl.cuh): each waits for its predecessor before its first load.
#include <algorithm>

#include <cuda_fp16.h>

#include "backends/cuda/ops/attention.cuh"
#include "backends/cuda/ops/attention_decode.cuh"
#include "backends/cuda/ops/attention_mla.cuh"
#include "backends/cuda/ops/attention_ref_order.cuh"
#include "backends/cuda/ops/kv_store.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/reduce.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

constexpr int kThreads = 128;
constexpr int kAcc = kCudaMaxHeadDim / kThreads;

__global__ void kv_store_kernel(TView x, uint8_t *base, size_t rb, int64_t row, int kt, const int32_t *cells, int n_cells,
                                unsigned *err) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t cell = cells[t];
  if (!kv_cell_in_cache(cell, n_cells, err, threadIdx.x == 0)) return;
  const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[2]);
  kv_store_values(src, static_cast<int>(row), base + static_cast<size_t>(cell) * rb, 0, kt);
}

__device__ __forceinline__ float k_dot(const uint8_t *k, const float *q, int hd, int kt) {
  float s = 0.0f;
  if (kt == static_cast<int>(DType::F32)) {
    const float *kf = reinterpret_cast<const float *>(k);
#pragma unroll 8
    for (int i = 0; i < hd; ++i) s += kf[i] * q[i];
  } else if (kt == static_cast<int>(DType::F16)) {
    const __half2 *k2 = reinterpret_cast<const __half2 *>(k);
#pragma unroll 8
    for (int i = 0; i < hd / 2; ++i) {
      const float2 kv = __half22float2(k2[i]);
      s += kv.x * q[2 * i] + kv.y * q[2 * i + 1];
    }
    if (hd & 1) s += __half2float(reinterpret_cast<const __half *>(k)[hd - 1]) * q[hd - 1];
  } else {
    for (int b = 0; b < hd / 32; ++b) {
      const uint8_t *blk = k + b * 34;
      const float d = h2f(blk);
      float a = 0.0f;
      for (int l = 0; l < 32; ++l) a += static_cast<int8_t>(blk[2 + l]) * q[b * 32 + l];
      s += a * d;
    }
  }
  return s;
}

// q row (head h, token t) rounded to the cache's dot type into s_q; whole warps on 32
// consecutive dims (attn_round_q's Q8_0 rule). The caller syncs before reading s_q.
__device__ __forceinline__ void load_q_rounded(const TView &q, const AttnArgs &a, int h, int t, float *s_q) {
  const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + h * q.nb[1] + t * q.nb[2]);
  for (int i0 = 0; i0 < a.hd_k; i0 += kThreads) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    const float v = attn_round_q(i < a.hd_k ? qrow[i] : 0.0f, a.kt);
    if (i < a.hd_k) s_q[i] = v;
  }
}

__global__ void __launch_bounds__(kThreads) attn_kernel(TView q, TView out, AttnArgs a, DevUbatch ub) {
  __shared__ float s_q[kCudaMaxHeadDim];
  __shared__ float s_p[kThreads];
  __shared__ float s_red[32];
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const int hk = h / a.group;
  load_q_rounded(q, a, h, t, s_q);
  __syncthreads();
  const int n_kv = *ub.n_kv;
  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  float M = -INFINITY, S = 0.0f;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int c0 = 0; c0 < n_kv; c0 += kThreads) {
    const int c = c0 + tid;
    float s = -INFINITY;
    if (c < n_kv) {
      const int cp = ub.cell_pos[c];
      if (attn_visible(cp, ub.cell_seq[c], bit, pos, a.window)) s = k_dot(a.kbase + c * a.krb + hk * a.khb, s_q, a.hd_k, a.kt) * a.scale;
    }
    const float tmax = blk_max(s, s_red);
    const float newM = fmaxf(M, tmax);
    if (newM == -INFINITY) continue;  // uniform: nothing visible yet
    const float corr = expf(M - newM);  // 0 when M is -inf
    const float p = s == -INFINITY ? 0.0f : expf(s - newM);
    s_p[tid] = p;
    const float psum = blk_sum(p, s_red);  // its barriers also publish s_p
    S = S * corr + psum;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] *= corr;
    const int n = min(kThreads, n_kv - c0);
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
      const float pj = s_p[j];
      if (pj == 0.0f) continue;
      const uint8_t *vrow = a.vbase + (c0 + j) * a.vrb + hk * a.vhb;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int d = tid + i * kThreads;
        if (d < a.hd_v) acc[i] += pj * attn_elem(vrow, d, a.kt);
      }
    }
    M = newM;
    __syncthreads();  // s_p is rewritten by the next tile
  }
  float *o = attn_out_row(out, t, h);
  const float f = attn_final_scale(M, S, a.sinks, h);  // the sink: one more logit with a zero value vector
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int d = tid + i * kThreads;
    if (d < a.hd_v) o[d] = acc[i] * f;
  }
}

// ---- decode (few query tokens): cells split over kSplit blocks per (head, token) ------

constexpr int kSplit = 16;
constexpr int kMaxSplitTokens = 4;
constexpr int kAccW = kCudaMaxHeadDim / 32;

// The partials of (head blockIdx.x, token blockIdx.y) merged by their own launch.
__global__ void attn_combine_kernel(TView out, AttnArgs a, const float *part, int n_split) {
  pdl_wait();
  pdl_trigger();
  attn_combine_row(out, a, part, n_split, blockIdx.x, blockIdx.y, gridDim.x, n_split);
}

// A warp per cell (lanes over head dims), an online softmax per warp, warps merged in shared
// memory; the block writes (max, sum, acc[hd_v]) for its share of the cells. merge = 1: the
// last of a (head, token)'s blocks (counter in DevUbatch::sync) merges them into the output.
__global__ void __launch_bounds__(kThreads) attn_split_kernel(TView q, TView out, AttnArgs a, DevUbatch ub, float *part, int merge) {
  __shared__ float s_q[kCudaMaxHeadDim];
  __shared__ bool s_last;
  __shared__ float s_acc[kThreads / 32][kCudaMaxHeadDim];
  __shared__ float s_m[kThreads / 32], s_s[kThreads / 32];
  const int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_head = gridDim.x;
  const int hk = h / a.group;
  pdl_wait();
  pdl_trigger();
  load_q_rounded(q, a, h, t, s_q);
  __syncthreads();
  const int n_kv = *ub.n_kv;
  const int chunk = (n_kv + kSplit - 1) / kSplit;
  const int c_begin = z * chunk, c_end = min(n_kv, c_begin + chunk);
  const unsigned long long bit = 1ull << ub.seq[t];
  const int pos = ub.pos[t];
  float M = -INFINITY, S = 0.0f;
  float acc[kAccW];
#pragma unroll
  for (int i = 0; i < kAccW; ++i) acc[i] = 0.0f;
  for (int c = c_begin + warp; c < c_end; c += kThreads / 32) {
    const int cp = ub.cell_pos[c];
    if (!attn_visible(cp, ub.cell_seq[c], bit, pos, a.window)) continue;
    const uint8_t *krow = a.kbase + c * a.krb + hk * a.khb;
    const uint8_t *vrow = a.vbase + c * a.vrb + hk * a.vhb;
    float vv[kAccW];
#pragma unroll
    for (int i = 0; i < kAccW; ++i) {
      const int d = lane + 32 * i;
      vv[i] = d < a.hd_v ? attn_elem(vrow, d, a.kt) : 0.0f;
    }
    float sdot = 0.0f;
    for (int d = lane; d < a.hd_k; d += 32) sdot += attn_elem(krow, d, a.kt) * s_q[d];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
    const float sc = sdot * a.scale;
    const float newM = fmaxf(M, sc);
    const float corr = expf(M - newM);
    const float p = expf(sc - newM);
    S = S * corr + p;
#pragma unroll
    for (int i = 0; i < kAccW; ++i) acc[i] = acc[i] * corr + p * vv[i];
    M = newM;
  }
#pragma unroll
  for (int i = 0; i < kAccW; ++i) {
    const int d = lane + 32 * i;
    if (d < a.hd_v) s_acc[warp][d] = acc[i];
  }
  if (lane == 0) { s_m[warp] = M; s_s[warp] = S; }
  __syncthreads();
  float Mb = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) Mb = fmaxf(Mb, s_m[w]);
  float wgt[kThreads / 32], Sb = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) {
    wgt[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - Mb);
    Sb += s_s[w] * wgt[w];
  }
  float *dst = attn_partial(part, t, h, z, n_head, kSplit, a.hd_v);
  for (int d = tid; d < a.hd_v; d += kThreads) {
    float v = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) v += s_acc[w][d] * wgt[w];
    dst[2 + d] = v;
  }
  if (tid == 0) { dst[0] = Mb; dst[1] = Sb; }
  if (!merge) return;
  __threadfence();  // this block's partial is visible device-wide before it is counted
  __syncthreads();
  unsigned *ctr = ub.sync + t * n_head + h;
  if (tid == 0) {
    s_last = atomicAdd(ctr, 1u) == gridDim.z - 1;
    if (s_last) *ctr = 0;  // every split has counted: ready for the next launch / replay
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  attn_combine_row(out, a, part, kSplit, h, t, n_head, kSplit);
}


// ---- prefill (many query tokens): tiled kernels (attention_tiled.cu, attention_mma.cu) ----

constexpr int64_t kMinTiledTokens = 8;
constexpr int64_t kMaxTiledSplit = 16;
// Target of blocks per SM: GpuTuning::prefill_attn_blocks, clamped to 1..16.
int64_t tiled_blocks_per_sm(const GpuTuning &tuning) { return std::min(std::max(tuning.prefill_attn_blocks, 1), 16); }
constexpr int64_t kPlannedSms = 132;  // the work buffer is sized for an H200; fewer splits fit any device

// Head dim 256 (Qwen3-Next / Qwen3.5) only on the tensor-core kernel (F16 cache): the FMA
// kernel's tiles are written for 64 / 128, so other caches keep the per-(head, token) kernel.
bool tiled_shape(int64_t hd_k, int64_t hd_v, bool v_from_k) {
  return !v_from_k && hd_k == hd_v && (hd_k == 64 || hd_k == 128 || hd_k == 256);
}

// Cell splits of the tiled path: a chunk with few rows still gets ~target blocks (each
// split writes partials that attn_combine_kernel merges).
int64_t tiled_splits(int64_t T, int64_t n_head, int64_t n_head_kv, int64_t rows_per_block, int64_t target_blocks) {
  const int64_t blocks = (T * (n_head / n_head_kv) + rows_per_block - 1) / rows_per_block * n_head_kv;
  return std::min(kMaxTiledSplit, std::max<int64_t>(1, target_blocks / std::max<int64_t>(1, blocks)));
}

size_t tiled_work(int64_t T, int64_t n_head, int64_t hd_v, int64_t n_split) {
  return n_split > 1 ? static_cast<size_t>(T * n_head * n_split * (hd_v + 2)) * 4 : 0;
}

// The tensor-core kernel needs sm_80 code and reads F16 K/V heads with 16-byte copies: every
// base and stride must allow them.
bool mma_eligible(const AttnArgs &a, const CudaPaths &paths) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.kbase) | reinterpret_cast<uintptr_t>(a.vbase) | a.krb | a.vrb | a.khb | a.vhb;
  return paths.tensor_cores && a.kt == static_cast<int>(DType::F16) && bits % 16 == 0;
}

// Scratch of the fast kernels (online softmax).
size_t fast_attention_work_size(const Graph &g, const Node &n, const GpuTuning &tuning) {
  const int64_t T = n.ne[2], n_head = n.ne[1], hd_v = n.ne[0];
  if (T <= kMaxSplitTokens) {
    // Either decode kernel may run (generic or grouped): room for both.
    const size_t generic = static_cast<size_t>(T * n_head * kSplit * (hd_v + 2)) * 4;
    return std::max(generic, attn_decode_work_size(T, n_head, hd_v));
  }
  const int64_t hd_k = g.node(n.src[0]).ne[0];
  const int64_t n_head_kv = g.node(n.src[1]).ip[0] / hd_k;  // K rows as KvStore writes them
  if ((n.ip[2] & 1) != 0) return attn_mla_work_size(T, n_head, n_head_kv, hd_k, hd_v);
  // Several sequences' one-token steps may take the grouped decode kernel (attn_decode_seqs_launch).
  const size_t seqs = attn_decode_seqs_work_size(T, n_head, hd_k, hd_v);
  if (T < kMinTiledTokens || !tiled_shape(hd_k, hd_v, (n.ip[2] & 1) != 0) || n_head_kv <= 0 || n_head % n_head_kv) return seqs;
  // The tensor-core kernel's larger row tiles give fewer blocks, so at least as many splits.
  return std::max(seqs, tiled_work(T, n_head, hd_v, tiled_splits(T, n_head, n_head_kv, kAttnTiledRowsMma, tiled_blocks_per_sm(tuning) * kPlannedSms)));
}

}  // namespace

// Room for the fast kernels and, where the node's cache may be F32 (Node::kv_type), for the
// reference-order one.
size_t cuda_attention_work_size(const Graph &g, const Node &n, const GpuTuning &tuning) {
  return std::max(fast_attention_work_size(g, n, tuning), attn_ref_order_work_size(g, n, tuning));
}

void attn_combine_launch(const TView &out, const AttnArgs &a, const float *part, int T, int n_head, int n_split, const LaunchStream &stream) {
  launch_pdl(attn_combine_kernel, dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T)), dim3(128), 0, stream, out, a, part, n_split);
}

void cuda_op_kv_store(const CudaOpCtx &c) {
  const Node &x = c.src(0);
  const int layer = c.n.kv_layer;
  const int64_t T = x.ne[2];
  if (T == 0) return;
  KvCache &kv = *c.kv;
  uint8_t *base = static_cast<uint8_t *>(c.n.kv_which == 0 ? kv.k_data(layer) : kv.v_data(layer));
  const size_t rb = c.n.kv_which == 0 ? kv.k_row_bytes(layer) : kv.v_row_bytes(layer);
  launch_pdl(kv_store_kernel, dim3(static_cast<unsigned>(T)), dim3(128), 0, c.stream, tview(x), base, rb, static_cast<int64_t>(c.n.ip[0]),
             static_cast<int>(kv.dtype()), c.ub.cells, static_cast<int>(kv.n_cells()), c.ub.err);
}

void cuda_op_attention(const CudaOpCtx &c) {
  const Node &q = c.src(0);
  KvCache &kv = *c.kv;
  const int layer = c.n.kv_layer;
  const int64_t hd_k = q.ne[0], n_head = q.ne[1], T = q.ne[2], hd_v = c.n.ne[0];
  if (T == 0 || n_head == 0) return;
  const int64_t n_head_kv = kv.dims(layer).k_row / hd_k;
  const DType kt = kv.dtype();
  AttnArgs a;
  // MLA: V is the leading part of the single K head (no V cache).
  const bool v_from_k = (c.n.ip[2] & 1) != 0;
  a.kbase = static_cast<const uint8_t *>(kv.k_data(layer));
  a.vbase = static_cast<const uint8_t *>(v_from_k ? kv.k_data(layer) : kv.v_data(layer));
  a.krb = kv.k_row_bytes(layer);
  a.vrb = v_from_k ? a.krb : kv.v_row_bytes(layer);
  a.khb = row_size(kt, hd_k);
  a.vhb = v_from_k ? a.khb : row_size(kt, hd_v);
  a.window = c.n.ip[3];
  a.sinks = c.n.src[3] >= 0 ? static_cast<const float *>(c.src(3).data) : nullptr;
  a.hd_k = static_cast<int>(hd_k);
  a.hd_v = static_cast<int>(hd_v);
  a.group = static_cast<int>(n_head / n_head_kv);
  a.kt = static_cast<int>(kt);
  a.scale = c.n.fp[0];
  // An F32 cache in the CPU's reference order (bit-exact with the CPU backend).
  if (attn_ref_order_launch(c, tview(q), tview(c.n), a)) return;
  if (c.paths.tensor_cores &&
      attn_mla_launch(c.stream, tview(q), tview(c.n), a, c.ub, static_cast<int>(T), static_cast<int>(n_head_kv), v_from_k,
                      static_cast<float *>(c.n.work), c.n.work_size, c.n_sm, c.tuning.mla_split_cells))
    return;  // MLA on an F16 cache (attention_mla.cu), any T
  // Both decode kernels use the scratch of attn_decode_work_size (fast_attention_work_size).
  if (c.tuning.tc_decode_attention && c.paths.tensor_cores && attn_decode_tc_applies(T, hd_k, hd_v, v_from_k, a) && c.n.work) {
    attn_decode_tc_launch(c.stream, tview(q), tview(c.n), a, c.ub, static_cast<float *>(c.n.work), c.tuning);
    return;
  }
  if (attn_decode_applies(T, hd_k, hd_v, v_from_k) && c.n.work) {
    attn_decode_launch(c.stream, tview(q), tview(c.n), a, c.ub, static_cast<float *>(c.n.work), c.tuning);
    return;
  }
  // Several sequences, one token each: the grouped kernel skips the other sequences' cells
  // (interleaved in the cache, so no tile of the tiled kernels could be skipped).
  if (!v_from_k && c.tuning.seqs_decode_attention &&
      attn_decode_seqs_launch(c.stream, tview(q), tview(c.n), a, c.ub, static_cast<float *>(c.n.work), c.n.work_size, c.tuning))
    return;
  if (T <= kMaxSplitTokens && c.n.work) {
    float *part = static_cast<float *>(c.n.work);
    const int merge = c.ub.sync && T * n_head <= kCudaSyncSlots ? 1 : 0;  // a counter per (head, token)
    launch_pdl(attn_split_kernel, dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T), kSplit), dim3(kThreads), 0, c.stream, tview(q),
               tview(c.n), a, c.ub, part, merge);
    if (!merge) attn_combine_launch(tview(c.n), a, part, static_cast<int>(T), static_cast<int>(n_head), kSplit, c.stream);
    return;
  }
  const bool mma = mma_eligible(a, c.paths);
  if (T >= kMinTiledTokens && tiled_shape(hd_k, hd_v, v_from_k) && n_head % n_head_kv == 0 && (mma || hd_k <= 128)) {
    const int64_t rows_per_block = mma ? kAttnTiledRowsMma : kAttnTiledRowsFma;
    int64_t n_split = tiled_splits(T, n_head, n_head_kv, rows_per_block, tiled_blocks_per_sm(c.tuning) * std::max(1, c.n_sm));
    while (n_split > 1 && (!c.n.work || tiled_work(T, n_head, hd_v, n_split) > c.n.work_size)) --n_split;
    const AttnTiledLaunch l{tview(q), tview(c.n), a, c.ub, static_cast<int>(T), static_cast<int>(n_head_kv), static_cast<int>(n_split),
                            static_cast<float *>(c.n.work), c.stream};
    if (mma) attn_tiled_mma_launch(l);
    else attn_tiled_fma_launch(l);
    if (n_split > 1) attn_combine_launch(tview(c.n), a, l.part, static_cast<int>(T), static_cast<int>(n_head), static_cast<int>(n_split), c.stream);
    return;
  }
  attn_kernel<<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(T)), kThreads, 0, c.stream>>>(tview(q), tview(c.n), a, c.ub);
  MOE_CUDA_LAUNCH_CHECK("attn_kernel");
}

}  // namespace moe
