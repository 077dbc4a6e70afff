// deepseek2 (DeepSeek-V2/V3, GLM-4.7-Flash): multi-head latent attention (MLA) with the
// absorbed-weights layout, leading dense blocks, then MoE blocks with shared experts,
// softmax or sigmoid gating, a selection-only score bias (exp_probs_b), grouped expert
// selection, renormalised and scaled expert weights; YaRN with deepseek2's mscale rules.
//
// MLA, per layer (H heads, latent rank R = kv_lora_rank, rope dims P, nope dims N):
//   q  = W_qb norm(W_qa x)  (or W_q x)          -> [N + P, H, T]
//   kv = W_kv_a x                                -> [R + P, T]: latent c, rope part k_pe
//   K cache row = [norm(c), rope(k_pe)]          (R + P values per token, no V cache)
//   q' = [W_kb,h q_nope, rope(q_pe)]             (k_b absorbed into q: scores = q'.K)
//   o_h = W_vb,h sum_j p_j c_j                   (V = the cached latent, v_b applied after)
// so the cache holds R + P values per token instead of H * (N + P + V).
#include <cmath>

#include "model/arch/arch.h"
#include "model/arch/blocks.h"

namespace moe {

namespace {

struct MlaDims {
  int64_t hd_k, hd_v, n_rot, n_nope, kv_lora, q_lora;
};

MlaDims mla_dims(const Hparams &h) {
  MlaDims d;
  d.hd_k = h.head_dim_k_mla ? h.head_dim_k_mla : h.head_dim_k;
  d.hd_v = h.head_dim_v_mla ? h.head_dim_v_mla : h.head_dim_v;
  d.n_rot = h.n_rot;
  d.n_nope = d.hd_k - d.n_rot;
  d.kv_lora = h.kv_lora_rank;
  d.q_lora = h.q_lora_rank;
  return d;
}

// deepseek2 GGUFs store rope.scaling.yarn_log_multiplier pre-multiplied by 0.1 (convert
// script); the reference cancels that factor, so do we.
float deepseek2_log_mul(const Hparams &h) { return h.yarn_log_mul / 0.1f; }

}  // namespace

static void deepseek2_validate(const Model::Impl &m) {
  const Hparams &h = m.hp;
  const MlaDims d = mla_dims(h);
  const int64_t E = h.n_embd, H = h.n_head;
  if (!d.kv_lora) fail(Status::InvalidModel, "deepseek2: attention.kv_lora_rank is required");
  if (d.n_rot <= 0 || d.n_nope < 1 || d.n_rot % 2)
    fail(Status::InvalidModel, "deepseek2: rope.dimension_count %lld must be even and below key_length_mla %lld", (long long)d.n_rot, (long long)d.hd_k);
  if (h.n_leading_dense < h.n_layer && (!h.n_expert || !h.n_ff_exp))
    fail(Status::InvalidModel, "deepseek2: expert_count and expert_feed_forward_length are required");
  if (h.n_expert_groups > 1 && (h.n_expert % h.n_expert_groups || !h.n_group_used || h.n_group_used > h.n_expert_groups ||
                                h.n_expert_used > h.n_expert / h.n_expert_groups * h.n_group_used))
    fail(Status::InvalidModel, "deepseek2: expert_group_count %u / expert_group_used_count %u do not fit %u experts (%u used)",
         h.n_expert_groups, h.n_group_used, h.n_expert, h.n_expert_used);
  require_embedding_and_head(m);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    m.require(p + "attn_norm.weight", {E});
    if (d.q_lora) {
      m.require(p + "attn_q_a.weight", {E, d.q_lora});
      m.require(p + "attn_q_a_norm.weight", {d.q_lora});
      m.require(p + "attn_q_b.weight", {d.q_lora, H * d.hd_k});
    } else {
      m.require(p + "attn_q.weight", {E, H * d.hd_k});
    }
    m.require(p + "attn_kv_a_mqa.weight", {E, d.kv_lora + d.n_rot});
    m.require(p + "attn_kv_a_norm.weight", {d.kv_lora});
    if (!m.find(p + "attn_k_b.weight") && m.find(p + "attn_kv_b.weight"))
      fail(Status::Unsupported, "deepseek2: tensor '%sattn_kv_b.weight' is the legacy unsplit layout; reconvert the model (attn_k_b/attn_v_b expected)", p.c_str());
    m.require(p + "attn_k_b.weight", {d.n_nope, d.kv_lora, H});
    m.require(p + "attn_v_b.weight", {d.kv_lora, d.hd_v, H});
    m.require(p + "attn_output.weight", {H * d.hd_v, E});
    m.require(p + "ffn_norm.weight", {E});
    if (il < h.n_leading_dense) {
      m.require(p + "ffn_gate.weight", {E, h.n_ff});
      m.require(p + "ffn_up.weight", {E, h.n_ff});
      m.require(p + "ffn_down.weight", {h.n_ff, E});
    } else {
      m.require(p + "ffn_gate_inp.weight", {E, h.n_expert});
      m.optional(p + "exp_probs_b.bias", {h.n_expert});
      m.require(p + "ffn_gate_exps.weight", {E, h.n_ff_exp, h.n_expert});
      m.require(p + "ffn_up_exps.weight", {E, h.n_ff_exp, h.n_expert});
      m.require(p + "ffn_down_exps.weight", {h.n_ff_exp, E, h.n_expert});
      if (h.n_expert_shared) {
        const int64_t ffs = static_cast<int64_t>(h.n_ff_exp) * h.n_expert_shared;
        m.require(p + "ffn_gate_shexp.weight", {E, ffs});
        m.require(p + "ffn_up_shexp.weight", {E, ffs});
        m.require(p + "ffn_down_shexp.weight", {ffs, E});
      }
    }
  }
}

// The cache keeps the normalised latent plus the roped key part; V reads the latent.
static std::vector<KvLayerDims> deepseek2_kv_layout(const Hparams &h) {
  const MlaDims d = mla_dims(h);
  return std::vector<KvLayerDims>(h.n_layer, KvLayerDims{d.kv_lora + d.n_rot, 0});
}

static void deepseek2_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g) {
  const Hparams &h = m.hp;
  const MlaDims d = mla_dims(h);
  const int64_t T = p.n_tokens, H = h.n_head;
  BlockInputs in = make_block_inputs(g, p);
  int cur_in = g.get_rows(g.weight(m.find("token_embd.weight")), in.tokens);

  // deepseek2 RoPE is the normal (GPT-J, interleaved) variant on the rope part only.
  RopeParams rope = rope_params_from(h, static_cast<int>(d.n_rot), /*neox=*/false);
  const float log_mul = deepseek2_log_mul(h);
  rope.attn_factor = yarn_rope_attn_factor(h, log_mul, /*deepseek2=*/true);
  // YaRN's magnitude correction moves from the rotated dims into the softmax scale.
  const float ln_factor = std::log(1.0f / rope.freq_scale);
  const float attn_factor_org = rope.attn_factor * (1.0f + 0.1f * ln_factor);
  const float mscale = attn_factor_org * (1.0f + 0.1f * log_mul * ln_factor);
  const float kq_scale = mscale * mscale / std::sqrt(static_cast<float>(d.hd_k));

  MoeRouting routing;
  routing.gating = h.gating;
  routing.n_groups = static_cast<int>(h.n_expert_groups);
  routing.n_groups_used = static_cast<int>(h.n_group_used);
  routing.norm_weights = h.expert_weights_norm;
  routing.weights_scale = h.expert_weights_scale;

  AttentionOptions ao;
  ao.v_from_k = true;
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    g.set_segment(static_cast<int>(il) + 1);
    const std::string pf = "blk." + std::to_string(il) + ".";
    auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
    int x = g.mul(g.rms_norm(cur_in, h.rms_eps), W("attn_norm.weight"));

    // The two products of x first, next to each other (q_a or q, then kv_a): a GPU runs them
    // as one launch (cuda_fusion.h: MatVecs), with the attention norm in it.
    int q = g.matmul(W(d.q_lora ? "attn_q_a.weight" : "attn_q.weight"), x);
    int kv = g.matmul(W("attn_kv_a_mqa.weight"), x);  // [kv_lora + n_rot, T]
    if (d.q_lora) q = g.matmul(W("attn_q_b.weight"), g.mul(g.rms_norm(q, h.rms_eps), W("attn_q_a_norm.weight")));
    q = g.view(q, {d.hd_k, H, T});
    // The glue in this order: the K row and its store, then q's slices and rope, all before the
    // k_b product: one launch on a GPU (cuda_fusion.h: Sequence), and the q concat right after
    // the product joins its launch (HeadsConcat).
    int k_pe = g.rope(g.view(g.slice(kv, d.kv_lora, d.n_rot), {d.n_rot, 1, T}), in.pos, rope);
    int latent = g.mul(g.rms_norm(g.slice(kv, 0, d.kv_lora), h.rms_eps), W("attn_kv_a_norm.weight"));
    int kk = g.concat(g.view(latent, {d.kv_lora, 1, T}), k_pe);  // [kv_lora + n_rot, 1, T]
    int ks = g.kv_store(kk, static_cast<int>(il), 0);
    int q_nope = g.slice(q, 0, d.n_nope);
    int q_pe = g.rope(g.slice(q, d.n_nope, d.n_rot), in.pos, rope);

    int q_abs = g.matmul_heads(W("attn_k_b.weight"), q_nope);  // [kv_lora, H, T]
    int qk = g.concat(q_abs, q_pe);                             // [kv_lora + n_rot, H, T]
    int att = g.attention_ext(qk, ks, ks, d.kv_lora, kq_scale, ao);  // [kv_lora, H, T]
    set_attention_cache(g, att, p);
    int heads = g.matmul_heads(W("attn_v_b.weight"), att);  // [hd_v, H, T]
    int o = g.matmul(W("attn_output.weight"), g.view(heads, {d.hd_v * H, T}));

    if (il + 1 == h.n_layer) {
      o = g.get_rows(o, in.out_ids);
      cur_in = g.get_rows(cur_in, in.out_ids);
    }
    int ffn_in = g.add(o, cur_in);
    int y = g.mul(g.rms_norm(ffn_in, h.rms_eps), W("ffn_norm.weight"));
    int ffn;
    if (il < h.n_leading_dense) {
      ffn = ffn_swiglu(g, y, W("ffn_gate.weight"), W("ffn_up.weight"), W("ffn_down.weight"));
    } else {
      MoeWeights mw{W("ffn_gate_inp.weight"), W("ffn_gate_exps.weight"), W("ffn_up_exps.weight"), W("ffn_down_exps.weight")};
      const GgufTensorInfo *bias = m.find(pf + "exp_probs_b.bias");
      routing.selection_bias = bias ? g.weight(bias) : -1;
      ffn = moe_ffn_routed(g, y, mw, static_cast<int>(h.n_expert_used), routing);
      if (h.n_expert_shared)
        ffn = g.add(ffn, ffn_swiglu(g, y, W("ffn_gate_shexp.weight"), W("ffn_up_shexp.weight"), W("ffn_down_shexp.weight")));
    }
    cur_in = g.add(ffn, ffn_in);
  }
  lm_head(g, m, cur_in);
}

const ArchSpec kArchDeepseek2 = {"deepseek2", deepseek2_validate, deepseek2_kv_layout, deepseek2_build};

}  // namespace moe
