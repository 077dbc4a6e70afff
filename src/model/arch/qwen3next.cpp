// qwen3next (Qwen3-Next-80B-A3B) and qwen35moe (Qwen3.5 / 3.6 MoE): hybrid stacks of gated
// DeltaNet blocks (linear attention with a per-sequence recurrent state) and, every
// full_attention_interval-th block, gated full attention; every block ends in a softmax-routed
// MoE plus a sigmoid-gated shared expert. The two differ only in how the DeltaNet block gets its
// beta / alpha gates (one fused ssm_ba vs ssm_beta + ssm_alpha) and in which key head a value
// head reads (h / r vs h % n_k). See docs/architectures.md.
#include <cmath>

#include "gguf/gguf_reader.h"
#include "model/arch/arch.h"
#include "model/arch/blocks.h"

namespace moe {

namespace {

enum class Variant { Next, Qwen35 };

struct DeltaDims {
  int64_t d, n_k, n_v, key_dim, value_dim, conv_dim, kernel;
  explicit DeltaDims(const Hparams &h)
      : d(h.ssm_d_state), n_k(h.ssm_n_k_heads), n_v(h.ssm_n_v_heads), key_dim(d * n_k), value_dim(d * n_v),
        conv_dim(2 * key_dim + value_dim), kernel(h.ssm_d_conv) {}
};

bool full_attention(const Hparams &h, uint32_t il) { return (il + 1) % h.full_attn_interval == 0; }

void require_f32(const GgufTensorInfo *t) {
  if (t->type != DType::F32)
    fail(Status::InvalidModel, "%s has type %s; this architecture needs it in F32 (as the converter writes it)", t->name.c_str(), dtype_name(t->type));
}

void validate_hparams(const Hparams &h) {
  const char *a = h.arch.c_str();
  if (!h.n_expert || !h.n_ff_exp || !h.n_ff_shexp)
    fail(Status::InvalidModel, "%s: expert_count, expert_feed_forward_length and expert_shared_feed_forward_length are required", a);
  if (h.full_attn_interval == 0 || h.full_attn_interval > h.n_layer + 1)
    fail(Status::InvalidModel, "%s.full_attention_interval = %u: must be in [1, block_count + 1]", a, h.full_attn_interval);
  if (h.ssm_d_conv < 1 || h.ssm_d_conv > 64) fail(Status::InvalidModel, "%s.ssm.conv_kernel = %u: must be in [1, 64]", a, h.ssm_d_conv);
  if (h.ssm_d_state == 0 || h.ssm_d_state > 1024) fail(Status::InvalidModel, "%s.ssm.state_size = %u: must be in [1, 1024]", a, h.ssm_d_state);
  if (h.ssm_n_k_heads == 0 || h.ssm_n_v_heads == 0 || h.ssm_n_v_heads % h.ssm_n_k_heads)
    fail(Status::InvalidModel, "%s: ssm.time_step_rank (value heads, %u) must be a non-zero multiple of ssm.group_count (key heads, %u)", a,
         h.ssm_n_v_heads, h.ssm_n_k_heads);
  if (static_cast<uint64_t>(h.ssm_d_inner) != static_cast<uint64_t>(h.ssm_d_state) * h.ssm_n_v_heads)
    fail(Status::InvalidModel, "%s.ssm.inner_size = %u: must be ssm.state_size x ssm.time_step_rank = %u x %u", a, h.ssm_d_inner,
         h.ssm_d_state, h.ssm_n_v_heads);
  if (h.head_dim_k != h.head_dim_v)
    fail(Status::InvalidModel, "%s: attention.key_length %u != value_length %u (the output gate has one value per key dimension)", a,
         h.head_dim_k, h.head_dim_v);
}

void validate_common(const Model::Impl &m, Variant var) {
  const Hparams &h = m.hp;
  validate_hparams(h);
  require_embedding_and_head(m);
  const int64_t E = h.n_embd, hd = h.head_dim_k, nh = h.n_head, nkv = h.n_head_kv;
  const DeltaDims dd(h);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    m.require(p + "attn_norm.weight", {E});
    m.require(p + "post_attention_norm.weight", {E});
    if (full_attention(h, il)) {
      m.require(p + "attn_q.weight", {E, 2 * hd * nh});  // per head: [q | gate]
      m.require(p + "attn_k.weight", {E, hd * nkv});
      m.require(p + "attn_v.weight", {E, hd * nkv});
      m.require(p + "attn_output.weight", {hd * nh, E});
      m.require(p + "attn_q_norm.weight", {hd});
      m.require(p + "attn_k_norm.weight", {hd});
    } else {
      if (!m.find(p + "attn_qkv.weight") && m.find(p + "ssm_in.weight"))
        fail(Status::InvalidModel, "%s: %sssm_in.weight is the older fused DeltaNet input layout; reconvert the model (attn_qkv + attn_gate)",
             h.arch.c_str(), p.c_str());
      m.require(p + "attn_qkv.weight", {E, dd.conv_dim});
      m.require(p + "attn_gate.weight", {E, dd.value_dim});
      require_f32(m.require(p + "ssm_conv1d.weight", {dd.kernel, dd.conv_dim}));
      require_f32(m.require(p + "ssm_dt.bias", {dd.n_v}));
      require_f32(m.require(p + "ssm_a", {dd.n_v}));
      if (var == Variant::Next) {
        m.require(p + "ssm_ba.weight", {E, 2 * dd.n_v});
      } else {
        m.require(p + "ssm_beta.weight", {E, dd.n_v});
        m.require(p + "ssm_alpha.weight", {E, dd.n_v});
      }
      m.require(p + "ssm_norm.weight", {dd.d});
      m.require(p + "ssm_out.weight", {dd.value_dim, E});
    }
    m.require(p + "ffn_gate_inp.weight", {E, h.n_expert});
    m.require(p + "ffn_gate_exps.weight", {E, h.n_ff_exp, h.n_expert});
    m.require(p + "ffn_up_exps.weight", {E, h.n_ff_exp, h.n_expert});
    m.require(p + "ffn_down_exps.weight", {h.n_ff_exp, E, h.n_expert});
    m.require(p + "ffn_gate_inp_shexp.weight", {E, 1});
    m.require(p + "ffn_gate_shexp.weight", {E, h.n_ff_shexp});
    m.require(p + "ffn_up_shexp.weight", {E, h.n_ff_shexp});
    m.require(p + "ffn_down_shexp.weight", {h.n_ff_shexp, E});
  }
}

void qwen3next_validate(const Model::Impl &m) { validate_common(m, Variant::Next); }

void qwen35moe_validate(const Model::Impl &m) {
  // IMRoPE: text positions are the same in the t/h/w components, so sectors t/h/w rotate as
  // NeoX RoPE does; the 4th component (always 0 for text) would leave its sector unrotated.
  if (const GgufValue *v = m.gguf->find("qwen35moe.rope.dimension_sections"))
    if (v->is_array() && (v->elem_type == GgufType::I32 || v->elem_type == GgufType::U32) && v->count >= 4 && v->elem_i64(3) != 0)
      fail(Status::Unsupported, "qwen35moe.rope.dimension_sections has a non-zero 4th section; only text position layouts are supported");
  validate_common(m, Variant::Qwen35);
}

std::vector<KvLayerDims> hybrid_kv_layout(const Hparams &h) {
  const DeltaDims dd(h);
  std::vector<KvLayerDims> out(h.n_layer);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    KvLayerDims &l = out[il];
    if (full_attention(h, il)) {
      l.k_row = static_cast<int64_t>(h.head_dim_k) * h.n_head_kv;
      l.v_row = static_cast<int64_t>(h.head_dim_v) * h.n_head_kv;
    } else {
      l.conv_state = (dd.kernel - 1) * dd.conv_dim;
      l.ssm_state = dd.n_v * dd.d * dd.d;
    }
  }
  return out;
}

// Gated full attention: q carries a per-head output gate, q/k get RMSNorm and partial RoPE.
int gated_attention(Graph &g, const Model::Impl &m, const std::string &pf, int x, int pos, uint32_t il, const GraphBuildParams &p) {
  const Hparams &h = m.hp;
  const int64_t T = p.n_tokens, hd = h.head_dim_k;
  auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
  // The three projections of x next to each other (one mat-vec group on CUDA), then the slices.
  const int qg = g.view(g.matmul(W("attn_q.weight"), x), {2 * hd, h.n_head, T});
  int k = g.view(g.matmul(W("attn_k.weight"), x), {hd, h.n_head_kv, T});
  const int v = g.view(g.matmul(W("attn_v.weight"), x), {hd, h.n_head_kv, T});
  int q = g.slice(qg, 0, hd);
  const int gate = g.slice(qg, hd, hd);
  q = g.mul(g.rms_norm(q, h.rms_eps), W("attn_q_norm.weight"));
  k = g.mul(g.rms_norm(k, h.rms_eps), W("attn_k_norm.weight"));
  const RopeParams rope = rope_params_from(h, static_cast<int>(h.n_rot), /*neox=*/true);
  q = g.rope(q, pos, rope);
  k = g.rope(k, pos, rope);
  int attn = attention_block(g, q, k, v, static_cast<int>(il), hd, 1.0f / std::sqrt(static_cast<float>(hd)), p);
  attn = g.mul(attn, g.sigmoid(gate));
  return g.matmul(W("attn_output.weight"), g.view(attn, {hd * h.n_head, T}));
}

// Gated DeltaNet: conv over qkv, L2-normalised q/k, gated delta rule, gated RMSNorm, out.
int gated_delta_net(Graph &g, const Model::Impl &m, const std::string &pf, int x, uint32_t il, Variant var, const GraphBuildParams &p) {
  const Hparams &h = m.hp;
  const DeltaDims dd(h);
  const int64_t T = p.n_tokens, r = dd.n_v / dd.n_k;
  auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
  const int qkv = g.matmul(W("attn_qkv.weight"), x);
  const int z = g.matmul(W("attn_gate.weight"), x);
  int beta, alpha;
  if (var == Variant::Next) {  // per key group: [beta of its r value heads | alpha of them]
    const int ba = g.view(g.matmul(W("ssm_ba.weight"), x), {2 * r, dd.n_k, T});
    beta = g.view(g.slice(ba, 0, r), {dd.n_v, T});
    alpha = g.view(g.slice(ba, r, r), {dd.n_v, T});
  } else {
    beta = g.matmul(W("ssm_beta.weight"), x);
    alpha = g.matmul(W("ssm_alpha.weight"), x);
  }
  const int decay = g.mul(g.softplus(g.add(alpha, W("ssm_dt.bias"))), W("ssm_a"));  // ssm_a = -exp(A_log)
  const int gates = g.concat(decay, g.sigmoid(beta));
  const int c = g.ssm_conv(qkv, W("ssm_conv1d.weight"), static_cast<int>(il));
  const int q = g.l2_norm(g.view(g.slice(c, 0, dd.key_dim), {dd.d, dd.n_k, T}), h.rms_eps);
  const int k = g.l2_norm(g.view(g.slice(c, dd.key_dim, dd.key_dim), {dd.d, dd.n_k, T}), h.rms_eps);
  const int v = g.view(g.slice(c, 2 * dd.key_dim, dd.value_dim), {dd.d, dd.n_v, T});
  int o = g.delta_net(q, k, v, gates, static_cast<int>(il), var == Variant::Next ? 0 : 1, 1.0f / std::sqrt(static_cast<float>(dd.d)));
  o = g.mul(g.rms_norm(o, h.rms_eps), W("ssm_norm.weight"));
  o = g.swiglu(g.view(z, {dd.d, dd.n_v, T}), o);
  return g.matmul(W("ssm_out.weight"), g.view(o, {dd.value_dim, T}));
}

void hybrid_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g, Variant var) {
  const Hparams &h = m.hp;
  BlockInputs in = make_block_inputs(g, p);
  int cur = g.get_rows(g.weight(m.find("token_embd.weight")), in.tokens);
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    g.set_segment(static_cast<int>(il) + 1);
    const std::string pf = "blk." + std::to_string(il) + ".";
    auto W = [&](const char *n) { return g.weight(m.find(pf + n)); };
    const int x = g.mul(g.rms_norm(cur, h.rms_eps), W("attn_norm.weight"));
    int o = full_attention(h, il) ? gated_attention(g, m, pf, x, in.pos, il, p) : gated_delta_net(g, m, pf, x, il, var, p);
    if (il + 1 == h.n_layer) {  // only the rows whose logits were asked for go on
      o = g.get_rows(o, in.out_ids);
      cur = g.get_rows(cur, in.out_ids);
    }
    const int ffn_in = g.add(o, cur);
    const int y = g.mul(g.rms_norm(ffn_in, h.rms_eps), W("post_attention_norm.weight"));
    // The shared expert's gate logit [1, T] right before the router's mat-vec of the same row:
    // the CUDA router launch computes both (cuda_fusion.h: Router).
    const int shared_logit = g.matmul(W("ffn_gate_inp_shexp.weight"), y);
    MoeWeights mw{W("ffn_gate_inp.weight"), W("ffn_gate_exps.weight"), W("ffn_up_exps.weight"), W("ffn_down_exps.weight")};
    const int routed = moe_ffn_softmax(g, y, mw, static_cast<int>(h.n_expert_used), /*norm_weights=*/true);
    const int shared = ffn_swiglu(g, y, W("ffn_gate_shexp.weight"), W("ffn_up_shexp.weight"), W("ffn_down_shexp.weight"));
    const int shared_gate = g.sigmoid(shared_logit);  // [1, T]
    // One scalar per token: a one-expert combine ([n_embd, 1, T] x [1, T]) scales each column.
    const int gated = g.moe_combine(g.view(shared, {static_cast<int64_t>(h.n_embd), 1, g.node(y).ne[1]}), shared_gate);
    cur = g.add(g.add(routed, gated), ffn_in);
  }
  lm_head(g, m, cur);
}

void qwen3next_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g) { hybrid_build(m, p, g, Variant::Next); }
void qwen35moe_build(const Model::Impl &m, const GraphBuildParams &p, Graph &g) { hybrid_build(m, p, g, Variant::Qwen35); }

}  // namespace

const ArchSpec kArchQwen3Next = {"qwen3next", qwen3next_validate, hybrid_kv_layout, qwen3next_build};
const ArchSpec kArchQwen35Moe = {"qwen35moe", qwen35moe_validate, hybrid_kv_layout, qwen35moe_build};

}  // namespace moe
