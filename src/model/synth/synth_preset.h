// Hyperparameters of the synthetic-model presets (real values of the models they imitate).
//
//   const SynthPreset &p = synth_preset("qwen3-30b-a3b");   // throws InvalidArgument
//   p.arch == "qwen3moe";  p.n_layer == 48;
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe {

struct SynthPreset {
  std::string name;            // preset name (CLI --preset)
  std::string arch;            // general.architecture: qwen3moe | deepseek2 | gpt-oss | qwen3next | qwen35moe
  std::string model_name;      // general.name
  uint32_t n_vocab = 0, n_ctx = 0, n_embd = 0, n_layer = 0;
  uint32_t n_head = 0, n_head_kv = 0, head_dim = 0;  // head_dim: key_length = value_length (GQA archs)
  uint32_t n_ff = 0;           // feed_forward_length (dense blocks; informational for qwen3moe and
                               // qwen3next); 0: key not written
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  bool tied = false;           // no output.weight
  float rope_base = 10000.0f, rms_eps = 1e-6f;
  // YaRN (rope.scaling.*) when rope_scaling == "yarn"
  std::string rope_scaling;
  float rope_factor = 1.0f;
  uint32_t rope_orig_ctx = 0;
  float yarn_log_mul = 0.0f;   // 0: key not written
  // deepseek2 (MLA, split k_b / v_b layout as llama.cpp converts it)
  uint32_t q_lora_rank = 0;    // 0: no q low-rank (plain attn_q)
  uint32_t kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  uint32_t n_expert_shared = 0, n_leading_dense = 0, n_group = 0, n_group_used = 0;
  uint32_t gating = 0;         // expert_gating_func (1 softmax, 2 sigmoid); 0: key not written
  float weights_scale = 0.0f;  // expert_weights_scale; 0: key not written
  bool weights_norm = false;
  bool has_weights_norm_key = false;
  bool exp_probs_b = false;    // selection bias tensor per MoE layer
  // gpt-oss
  uint32_t sliding_window = 0;
  // qwen3next / qwen35moe: gated DeltaNet blocks, gated full attention every
  // full_attn_interval-th block (block i when (i + 1) % interval == 0), shared expert
  uint32_t full_attn_interval = 0;  // full_attention_interval
  uint32_t n_rot = 0;               // rope.dimension_count (partial rotary); 0: key not written
  std::vector<int32_t> rope_sections;  // rope.dimension_sections (qwen35moe IMRoPE); empty: not written
  uint32_t n_ff_shexp = 0;          // expert_shared_feed_forward_length
  uint32_t ssm_conv = 0;            // ssm.conv_kernel
  uint32_t ssm_state = 0;           // ssm.state_size: head size of the DeltaNet q, k and v
  uint32_t ssm_k_heads = 0;         // ssm.group_count
  uint32_t ssm_v_heads = 0;         // ssm.time_step_rank (ssm.inner_size = state x v heads)
  // tokenizer
  std::string tok_pre;
  uint32_t n_vocab_real = 0;   // ids past this are [PADn] fillers (synthetic vocab)
  std::vector<std::pair<uint32_t, std::string>> controls;  // id -> control token text
  uint32_t bos = 0, eos = 0, pad = 0;
  int add_bos = -1;            // -1: key absent, else tokenizer.ggml.add_bos_token
  int add_eos = -1;
  std::string chat_template;
};

const SynthPreset &synth_preset(const std::string &name);
const std::vector<SynthPreset> &synth_presets();

}  // namespace moe
