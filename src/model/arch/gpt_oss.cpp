// gpt-oss (general.architecture "gpt-oss", OpenAI's MoE): GQA attention with biases on
// q/k/v/o, learned per-head attention sinks, sliding-window attention on every other block
// (blocks 0, 2, ... by default), NeoX RoPE with YaRN; MoE with a biased router, top-k of
// the raw logits then softmax over the chosen, experts with biases and the clamped
// "SwiGLU-OAI" activation (alpha 1.702, limit 7); weights usually MXFP4.
#include <cmath>

#include "gguf/gguf_reader.h"
#include "model/arch/arch.h"
#include "model/arch/blocks.h"

namespace moe {

namespace {

constexpr float kSwigluAlpha = 1.702f;
constexpr float kSwigluLimit = 7.0f;

// Sliding-window layers: attention.sliding_window_pattern (period, default 2) marks layer
// il as windowed when il % period < period - 1, as the reference does.
bool is_swa_layer(const Model::Impl &m, uint32_t il) {
  const uint32_t period = m.gguf->get_u32("gpt-oss.attention.sliding_window_pattern", 2);
  if (m.hp.sliding_window == 0) return false;
  return period == 0 || il % period < period - 1;
}

}  // namespace

static void gpt_oss_validate(const Model::Impl &m) {
  const Hparams &h = m.hp;
  const int64_t E = h.n_embd, hd = h.head_dim_k, hq = hd * h.n_head, hk = hd * h.n_head_kv,
                hv = static_cast<int64_t>(h.head_dim_v) * h.n_head_kv, X = h.n_expert, F = h.n_ff_exp;
  if (!h.n_expert || !h.n_ff_exp) fail(Status::InvalidModel, "gpt-oss: expert_count and expert_feed_forward_length are required");
  if (h.head_dim_k != h.head_dim_v) fail(Status::InvalidModel, "gpt-oss: key_length %u and value_length %u differ", h.head_dim_k, h.head_dim_v);
  require_embedding_and_head(m);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    m.require(p + "attn_norm.weight", {E});
    m.require(p + "post_attention_norm.weight", {E});
    m.require(p + "attn_q.weight", {E, hq});
    m.require(p + "attn_q.bias", {hq});
    m.require(p + "attn_k.weight", {E, hk});
    m.require(p + "attn_k.bias", {hk});
    m.require(p + "attn_v.weight", {E, hv});
    m.require(p + "attn_v.bias", {hv});
    m.require(p + "attn_output.weight", {hd * h.n_head, E});
    m.require(p + "attn_output.bias", {E});
    m.require(p + "attn_sinks.weight", {static_cast<int64_t>(h.n_head)});
    m.require(p + "ffn_gate_inp.weight", {E, X});
    m.require(p + "ffn_gate_inp.bias", {X});
    m.require(p + "ffn_gate_exps.weight", {E, F, X});
    m.require(p + "ffn_gate_exps.bias", {F, X});
    m.require(p + "ffn_up_exps.weight", {E, F, X});
    m.require(p + "ffn_up_exps.bias", {F, X});
    m.require(p + "ffn_down_exps.weight", {F, E, X});
    m.require(p + "ffn_down_exps.bias", {E, X});
    for (const char *b : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_sinks.weight", "ffn_gate_inp.bias",
                          "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"})
      if (m.find(p + b)->type != DType::F32) fail(Status::InvalidModel, "gpt-oss: tensor '%s%s' must be f32", p.c_str(), b);
  }
}

static std::vector<KvLayerDims> gpt_oss_kv_layout(const Hparams &h) {
  // Every layer keeps every cell; windowed layers only mask (see docs/architectures.md).
  return std::vector<KvLayerDims>(h.n_layer, KvLayerDims{static_cast<int64_t>(h.head_dim_k) * h.n_head_kv,
                                                          static_cast<int64_t>(h.head_dim_v) * h.n_head_kv});
}

static void gpt_oss_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g) {
  const Hparams &h = m.hp;
  const int64_t T = p.n_tokens, hd = h.head_dim_k;
  BlockInputs in = make_block_inputs(g, p);
  int cur_in = g.get_rows(g.weight(m.find("token_embd.weight")), in.tokens);

  RopeParams rope = rope_params_from(h, static_cast<int>(h.n_rot), /*neox=*/true);
  rope.attn_factor = yarn_rope_attn_factor(h, h.yarn_log_mul, /*deepseek2=*/false);
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(h.n_rot));
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    g.set_segment(static_cast<int>(il) + 1);
    const std::string pf = "blk." + std::to_string(il) + ".";
    auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
    int x = g.mul(g.rms_norm(cur_in, h.rms_eps), W("attn_norm.weight"));

    int q = g.add(g.matmul(W("attn_q.weight"), x), W("attn_q.bias"));
    int k = g.add(g.matmul(W("attn_k.weight"), x), W("attn_k.bias"));
    int v = g.add(g.matmul(W("attn_v.weight"), x), W("attn_v.bias"));
    q = g.rope(g.view(q, {hd, h.n_head, T}), in.pos, rope);
    k = g.rope(g.view(k, {hd, h.n_head_kv, T}), in.pos, rope);
    v = g.view(v, {hd, h.n_head_kv, T});
    AttentionOptions ao;
    ao.window = is_swa_layer(m, il) ? static_cast<int32_t>(h.sliding_window) : 0;
    ao.sinks = W("attn_sinks.weight");
    int ks = g.kv_store(k, static_cast<int>(il), 0);
    int vs = g.kv_store(v, static_cast<int>(il), 1);
    int att = g.attention_ext(q, ks, vs, hd, kq_scale, ao);
    set_attention_cache(g, att, p);
    int o = g.add(g.matmul(W("attn_output.weight"), g.view(att, {hd * h.n_head, T})), W("attn_output.bias"));

    if (il + 1 == h.n_layer) {
      o = g.get_rows(o, in.out_ids);
      cur_in = g.get_rows(cur_in, in.out_ids);
    }
    int ffn_in = g.add(o, cur_in);
    int y = g.mul(g.rms_norm(ffn_in, h.rms_eps), W("post_attention_norm.weight"));

    // Router: top-k of the raw (biased) logits, softmax over the chosen ones only.
    int logits = g.add(g.matmul(W("ffn_gate_inp.weight"), y), W("ffn_gate_inp.bias"));
    int ids = g.top_k(logits, static_cast<int>(h.n_expert_used));
    int weights = g.softmax(g.gather_cols(logits, ids));
    if (h.expert_weights_scale != 0.0f && h.expert_weights_scale != 1.0f) weights = g.scale(weights, h.expert_weights_scale);

    const int64_t E = g.node(y).ne[0], Ty = g.node(y).ne[1];
    int y3 = g.view(y, {E, 1, Ty});
    int up = g.add_id(g.matmul_id(W("ffn_up_exps.weight"), y3, ids), W("ffn_up_exps.bias"), ids);
    int gate = g.add_id(g.matmul_id(W("ffn_gate_exps.weight"), y3, ids), W("ffn_gate_exps.bias"), ids);
    int act = g.swiglu_oai(gate, up, kSwigluAlpha, kSwigluLimit);
    int down = g.add_id(g.matmul_id(W("ffn_down_exps.weight"), act, ids), W("ffn_down_exps.bias"), ids);
    cur_in = g.add(g.moe_combine(down, weights), ffn_in);
  }
  lm_head(g, m, cur_in);
}

const ArchSpec kArchGptOss = {"gpt-oss", gpt_oss_validate, gpt_oss_kv_layout, gpt_oss_build};

}  // namespace moe
