// Gated DeltaNet kernels, the CUDA side of src/backends/cpu/ops/delta_net.cpp: the causal
// depthwise convolution with its per-sequence tail (SsmConv) and the gated delta rule over the
// per-sequence d x d matrix state (DeltaNet), token by token in batch order.
//
// State: each layer's [2 copies][n_seq_max][conv tail | n_v x d x d] floats live in this GPU's
// memory (KvCache, allocated through the layer's backend). Which copy a sequence reads and which
// it writes comes from DevUbatch::rs, uploaded with the ubatch, so a decode step needs no host
// decision at launch time and replays as a CUDA graph: grid.y walks the table's sequences (the
// grid is sized for min(T, n_seq_max); slots past the table's count exit). Every block reads
// its part of the state once from the source copy, advances it in registers over the
// sequence's tokens of the ubatch, and writes it once to the destination copy (the same copy
// when an earlier ubatch of the call already wrote it: each thread reads its values before it
// writes them back).
//
// DeltaNet rows are independent (row j of S only meets k, q, v_j): one warp per state row, its
// d values in registers (lane l holds i = l + 32 m), two warp sums per token. With the output
// norm fused (cuda_fusion.h: DeltaNorm; decode and a few tokens) the last of a head's blocks to
// write its outputs of a token applies the gated RMSNorm to that head row, with the GatedNorm
// kernel's reduction order and expressions (bit-identical). Prompts
// Ubatches of kChunkMinTokens or more with d = 128 take the chunked tensor-core kernel of
// ops/delta_net_chunked.cu on sm_80+ (docs/perf/qwen3next-cuda.md); the rest run this one.
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/last_block.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/ref_math.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

// The state of table slot `slot` in copy `copy` (0 or 1).
__device__ __forceinline__ float *state_of(float *base, int64_t per, int n_seq_max, const int32_t *rs, int slot, int which) {
  const int seq = rs[1 + 3 * slot], copy = rs[1 + 3 * slot + which];
  return base + (static_cast<int64_t>(copy) * n_seq_max + seq) * per;
}

struct ConvArgs {
  float *out;            // [C, T], column stride out_nb1 floats
  const float *x;        // [C, T], column stride x_nb1 floats
  const float *w;        // [K, C] (K taps per channel, oldest first)
  int64_t out_nb1, x_nb1, C, T;
  int K;
  const int32_t *seq;    // DevUbatch::seq
  const int32_t *rs;     // DevUbatch::rs
  float *base;           // the layer's state buffer
  int64_t per;           // floats per sequence state
  int n_seq_max;
};

// silu(sum of win[j] w[j]) summed oldest to newest, unfused, as the CPU sums (refmath::silu_v).
template <int kMax> __device__ __forceinline__ float conv_silu(const float (&win)[kMax], const float *w, int K) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMax; ++j)
    if (j < K) sum = __fadd_rn(sum, __fmul_rn(win[j], w[j]));
  return __fdiv_rn(sum, __fadd_rn(1.0f, ref_expf_v(__fsub_rn(0.0f, sum))));
}

// Writes win[0 .. K - 2] as a sequence's new tail [K-1][C] (oldest first).
template <int kMax> __device__ __forceinline__ void conv_store_tail(const float (&win)[kMax], float *dst, int64_t C, int64_t c, int K) {
#pragma unroll
  for (int j = 0; j + 1 < kMax; ++j)
    if (j + 1 < K) dst[j * C + c] = win[j];
}

template <int kMax>
__device__ __forceinline__ void conv_history(const ConvArgs &a, const float *tail, int64_t c, int64_t t, int32_t seq, int K,
                                             float (&win)[kMax]);

// One thread per channel and table sequence. KT > 0: the width known at compile time (the
// window stays in registers); KT = 0: any width up to 64. TailOnly (after
// ssm_conv_tokens_kernel): only the new tail, its last K - 1 inputs, the old tail's newest
// values where the batch has fewer; each thread reads its old values before writing them.
template <int KT, bool TailOnly = false>
__global__ void ssm_conv_kernel(ConvArgs a) {
  pdl_wait();
  pdl_trigger();
  const int slot = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= a.rs[0] || c >= a.C) return;
  constexpr int kMax = KT ? KT : 64;
  const int K = KT ? KT : a.K;
  const int32_t seq = a.rs[1 + 3 * slot];
  if constexpr (TailOnly) {
    float win[kMax];
    conv_history(a, state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 1), c, a.T, seq, K, win);
    conv_store_tail(win, state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 2), a.C, c, K);
    return;
  }
  const float *src = state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 1);
  float *dst = state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 2);
  float win[kMax], wc[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    if (j >= K) break;
    wc[j] = a.w[c * K + j];
    if (j + 1 < K) win[j] = src[j * a.C + c];  // tail [K-1][C], oldest first
  }
  for (int64_t t = 0; t < a.T; ++t) {
    if (a.seq[t] != seq) continue;
    win[K - 1] = a.x[t * a.x_nb1 + c];
    a.out[t * a.out_nb1 + c] = conv_silu(win, wc, K);
#pragma unroll
    for (int j = 0; j + 1 < kMax; ++j)
      if (j + 1 < K) win[j] = win[j + 1];
  }
  conv_store_tail(win, dst, a.C, c, K);
}

// Prompts (T >= kConvTokensMin): a thread per (channel, token) instead of one walking every
// token (one thread per channel walked 512 tokens in ~300 us on the H200, 64 blocks busy).
// The K - 1 inputs before token t of its sequence come from the batch (walking back over other
// sequences' tokens) or from the sequence's tail; same products and sums as ssm_conv_kernel,
// so the outputs are the same bits. The new tails are written by ssm_conv_kernel<.., true> after
// every output is computed: the source and destination copies may be one.
constexpr int64_t kConvTokensMin = 8;

// Table slot of sequence seq (-1 when it is not in the table).
__device__ __forceinline__ int slot_of(const int32_t *rs, int32_t seq) {
  for (int s = 0; s < rs[0]; ++s)
    if (rs[1 + 3 * s] == seq) return s;
  return -1;
}

// win[0 .. K - 2] = the K - 1 inputs of channel c before token t (exclusive) of sequence seq,
// oldest first: from the batch where it has them, the rest from the tail (newest last).
template <int kMax>
__device__ __forceinline__ void conv_history(const ConvArgs &a, const float *tail, int64_t c, int64_t t, int32_t seq, int K,
                                             float (&win)[kMax]) {
  int j = K - 2;
  for (int64_t u = t - 1; u >= 0 && j >= 0; --u)
    if (a.seq[u] == seq) win[j--] = a.x[u * a.x_nb1 + c];
  for (int m = 0; m <= j; ++m) win[j - m] = tail[(K - 2 - m) * a.C + c];
}

template <int KT>
__global__ void ssm_conv_tokens_kernel(ConvArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (c >= a.C) return;
  constexpr int kMax = KT ? KT : 64;
  const int K = KT ? KT : a.K;
  const int32_t seq = a.seq[t];
  const int slot = slot_of(a.rs, seq);
  if (slot < 0) return;
  float win[kMax];
  conv_history(a, state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 1), c, t, seq, K, win);
  win[K - 1] = a.x[t * a.x_nb1 + c];
  a.out[t * a.out_nb1 + c] = conv_silu(win, a.w + c * K, K);
}

struct DeltaArgs {
  float *o;                     // [d, n_v, T]
  const float *q, *k;           // [d, n_k, T]
  const float *v;               // [d, n_v, T]
  const float *gb;              // [2 n_v, T]: log decay, beta
  int64_t d, n_k, n_v, T, conv; // conv: floats of the conv tail before the matrices
  int head_map;                 // 0: key head h / (n_v / n_k), 1: h % n_k
  float scale;
  const int32_t *seq, *rs;
  float *base;
  int64_t per;
  int n_seq_max;
  // The fused output norm (Norm kernels): y = silu(z) * (rms_norm(o) * norm_w), rows of d
  // per head and token; one DevUbatch::sync counter per (head, token): sync[h + n_v t].
  const float *norm_w;
  TView y, z;
  float eps;
  unsigned *sync;
};

constexpr int kDeltaWarps = 4;  // state rows per block
static_assert(kDeltaWarps == kDeltaNormRowsPerBlock, "cuda_fusion.h plans the fused output norm for this block shape");

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The fused output norm of head h, token t (block-wide; after the block's o rows of t are
// written and fenced): the head's last block stages its d outputs (through L2), and every warp
// takes the RmsNorm scale by rms_row_scale_warp (the bits of the RmsNorm kernel's block of
// row_threads(d)), then the block writes y as gated_norm_kernel (delta_net_fused.cu) does.
__device__ void delta_out_norm(const DeltaArgs &a, int64_t h, int64_t t, unsigned blocks_per_head, float *s_o) {
  if (!last_block_arrives(a.sync + h + a.n_v * t, blocks_per_head)) return;
  const int n = static_cast<int>(a.d);
  const float *o = a.o + (t * a.n_v + h) * a.d;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s_o[i] = __ldcg(o + i);
  __syncthreads();
  const float scale = rms_row_scale_warp(s_o, n, a.eps, row_threads(n));
  const float *z = rowp(a.z, h, t, 0);
  float *y = rowp(a.y, h, t, 0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float normed = s_o[i] * scale;  // the RmsNorm output, rounded to float as stored
    y[i] = ew_value(kSwiGLU, z[i], normed * a.norm_w[i], i, n, 0.0f, 0.0f);
  }
  __syncthreads();  // every read of s_o before the next token stages it
}

// Block: kDeltaWarps rows j of one value head h; grid.x = n_v x ceil(d / kDeltaWarps),
// grid.y = table sequence. M values per lane (d <= 32 M). Norm: with the fused output norm
// (d a multiple of kDeltaWarps: no warp leaves early, the block counts itself per token).
template <int M, bool Norm>
__global__ void delta_net_kernel(DeltaArgs a) {
  __shared__ float s_o[Norm ? kDeltaNormMaxD : 1];
  pdl_wait();
  pdl_trigger();
  const int slot = blockIdx.y;
  if (slot >= a.rs[0]) return;
  const int64_t blocks_per_head = (a.d + kDeltaWarps - 1) / kDeltaWarps;
  const int64_t h = blockIdx.x / blocks_per_head;
  const int64_t j = (blockIdx.x % blocks_per_head) * kDeltaWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (j >= a.d) return;
  const int64_t kh = a.head_map == 0 ? h / (a.n_v / a.n_k) : h % a.n_k;
  const int32_t seq = a.rs[1 + 3 * slot];
  const int64_t row_off = a.conv + (h * a.d + j) * a.d;
  const float *in = state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 1) + row_off;
  float *out = state_of(a.base, a.per, a.n_seq_max, a.rs, slot, 2) + row_off;
  float row[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int64_t i = lane + 32 * m;
    row[m] = i < a.d ? in[i] : 0.0f;
  }
  for (int64_t t = 0; t < a.T; ++t) {
    if (a.seq[t] != seq) continue;
    const float *qt = a.q + (t * a.n_k + kh) * a.d, *kt = a.k + (t * a.n_k + kh) * a.d;
    float kk[M], qq[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int64_t i = lane + 32 * m;
      kk[m] = i < a.d ? kt[i] : 0.0f;
      qq[m] = i < a.d ? qt[i] : 0.0f;
    }
    const float *g = a.gb + t * 2 * a.n_v;
    const float decay = expf(g[h]), beta = g[a.n_v + h];
    const float vj = a.v[(t * a.n_v + h) * a.d + j];
    float sk = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      row[m] *= decay;
      sk = fmaf(row[m], kk[m], sk);
    }
    const float delta = beta * (vj - warp_sum(sk));
    float sq = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      row[m] = fmaf(kk[m], delta, row[m]);
      sq = fmaf(row[m], qq[m], sq);
    }
    sq = warp_sum(sq);
    if (lane == 0) {
      a.o[(t * a.n_v + h) * a.d + j] = sq * a.scale;
      if constexpr (Norm) __threadfence();  // visible to the head's last block
    }
    if constexpr (Norm) delta_out_norm(a, h, t, static_cast<unsigned>(blocks_per_head), s_o);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int64_t i = lane + 32 * m;
    if (i < a.d) out[i] = row[m];
  }
}

// --- end of kernels (tools/cuda_emu/gen_dnnorm.py cuts the text above) ---

template <int M, bool Norm>
void launch_delta(const DeltaArgs &a, dim3 grid, const LaunchStream &s) {
  launch_pdl(delta_net_kernel<M, Norm>, grid, dim3(32 * kDeltaWarps), 0, s, a);
}

// The token-sequential kernel for DeltaNet node c.n, by head size.
template <bool Norm>
void launch_delta_net(const CudaOpCtx &c, const DeltaArgs &a) {
  const unsigned slots = static_cast<unsigned>(std::min<int64_t>(a.T, c.kv->n_seq_max()));
  const dim3 grid(static_cast<unsigned>(a.n_v * ((a.d + kDeltaWarps - 1) / kDeltaWarps)), slots);
  if (a.d <= 32) launch_delta<1, Norm>(a, grid, c.stream);
  else if (a.d <= 64) launch_delta<2, Norm>(a, grid, c.stream);
  else if (a.d <= 128) launch_delta<4, Norm>(a, grid, c.stream);
  else if (a.d <= 256) launch_delta<8, Norm>(a, grid, c.stream);
  else if (a.d <= 512) launch_delta<16, Norm>(a, grid, c.stream);
  else launch_delta<32, Norm>(a, grid, c.stream);
}

// The layer's state buffer, with a clear error where the graph and the cache disagree.
float *layer_state(const CudaOpCtx &c) {
  const int layer = c.n.kv_layer;
  if (!c.kv || layer < 0 || layer >= c.kv->n_layer() || !c.kv->recurrent_base(layer) || !c.ub.rs || !c.ub.seq)
    fail(Status::Internal, "CUDA %s: layer %d has no recurrent state or the ubatch no recurrent table", op_name(c.n.op), layer);
  return c.kv->recurrent_base(layer);
}

unsigned seq_slots(const CudaOpCtx &c, int64_t T) {
  return static_cast<unsigned>(std::min<int64_t>(T, c.kv->n_seq_max()));
}

}  // namespace

bool cuda_delta_net_supported(const Graph &g, const Node &n) {
  auto dense = [](const Node &t) { return t.type == DType::F32 && t.nb[0] == 4; };
  if (n.op == Op::SsmConv) {
    const Node &x = g.node(n.src[0]), &w = g.node(n.src[1]);
    return dense(n) && dense(x) && w.type == DType::F32 && w.is_contiguous() && n.ip[0] >= 1 && n.ip[0] <= 64;
  }
  if (n.op != Op::DeltaNet) return false;
  for (int s = 0; s < 4; ++s)
    if (!g.node(n.src[s]).is_contiguous() || g.node(n.src[s]).type != DType::F32) return false;
  return n.is_contiguous() && n.ne[0] >= 1 && n.ne[0] <= 1024;
}

void cuda_op_ssm_conv(const CudaOpCtx &c) {
  const Node &n = c.n, &x = c.src(0);
  const int64_t C = x.ne[0], T = x.ne[1];
  if (C == 0 || T == 0) return;
  float *base = layer_state(c);
  ConvArgs a{static_cast<float *>(n.data), static_cast<const float *>(x.data), static_cast<const float *>(c.src(1).data),
             static_cast<int64_t>(n.nb[1] / 4), static_cast<int64_t>(x.nb[1] / 4), C, T, n.ip[0], c.ub.seq, c.ub.rs, base,
             c.kv->dims(n.kv_layer).recurrent(), static_cast<int>(c.kv->n_seq_max())};
  const dim3 grid(static_cast<unsigned>((C + 127) / 128), seq_slots(c, T));
  if (T >= kConvTokensMin && T <= 65535) {
    const dim3 tokens(grid.x, static_cast<unsigned>(T));
    if (a.K == 4) launch_pdl(ssm_conv_tokens_kernel<4>, tokens, dim3(128), 0, c.stream, a);
    else launch_pdl(ssm_conv_tokens_kernel<0>, tokens, dim3(128), 0, c.stream, a);
    if (a.K == 4) launch_pdl(ssm_conv_kernel<4, true>, grid, dim3(128), 0, c.stream, a);
    else launch_pdl(ssm_conv_kernel<0, true>, grid, dim3(128), 0, c.stream, a);
    return;
  }
  if (a.K == 4) launch_pdl(ssm_conv_kernel<4>, grid, dim3(128), 0, c.stream, a);
  else launch_pdl(ssm_conv_kernel<0>, grid, dim3(128), 0, c.stream, a);
}

namespace {

// The kernel arguments of DeltaNet node c.n (the layer's state checked by layer_state).
DeltaArgs delta_args(const CudaOpCtx &c, float *base) {
  const Node &n = c.n, &q = c.src(0), &v = c.src(2);
  const KvLayerDims &dims = c.kv->dims(n.kv_layer);
  DeltaArgs a{};
  a.o = static_cast<float *>(n.data);
  a.q = static_cast<const float *>(q.data);
  a.k = static_cast<const float *>(c.src(1).data);
  a.v = static_cast<const float *>(v.data);
  a.gb = static_cast<const float *>(c.src(3).data);
  a.d = v.ne[0];
  a.n_k = q.ne[1];
  a.n_v = v.ne[1];
  a.T = v.ne[2];
  a.conv = dims.conv_state;
  a.head_map = n.ip[0];
  a.scale = n.fp[0];
  a.seq = c.ub.seq;
  a.rs = c.ub.rs;
  a.base = base;
  a.per = dims.recurrent();
  a.n_seq_max = static_cast<int>(c.kv->n_seq_max());
  return a;
}

}  // namespace

void cuda_op_delta_net(const CudaOpCtx &c) {
  const Node &v = c.src(2);
  if (v.ne[0] == 0 || v.ne[1] == 0 || v.ne[2] == 0) return;
  float *base = layer_state(c);
  if (cuda_delta_net_chunked(c, base)) return;
  launch_delta_net<false>(c, delta_args(c, base));
}

bool cuda_delta_norm_fits(const Graph &g, const Node &dn) {
  const int64_t d = dn.ne[0], n_v = dn.ne[1], T = dn.ne[2];
  return dn.op == Op::DeltaNet && cuda_delta_net_supported(g, dn) && d % kDeltaWarps == 0 && d <= kDeltaNormMaxD && T <= kMaxDeltaInTokens &&
         n_v * T <= kCudaSyncSlots;
}

void cuda_fused_delta_norm(const CudaOpCtx &c, const FusedGroup &grp) {
  const Node &dn = c.g.node(grp.members[0]), &norm = c.g.node(grp.members[1]), &mul = c.g.node(grp.members[2]), &sw = c.g.node(grp.members[3]);
  const CudaOpCtx dc = c.with_node(dn);
  if (dn.ne[0] == 0 || dn.ne[1] == 0 || dn.ne[2] == 0) return;
  if (!c.ub.sync || !cuda_delta_norm_fits(c.g, dn)) {  // (the plan checked the shapes; no counters: apart)
    for (int m : grp.members) cuda_run_node(c.with_node(c.g.node(m)));
    return;
  }
  DeltaArgs a = delta_args(dc, layer_state(dc));
  a.norm_w = static_cast<const float *>(c.g.node(mul.src[1]).data);
  a.y = tview(sw);
  a.z = tview(c.g.node(sw.src[0]));
  a.eps = norm.fp[0];
  a.sync = c.ub.sync;
  launch_delta_net<true>(dc, a);
}

}  // namespace moe
