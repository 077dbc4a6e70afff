// A naive float64 forward pass of gpt-oss written from the architecture's definition
// (HF modeling_gpt_oss semantics): biased GQA attention with per-head sinks and alternating
// sliding windows, NeoX RoPE with YaRN (cos/sin scaled by 0.1 ln(factor) + 1), biased
// router -> top-k -> softmax over the chosen, SwiGLU-OAI experts with biases. Only the
// format dequantizers are shared with the engine.
#pragma once
#include "backends/cpu/kernels/f16_halfsum_dot.h"
#include "core/fp16.h"
#include "support/reference_qwen3moe.h"

namespace moe_ref {

// YaRN NeoX rope (ggml's ramp between the beta_fast / beta_slow correction dims) on one head.
inline void rope_neox_yarn(double *x, int n_rot, int pos, double base, double factor, int n_ctx_orig, double mscale) {
  auto corr_dim = [&](double n_rot_beta) { return n_rot * std::log(n_ctx_orig / (n_rot_beta * 2 * M_PI)) / (2 * std::log(base)); };
  const double low = std::max(0.0, std::floor(corr_dim(32.0))), high = std::min(n_rot - 1.0, std::ceil(corr_dim(1.0)));
  for (int i = 0; i < n_rot / 2; ++i) {
    const double extrap = pos * std::pow(base, -2.0 * i / n_rot), interp = extrap / factor;
    const double y = (i - low) / std::max(0.001, high - low);
    const double ramp = 1.0 - std::min(1.0, std::max(0.0, y));
    const double th = interp * (1 - ramp) + extrap * ramp;
    const double c = std::cos(th) * mscale, s = std::sin(th) * mscale;
    const double x0 = x[i], x1 = x[i + n_rot / 2];
    x[i] = x0 * c - x1 * s;
    x[i + n_rot / 2] = x0 * s + x1 * c;
  }
}

// Optionally round the activation the way the reference engine feeds each weight type:
// F16 weights see F16-rounded activations, Q8_0/MXFP4 weights see Q8_0 blocks.
inline Vec act_for(const moe::GgufFile &f, const std::string &weight, const Vec &x, bool emulate) {
  if (!emulate) return x;
  const moe::DType t = f.tensor(weight)->type;
  std::vector<float> xf(x.begin(), x.end()), back(x.size());
  if (t == moe::DType::F16) {
    for (size_t i = 0; i < x.size(); ++i) back[i] = moe::fp16_to_fp32(moe::fp32_to_fp16(xf[i]));
  } else if (t == moe::DType::Q8_0 || t == moe::DType::MXFP4) {
    std::vector<uint8_t> q(moe::row_size(moe::DType::Q8_0, static_cast<int64_t>(x.size())));
    moe::quantize_row(moe::DType::Q8_0, xf.data(), q.data(), static_cast<int64_t>(x.size()));
    moe::dequantize_row(moe::DType::Q8_0, q.data(), back.data(), static_cast<int64_t>(x.size()));
  } else {
    back = xf;
  }
  return Vec(back.begin(), back.end());
}

inline Vec add_bias(Vec v, const Mat &b, int64_t row = 0) {
  for (size_t i = 0; i < v.size(); ++i) v[i] += b.row(row)[i];
  return v;
}

// Logits of the last token after feeding `ids` at positions 0..n-1.
// emulate_act: round activations per weight type as the reference engine does (see act_for).
// first_single: positions >= it were decoded one token at a time; with emulate_act their F16
// attn_output product uses the reference engine's half-precision sum (single-token products
// with k >= 128 take it there, see kernels/f16_halfsum_dot.h). -1: whole prompt batched.
inline Vec gpt_oss_last_logits(const moe::GgufFile &f, const std::vector<int32_t> &ids, bool emulate_act = false,
                               int64_t first_single = -1) {
  const moe::Hparams h = moe::Hparams::from_gguf(f);
  const int64_t E = h.n_embd, hd = h.head_dim_k, nh = h.n_head, nkv = h.n_head_kv, T = static_cast<int64_t>(ids.size());
  const int64_t window = h.sliding_window;
  const double factor = h.rope_scaling == moe::RopeScaling::Yarn ? h.rope_scale_factor : 1.0;
  const double mscale = factor > 1.0 ? 0.1 * std::log(factor) + 1.0 : 1.0;
  const Mat emb = load(f, "token_embd.weight");
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) x[static_cast<size_t>(t)].assign(emb.row(ids[static_cast<size_t>(t)]), emb.row(ids[static_cast<size_t>(t)]) + E);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const bool swa = window > 0 && il % 2 == 0;
    const Mat an = load(f, p + "attn_norm.weight"), pn = load(f, p + "post_attention_norm.weight");
    const Mat wq = load(f, p + "attn_q.weight"), bq = load(f, p + "attn_q.bias"), wk = load(f, p + "attn_k.weight"),
              bk = load(f, p + "attn_k.bias"), wv = load(f, p + "attn_v.weight"), bv = load(f, p + "attn_v.bias"),
              wo = load(f, p + "attn_output.weight"), bo = load(f, p + "attn_output.bias"), sinks = load(f, p + "attn_sinks.weight");
    const Mat router = load(f, p + "ffn_gate_inp.weight"), rb = load(f, p + "ffn_gate_inp.bias");
    const Mat gb = load(f, p + "ffn_gate_exps.bias"), ub = load(f, p + "ffn_up_exps.bias"), db = load(f, p + "ffn_down_exps.bias");
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec xn = rms_norm(x[static_cast<size_t>(t)], an, h.rms_eps);
      const Vec xa = act_for(f, p + "attn_q.weight", xn, emulate_act);
      q[static_cast<size_t>(t)] = add_bias(matvec(wq, xa), bq);
      k[static_cast<size_t>(t)] = add_bias(matvec(wk, xa), bk);
      v[static_cast<size_t>(t)] = add_bias(matvec(wv, xa), bv);
      for (int64_t hh = 0; hh < nh; ++hh)
        rope_neox_yarn(q[static_cast<size_t>(t)].data() + hh * hd, static_cast<int>(h.n_rot), static_cast<int>(t), h.rope_theta, factor,
                       static_cast<int>(h.rope_orig_ctx), mscale);
      for (int64_t hh = 0; hh < nkv; ++hh)
        rope_neox_yarn(k[static_cast<size_t>(t)].data() + hh * hd, static_cast<int>(h.n_rot), static_cast<int>(t), h.rope_theta, factor,
                       static_cast<int>(h.rope_orig_ctx), mscale);
    }
    std::vector<Vec> nx(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec att(static_cast<size_t>(nh * hd), 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t kh = hh / (nh / nkv);
        std::vector<double> s;
        std::vector<int64_t> us;
        double mx = sinks.w[static_cast<size_t>(hh)];
        for (int64_t u = 0; u <= t; ++u) {
          if (swa && t - u >= window) continue;
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[static_cast<size_t>(t)][static_cast<size_t>(hh * hd + i)] * k[static_cast<size_t>(u)][static_cast<size_t>(kh * hd + i)];
          s.push_back(d / std::sqrt(static_cast<double>(h.n_rot)));
          us.push_back(u);
          mx = std::max(mx, s.back());
        }
        double sum = std::exp(sinks.w[static_cast<size_t>(hh)] - mx);
        for (auto &e : s) { e = std::exp(e - mx); sum += e; }
        for (size_t n = 0; n < us.size(); ++n)
          for (int64_t i = 0; i < hd; ++i)
            att[static_cast<size_t>(hh * hd + i)] += s[n] / sum * v[static_cast<size_t>(us[n])][static_cast<size_t>(kh * hd + i)];
      }
      Vec o;
      const bool halfsum = emulate_act && first_single >= 0 && t >= first_single &&
                           f.tensor(p + "attn_output.weight")->type == moe::DType::F16 && wo.cols >= 128;
      if (halfsum) {
        const Vec xa = act_for(f, p + "attn_output.weight", att, emulate_act);
        std::vector<uint16_t> xh(xa.size()), wr(static_cast<size_t>(wo.cols));
        for (size_t i = 0; i < xa.size(); ++i) xh[i] = moe::fp32_to_fp16(static_cast<float>(xa[i]));
        o.assign(static_cast<size_t>(wo.rows), 0.0);
        for (int64_t r = 0; r < wo.rows; ++r) {
          for (int64_t c = 0; c < wo.cols; ++c) wr[static_cast<size_t>(c)] = moe::fp32_to_fp16(static_cast<float>(wo.row(r)[c]));
          o[static_cast<size_t>(r)] = moe::f16_halfsum_dot(static_cast<int>(wo.cols), wr.data(), xh.data());
        }
        o = add_bias(o, bo);
      } else {
        o = add_bias(matvec(wo, act_for(f, p + "attn_output.weight", att, emulate_act)), bo);
      }
      Vec ffn_in(static_cast<size_t>(E));
      for (int64_t i = 0; i < E; ++i) ffn_in[static_cast<size_t>(i)] = o[static_cast<size_t>(i)] + x[static_cast<size_t>(t)][static_cast<size_t>(i)];
      Vec y = rms_norm(ffn_in, pn, h.rms_eps);
      Vec lg = add_bias(matvec(router, y), rb);
      std::vector<int> order(lg.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[static_cast<size_t>(a)] > lg[static_cast<size_t>(b)]; });
      const double mxl = lg[static_cast<size_t>(order[0])];
      double wsum = 0;
      for (uint32_t j = 0; j < h.n_expert_used; ++j) wsum += std::exp(lg[static_cast<size_t>(order[j])] - mxl);
      Vec out = ffn_in;
      for (uint32_t j = 0; j < h.n_expert_used; ++j) {
        const int e = order[j];
        const Mat g = load(f, p + "ffn_gate_exps.weight", e), u = load(f, p + "ffn_up_exps.weight", e), d = load(f, p + "ffn_down_exps.weight", e);
        const Vec ya = act_for(f, p + "ffn_gate_exps.weight", y, emulate_act);
        Vec gv = add_bias(matvec(g, ya), gb, e), uv = add_bias(matvec(u, ya), ub, e);
        for (size_t i = 0; i < gv.size(); ++i) {
          const double xg = std::min(gv[i], 7.0), xu = std::max(-7.0, std::min(uv[i], 7.0));
          gv[i] = xg / (1 + std::exp(-1.702 * xg)) * (xu + 1.0);
        }
        Vec dv = add_bias(matvec(d, act_for(f, p + "ffn_down_exps.weight", gv, emulate_act)), db, e);
        const double wgt = std::exp(lg[static_cast<size_t>(e)] - mxl) / wsum;
        for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += wgt * dv[static_cast<size_t>(i)];
      }
      nx[static_cast<size_t>(t)] = out;
    }
    x = nx;
  }
  const Mat on = load(f, "output_norm.weight");
  Vec xn = rms_norm(x.back(), on, h.rms_eps);
  const std::string head_name = f.tensor("output.weight") ? "output.weight" : "token_embd.weight";
  return matvec(load(f, head_name), act_for(f, head_name, xn, emulate_act));
}

}  // namespace moe_ref
