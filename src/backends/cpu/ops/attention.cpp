// KV cache writes and causal GQA attention over the cache.
//
// Numerics follow the reference engine per cache type, because the conformance data was
// produced that way: F32 cache - plain f32 dots and softmax; F16 cache - q and the softmax
// probabilities rounded to f16 before meeting f16 K/V; Q8_0 cache (flash attention) - q
// quantized to Q8_0 for the K dots, online softmax, V dequantized and accumulated in f32.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/ref_math.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/ops/attention_simd.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "core/fp16.h"
#include "kv/kv_cache.h"

namespace moe {

void cpu_kv_store(const CpuKernelArgs &a) {
  const Node &x = a.src(0);
  const UbatchInfo &ub = *a.env.ub;
  KvCache &kv = *a.env.kv;
  const int layer = a.n.kv_layer;
  const int64_t row = a.n.ip[0];
  uint8_t *base = static_cast<uint8_t *>(a.n.kv_which == 0 ? kv.k_data(layer) : kv.v_data(layer));
  const size_t rb = a.n.kv_which == 0 ? kv.k_row_bytes(layer) : kv.v_row_bytes(layer);
  int64_t r0, r1;
  split_rows(ub.n_tokens, a.ith, a.nth, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float *src = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + t * x.nb[2]);
    quantize_row(kv.dtype(), src, base + static_cast<size_t>(ub.cells[t]) * rb, row);
  }
}

// q heads that share one KV head (GQA group), from the q shape and the K rows KvStore writes.
static int64_t gqa_group(const Graph &g, const Node &n) {
  const Node &q = g.node(n.src[0]);
  const int64_t k_row = g.node(n.src[1]).ip[0];
  const int64_t n_head_kv = k_row / q.ne[0];
  return n_head_kv > 0 ? q.ne[1] / n_head_kv : 1;
}

// F16 cache, several tokens: each thread takes one KV head's tokens in a row and converts
// that head's K and V cells to f32 once (not once per token: for a 512-token prompt the
// conversions were as much work as the dots). The copy has at most 1 MiB per thread
// (2,048 cells of 128 + 128 values); a ubatch that sees more cells converts per token.
static int64_t prefill_conv_cells(int64_t n_cells, int64_t hd_k, int64_t hd_v, bool v_from_k) {
  if (v_from_k || hd_k + hd_v <= 0) return 0;
  return std::min(n_cells, int64_t(1 << 20) / (4 * (hd_k + hd_v)));
}

size_t cpu_attention_work(const Graph &g, const Node &n, int n_threads) {
  // Per thread: scores for every cell (one row per head of a GQA group), then the group's
  // f32 accumulators and q rows, a converted K/V row and the converted q, each sized for
  // the largest head the builder allows (kMaxHeadDim); then the prefill K/V copy.
  const int64_t n_cells = n.ip[1];
  const int64_t group = std::min<int64_t>(std::max<int64_t>(gqa_group(g, n), 1), kMaxGqaGroup);
  const int64_t hd_k = g.node(n.src[0]).ne[0], hd_v = n.ne[0];
  const int64_t conv = prefill_conv_cells(n_cells, hd_k, hd_v, (n.ip[2] & 1) != 0) * (hd_k + hd_v);
  const size_t per_thread = (static_cast<size_t>(group * n_cells) * 4 + static_cast<size_t>(kMaxHeadDim * 4 * (2 + 2 * group)) +
                             row_size(DType::F32, kMaxHeadDim) + static_cast<size_t>(conv) * 4 + 63) / 64 * 64;
  return per_thread * static_cast<size_t>(n_threads);
}

namespace {

// F32 cache, reference order (KQ, soft_max, KQV as the reference's separate ops, with its
// float grouping; see kernels/ref_math.h). Cells sit at their cache index, as in the
// reference's 256-padded view, so the lane of cell c is fixed by c; hidden cells are exact
// zeros there and are skipped here. batched: the reference's KQV runs as a multi-token GEMM.
template <class Hidden>
void attend_f32_reference_order(const uint8_t *k, size_t krb, const uint8_t *v, size_t vrb, const float *q, int64_t hd_k,
                                int64_t hd_v, int32_t n_kv, float scale, bool batched, const Hidden &hidden, float *p,
                                float *out) {
  float mx = -INFINITY;
  for (int32_t c = 0; c < n_kv; ++c) {
    if (hidden(c)) { p[c] = -INFINITY; continue; }
    p[c] = refmath::dot_f32_vec(static_cast<int>(hd_k), reinterpret_cast<const float *>(k + c * krb), 1, q, 1) * scale;
    mx = std::fmax(mx, p[c]);
  }
  // Vector exp over 16-cell chunks; each chunk's lanes summed by the 16-lane tree, in double.
  double sum = 0.0;
  for (int32_t c0 = 0; c0 < n_kv; c0 += 16) {
    float lanes[16] = {};
    for (int32_t c = c0; c < c0 + 16 && c < n_kv; ++c) {
      p[c] = p[c] == -INFINITY ? 0.0f : refmath::expf_v(p[c] - mx);
      lanes[c - c0] = p[c];
    }
    sum += static_cast<double>(refmath::hsum16(lanes));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int32_t c = 0; c < n_kv; ++c) p[c] *= inv;
  constexpr int64_t kMaxHd = kMaxHeadDim;
  if (batched) {
    float acc[kMaxHd][16];
    std::memset(acc, 0, sizeof(acc[0]) * static_cast<size_t>(hd_v));
    for (int32_t c = 0; c < n_kv; ++c) {
      if (p[c] == 0.0f) continue;  // fma(v, 0, a) == a
      const float *vr = reinterpret_cast<const float *>(v + c * vrb);
      for (int64_t i = 0; i < hd_v; ++i) acc[i][c & 15] = std::fma(vr[i], p[c], acc[i][c & 15]);
    }
    for (int64_t i = 0; i < hd_v; ++i) out[i] = refmath::hsum16(acc[i]);
  } else {
    float acc[kMaxHd][64];  // [(c % 64) / 16][c % 16]
    std::memset(acc, 0, sizeof(acc[0]) * static_cast<size_t>(hd_v));
    for (int32_t c = 0; c < n_kv; ++c) {
      if (p[c] == 0.0f) continue;
      const float *vr = reinterpret_cast<const float *>(v + c * vrb);
      for (int64_t i = 0; i < hd_v; ++i) acc[i][c & 63] = std::fma(vr[i], p[c], acc[i][c & 63]);
    }
    for (int64_t i = 0; i < hd_v; ++i) {
      float f[16];
      for (int l = 0; l < 16; ++l) f[l] = (acc[i][l] + acc[i][32 + l]) + (acc[i][16 + l] + acc[i][48 + l]);
      out[i] = refmath::hsum16(f);
    }
  }
}

}  // namespace

void cpu_attention(const CpuKernelArgs &a) {
  const Node &q = a.src(0);
  const UbatchInfo &ub = *a.env.ub;
  KvCache &kv = *a.env.kv;
  const int layer = a.n.kv_layer;
  const int64_t hd_k = q.ne[0], n_head = q.ne[1], T = q.ne[2], hd_v = a.n.ne[0];
  const int64_t n_head_kv = kv.dims(layer).k_row / hd_k;
  const int64_t group = n_head / n_head_kv;
  const float scale = a.n.fp[0];
  const DType kt = kv.dtype();
  const uint8_t *kbase = static_cast<const uint8_t *>(kv.k_data(layer));
  // MLA: V is the leading latent part of the single K head (no V cache at all).
  const bool v_from_k = (a.n.ip[2] & 1) != 0;
  const uint8_t *vbase = static_cast<const uint8_t *>(v_from_k ? kv.k_data(layer) : kv.v_data(layer));
  const size_t krb = kv.k_row_bytes(layer), vrb = v_from_k ? krb : kv.v_row_bytes(layer);
  const size_t k_head_bytes = row_size(kt, hd_k), v_head_bytes = v_from_k ? k_head_bytes : row_size(kt, hd_v);
  const int32_t window = a.n.ip[3];
  const float *sinks = a.n.src[3] >= 0 ? static_cast<const float *>(a.src(3).data) : nullptr;
  const int32_t n_kv = ub.n_kv;
  const KvCell *cells = ub.cell_state;

  const size_t per_thread = a.n.work_size / static_cast<size_t>(a.nth);
  uint8_t *scratch = a.work + per_thread * static_cast<size_t>(a.ith);
  float *scores = reinterpret_cast<float *>(scratch);
  float *acc = scores + a.n.ip[1];
  float *vtmp = acc + kMaxHeadDim;
  uint8_t *qconv = reinterpret_cast<uint8_t *>(vtmp + kMaxHeadDim);

  if (kt == DType::F16 && !v_from_k && group <= kMaxGqaGroup) {
    // GQA: the q heads that share a KV head walk the cache together, so each K/V row is
    // converted to f32 once per group instead of once per head (the decode hot loop).
    const int64_t nc = a.n.ip[1];
    float *sc = reinterpret_cast<float *>(scratch);  // [group][n_cells]
    float *qf = sc + group * nc;                     // [group][hd_k], q rounded to f16
    float *accg = qf + group * kMaxHeadDim;          // [group][hd_v]
    float *row = accg + group * kMaxHeadDim;         // one converted K or V row
    // Prefill: rows in (KV head, token) order and the head's cells converted once per run
    // of rows (kf / vf: [cell][hd]); the dots and sums are the same either way.
    const bool conv = T > 1 && n_kv <= prefill_conv_cells(a.n.ip[1], hd_k, hd_v, false);
    float *kf = row + kMaxHeadDim, *vf = kf + static_cast<int64_t>(n_kv) * hd_k;
    int64_t conv_hk = -1;
    int64_t g0, g1;
    split_rows(T * n_head_kv, a.ith, a.nth, g0, g1);
    for (int64_t r = g0; r < g1; ++r) {
      if (a.pool.stop_point(a.ith)) break;  // a cancel (the decode fails; the rows left do not matter)
      const int64_t t = conv ? r % T : r / n_head_kv, hk = conv ? r / T : r % n_head_kv;
      if (conv && hk != conv_hk) {
        for (int32_t c = 0; c < n_kv; ++c) {
          if (cells[c].pos < 0) continue;  // never read: every token hides an empty cell
          attn_f16_to_f32(static_cast<int>(hd_k), kf + c * hd_k, reinterpret_cast<const uint16_t *>(kbase + c * krb + hk * k_head_bytes));
          attn_f16_to_f32(static_cast<int>(hd_v), vf + c * hd_v, reinterpret_cast<const uint16_t *>(vbase + c * vrb + hk * v_head_bytes));
        }
        conv_hk = hk;
      }
      const uint64_t seq_bit = 1ull << ub.seq[t];
      const int32_t pos = ub.pos[t];
      auto hidden = [&](int32_t c) {
        return cells[c].pos < 0 || !(cells[c].seq & seq_bit) || cells[c].pos > pos || (window > 0 && pos - cells[c].pos >= window);
      };
      float mx[kMaxGqaGroup], inv[kMaxGqaGroup];
      for (int64_t gi = 0; gi < group; ++gi) {
        const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + (hk * group + gi) * q.nb[1] + t * q.nb[2]);
        for (int64_t i = 0; i < hd_k; ++i) qf[gi * hd_k + i] = round_fp16(qrow[i]);
        mx[gi] = -INFINITY;
      }
      for (int32_t c = 0; c < n_kv; ++c) {
        if (hidden(c)) {
          for (int64_t gi = 0; gi < group; ++gi) sc[gi * nc + c] = -INFINITY;
          continue;
        }
        const float *kr = row;
        if (conv) kr = kf + c * hd_k;
        else attn_f16_to_f32(static_cast<int>(hd_k), row, reinterpret_cast<const uint16_t *>(kbase + c * krb + hk * k_head_bytes));
        for (int64_t gi = 0; gi < group; ++gi) {
          const float sv = attn_dot_f32(static_cast<int>(hd_k), qf + gi * hd_k, kr) * scale;
          sc[gi * nc + c] = sv;
          mx[gi] = std::fmax(mx[gi], sv);
        }
      }
      for (int64_t gi = 0; gi < group; ++gi) {
        const int64_t h = hk * group + gi;
        if (sinks && sinks[h] > mx[gi]) mx[gi] = sinks[h];
        double sum = 0.0;
        float *sg = sc + gi * nc;
        for (int32_t c = 0; c < n_kv; ++c) {
          const float e = sg[c] == -INFINITY ? 0.0f : std::exp(sg[c] - mx[gi]);
          sg[c] = e;
          sum += e;
        }
        if (sinks) sum += static_cast<double>(std::exp(sinks[h] - mx[gi]));
        inv[gi] = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
        for (int64_t i = 0; i < hd_v; ++i) accg[gi * hd_v + i] = 0.0f;
      }
      for (int32_t c = 0; c < n_kv; ++c) {
        if (hidden(c)) continue;
        const float *vr = row;
        if (conv) vr = vf + c * hd_v;
        else attn_f16_to_f32(static_cast<int>(hd_v), row, reinterpret_cast<const uint16_t *>(vbase + c * vrb + hk * v_head_bytes));
        for (int64_t gi = 0; gi < group; ++gi) {
          const float pr = sc[gi * nc + c] * inv[gi];
          if (pr == 0.0f) continue;
          attn_axpy_f32(static_cast<int>(hd_v), accg + gi * hd_v, vr, round_fp16(pr));
        }
      }
      for (int64_t gi = 0; gi < group; ++gi) {
        float *out = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + (hk * group + gi) * a.n.nb[1] + t * a.n.nb[2]);
        for (int64_t i = 0; i < hd_v; ++i) out[i] = accg[gi * hd_v + i];
      }
    }
    return;
  }

  const CpuTypeKernels &kk = cpu_type_kernels(kt);
  int64_t r0, r1;
  split_rows(T * n_head, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    if (a.pool.stop_point(a.ith)) break;
    const int64_t t = r / n_head, h = r % n_head, hk = h / group;
    const float *qrow = reinterpret_cast<const float *>(static_cast<const uint8_t *>(q.data) + h * q.nb[1] + t * q.nb[2]);
    float *out = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + h * a.n.nb[1] + t * a.n.nb[2]);
    const uint64_t seq_bit = 1ull << ub.seq[t];
    const int32_t pos = ub.pos[t];
    // Sliding window (reference rule): a cell is hidden once pos - cell_pos >= window.
    auto hidden = [&](int32_t c) {
      return cells[c].pos < 0 || !(cells[c].seq & seq_bit) || cells[c].pos > pos || (window > 0 && pos - cells[c].pos >= window);
    };
    // q in the K cache's dot type (f32 stays f32, f16 rounds, q8_0 quantizes).
    const void *qk = qrow;
    if (kt != DType::F32) { kk.from_float(qrow, qconv, hd_k); qk = qconv; }

    if (kt == DType::Q8_0) {
      // Online softmax (flash-attention order), V dequantized to f32.
      float M = -INFINITY, S = 0.0f;
      for (int64_t i = 0; i < hd_v; ++i) acc[i] = 0.0f;
      for (int32_t c = 0; c < n_kv; ++c) {
        if (hidden(c)) continue;
        float s;
        kk.vec_dot(static_cast<int>(hd_k), &s, kbase + c * krb + hk * k_head_bytes, qk);
        s *= scale;
        const float Mold = M;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
          M = s;
          ms = std::exp(Mold - M);
          for (int64_t i = 0; i < hd_v; ++i) acc[i] *= ms;
        } else {
          vs = std::exp(s - M);
        }
        dequantize_row(kt, vbase + c * vrb + hk * v_head_bytes, vtmp, hd_v);
        for (int64_t i = 0; i < hd_v; ++i) acc[i] += vtmp[i] * vs;
        S = S * ms + vs;
      }
      if (sinks) {  // a sink is one more logit with a zero value vector
        const float sk = sinks[h];
        if (sk > M) {
          const float ms = std::exp(M - sk);
          for (int64_t i = 0; i < hd_v; ++i) acc[i] *= ms;
          S = S * ms + 1.0f;
        } else {
          S += std::exp(sk - M);
        }
      }
      const float inv = S > 0.0f ? 1.0f / S : 0.0f;
      for (int64_t i = 0; i < hd_v; ++i) out[i] = acc[i] * inv;
      continue;
    }

    if (kt == DType::F32 && !sinks && !v_from_k) {
      attend_f32_reference_order(kbase + hk * k_head_bytes, krb, vbase + hk * v_head_bytes, vrb, qrow, hd_k, hd_v, n_kv,
                                 scale, T >= 2, hidden, scores, out);
      continue;
    }
    // Two-pass softmax over the visible cells.
    float mx = -INFINITY;
    for (int32_t c = 0; c < n_kv; ++c) {
      if (hidden(c)) { scores[c] = -INFINITY; continue; }
      float s;
      kk.vec_dot(static_cast<int>(hd_k), &s, kbase + c * krb + hk * k_head_bytes, qk);
      s *= scale;
      scores[c] = s;
      if (s > mx) mx = s;
    }
    if (sinks && sinks[h] > mx) mx = sinks[h];
    double sum = 0.0;
    for (int32_t c = 0; c < n_kv; ++c) {
      const float e = scores[c] == -INFINITY ? 0.0f : std::exp(scores[c] - mx);
      scores[c] = e;
      sum += e;
    }
    if (sinks) sum += static_cast<double>(std::exp(sinks[h] - mx));
    const float inv = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < hd_v; ++i) acc[i] = 0.0f;
    for (int32_t c = 0; c < n_kv; ++c) {
      float p = scores[c] * inv;
      if (p == 0.0f) continue;
      if (kt == DType::F16) {
        p = round_fp16(p);
        attn_axpy_f16(static_cast<int>(hd_v), acc, reinterpret_cast<const uint16_t *>(vbase + c * vrb + hk * v_head_bytes), p);
      } else {
        attn_axpy_f32(static_cast<int>(hd_v), acc, reinterpret_cast<const float *>(vbase + c * vrb + hk * v_head_bytes), p);
      }
    }
    for (int64_t i = 0; i < hd_v; ++i) out[i] = acc[i];
  }
}

}  // namespace moe
