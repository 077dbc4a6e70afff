// Gated DeltaNet kernels (qwen3next / qwen35moe linear-attention layers): the causal
// convolution with its per-sequence tail, L2 norm, softplus and the gated delta rule over a
// per-sequence matrix state. Both stateful kernels walk the ubatch's tokens in order and
// advance the state of each token's sequence (KvCache::recurrent_src -> recurrent_dst: the first
// token of a sequence in the ubatch copies the committed state into the copy being written).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/ref_math_vec.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "backends/cpu/ops/delta_net_step.h"
#include "kv/kv_cache.h"

namespace moe {

static const float *col_f32(const Node &n, int64_t i1, int64_t i2 = 0) {
  return reinterpret_cast<const float *>(static_cast<const uint8_t *>(n.data) + i1 * n.nb[1] + i2 * n.nb[2]);
}
static float *col_f32_mut(const Node &n, int64_t i1, int64_t i2 = 0) {
  return reinterpret_cast<float *>(static_cast<uint8_t *>(n.data) + i1 * n.nb[1] + i2 * n.nb[2]);
}

// Sequences met so far in this thread's walk over the ubatch (ids < 64).
struct SeenSeqs {
  uint64_t bits = 0;
  bool first(int32_t s) {
    const uint64_t b = 1ull << s;
    const bool f = !(bits & b);
    bits |= b;
    return f;
  }
};

// Channels are independent: each thread takes blocks of kConvBlock channels, and for each
// sequence walks its tokens in order with the window as K column pointers (the committed tail
// rows, then the ubatch's own inputs), so the sums run over contiguous channels (SIMD) and the
// tail is written once per sequence, not shifted per token. Per channel the sum goes oldest to
// newest from 0, as the reference sums.
constexpr int64_t kConvBlock = 64;

void cpu_ssm_conv(const CpuKernelArgs &a) {
  const Node &x = a.src(0), &w = a.src(1);
  const UbatchInfo &ub = *a.env.ub;
  KvCache &kv = *a.env.kv;
  const int layer = a.n.kv_layer;
  const int64_t C = x.ne[0], K = a.n.ip[0], T = x.ne[1];
  uint64_t pending = 0;
  for (int64_t t = 0; t < T; ++t) pending |= 1ull << ub.seq[t];
  float wt[64 * kConvBlock];  // this block's weights, [K][channel]
  const float *win[64];       // the window, oldest first (K - 1 tail rows, then the new input)
  int64_t b0, b1;
  split_rows((C + kConvBlock - 1) / kConvBlock, a.ith, a.nth, b0, b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t c0 = b * kConvBlock, nc = std::min(kConvBlock, C - c0);
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t j = 0; j < K; ++j) wt[j * kConvBlock + c] = static_cast<const float *>(w.data)[(c0 + c) * K + j];
    for (int32_t s = 0; s < 64; ++s) {
      if (!(pending >> s & 1)) continue;
      const float *from = kv.recurrent_src(layer, s);  // tail [K-1][C], oldest first
      float *st = kv.recurrent_dst(layer, s);
      for (int64_t j = 0; j + 1 < K; ++j) win[j] = from + j * C + c0;
      for (int64_t t = 0; t < T; ++t) {
        if (ub.seq[t] != s) continue;
        win[K - 1] = col_f32(x, t) + c0;
        float *out = col_f32_mut(a.n, t) + c0;
        for (int64_t c = 0; c < nc; ++c) out[c] = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const float *in = win[j], *wj = wt + j * kConvBlock;
          for (int64_t c = 0; c < nc; ++c) out[c] += in[c] * wj[c];
        }
        ref_silu(nc, out, out);
        for (int64_t j = 0; j + 1 < K; ++j) win[j] = win[j + 1];
      }
      // The new tail: the last K - 1 inputs. In place (from == st) a row j is read from tail
      // row >= j or from x, so ascending rows never read one already overwritten.
      for (int64_t j = 0; j + 1 < K; ++j)
        if (win[j] != st + j * C + c0) std::memcpy(st + j * C + c0, win[j], static_cast<size_t>(nc) * sizeof(float));
    }
  }
}

void cpu_l2_norm(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t n = a.n.ne[0], rows = a.n.ne[1] * a.n.ne[2] * a.n.ne[3];
  const float eps = a.n.fp[0];
  int64_t r0, r1;
  split_rows(rows, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const float *src = col_f32(x, r % x.ne[1], r / x.ne[1]);
    float *dst = col_f32_mut(a.n, r % a.n.ne[1], r / a.n.ne[1]);
    double sum = 0.0;  // the reference accumulates in double
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(src[i] * src[i]);
    const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
  }
}

void cpu_softplus(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const int64_t n = a.n.ne[0], rows = a.n.ne[1] * a.n.ne[2] * a.n.ne[3];
  int64_t r0, r1;
  split_rows(rows, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const float *src = col_f32(x, r % x.ne[1], r / x.ne[1]);
    float *dst = col_f32_mut(a.n, r % a.n.ne[1], r / a.n.ne[1]);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] > 20.0f ? src[i] : std::log(1.0f + std::exp(src[i]));
  }
}

// Each state row j is independent, so the whole step is one pass over the state.
void delta_step_scalar(float *S, const float *S_in, int64_t d, const float *q, const float *k, const float *v, float decay, float beta,
                       float scale, float *o) {
  for (int64_t j = 0; j < d; ++j) {
    float *row = S + j * d;
    const float *in = S_in + j * d;
    float kv = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      row[i] = in[i] * decay;
      kv += row[i] * k[i];
    }
    const float delta = beta * (v[j] - kv);
    float out = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      row[i] += k[i] * delta;
      out += row[i] * q[i];
    }
    o[j] = out * scale;
  }
}

// Tokens of one sequence (indices into the ubatch) handled as one chunk of the chunked form.
struct Chunk {
  int32_t idx[kDeltaNetChunk];
  int64_t n = 0;
};

// Chunked form of the same recurrence for L tokens of one head (WY form): with cumulative log
// decays c_a, the state rows after the chunk are exp(c_L) S0 + sum_b exp(c_L - c_b) D_b k_b^T,
// where the deltas D solve the unit lower-triangular system
//   D_a = beta_a (v_a - exp(c_a) S0 k_a) - sum_{b<a} beta_a exp(c_a - c_b) (k_b . k_a) D_b,
// and o_a = scale (exp(c_a) S0 q_a + sum_{b<=a} exp(c_a - c_b) (k_b . q_a) D_b). The products
// with S0 are matrix products over the chunk (what a tensor-core kernel batches); the
// token-to-token part is L x L. Scratch: L + L*d floats.
static void delta_chunk(float *S, int64_t d, const Chunk &ch, const float *const *q, const float *const *k, const float *const *v,
                        const float *g, const float *beta, float scale, float *const *o, float *scratch) {
  const int64_t L = ch.n;
  float *c = scratch, *D = scratch + L;
  for (int64_t a = 0; a < L; ++a) c[a] = (a ? c[a - 1] : 0.0f) + g[a];
  for (int64_t a = 0; a < L; ++a) {
    const float ea = std::exp(c[a]);
    float *Da = D + a * d;
    for (int64_t j = 0; j < d; ++j) {
      float sk = 0.0f, sq = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        sk += S[j * d + i] * k[a][i];
        sq += S[j * d + i] * q[a][i];
      }
      Da[j] = beta[a] * (v[a][j] - ea * sk);
      o[a][j] = ea * sq;  // the S0 part of the output; the chunk's own part below
    }
    for (int64_t b = 0; b < a; ++b) {
      float kk = 0.0f;
      for (int64_t i = 0; i < d; ++i) kk += k[b][i] * k[a][i];
      const float coef = beta[a] * std::exp(c[a] - c[b]) * kk;
      for (int64_t j = 0; j < d; ++j) Da[j] -= coef * D[b * d + j];
    }
    for (int64_t b = 0; b <= a; ++b) {
      float kq = 0.0f;
      for (int64_t i = 0; i < d; ++i) kq += k[b][i] * q[a][i];
      const float coef = std::exp(c[a] - c[b]) * kq;
      for (int64_t j = 0; j < d; ++j) o[a][j] += coef * D[b * d + j];
    }
    for (int64_t j = 0; j < d; ++j) o[a][j] *= scale;
  }
  const float eL = std::exp(c[L - 1]);
  for (int64_t j = 0; j < d; ++j) {
    float *row = S + j * d;
    for (int64_t i = 0; i < d; ++i) row[i] *= eL;
    for (int64_t b = 0; b < L; ++b) {
      const float w = std::exp(c[L - 1] - c[b]) * D[b * d + j];
      for (int64_t i = 0; i < d; ++i) row[i] += w * k[b][i];
    }
  }
}

size_t cpu_delta_net_work(const Node &n, int n_threads) {
  if (n.ip[1] == 0) return 0;
  const int64_t d = n.ne[0];
  return static_cast<size_t>(n_threads) * static_cast<size_t>(kDeltaNetChunk * (1 + d)) * sizeof(float);
}

// The chunked form for every sequence of the ubatch, one head: each sequence's tokens in
// order, kDeltaNetChunk at a time.
static void delta_net_chunked_head(const CpuKernelArgs &a, int64_t h, int64_t kh, float *scratch) {
  const Node &q = a.src(0), &k = a.src(1), &v = a.src(2), &gb = a.src(3);
  const UbatchInfo &ub = *a.env.ub;
  KvCache &kv = *a.env.kv;
  const int layer = a.n.kv_layer;
  const int64_t d = v.ne[0], n_v = v.ne[1], T = v.ne[2], dd = d * d, conv = kv.dims(layer).conv_state;
  uint64_t pending = 0;
  for (int64_t t = 0; t < T; ++t) pending |= 1ull << ub.seq[t];
  const float *qp[kDeltaNetChunk], *kp[kDeltaNetChunk], *vp[kDeltaNetChunk];
  float *op[kDeltaNetChunk], gs[kDeltaNetChunk], bs[kDeltaNetChunk];
  for (int32_t s = 0; s < 64; ++s) {
    if (!(pending >> s & 1)) continue;
    float *S = kv.recurrent_dst(layer, s) + conv + h * dd;
    const float *from = kv.recurrent_src(layer, s) + conv + h * dd;
    if (from != S) std::memcpy(S, from, static_cast<size_t>(dd) * sizeof(float));
    Chunk ch;
    for (int64_t t = 0; t <= T; ++t) {
      if (t < T && ub.seq[t] == s) ch.idx[ch.n++] = static_cast<int32_t>(t);
      if (ch.n == kDeltaNetChunk || (t == T && ch.n > 0)) {
        for (int64_t i = 0; i < ch.n; ++i) {
          const int64_t tt = ch.idx[i];
          qp[i] = col_f32(q, kh, tt);
          kp[i] = col_f32(k, kh, tt);
          vp[i] = col_f32(v, h, tt);
          op[i] = col_f32_mut(a.n, h, tt);
          gs[i] = col_f32(gb, tt)[h];
          bs[i] = col_f32(gb, tt)[n_v + h];
        }
        delta_chunk(S, d, ch, qp, kp, vp, gs, bs, a.n.fp[0], op, scratch);
        ch.n = 0;
      }
    }
  }
}

using DeltaStep = void (*)(float *, const float *, int64_t, const float *, const float *, const float *, float, float, float, float *);
static DeltaStep delta_step_for_isa() {
#if defined(MOEINFER_X86)
  if (active_cpu_isa() == CpuIsa::Avx2 || active_cpu_isa() == CpuIsa::Avx512) return delta_step_avx2;
#endif
  return delta_step_scalar;
}

void cpu_delta_net(const CpuKernelArgs &a) {
  const Node &q = a.src(0), &k = a.src(1), &v = a.src(2), &gb = a.src(3);
  const UbatchInfo &ub = *a.env.ub;
  KvCache &kv = *a.env.kv;
  const int layer = a.n.kv_layer;
  const int64_t d = v.ne[0], n_v = v.ne[1], n_k = q.ne[1], T = v.ne[2], r = n_v / n_k;
  const int64_t conv = kv.dims(layer).conv_state, dd = d * d;
  const float scale = a.n.fp[0];
  const DeltaStep step = delta_step_for_isa();
  int64_t h0, h1;
  split_rows(n_v, a.ith, a.nth, h0, h1);
  for (int64_t h = h0; h < h1; ++h) {
    const int64_t kh = a.n.ip[0] == 0 ? h / r : h % n_k;
    if (a.n.ip[1]) {
      float *scratch = reinterpret_cast<float *>(a.work) + static_cast<size_t>(a.ith) * static_cast<size_t>(kDeltaNetChunk * (1 + d));
      delta_net_chunked_head(a, h, kh, scratch);
      continue;
    }
    SeenSeqs seen;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = ub.seq[t];
      float *S = kv.recurrent_dst(layer, s) + conv + h * dd;
      const float *S_in = seen.first(s) ? kv.recurrent_src(layer, s) + conv + h * dd : S;
      const float *g = col_f32(gb, t);
      step(S, S_in, d, col_f32(q, kh, t), col_f32(k, kh, t), col_f32(v, h, t), std::exp(g[h]), g[n_v + h], scale,
                 col_f32_mut(a.n, h, t));
    }
  }
}

}  // namespace moe
