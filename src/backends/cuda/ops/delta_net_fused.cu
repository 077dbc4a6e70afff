// Fused launches of the qwen3next / qwen35moe layers (FusedKind::DeltaIn, GatedNorm and
// SharedGate, cuda_fusion.h):
//
//   DeltaIn: everything between the input projections and the DeltaNet kernel in ONE launch:
//     the gate chain   g = concat(softplus(alpha + dt_bias) * ssm_a, sigmoid(beta))
//     the convolution  c = silu(causal depthwise conv of qkv) (advancing the conv tail)
//     the q / k / v parts of c, q and k L2-normalised per head row of d values.
//   Blocks: one per q or k head row (d channels, its L2 norm in the block), then blocks of
//   channels of v, then one block for the gates; grid.y walks the ubatch's sequences as the
//   SsmConv kernel does (the gate block runs in slot 0 only).
//   GatedNorm: RmsNorm(o) -> Mul(ssm_norm) -> SwiGLU(z, .) per head row in one launch.
//   SharedGate: the sigmoid-gated shared expert added to the routed experts and the residual
//     (Sigmoid, MoeCombine, Add, Add) in one element-wise launch.
//
// Every value is computed with the unfused kernels' expressions and reduction orders (the
// SsmConv sum of delta_net.cu, l2_row_scale / rms_row_scale with the row kernels' block
// sizes, ew_value), so fused and unfused results are bit-identical (tests/unit/
// test_cuda_dnfuse.cpp; tools/cuda_emu/run_dnfuse.sh checks the kernels without a GPU).
#include <algorithm>

#include "backends/cuda/cuda_fusion.h"
#include "backends/cuda/ops/ew_value.cuh"
#include "backends/cuda/ops/pdl.cuh"
#include "backends/cuda/ops/row_ops.cuh"
#include "kv/kv_cache.h"

namespace moe {

namespace {

// Element f of a [n_v, T] gate operand read through its Slice (or the tensor itself:
// start 0, len = its ne0): f = h + n_v t, taken from element (start + f % len, i1, i2) of src.
struct GateSrc {
  const uint8_t *data;
  int64_t start, len, ne1, nb1, nb2;
};

struct DeltaInArgs {
  // SsmConv: x [C, T] (column stride x_nb1 floats), w [K, C]; the layer's state table.
  const float *x, *w;
  int64_t x_nb1, C, T;
  int K;
  const int32_t *seq, *rs;
  float *base;
  int64_t per;
  int n_seq_max;
  // Parts of c: q = channels [0, d n_k), k = [d n_k, 2 d n_k) (rows of d, L2-normalised into
  // the L2Norm outputs), v = the rest (the Slice output, column stride v_nb1 floats).
  int64_t d, n_k;
  float eps_q, eps_k;
  int norm_threads;  // the unfused L2Norm kernel's block size (its reduction order)
  TView q, k;
  float *v;
  int64_t v_nb1;
  int v_blocks;
  // Gates: out [2 n_v, T] (column stride g_nb1 floats) = softplus(alpha + bias) * a, sigmoid(beta).
  GateSrc alpha, beta;
  const float *bias, *a;
  float *g;
  int64_t g_nb1, n_v;
};

constexpr int kDeltaInMaxThreads = 1024;  // head rows of up to 1024 values (DeltaNet's limit)

__device__ __forceinline__ float gate_src_value(const GateSrc &s, int64_t f) {
  const int64_t i = f % s.len, rest = f / s.len;
  return *reinterpret_cast<const float *>(s.data + (s.start + i) * 4 + (rest % s.ne1) * s.nb1 + (rest / s.ne1) * s.nb2);
}

// The state of table slot `slot` in copy `which` (1: read, 2: written), as delta_net.cu finds it.
__device__ __forceinline__ float *delta_state(const DeltaInArgs &a, int slot, int which) {
  const int seq = a.rs[1 + 3 * slot], copy = a.rs[1 + 3 * slot + which];
  return a.base + (static_cast<int64_t>(copy) * a.n_seq_max + seq) * a.per;
}

// 1 / max(||x||, eps) of a row as l2_norm_kernel (elementwise.cu) computes it with nthr
// threads: float squares, double sums with stride nthr, blk_sum. Block-wide.
__device__ __forceinline__ float l2_row_scale_fused(const float *src, int n, float eps, int nthr, double *sh) {
  double s = 0.0;
  if (static_cast<int>(threadIdx.x) < nthr)
    for (int i = threadIdx.x; i < n; i += nthr) s += static_cast<double>(src[i] * src[i]);
  s = blk_sum(s, sh);
  return 1.0f / fmaxf(sqrtf(static_cast<float>(s)), eps);
}

// The gate block (the gates never lie over their operands: cuda_fusion_keep_live).
__device__ void delta_gates(const DeltaInArgs &a) {
  for (int64_t f = threadIdx.x; f < a.n_v * a.T; f += blockDim.x) {
    const int64_t h = f % a.n_v, t = f / a.n_v;
    const float sp = ew_value(kSoftplus, ew_value(kAdd, gate_src_value(a.alpha, f), a.bias[h], 0, 1, 0, 0), 0.0f, 0, 1, 0, 0);
    a.g[t * a.g_nb1 + h] = ew_value(kMul, sp, a.a[h], 0, 1, 0, 0);
    a.g[t * a.g_nb1 + a.n_v + h] = ew_value(kSigmoid, gate_src_value(a.beta, f), 0.0f, 0, 1, 0, 0);
  }
}

// KT > 0: the conv width known at compile time; KT = 0: any width up to 64.
template <int KT>
__global__ void __launch_bounds__(kDeltaInMaxThreads) delta_in_kernel(const __grid_constant__ DeltaInArgs a) {
  __shared__ float s_row[kDeltaInMaxThreads];
  __shared__ double s_red[32];
  pdl_wait();
  pdl_trigger();
  const int slot = blockIdx.y;
  const int64_t qk_rows = 2 * a.n_k, b = blockIdx.x;
  if (b == qk_rows + a.v_blocks) {
    if (slot == 0) delta_gates(a);
    return;
  }
  if (slot >= a.rs[0]) return;  // (uniform in the block)
  const bool norm = b < qk_rows;
  const int64_t c = norm ? b * a.d + threadIdx.x : 2 * a.n_k * a.d + (b - qk_rows) * blockDim.x + threadIdx.x;
  const bool live = norm ? static_cast<int64_t>(threadIdx.x) < a.d : c < a.C;
  constexpr int kMax = KT ? KT : 64;
  const int K = KT ? KT : a.K;
  const int32_t seq = a.rs[1 + 3 * slot];
  const float *src = delta_state(a, slot, 1);
  float *dst = delta_state(a, slot, 2);
  float win[kMax], wc[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    if (j >= K) break;
    wc[j] = live ? a.w[c * K + j] : 0.0f;
    if (j + 1 < K) win[j] = live ? src[j * a.C + c] : 0.0f;  // tail [K-1][C], oldest first
  }
  const TView &out = b < a.n_k ? a.q : a.k;
  const float eps = b < a.n_k ? a.eps_q : a.eps_k;
  for (int64_t t = 0; t < a.T; ++t) {
    if (a.seq[t] != seq) continue;
    win[K - 1] = live ? a.x[t * a.x_nb1 + c] : 0.0f;
    float sum = 0.0f;  // oldest to newest, unfused, as ssm_conv_kernel (and the CPU) sums
#pragma unroll
    for (int j = 0; j < kMax; ++j)
      if (j < K) sum = __fadd_rn(sum, __fmul_rn(win[j], wc[j]));
    const float y = __fdiv_rn(sum, __fadd_rn(1.0f, ref_expf_v(__fsub_rn(0.0f, sum))));  // refmath::silu_v
#pragma unroll
    for (int j = 0; j + 1 < kMax; ++j)
      if (j + 1 < K) win[j] = win[j + 1];
    if (!norm) {
      if (live) a.v[t * a.v_nb1 + (c - 2 * a.n_k * a.d)] = y;
      continue;
    }
    s_row[threadIdx.x] = y;
    __syncthreads();
    const float scale = l2_row_scale_fused(s_row, static_cast<int>(a.d), eps, a.norm_threads, s_red);  // its barriers end the reads of s_row
    if (live) rowp(out, b % a.n_k, t, 0)[threadIdx.x] = y * scale;
  }
  if (live)
#pragma unroll
    for (int j = 0; j + 1 < kMax; ++j)
      if (j + 1 < K) dst[j * a.C + c] = win[j];
}

struct GatedNormArgs {
  TView out, x, z;  // rows of d: out = silu(z) * (rms_norm(x) * w)
  const float *w;
  float eps;
  int rms_threads;  // the unfused RmsNorm kernel's block size (its reduction order)
};

// A block per row, of rms_threads threads (rms_norm_kernel's shape).
__global__ void gated_norm_kernel(const __grid_constant__ GatedNormArgs a) {
  __shared__ double s_red[32];
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x, n = a.out.ne[0];
  const int64_t i1 = r % a.out.ne[1], i2 = (r / a.out.ne[1]) % a.out.ne[2], i3 = r / (a.out.ne[1] * a.out.ne[2]);
  const float *x = rowp(a.x, i1, i2, i3), *z = rowp(a.z, i1, i2, i3);
  float *o = rowp(a.out, i1, i2, i3);
  const float scale = rms_row_scale(x, static_cast<int>(n), a.eps, a.rms_threads, s_red);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float normed = x[i] * scale;  // the RmsNorm output, rounded to float as stored
    o[i] = ew_value(kSwiGLU, z[i], normed * a.w[i], i, n, 0.0f, 0.0f);
  }
}

struct SharedGateArgs {
  TView out, routed, res, shared, logit;  // out, routed, res: [M, T]; shared [M, 1, T]; logit [1, T]
};

// y = (routed + shared * sigmoid(logit)) + res, each step rounded as the unfused Sigmoid,
// MoeCombine (one expert: one rounded product) and Adds store it.
__global__ void shared_gate_kernel(const __grid_constant__ SharedGateArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.out.ne[0]) return;
  const float s = ew_value(kSigmoid, *rowp(a.logit, t, 0, 0), 0.0f, 0, 1, 0, 0);
  const float g = __fmul_rn(rowp(a.shared, 0, t, 0)[i], s);
  rowp(a.out, t, 0, 0)[i] = __fadd_rn(__fadd_rn(rowp(a.routed, t, 0, 0)[i], g), rowp(a.res, t, 0, 0)[i]);
}

// --- end of kernels (tools/cuda_emu/gen_dnfuse.py cuts the text above) ---

GateSrc gate_src(const Graph &g, int operand) {
  int src = 0;
  int64_t start = 0, len = 0;
  delta_gate_source(g, operand, src, start, len);
  const Node &s = g.node(src);
  return GateSrc{static_cast<const uint8_t *>(s.data), start, len, s.ne[1], static_cast<int64_t>(s.nb[1]), static_cast<int64_t>(s.nb[2])};
}

}  // namespace

void cuda_fused_delta_in(const CudaOpCtx &c, const FusedGroup &grp) {
  const Graph &g = c.g;
  const Node &conv = g.node(grp.parts[kDiConv]), &q = g.node(grp.parts[kDiQ]), &k = g.node(grp.parts[kDiK]);
  const Node &v = g.node(grp.parts[kDiV]), &cc = g.node(grp.parts[kDiGates]), &add = g.node(grp.parts[kDiAdd]);
  const Node &mul = g.node(grp.parts[kDiMul]), &sig = g.node(grp.parts[kDiSigmoid]), &x = g.node(conv.src[0]);
  const int layer = conv.kv_layer;
  if (!c.kv || layer < 0 || layer >= c.kv->n_layer() || !c.kv->recurrent_base(layer) || !c.ub.rs || !c.ub.seq)
    fail(Status::Internal, "CUDA fused DeltaNet input: layer %d has no recurrent state or the ubatch no recurrent table", layer);
  const int64_t C = x.ne[0], T = x.ne[1], d = q.ne[0], n_k = q.ne[1], n_v = cc.ne[0] / 2;
  if (C == 0 || T == 0) return;
  DeltaInArgs a{};
  a.x = static_cast<const float *>(x.data);
  a.w = static_cast<const float *>(g.node(conv.src[1]).data);
  a.x_nb1 = static_cast<int64_t>(x.nb[1] / 4);
  a.C = C;
  a.T = T;
  a.K = conv.ip[0];
  a.seq = c.ub.seq;
  a.rs = c.ub.rs;
  a.base = c.kv->recurrent_base(layer);
  a.per = c.kv->dims(layer).recurrent();
  a.n_seq_max = static_cast<int>(c.kv->n_seq_max());
  a.d = d;
  a.n_k = n_k;
  a.eps_q = q.fp[0];
  a.eps_k = k.fp[0];
  a.norm_threads = row_threads(d);
  a.q = tview(q);
  a.k = tview(k);
  a.v = static_cast<float *>(v.data);
  a.v_nb1 = static_cast<int64_t>(v.nb[1] / 4);
  const int threads = std::max(static_cast<int>((d + 31) / 32 * 32), row_threads(d));
  a.v_blocks = static_cast<int>((C - 2 * n_k * d + threads - 1) / threads);
  a.alpha = gate_src(g, add.src[0]);
  a.beta = gate_src(g, sig.src[0]);
  a.bias = static_cast<const float *>(g.node(add.src[1]).data);
  a.a = static_cast<const float *>(g.node(mul.src[1]).data);
  a.g = static_cast<float *>(cc.data);
  a.g_nb1 = static_cast<int64_t>(cc.nb[1] / 4);
  a.n_v = n_v;
  const dim3 grid(static_cast<unsigned>(2 * n_k + a.v_blocks + 1), static_cast<unsigned>(std::min<int64_t>(T, c.kv->n_seq_max())));
  if (a.K == 4) launch_pdl(delta_in_kernel<4>, grid, dim3(static_cast<unsigned>(threads)), 0, c.stream, a);
  else launch_pdl(delta_in_kernel<0>, grid, dim3(static_cast<unsigned>(threads)), 0, c.stream, a);
}

void cuda_fused_gated_norm(const CudaOpCtx &c, const FusedGroup &grp) {
  const Node &norm = c.g.node(grp.members[0]), &mul = c.g.node(grp.members[1]), &sw = c.g.node(grp.members[2]);
  const int64_t rows = sw.ne[1] * sw.ne[2] * sw.ne[3];
  if (rows == 0 || sw.ne[0] == 0) return;
  GatedNormArgs a{tview(sw), tview(c.g.node(norm.src[0])), tview(c.g.node(sw.src[0])), static_cast<const float *>(c.g.node(mul.src[1]).data),
                  norm.fp[0], row_threads(sw.ne[0])};
  launch_pdl(gated_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(a.rms_threads)), 0, c.stream, a);
}

void cuda_fused_shared_gate(const CudaOpCtx &c, const FusedGroup &grp) {
  const Graph &g = c.g;
  const Node &s = g.node(grp.members[0]), &cn = g.node(grp.members[1]), &a = g.node(grp.members[2]), &y = g.node(grp.members[3]);
  const int64_t M = y.ne[0], T = y.ne[1];
  if (M == 0 || T == 0) return;
  const int routed = a.src[0] == grp.members[1] ? a.src[1] : a.src[0], res = y.src[0] == grp.members[2] ? y.src[1] : y.src[0];
  SharedGateArgs args{tview(y), tview(g.node(routed)), tview(g.node(res)), tview(g.node(cn.src[0])), tview(g.node(s.src[0]))};
  launch_pdl(shared_gate_kernel, dim3(static_cast<unsigned>((M + 255) / 256), static_cast<unsigned>(T)), dim3(256), 0, c.stream, args);
}

}  // namespace moe
