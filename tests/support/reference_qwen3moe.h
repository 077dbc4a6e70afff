// A naive float64 forward pass of qwen3moe written straight from the architecture's
// definition (no graph, no planner, no kernels of ours besides the format dequantizers):
// the independent expectation the engine is checked against.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "quant/dtype.h"

namespace moe_ref {

using Vec = std::vector<double>;

struct Mat {  // rows x cols, row r = output r
  int64_t rows = 0, cols = 0;
  std::vector<double> w;
  const double *row(int64_t r) const { return w.data() + r * cols; }
};

inline Mat load(const moe::GgufFile &f, const std::string &name, int64_t expert = -1) {
  const moe::GgufTensorInfo *t = f.tensor(name);
  Mat m;
  m.cols = t->ne[0];
  m.rows = t->ne[1];
  const size_t rs = moe::row_size(t->type, t->ne[0]);
  const uint8_t *base = t->data + (expert >= 0 ? static_cast<size_t>(expert) * rs * static_cast<size_t>(m.rows) : 0);
  std::vector<float> tmp(static_cast<size_t>(m.cols));
  m.w.resize(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    moe::dequantize_row(t->type, base + r * rs, tmp.data(), m.cols);
    for (int64_t c = 0; c < m.cols; ++c) m.w[static_cast<size_t>(r * m.cols + c)] = tmp[static_cast<size_t>(c)];
  }
  return m;
}

inline Vec matvec(const Mat &m, const Vec &x) {
  Vec y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < m.cols; ++c) s += m.row(r)[c] * x[static_cast<size_t>(c)];
    y[static_cast<size_t>(r)] = s;
  }
  return y;
}

inline Vec rms_norm(const Vec &x, const Mat &w, double eps, size_t off = 0, size_t n = 0) {
  if (!n) n = x.size();
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double sc = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  Vec y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * sc * w.w[i];
  return y;
}

// NeoX rope on one head in place.
inline void rope_neox(double *h, int n_rot, int pos, double base) {
  for (int i = 0; i < n_rot / 2; ++i) {
    const double theta = pos * std::pow(base, -2.0 * i / n_rot);
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = h[i], x1 = h[i + n_rot / 2];
    h[i] = x0 * c - x1 * s;
    h[i + n_rot / 2] = x0 * s + x1 * c;
  }
}

// Logits of the last token after feeding `ids` at positions 0..n-1.
inline Vec qwen3moe_last_logits(const moe::GgufFile &f, const std::vector<int32_t> &ids) {
  const moe::Hparams h = moe::Hparams::from_gguf(f);
  const int64_t E = h.n_embd, hd = h.head_dim_k, nh = h.n_head, nkv = h.n_head_kv, T = static_cast<int64_t>(ids.size());
  const Mat emb = load(f, "token_embd.weight");
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) x[static_cast<size_t>(t)].assign(emb.row(ids[static_cast<size_t>(t)]), emb.row(ids[static_cast<size_t>(t)]) + E);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const Mat an = load(f, p + "attn_norm.weight"), wq = load(f, p + "attn_q.weight"), wk = load(f, p + "attn_k.weight"),
              wv = load(f, p + "attn_v.weight"), wo = load(f, p + "attn_output.weight"), qn = load(f, p + "attn_q_norm.weight"),
              kn = load(f, p + "attn_k_norm.weight"), fn = load(f, p + "ffn_norm.weight"), router = load(f, p + "ffn_gate_inp.weight");
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec xn = rms_norm(x[static_cast<size_t>(t)], an, h.rms_eps);
      q[static_cast<size_t>(t)] = matvec(wq, xn);
      k[static_cast<size_t>(t)] = matvec(wk, xn);
      v[static_cast<size_t>(t)] = matvec(wv, xn);
      for (int64_t hh = 0; hh < nh; ++hh) {
        Vec n = rms_norm(q[static_cast<size_t>(t)], qn, h.rms_eps, static_cast<size_t>(hh * hd), static_cast<size_t>(hd));
        std::copy(n.begin(), n.end(), q[static_cast<size_t>(t)].begin() + hh * hd);
        rope_neox(q[static_cast<size_t>(t)].data() + hh * hd, static_cast<int>(h.n_rot), static_cast<int>(t), h.rope_theta);
      }
      for (int64_t hh = 0; hh < nkv; ++hh) {
        Vec n = rms_norm(k[static_cast<size_t>(t)], kn, h.rms_eps, static_cast<size_t>(hh * hd), static_cast<size_t>(hd));
        std::copy(n.begin(), n.end(), k[static_cast<size_t>(t)].begin() + hh * hd);
        rope_neox(k[static_cast<size_t>(t)].data() + hh * hd, static_cast<int>(h.n_rot), static_cast<int>(t), h.rope_theta);
      }
    }
    std::vector<Vec> nx(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec att(static_cast<size_t>(nh * h.head_dim_v), 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t kh = hh / (nh / nkv);
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[static_cast<size_t>(t)][static_cast<size_t>(hh * hd + i)] * k[static_cast<size_t>(u)][static_cast<size_t>(kh * hd + i)];
          s[static_cast<size_t>(u)] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[static_cast<size_t>(u)]);
        }
        double sum = 0;
        for (auto &e : s) { e = std::exp(e - mx); sum += e; }
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < h.head_dim_v; ++i)
            att[static_cast<size_t>(hh * h.head_dim_v + i)] += s[static_cast<size_t>(u)] / sum * v[static_cast<size_t>(u)][static_cast<size_t>(kh * h.head_dim_v + i)];
      }
      Vec o = matvec(wo, att);
      Vec ffn_in(static_cast<size_t>(E));
      for (int64_t i = 0; i < E; ++i) ffn_in[static_cast<size_t>(i)] = o[static_cast<size_t>(i)] + x[static_cast<size_t>(t)][static_cast<size_t>(i)];
      Vec y = rms_norm(ffn_in, fn, h.rms_eps);
      Vec lg = matvec(router, y);
      double mx = *std::max_element(lg.begin(), lg.end()), sum = 0;
      Vec pr(lg.size());
      for (size_t i = 0; i < lg.size(); ++i) { pr[i] = std::exp(lg[i] - mx); sum += pr[i]; }
      for (auto &e : pr) e /= sum;
      std::vector<int> order(pr.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[static_cast<size_t>(a)] > pr[static_cast<size_t>(b)]; });
      double wsum = 0;
      for (uint32_t j = 0; j < h.n_expert_used; ++j) wsum += pr[static_cast<size_t>(order[j])];
      Vec out = ffn_in;
      for (uint32_t j = 0; j < h.n_expert_used; ++j) {
        const int e = order[j];
        const Mat g = load(f, p + "ffn_gate_exps.weight", e), u = load(f, p + "ffn_up_exps.weight", e), d = load(f, p + "ffn_down_exps.weight", e);
        Vec gv = matvec(g, y), uv = matvec(u, y);
        for (size_t i = 0; i < gv.size(); ++i) gv[i] = gv[i] / (1 + std::exp(-gv[i])) * uv[i];
        Vec dv = matvec(d, gv);
        const double wgt = pr[static_cast<size_t>(e)] / wsum;
        for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += wgt * dv[static_cast<size_t>(i)];
      }
      nx[static_cast<size_t>(t)] = out;
    }
    x = nx;
  }
  const Mat on = load(f, "output_norm.weight");
  Vec xn = rms_norm(x.back(), on, h.rms_eps);
  const Mat head = f.tensor("output.weight") ? load(f, "output.weight") : emb;
  return matvec(head, xn);
}

}  // namespace moe_ref
