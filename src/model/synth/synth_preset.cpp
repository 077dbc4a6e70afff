#include "model/synth/synth_preset.h"

#include "core/status.h"

namespace moe {

// Minimal ChatML template (Qwen style) so chat-template code paths have something to read.
static const char *kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Short templates in each family's format (the real ones are long and license-bound).
static const char *kDeepSeekChat =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
static const char *kGlmChat =
    "[gMASK]<sop>{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";
static const char *kHarmonyChat =
    "{% for message in messages %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}";

static SynthPreset qwen3moe_base() {
  SynthPreset p;
  p.arch = "qwen3moe";
  p.n_vocab = 151936; p.n_vocab_real = 151669; p.n_ctx = 40960;
  p.rope_base = 1e6f; p.rms_eps = 1e-6f;
  p.tok_pre = "qwen2";
  p.controls = {{151643, "<|endoftext|>"}, {151644, "<|im_start|>"}, {151645, "<|im_end|>"}};
  p.bos = 151643; p.eos = 151645; p.pad = 151643; p.add_bos = 0;
  p.chat_template = kChatMl;
  return p;
}

// Qwen3-Next / Qwen3.5 MoE: the parts both hybrid presets share (rope base 1e7, partial
// rotary of a quarter of the head, DeltaNet conv kernel 4, one shared expert).
static SynthPreset hybrid_base(const char *arch) {
  SynthPreset p = qwen3moe_base();
  p.arch = arch;
  p.n_ctx = 262144;
  p.rope_base = 1e7f;
  p.ssm_conv = 4;
  return p;
}

// Tiny hybrid presets: rows of 256 wherever llama.cpp's Q4_K_M would put a K-quant, so q4_k_m
// files really hold Q4_K / Q6_K (not the Q8_0 fallback), yet small enough for unit tests.
static SynthPreset tiny_hybrid(const char *arch) {
  SynthPreset p = hybrid_base(arch);
  p.n_vocab = 512; p.n_vocab_real = 512; p.n_ctx = 4096;
  p.controls = {{509, "<|endoftext|>"}, {510, "<|im_start|>"}, {511, "<|im_end|>"}};
  p.bos = 509; p.eos = 511; p.pad = 509;
  p.n_embd = 256; p.n_head = 4; p.head_dim = 64; p.n_rot = 16;
  p.n_expert = 16; p.n_ff_exp = 256; p.n_ff_shexp = 256;
  p.ssm_state = 64; p.ssm_k_heads = 2; p.ssm_v_heads = 4;  // value_dim 256, conv_dim 512
  return p;
}

static std::vector<SynthPreset> make_presets() {
  std::vector<SynthPreset> v;
  {  // tiny: fast tests; 512-token byte-level vocab
    SynthPreset p = qwen3moe_base();
    p.name = "tiny"; p.model_name = "synthetic-qwen3moe-tiny";
    p.n_vocab = 512; p.n_vocab_real = 512; p.n_ctx = 4096;
    p.n_embd = 64; p.n_layer = 2; p.n_head = 4; p.n_head_kv = 2; p.head_dim = 32;
    p.n_ff = 128; p.n_expert = 8; p.n_expert_used = 2; p.n_ff_exp = 32;
    p.controls = {{509, "<|endoftext|>"}, {510, "<|im_start|>"}, {511, "<|im_end|>"}};
    p.bos = 509; p.eos = 511; p.pad = 509;
    v.push_back(p);
  }
  {  // tiny-e16: tiny with 16 experts, 4 used (tests that per-step costs such as kernel
     // launches do not depend on the expert counts)
    SynthPreset p = v.front();
    p.name = "tiny-e16"; p.model_name = "synthetic-qwen3moe-tiny-e16";
    p.n_expert = 16; p.n_expert_used = 4;
    v.push_back(p);
  }
  {  // small: rows of 256 so the K-quant mixes really produce K-quants (tiny falls back to Q8_0)
    SynthPreset p = qwen3moe_base();
    p.name = "small"; p.model_name = "synthetic-qwen3moe-small";
    p.n_vocab = 512; p.n_vocab_real = 512; p.n_ctx = 4096;
    p.n_embd = 256; p.n_layer = 4; p.n_head = 4; p.n_head_kv = 2; p.head_dim = 64;
    p.n_ff = 768; p.n_expert = 16; p.n_expert_used = 4; p.n_ff_exp = 256;
    p.controls = {{509, "<|endoftext|>"}, {510, "<|im_start|>"}, {511, "<|im_end|>"}};
    p.bos = 509; p.eos = 511; p.pad = 509;
    v.push_back(p);
  }
  {  // tiny-deepseek2: the conformance deepseek2 structure (MLA, dense first block, grouped
     // sigmoid routing with bias, shared expert, YaRN) with a 512-token vocab
    SynthPreset p;
    p.name = "tiny-deepseek2"; p.arch = "deepseek2"; p.model_name = "synthetic-deepseek2-tiny";
    p.n_vocab = 512; p.n_vocab_real = 512; p.n_ctx = 4096;
    p.n_embd = 64; p.n_layer = 3; p.n_head = 4; p.n_ff = 128;
    p.n_expert = 16; p.n_expert_used = 4; p.n_ff_exp = 32; p.n_expert_shared = 1;
    p.n_leading_dense = 1; p.n_group = 4; p.n_group_used = 2; p.gating = 2;
    p.weights_scale = 2.5f; p.weights_norm = true; p.has_weights_norm_key = true; p.exp_probs_b = true;
    p.q_lora_rank = 32; p.kv_lora_rank = 32; p.qk_nope = 32; p.qk_rope = 16; p.v_head = 32;
    p.rope_base = 10000.0f; p.rms_eps = 1e-6f;
    p.rope_scaling = "yarn"; p.rope_factor = 40.0f; p.rope_orig_ctx = 4096; p.yarn_log_mul = 0.1f;
    p.tok_pre = "deepseek-v3";
    p.controls = {{509, "<｜begin▁of▁sentence｜>"}, {510, "<｜end▁of▁sentence｜>"}, {511, "<｜User｜>"}};
    p.bos = 509; p.eos = 510; p.pad = 510; p.add_bos = 1; p.add_eos = 0;
    p.chat_template = kDeepSeekChat;
    v.push_back(p);
  }
  {  // tiny-gpt-oss: the conformance gpt-oss structure (biases, sinks, SWA 8 on even blocks,
     // MXFP4 experts, YaRN) with a 512-token vocab
    SynthPreset p;
    p.name = "tiny-gpt-oss"; p.arch = "gpt-oss"; p.model_name = "synthetic-gpt-oss-tiny";
    p.n_vocab = 512; p.n_vocab_real = 512; p.n_ctx = 4096;
    p.n_embd = 64; p.n_layer = 4; p.n_head = 4; p.n_head_kv = 2; p.head_dim = 32;
    p.n_ff = 64; p.n_expert = 16; p.n_expert_used = 4; p.n_ff_exp = 64;
    p.sliding_window = 8;
    p.rope_base = 150000.0f; p.rms_eps = 1e-5f;
    p.rope_scaling = "yarn"; p.rope_factor = 32.0f; p.rope_orig_ctx = 4096;
    p.tok_pre = "gpt-4o";
    p.controls = {{505, "<|startoftext|>"}, {506, "<|endoftext|>"}, {507, "<|return|>"}, {508, "<|channel|>"},
                  {509, "<|start|>"}, {510, "<|end|>"}, {511, "<|message|>"}};
    p.bos = 505; p.eos = 507; p.pad = 506;
    p.chat_template = kHarmonyChat;
    v.push_back(p);
  }
  {  // tiny-gpt-oss-hd64: tiny-gpt-oss with gpt-oss-20b's attention shape (head dim 64, 8 query
     // heads per KV head), so CUDA decode takes the grouped kernel; SWA 16
    SynthPreset p = v.back();
    p.name = "tiny-gpt-oss-hd64"; p.model_name = "synthetic-gpt-oss-tiny-hd64";
    p.n_head = 8; p.n_head_kv = 1; p.head_dim = 64;
    p.sliding_window = 16;
    v.push_back(p);
  }
  {  // tiny-qwen3next: blocks 0, 1, 2 and 4 gated DeltaNet, 3 full attention (interval 4);
     // value head h reads key head h / 2
    SynthPreset p = tiny_hybrid("qwen3next");
    p.name = "tiny-qwen3next"; p.model_name = "synthetic-qwen3next-tiny";
    p.n_layer = 5; p.full_attn_interval = 4; p.n_head_kv = 2; p.n_ff = 512; p.n_expert_used = 4;
    v.push_back(p);
  }
  {  // tiny-qwen35moe: blocks 0, 1 and 3 gated DeltaNet, 2 full attention (interval 3), one KV
     // head, separate beta / alpha projections, IMRoPE sections; no feed_forward_length (as the
     // Qwen3.5 MoE converter writes it)
    SynthPreset p = tiny_hybrid("qwen35moe");
    p.name = "tiny-qwen35moe"; p.model_name = "synthetic-qwen35moe-tiny";
    p.n_layer = 4; p.full_attn_interval = 3; p.n_head_kv = 1; p.n_expert_used = 8;
    p.rope_sections = {3, 3, 2, 0};
    v.push_back(p);
  }
  {  // medium: 2.81 B parameters, fits comfortably on one GPU in any mix
    SynthPreset p = qwen3moe_base();
    p.name = "medium"; p.model_name = "synthetic-qwen3moe-medium";
    p.n_embd = 1024; p.n_layer = 16; p.n_head = 16; p.n_head_kv = 4; p.head_dim = 128;
    p.n_ff = 3072; p.n_expert = 64; p.n_expert_used = 8; p.n_ff_exp = 768;
    v.push_back(p);
  }
  {  // Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B)
    SynthPreset p = qwen3moe_base();
    p.name = "qwen3-30b-a3b"; p.model_name = "synthetic-Qwen3-30B-A3B";
    p.n_embd = 2048; p.n_layer = 48; p.n_head = 32; p.n_head_kv = 4; p.head_dim = 128;
    p.n_ff = 6144; p.n_expert = 128; p.n_expert_used = 8; p.n_ff_exp = 768;
    v.push_back(p);
  }
  {  // Qwen3-Next-80B-A3B (config.json of Qwen/Qwen3-Next-80B-A3B-Instruct): 48 blocks, full
     // attention every 4th; attention 16 q / 2 KV heads x 256, 64 rotary dims; DeltaNet 16 key /
     // 32 value heads x 128; 512 experts (10 used) of 512, shared expert 512; untied head
    SynthPreset p = hybrid_base("qwen3next");
    p.name = "qwen3-next-80b-a3b"; p.model_name = "synthetic-Qwen3-Next-80B-A3B";
    p.n_embd = 2048; p.n_layer = 48; p.full_attn_interval = 4;
    p.n_head = 16; p.n_head_kv = 2; p.head_dim = 256; p.n_rot = 64;
    p.n_ff = 5120; p.n_expert = 512; p.n_expert_used = 10; p.n_ff_exp = 512; p.n_ff_shexp = 512;
    p.ssm_state = 128; p.ssm_k_heads = 16; p.ssm_v_heads = 32;
    v.push_back(p);
  }
  {  // Qwen3.5-35B-A3B (text_config of Qwen/Qwen3.5-35B-A3B's config.json, as quoted by public
     // code that cites it; the same shape as Qwen3.6-35B-A3B): 40 blocks, full attention every
     // 4th; attention 16 q / 2 KV heads x 256, 64 rotary dims in IMRoPE sections [11, 11, 10];
     // DeltaNet 16 key / 32 value heads x 128; 256 experts (8 used) of 512, shared expert 512;
     // untied head; vocabulary 248320. Token texts: the Qwen3.5 tokenizer is not reproduced (byte
     // BPE fillers up to <|endoftext|> 248044, its ChatML controls, [PADn] after them).
    SynthPreset p = hybrid_base("qwen35moe");
    p.name = "qwen3.5-35b-a3b"; p.model_name = "synthetic-Qwen3.5-35B-A3B";
    p.n_vocab = 248320; p.n_vocab_real = 248047;
    p.controls = {{248044, "<|endoftext|>"}, {248045, "<|im_start|>"}, {248046, "<|im_end|>"}};
    p.bos = 248044; p.eos = 248046; p.pad = 248044;
    p.n_embd = 2048; p.n_layer = 40; p.full_attn_interval = 4;
    p.n_head = 16; p.n_head_kv = 2; p.head_dim = 256; p.n_rot = 64; p.rope_sections = {11, 11, 10, 0};
    p.n_expert = 256; p.n_expert_used = 8; p.n_ff_exp = 512; p.n_ff_shexp = 512;
    p.ssm_state = 128; p.ssm_k_heads = 16; p.ssm_v_heads = 32;
    v.push_back(p);
  }
  {  // DeepSeek-V2-Lite: no q low-rank, 64 experts (6 used) + 2 shared, softmax gating, 1 dense block
    SynthPreset p;
    p.name = "deepseek-v2-lite"; p.arch = "deepseek2"; p.model_name = "synthetic-DeepSeek-V2-Lite";
    p.n_vocab = 102400; p.n_vocab_real = 100015; p.n_ctx = 163840;
    p.n_embd = 2048; p.n_layer = 27; p.n_head = 16; p.n_ff = 10944;
    p.n_expert = 64; p.n_expert_used = 6; p.n_ff_exp = 1408; p.n_expert_shared = 2;
    p.n_leading_dense = 1; p.n_group = 1; p.n_group_used = 1; p.gating = 1;
    p.weights_scale = 1.0f; p.weights_norm = false; p.has_weights_norm_key = true;
    p.q_lora_rank = 0; p.kv_lora_rank = 512; p.qk_nope = 128; p.qk_rope = 64; p.v_head = 128;
    p.rope_base = 10000.0f; p.rms_eps = 1e-6f;
    p.rope_scaling = "yarn"; p.rope_factor = 40.0f; p.rope_orig_ctx = 4096; p.yarn_log_mul = 0.0707f;
    p.tok_pre = "deepseek-llm";
    p.controls = {{100000, "<｜begin▁of▁sentence｜>"}, {100001, "<｜end▁of▁sentence｜>"}};
    p.bos = 100000; p.eos = 100001; p.pad = 100001; p.add_bos = 1; p.add_eos = 0;
    p.chat_template = kDeepSeekChat;
    v.push_back(p);
  }
  {  // GLM-4.7-Flash (deepseek2 in llama.cpp): MLA with q low-rank, sigmoid gating + bias,
     // 64 experts (4 used) + 1 shared, 1 dense block
    SynthPreset p;
    p.name = "glm-4.7-flash"; p.arch = "deepseek2"; p.model_name = "synthetic-GLM-4.7-Flash";
    p.n_vocab = 154880; p.n_vocab_real = 154856; p.n_ctx = 202752;
    p.n_embd = 2048; p.n_layer = 47; p.n_head = 20; p.n_ff = 10240;
    p.n_expert = 64; p.n_expert_used = 4; p.n_ff_exp = 1536; p.n_expert_shared = 1;
    p.n_leading_dense = 1; p.n_group = 1; p.n_group_used = 1; p.gating = 2;
    p.weights_scale = 1.8f; p.weights_norm = true; p.has_weights_norm_key = true; p.exp_probs_b = true;
    p.q_lora_rank = 768; p.kv_lora_rank = 512; p.qk_nope = 192; p.qk_rope = 64; p.v_head = 256;
    p.rope_base = 1e6f; p.rms_eps = 1e-5f;
    p.tok_pre = "glm4";
    p.controls = {{154820, "<|endoftext|>"}, {154821, "[MASK]"}, {154822, "[gMASK]"}, {154823, "[sMASK]"},
                  {154824, "<sop>"}, {154825, "<eop>"}, {154826, "<|system|>"}, {154827, "<|user|>"},
                  {154828, "<|assistant|>"}, {154829, "<|observation|>"}};
    p.bos = 154822; p.eos = 154820; p.pad = 154820;
    p.chat_template = kGlmChat;
    v.push_back(p);
  }
  {  // gpt-oss-20b: alternating sliding-window attention, attention sinks, MXFP4 experts
    SynthPreset p;
    p.name = "gpt-oss-20b"; p.arch = "gpt-oss"; p.model_name = "synthetic-gpt-oss-20b";
    p.n_vocab = 201088; p.n_vocab_real = 200019; p.n_ctx = 131072;
    p.n_embd = 2880; p.n_layer = 24; p.n_head = 64; p.n_head_kv = 8; p.head_dim = 64;
    p.n_ff = 2880; p.n_expert = 32; p.n_expert_used = 4; p.n_ff_exp = 2880;
    p.sliding_window = 128;
    p.rope_base = 150000.0f; p.rms_eps = 1e-5f;
    p.rope_scaling = "yarn"; p.rope_factor = 32.0f; p.rope_orig_ctx = 4096;
    p.tok_pre = "gpt-4o";
    p.controls = {{199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
                  {200003, "<|constrain|>"}, {200005, "<|channel|>"}, {200006, "<|start|>"},
                  {200007, "<|end|>"}, {200008, "<|message|>"}, {200012, "<|call|>"}};
    p.bos = 199998; p.eos = 200002; p.pad = 199999;
    p.chat_template = kHarmonyChat;
    v.push_back(p);
  }
  return v;
}

const std::vector<SynthPreset> &synth_presets() {
  static const std::vector<SynthPreset> presets = make_presets();
  return presets;
}

const SynthPreset &synth_preset(const std::string &name) {
  for (const auto &p : synth_presets())
    if (p.name == name) return p;
  std::string names;
  for (const auto &p : synth_presets()) names += (names.empty() ? "" : ", ") + p.name;
  fail(Status::InvalidArgument, "unknown synthetic model preset '%s' (known: %s)", name.c_str(), names.c_str());
}

}  // namespace moe
