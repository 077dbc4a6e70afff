#include "model/hparams.h"

#include <cmath>

#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace moe {

Hparams Hparams::from_gguf(const GgufFile &f) {
  Hparams h;
  h.arch = f.get_str("general.architecture");
  const std::string a = h.arch + ".";
  auto u32 = [&](const char *k, uint32_t def) { return f.get_u32(a + k, def); };
  // Float hparams (from the file or an override) must be finite and in range: a zero or
  // negative RoPE base or epsilon loads fine and decodes to NaN everywhere. lo_open: lo itself
  // is out of range. The message names the key and the value.
  auto real = [&](const char *k, float def, float lo, bool lo_open, float hi, const char *what) {
    const float v = f.get_f32(a + k, def);
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    if (!ok) fail(Status::InvalidModel, "%s%s = %g: must be a finite number %s %g%s (%s)", a.c_str(), k, static_cast<double>(v),
                  lo_open ? ">" : ">=", static_cast<double>(lo), hi < 3e38f ? strfmt(" and <= %g", static_cast<double>(hi)).c_str() : "", what);
    return v;
  };
  constexpr float kMax = 3.4028235e38f;
  h.n_ctx_train = u32("context_length", 0);
  h.n_embd = f.get_u32(a + "embedding_length");
  h.n_layer = f.get_u32(a + "block_count");
  h.n_head = f.get_u32(a + "attention.head_count");
  h.n_head_kv = u32("attention.head_count_kv", h.n_head);
  if (h.n_head == 0 || h.n_layer == 0 || h.n_embd == 0)
    fail(Status::InvalidModel, "%s: head_count, block_count and embedding_length must be non-zero", h.arch.c_str());
  h.head_dim_k = u32("attention.key_length", h.n_embd / h.n_head);
  h.head_dim_v = u32("attention.value_length", h.n_embd / h.n_head);
  h.n_ff = u32("feed_forward_length", 0);
  h.n_expert = u32("expert_count", 0);
  h.n_expert_used = u32("expert_used_count", 0);
  h.n_ff_exp = u32("expert_feed_forward_length", 0);
  h.n_ff_shexp = u32("expert_shared_feed_forward_length", 0);
  h.n_expert_shared = u32("expert_shared_count", 0);
  h.expert_weights_norm = f.get_bool(a + "expert_weights_norm", false);
  h.expert_weights_scale = real("expert_weights_scale", 1.0f, 0.0f, false, kMax, "scale of the routed experts' weights; 0 = none");
  const uint32_t gating = u32("expert_gating_func", 1);
  if (gating != 1 && gating != 2) fail(Status::InvalidModel, "%sexpert_gating_func = %u (1 softmax, 2 sigmoid)", a.c_str(), gating);
  h.gating = static_cast<ExpertGating>(gating);
  h.n_expert_groups = u32("expert_group_count", 0);
  h.n_group_used = u32("expert_group_used_count", 0);
  h.n_leading_dense = u32("leading_dense_block_count", 0);
  h.rms_eps = real("attention.layer_norm_rms_epsilon", 1e-6f, 0.0f, true, 1.0f, "RMSNorm epsilon");
  h.n_rot = u32("rope.dimension_count", h.head_dim_k);
  if (h.n_rot == 0 || h.n_rot % 2 != 0 || h.n_rot > h.head_dim_k)
    fail(Status::InvalidModel, "%srope.dimension_count = %u: must be even and in [2, %u] (the key head size)", a.c_str(), h.n_rot, h.head_dim_k);
  h.rope_theta = real("rope.freq_base", 10000.0f, 1.0f, false, kMax, "RoPE frequency base");
  const std::string scaling = f.get_str(a + "rope.scaling.type", "none");
  if (scaling == "yarn") h.rope_scaling = RopeScaling::Yarn;
  else if (scaling == "linear") h.rope_scaling = RopeScaling::Linear;
  else if (scaling != "none") fail(Status::Unsupported, "%srope.scaling.type '%s' is not supported", a.c_str(), scaling.c_str());
  // 0 means "not set" (1), as in the reference; below 1/1024 positions would be stretched
  // past any float range.
  h.rope_scale_factor = real("rope.scaling.factor", 1.0f, 0.0f, false, kMax, "RoPE scaling factor; 0 = none");
  if (h.rope_scale_factor == 0.0f) h.rope_scale_factor = 1.0f;
  else if (h.rope_scale_factor < 1.0f / 1024.0f)
    fail(Status::InvalidModel, "%srope.scaling.factor = %g: must be 0 (none) or >= %g (RoPE scaling factor)", a.c_str(),
         static_cast<double>(h.rope_scale_factor), 1.0 / 1024.0);
  h.rope_orig_ctx = u32("rope.scaling.original_context_length", h.n_ctx_train);
  h.yarn_log_mul = real("rope.scaling.yarn_log_multiplier", 0.0f, 0.0f, false, kMax, "YaRN attention-scale multiplier");
  h.q_lora_rank = u32("attention.q_lora_rank", 0);
  h.kv_lora_rank = u32("attention.kv_lora_rank", 0);
  h.head_dim_k_mla = u32("attention.key_length_mla", 0);
  h.head_dim_v_mla = u32("attention.value_length_mla", 0);
  h.sliding_window = u32("attention.sliding_window", 0);
  h.ssm_d_conv = u32("ssm.conv_kernel", 0);
  h.ssm_d_inner = u32("ssm.inner_size", 0);
  h.ssm_d_state = u32("ssm.state_size", 0);
  h.ssm_n_v_heads = u32("ssm.time_step_rank", 0);
  h.ssm_n_k_heads = u32("ssm.group_count", 0);
  h.full_attn_interval = u32("full_attention_interval", 4);
  if (h.n_expert && (h.n_expert_used == 0 || h.n_expert_used > h.n_expert))
    fail(Status::InvalidModel, "%sexpert_used_count = %u but expert_count = %u", a.c_str(), h.n_expert_used, h.n_expert);
  if (h.n_head_kv == 0 || h.n_head % h.n_head_kv)
    fail(Status::InvalidModel, "%sattention.head_count %u is not a multiple of head_count_kv %u", a.c_str(), h.n_head, h.n_head_kv);
  h.tied_output = f.tensor("output.weight") == nullptr;
  if (const GgufValue *v = f.find("tokenizer.ggml.tokens")) h.n_vocab = static_cast<uint32_t>(v->count);
  if (const GgufTensorInfo *t = f.tensor("token_embd.weight")) h.n_vocab = static_cast<uint32_t>(t->ne[1]);
  return h;
}

}  // namespace moe
