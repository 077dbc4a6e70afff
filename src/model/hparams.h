// Model hyperparameters read from GGUF metadata ("<arch>.<key>"). One struct for every
// architecture; fields an architecture does not use keep their defaults.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe {

class GgufFile;

enum class RopeScaling : int { None = 0, Linear = 1, Yarn = 2 };
enum class ExpertGating : int { Softmax = 1, Sigmoid = 2 };  // GGUF expert_gating_func values

struct Hparams {
  std::string arch;
  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;       // context_length
  uint32_t n_embd = 0;            // embedding_length
  uint32_t n_layer = 0;           // block_count
  uint32_t n_head = 0;            // attention.head_count
  uint32_t n_head_kv = 0;         // attention.head_count_kv
  uint32_t head_dim_k = 0;        // attention.key_length (default n_embd / n_head)
  uint32_t head_dim_v = 0;        // attention.value_length
  uint32_t n_ff = 0;              // feed_forward_length (dense blocks)
  uint32_t n_expert = 0;          // expert_count
  uint32_t n_expert_used = 0;     // expert_used_count
  uint32_t n_ff_exp = 0;          // expert_feed_forward_length
  uint32_t n_ff_shexp = 0;        // expert_shared_feed_forward_length
  uint32_t n_expert_shared = 0;   // expert_shared_count
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;
  ExpertGating gating = ExpertGating::Softmax;
  uint32_t n_expert_groups = 0;   // expert_group_count (0/1 = no grouping)
  uint32_t n_group_used = 0;      // expert_group_used_count
  uint32_t n_leading_dense = 0;   // leading_dense_block_count
  float rms_eps = 1e-6f;          // attention.layer_norm_rms_epsilon
  // RoPE
  uint32_t n_rot = 0;             // rope.dimension_count (default head_dim_k)
  float rope_theta = 10000.0f;    // rope.freq_base
  RopeScaling rope_scaling = RopeScaling::None;
  float rope_scale_factor = 1.0f; // rope.scaling.factor
  uint32_t rope_orig_ctx = 0;     // rope.scaling.original_context_length
  float yarn_log_mul = 0.0f;      // rope.scaling.yarn_log_multiplier
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float yarn_ext_factor = -1.0f;  // <0: derived (1 for YaRN, 0 otherwise)
  float yarn_attn_factor = 1.0f;
  // deepseek2 (MLA)
  uint32_t q_lora_rank = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t n_rot_mla = 0;          // qk rope head dim
  uint32_t head_dim_k_mla = 0;     // key_length_mla
  uint32_t head_dim_v_mla = 0;     // value_length_mla
  // gpt-oss
  uint32_t sliding_window = 0;
  std::vector<bool> swa_layers;    // per layer: sliding-window attention
  bool tied_output = false;        // no output.weight: LM head = token_embd
  // qwen3next / qwen35moe: gated DeltaNet layers ("ssm.*"), full attention every
  // full_attention_interval-th layer
  uint32_t ssm_d_conv = 0;         // ssm.conv_kernel
  uint32_t ssm_d_inner = 0;        // ssm.inner_size (value heads x state size)
  uint32_t ssm_d_state = 0;        // ssm.state_size (head size of q, k, v)
  uint32_t ssm_n_v_heads = 0;      // ssm.time_step_rank
  uint32_t ssm_n_k_heads = 0;      // ssm.group_count
  uint32_t full_attn_interval = 4; // full_attention_interval

  // Reads "<arch>.*" keys; throws InvalidModel naming the key on missing/inconsistent values.
  static Hparams from_gguf(const GgufFile &f);
};

}  // namespace moe
