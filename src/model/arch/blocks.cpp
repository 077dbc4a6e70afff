#include "model/arch/blocks.h"

#include <cmath>

namespace moe {

BlockInputs make_block_inputs(Graph &g, const GraphBuildParams &p) {
  BlockInputs in;
  in.tokens = g.input("tokens", DType::I32, {p.n_tokens});
  in.pos = g.input("pos", DType::I32, {p.n_tokens});
  in.out_ids = g.input("out_ids", DType::I32, {p.n_outputs});
  return in;
}

RopeParams rope_params_from(const Hparams &h, int n_rot, bool neox) {
  RopeParams r;
  r.n_rot = n_rot;
  r.neox = neox;
  r.freq_base = h.rope_theta;
  r.n_ctx_orig = static_cast<int>(h.rope_orig_ctx ? h.rope_orig_ctx : h.n_ctx_train);
  r.beta_fast = h.yarn_beta_fast;
  r.beta_slow = h.yarn_beta_slow;
  r.attn_factor = h.yarn_attn_factor;
  if (h.rope_scaling != RopeScaling::None) r.freq_scale = 1.0f / h.rope_scale_factor;
  r.ext_factor = h.yarn_ext_factor >= 0.0f ? h.yarn_ext_factor : (h.rope_scaling == RopeScaling::Yarn ? 1.0f : 0.0f);
  return r;
}

void lm_head(Graph &g, const Model::Impl &m, int x) {
  const Hparams &h = m.hp;
  g.set_segment(static_cast<int>(h.n_layer) + 1);
  int out = g.mul(g.rms_norm(x, h.rms_eps), g.weight(m.find("output_norm.weight")));
  const GgufTensorInfo *head = h.tied_output ? m.find("token_embd.weight") : m.find("output.weight");
  g.mark_output(g.matmul(g.weight(head), out), "logits");
}

void require_embedding_and_head(const Model::Impl &m) {
  const int64_t E = m.hp.n_embd, V = m.hp.n_vocab;
  m.require("token_embd.weight", {E, V});
  m.require("output_norm.weight", {E});
  if (!m.hp.tied_output) m.require("output.weight", {E, V});
}

int attention_block(Graph &g, int q, int k, int v, int layer, int64_t head_dim_v, float scale, const GraphBuildParams &p) {
  int ks = g.kv_store(k, layer, 0);
  int vs = g.kv_store(v, layer, 1);
  int a = g.attention(q, ks, vs, head_dim_v, scale);
  set_attention_cache(g, a, p);
  return a;
}

void set_attention_cache(Graph &g, int attention, const GraphBuildParams &p) {
  Node &n = g.node(attention);
  n.ip[1] = static_cast<int32_t>(p.n_cells);
  n.kv_type = kv_dtype(p.kv_type);
}

namespace {
int expert_products(Graph &g, int x3, const MoeWeights &w, int ids, int weights, bool direct) {
  const size_t first = g.nodes().size();
  int up = g.matmul_id(w.up, x3, ids);
  int gate = g.matmul_id(w.gate, x3, ids);
  int act = g.swiglu(gate, up);
  int down = g.matmul_id(w.down, act, ids);
  if (direct)
    for (size_t i = first; i < g.nodes().size(); ++i)
      if (g.nodes()[i].op == Op::MatMulId) g.nodes()[i].direct_read = true;
  return g.moe_combine(down, weights);
}
}  // namespace

int moe_experts(Graph &g, int x, const MoeWeights &w, int ids, int weights) {
  const int64_t E = g.node(x).ne[0], T = g.node(x).ne[1];
  int x3 = g.view(x, {E, 1, T});
  const int64_t n_used = g.node(ids).ne[0];
  const int64_t s = g.moe_direct_slots();
  if (T != 1 || s <= 0 || s >= n_used) return expert_products(g, x3, w, ids, weights, false);
  // One token: slots [0, s) on the GPU (built first, so it is launched before the host
  // waits for the CPU's inputs), slots [s, n_used) on the host; ids and weights are
  // contiguous [n_used] columns, so each part is a plain view.
  const int ids_gpu = g.view(ids, {s, 1}), ids_host = g.view(ids, {n_used - s, 1}, static_cast<size_t>(s) * 4);
  const int w_gpu = g.view(weights, {s, 1}), w_host = g.view(weights, {n_used - s, 1}, static_cast<size_t>(s) * 4);
  const int on_gpu = expert_products(g, x3, w, ids_gpu, w_gpu, true);
  const int on_host = expert_products(g, x3, w, ids_host, w_host, false);
  return g.add(on_gpu, on_host);
}

int moe_ffn_softmax(Graph &g, int x, const MoeWeights &w, int n_used, bool norm_weights) {
  int logits = g.matmul(w.router, x);
  int probs = g.softmax(logits);
  int ids = g.top_k(probs, n_used);
  int weights = g.gather_cols(probs, ids);
  if (norm_weights) weights = g.norm_sum(weights);
  return moe_experts(g, x, w, ids, weights);
}

int ffn_swiglu(Graph &g, int x, int gate, int up, int down) {
  int u = g.matmul(up, x);
  int gt = g.matmul(gate, x);
  return g.matmul(down, g.swiglu(gt, u));
}

int moe_ffn_routed(Graph &g, int x, const MoeWeights &w, int n_used, const MoeRouting &r) {
  int logits = g.matmul(w.router, x);
  int probs = r.gating == ExpertGating::Sigmoid ? g.sigmoid(logits) : g.softmax(logits);
  int sel = r.selection_bias >= 0 ? g.add(probs, r.selection_bias) : probs;
  int ids = r.n_groups > 1 ? g.grouped_top_k(sel, n_used, r.n_groups, r.n_groups_used) : g.top_k(sel, n_used);
  int weights = g.gather_cols(probs, ids);  // unbiased scores
  if (r.norm_weights) weights = g.norm_sum(weights);
  if (r.weights_scale != 0.0f && r.weights_scale != 1.0f) weights = g.scale(weights, r.weights_scale);
  return moe_experts(g, x, w, ids, weights);
}

float yarn_rope_attn_factor(const Hparams &h, float log_mul, bool deepseek2) {
  float f = h.yarn_attn_factor;
  const float ext = h.yarn_ext_factor >= 0.0f ? h.yarn_ext_factor : (h.rope_scaling == RopeScaling::Yarn ? 1.0f : 0.0f);
  if (ext != 0.0f && h.rope_scaling != RopeScaling::None) {
    const float factor = h.rope_scale_factor;
    auto get_mscale = [](float s, float m) { return s <= 1.0f ? 1.0f : 0.1f * m * std::log(s) + 1.0f; };
    if (log_mul != 0.0f) {
      const float mscale = deepseek2 && log_mul != 1.0f ? log_mul : 1.0f;
      f = get_mscale(factor, mscale) / get_mscale(factor, log_mul);
    } else {
      f = get_mscale(factor, 1.0f);
    }
    f *= 1.0f / (1.0f + 0.1f * std::log(factor));  // the RoPE kernel multiplies this back in
  }
  return f;
}

}  // namespace moe
