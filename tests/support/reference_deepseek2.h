// A naive float64 forward pass of deepseek2 (DeepSeek-V3 semantics as in HF
// modeling_deepseek): MLA, leading dense blocks, sigmoid/softmax routing with a
// selection-only bias and grouped selection, renormalised + scaled weights, shared experts,
// YaRN (cos/sin scaled by mscale/mscale_all_dim, softmax scale by mscale_all_dim^2).
// Without activation rounding it uses the decompressed MHA form (k_nope = W_kb c,
// v = W_vb c), an independent check of the engine's absorbed form; with it, the absorbed
// form with the reference engine's roundings (see act_for).
#pragma once
#include "support/reference_gpt_oss.h"

namespace moe_ref {

// GPT-J ("normal") pairing (2i, 2i+1) with the same YaRN ramp as rope_neox_yarn.
inline void rope_norm_yarn(double *x, int n_rot, int pos, double base, double factor, int n_ctx_orig, double mscale) {
  auto corr_dim = [&](double n_rot_beta) { return n_rot * std::log(n_ctx_orig / (n_rot_beta * 2 * M_PI)) / (2 * std::log(base)); };
  const double low = std::max(0.0, std::floor(corr_dim(32.0))), high = std::min(n_rot - 1.0, std::ceil(corr_dim(1.0)));
  for (int i = 0; i < n_rot / 2; ++i) {
    const double extrap = pos * std::pow(base, -2.0 * i / n_rot), interp = extrap / factor;
    const double ramp = 1.0 - std::min(1.0, std::max(0.0, (i - low) / std::max(0.001, high - low)));
    const double th = factor > 1.0 ? interp * (1 - ramp) + extrap * ramp : extrap;
    const double c = std::cos(th) * mscale, s = std::sin(th) * mscale;
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

inline Vec deepseek2_last_logits(const moe::GgufFile &f, const std::vector<int32_t> &ids, bool emulate_act = false) {
  const moe::Hparams h = moe::Hparams::from_gguf(f);
  const int64_t E = h.n_embd, H = h.n_head, T = static_cast<int64_t>(ids.size());
  const int64_t hdk = h.head_dim_k_mla ? h.head_dim_k_mla : h.head_dim_k, hdv = h.head_dim_v_mla ? h.head_dim_v_mla : h.head_dim_v;
  const int64_t P = h.n_rot, N = hdk - P, R = h.kv_lora_rank;
  const double factor = h.rope_scaling == moe::RopeScaling::Yarn ? h.rope_scale_factor : 1.0;
  const double mscale_all_dim = h.yarn_log_mul / 0.1;  // the GGUF stores 0.1 * mscale_all_dim
  auto get_mscale = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  const double rope_mscale = get_mscale(1.0) / get_mscale(mscale_all_dim);  // HF: mscale (1) / mscale_all_dim
  const double kq_scale = get_mscale(mscale_all_dim) * get_mscale(mscale_all_dim) / std::sqrt(static_cast<double>(hdk));
  auto mv = [&](const std::string &w, const Vec &x) { return matvec(load(f, w), act_for(f, w, x, emulate_act)); };
  auto swiglu_ffn = [&](const std::string &p, const char *g, const char *u, const char *d, const Vec &y, int64_t e) {
    const Vec ya = act_for(f, p + g, y, emulate_act);
    Vec gv = matvec(load(f, p + g, e), ya), uv = matvec(load(f, p + u, e), ya);
    for (size_t i = 0; i < gv.size(); ++i) gv[i] = gv[i] / (1 + std::exp(-gv[i])) * uv[i];
    return matvec(load(f, p + d, e), act_for(f, p + d, gv, emulate_act));
  };
  const Mat emb = load(f, "token_embd.weight");
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) x[static_cast<size_t>(t)].assign(emb.row(ids[static_cast<size_t>(t)]), emb.row(ids[static_cast<size_t>(t)]) + E);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const Mat an = load(f, p + "attn_norm.weight"), kvn = load(f, p + "attn_kv_a_norm.weight"), fn = load(f, p + "ffn_norm.weight");
    std::vector<Mat> kb(static_cast<size_t>(H)), vb(static_cast<size_t>(H));  // per head: kb {R rows x N}, vb {hdv rows x R}
    for (int64_t hh = 0; hh < H; ++hh) { kb[static_cast<size_t>(hh)] = load(f, p + "attn_k_b.weight", hh); vb[static_cast<size_t>(hh)] = load(f, p + "attn_v_b.weight", hh); }
    std::vector<Vec> q(static_cast<size_t>(T)), c(static_cast<size_t>(T)), kpe(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec xn = rms_norm(x[static_cast<size_t>(t)], an, h.rms_eps);
      if (h.q_lora_rank) q[static_cast<size_t>(t)] = mv(p + "attn_q_b.weight", rms_norm(mv(p + "attn_q_a.weight", xn), load(f, p + "attn_q_a_norm.weight"), h.rms_eps));
      else q[static_cast<size_t>(t)] = mv(p + "attn_q.weight", xn);
      Vec kv = mv(p + "attn_kv_a_mqa.weight", xn);
      c[static_cast<size_t>(t)] = rms_norm(kv, kvn, h.rms_eps, 0, static_cast<size_t>(R));
      kpe[static_cast<size_t>(t)].assign(kv.begin() + R, kv.begin() + R + P);
      rope_norm_yarn(kpe[static_cast<size_t>(t)].data(), static_cast<int>(P), static_cast<int>(t), h.rope_theta, factor, static_cast<int>(h.rope_orig_ctx), rope_mscale);
      for (int64_t hh = 0; hh < H; ++hh)
        rope_norm_yarn(q[static_cast<size_t>(t)].data() + hh * hdk + N, static_cast<int>(P), static_cast<int>(t), h.rope_theta, factor, static_cast<int>(h.rope_orig_ctx), rope_mscale);
    }
    std::vector<Vec> nx(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec att(static_cast<size_t>(H * hdv), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const Mat &KB = kb[static_cast<size_t>(hh)], &VB = vb[static_cast<size_t>(hh)];
        const double *qh = q[static_cast<size_t>(t)].data() + hh * hdk;
        Vec qn(qh, qh + N);
        Vec qabs;  // absorbed form: W_kb^T q_nope, one R-vector per head
        if (emulate_act) qabs = matvec(KB, act_for(f, p + "attn_k_b.weight", qn, true));
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          if (emulate_act) {
            for (int64_t r = 0; r < R; ++r) d += qabs[static_cast<size_t>(r)] * c[static_cast<size_t>(u)][static_cast<size_t>(r)];
          } else {  // decompressed: k_nope[n] = sum_r KB[r][n] c[r]
            for (int64_t n = 0; n < N; ++n) {
              double kn = 0;
              for (int64_t r = 0; r < R; ++r) kn += KB.row(r)[n] * c[static_cast<size_t>(u)][static_cast<size_t>(r)];
              d += qn[static_cast<size_t>(n)] * kn;
            }
          }
          for (int64_t i = 0; i < P; ++i) d += qh[N + i] * kpe[static_cast<size_t>(u)][static_cast<size_t>(i)];
          s[static_cast<size_t>(u)] = d * kq_scale;
          mx = std::max(mx, s[static_cast<size_t>(u)]);
        }
        double sum = 0;
        for (auto &e : s) { e = std::exp(e - mx); sum += e; }
        Vec lat(static_cast<size_t>(R), 0.0);  // attention-weighted latent
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t r = 0; r < R; ++r) lat[static_cast<size_t>(r)] += s[static_cast<size_t>(u)] / sum * c[static_cast<size_t>(u)][static_cast<size_t>(r)];
        Vec oh = matvec(VB, act_for(f, p + "attn_v_b.weight", lat, emulate_act));
        for (int64_t i = 0; i < hdv; ++i) att[static_cast<size_t>(hh * hdv + i)] = oh[static_cast<size_t>(i)];
      }
      Vec o = mv(p + "attn_output.weight", att);
      Vec ffn_in(static_cast<size_t>(E));
      for (int64_t i = 0; i < E; ++i) ffn_in[static_cast<size_t>(i)] = o[static_cast<size_t>(i)] + x[static_cast<size_t>(t)][static_cast<size_t>(i)];
      Vec y = rms_norm(ffn_in, fn, h.rms_eps);
      Vec out = ffn_in;
      if (il < h.n_leading_dense) {
        Vec d = swiglu_ffn(p, "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", y, -1);
        for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
      } else {
        Vec lg = mv(p + "ffn_gate_inp.weight", y), pr(lg.size());
        if (h.gating == moe::ExpertGating::Sigmoid) {
          for (size_t i = 0; i < lg.size(); ++i) pr[i] = 1.0 / (1.0 + std::exp(-lg[i]));
        } else {
          const double mxl = *std::max_element(lg.begin(), lg.end());
          double sum = 0;
          for (size_t i = 0; i < lg.size(); ++i) { pr[i] = std::exp(lg[i] - mxl); sum += pr[i]; }
          for (auto &e : pr) e /= sum;
        }
        Vec sel = pr;
        if (f.tensor(p + "exp_probs_b.bias")) {
          const Mat b = load(f, p + "exp_probs_b.bias");
          for (size_t i = 0; i < sel.size(); ++i) sel[i] += b.w[i];
        }
        // groups by the sum of their two best scores, then the best experts of the kept groups
        const int64_t G = h.n_expert_groups > 1 ? h.n_expert_groups : 1, per = static_cast<int64_t>(sel.size()) / G;
        std::vector<double> gs(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) {
          Vec v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
          std::sort(v.begin(), v.end(), std::greater<double>());
          gs[static_cast<size_t>(g)] = per >= 2 ? v[0] + v[1] : v[0];
        }
        std::vector<int> go(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) go[static_cast<size_t>(g)] = static_cast<int>(g);
        std::stable_sort(go.begin(), go.end(), [&](int a, int b2) { return gs[static_cast<size_t>(a)] > gs[static_cast<size_t>(b2)]; });
        const int64_t g_used = G > 1 ? h.n_group_used : 1;
        std::vector<int> cand;
        for (int e = 0; e < static_cast<int>(sel.size()); ++e)
          for (int64_t j = 0; j < g_used; ++j)
            if (e / per == go[static_cast<size_t>(j)]) cand.push_back(e);
        std::stable_sort(cand.begin(), cand.end(), [&](int a, int b2) { return sel[static_cast<size_t>(a)] > sel[static_cast<size_t>(b2)]; });
        double wsum = 0;
        for (uint32_t j = 0; j < h.n_expert_used; ++j) wsum += pr[static_cast<size_t>(cand[j])];
        for (uint32_t j = 0; j < h.n_expert_used; ++j) {
          const int e = cand[j];
          const double w = (h.expert_weights_norm ? pr[static_cast<size_t>(e)] / wsum : pr[static_cast<size_t>(e)]) * h.expert_weights_scale;
          Vec d = swiglu_ffn(p, "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", y, e);
          for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += w * d[static_cast<size_t>(i)];
        }
        if (h.n_expert_shared) {
          Vec d = swiglu_ffn(p, "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight", y, -1);
          for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
        }
      }
      nx[static_cast<size_t>(t)] = out;
    }
    x = nx;
  }
  const Vec xn = rms_norm(x.back(), load(f, "output_norm.weight"), h.rms_eps);
  const std::string head_name = f.tensor("output.weight") ? "output.weight" : "token_embd.weight";
  return matvec(load(f, head_name), act_for(f, head_name, xn, emulate_act));
}

}  // namespace moe_ref
