// qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): GQA attention with per-head q/k RMSNorm
// and NeoX RoPE; MoE FFN with softmax router -> top-k -> (optional) renormalisation,
// SwiGLU experts; tied or untied LM head.
#include <cmath>

#include "model/arch/arch.h"
#include "model/arch/blocks.h"

namespace moe {

static void qwen3moe_validate(const Model::Impl &m) {
  const Hparams &h = m.hp;
  const int64_t E = h.n_embd, hq = h.head_dim_k * h.n_head, hk = h.head_dim_k * h.n_head_kv,
                hv = h.head_dim_v * h.n_head_kv;
  if (!h.n_expert || !h.n_ff_exp) fail(Status::InvalidModel, "qwen3moe: expert_count and expert_feed_forward_length are required");
  require_embedding_and_head(m);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    m.require(p + "attn_norm.weight", {E});
    m.require(p + "attn_q.weight", {E, hq});
    m.require(p + "attn_k.weight", {E, hk});
    m.require(p + "attn_v.weight", {E, hv});
    m.require(p + "attn_output.weight", {h.head_dim_v * h.n_head, E});
    m.require(p + "attn_q_norm.weight", {h.head_dim_k});
    m.require(p + "attn_k_norm.weight", {h.head_dim_k});
    m.require(p + "ffn_norm.weight", {E});
    m.require(p + "ffn_gate_inp.weight", {E, h.n_expert});
    m.require(p + "ffn_gate_exps.weight", {E, h.n_ff_exp, h.n_expert});
    m.require(p + "ffn_up_exps.weight", {E, h.n_ff_exp, h.n_expert});
    m.require(p + "ffn_down_exps.weight", {h.n_ff_exp, E, h.n_expert});
  }
}

static std::vector<KvLayerDims> qwen3moe_kv_layout(const Hparams &h) {
  return std::vector<KvLayerDims>(h.n_layer, KvLayerDims{static_cast<int64_t>(h.head_dim_k) * h.n_head_kv,
                                                          static_cast<int64_t>(h.head_dim_v) * h.n_head_kv});
}

static void qwen3moe_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g) {
  const Hparams &h = m.hp;
  const int64_t T = p.n_tokens;
  BlockInputs in = make_block_inputs(g, p);
  int cur_in = g.get_rows(g.weight(m.find("token_embd.weight")), in.tokens);

  RopeParams rope = rope_params_from(h, static_cast<int>(h.n_rot), /*neox=*/true);
  // Qwen3-MoE renormalises the top-k router weights (norm_topk_prob); files rarely say so.
  const bool norm_weights = m.gguf->get_bool("qwen3moe.expert_weights_norm", true);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    g.set_segment(static_cast<int>(il) + 1);
    const std::string pf = "blk." + std::to_string(il) + ".";
    auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
    int x = g.mul(g.rms_norm(cur_in, h.rms_eps), W("attn_norm.weight"));

    int q = g.matmul(W("attn_q.weight"), x);
    int k = g.matmul(W("attn_k.weight"), x);
    int v = g.matmul(W("attn_v.weight"), x);
    q = g.view(q, {h.head_dim_k, h.n_head, T});
    k = g.view(k, {h.head_dim_k, h.n_head_kv, T});
    v = g.view(v, {h.head_dim_v, h.n_head_kv, T});
    q = g.mul(g.rms_norm(q, h.rms_eps), W("attn_q_norm.weight"));
    k = g.mul(g.rms_norm(k, h.rms_eps), W("attn_k_norm.weight"));
    q = g.rope(q, in.pos, rope);
    k = g.rope(k, in.pos, rope);
    int attn = attention_block(g, q, k, v, static_cast<int>(il), h.head_dim_v, 1.0f / std::sqrt(static_cast<float>(h.head_dim_k)), p);
    int o = g.matmul(W("attn_output.weight"), g.view(attn, {h.head_dim_v * h.n_head, T}));

    // Last layer: only the rows whose logits were asked for go through the FFN.
    if (il + 1 == h.n_layer) {
      o = g.get_rows(o, in.out_ids);
      cur_in = g.get_rows(cur_in, in.out_ids);
    }
    int ffn_in = g.add(o, cur_in);
    int y = g.mul(g.rms_norm(ffn_in, h.rms_eps), W("ffn_norm.weight"));

    MoeWeights mw{W("ffn_gate_inp.weight"), W("ffn_gate_exps.weight"), W("ffn_up_exps.weight"), W("ffn_down_exps.weight")};
    int moe = moe_ffn_softmax(g, y, mw, static_cast<int>(h.n_expert_used), norm_weights);
    cur_in = g.add(moe, ffn_in);
  }
  lm_head(g, m, cur_in);
}

const ArchSpec kArchQwen3Moe = {"qwen3moe", qwen3moe_validate, qwen3moe_kv_layout, qwen3moe_build};

}  // namespace moe
