#include "model/synth/synth_plan.h"

#include <cmath>
#include <cstdio>

#include "core/status.h"

namespace moe {

namespace {

struct MixInfo { const char *name; uint32_t ftype; DType base; };
const MixInfo kMixes[] = {
    {"f32", 0, DType::F32},    {"f16", 1, DType::F16},    {"bf16", 32, DType::BF16},
    {"q4_0", 2, DType::Q4_0},  {"q8_0", 7, DType::Q8_0},  {"q4_k_m", 15, DType::Q4_K},
    {"q5_k_m", 17, DType::Q5_K}, {"q6_k", 18, DType::Q6_K}, {"mxfp4", 38, DType::Q8_0},
    {"q4_1", 3, DType::Q4_1},  {"q5_0", 8, DType::Q5_0},  {"q5_1", 9, DType::Q5_1},
    {"iq4_nl", 25, DType::IQ4_NL}, {"iq4_xs", 30, DType::IQ4_XS}, {"iq3_s", 26, DType::IQ3_S},
    {"iq3_xxs", 23, DType::IQ3_XXS}, {"iq2_s", 28, DType::IQ2_S}, {"iq2_xs", 20, DType::IQ2_XS},
    {"iq2_xxs", 19, DType::IQ2_XXS}, {"iq1_m", 31, DType::IQ1_M}, {"iq1_s", 24, DType::IQ1_S},
};

const MixInfo &mix_info(const std::string &mix) {
  for (const auto &m : kMixes)
    if (mix == m.name) return m;
  std::string names;
  for (const auto &m : kMixes) names += std::string(names.empty() ? "" : ", ") + m.name;
  fail(Status::InvalidArgument, "unknown type mix '%s' (known: %s)", mix.c_str(), names.c_str());
}

bool ends_with(const std::string &s, const char *suffix) {
  size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
bool has(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

// llama.cpp's use_more_bits: first and last eighth, and every third layer in between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int layer_of(const std::string &name) {
  int i = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &i) != 1) return -1;
  return i;
}

// Type of an incompatible row length, as llama.cpp falls back (Q5_0/Q5_1 have no quantizer
// here: Q8_0 instead).
DType fallback(DType t, int64_t ne0) {
  if (ne0 % type_traits(t).block_size == 0) return t;
  DType f = DType::F16;
  switch (t) {
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q4_0: f = DType::Q8_0; break;
    case DType::IQ4_XS: case DType::IQ3_S: case DType::IQ3_XXS: case DType::IQ2_S: case DType::IQ2_XS:
    case DType::IQ2_XXS: case DType::IQ1_M: case DType::IQ1_S: f = DType::IQ4_NL; break;
    default: f = DType::F16; break;
  }
  if (ne0 % type_traits(f).block_size != 0) f = DType::F16;
  return f;
}

struct Builder {
  std::vector<PlannedTensor> out;
  void add(const std::string &name, std::vector<int64_t> ne, SynthInit init, float scale) {
    PlannedTensor t;
    t.info.name = name;
    t.info.ne = std::move(ne);
    t.info.type = DType::F32;
    t.init = init;
    t.scale = scale;
    out.push_back(std::move(t));
  }
  void mat(const std::string &name, std::vector<int64_t> ne) {
    float s = 1.0f / std::sqrt(float(ne[0]));
    add(name, std::move(ne), SynthInit::Matrix, s);
  }
  void norm(const std::string &name, int64_t n) { add(name, {n}, SynthInit::Norm, 0.1f); }
  void bias(const std::string &name, std::vector<int64_t> ne, float s = 0.02f) { add(name, std::move(ne), SynthInit::Bias, s); }
  void uniform(const std::string &name, int64_t n, float lo, float hi) {
    add(name, {n}, SynthInit::Uniform, 0.0f);
    out.back().lo = lo;
    out.back().hi = hi;
  }
};

std::string blk(uint32_t i, const char *rest) { return "blk." + std::to_string(i) + "." + rest; }

void plan_qwen3moe(Builder &b, const SynthPreset &p) {
  const int64_t E = p.n_embd, D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv, F = p.n_ff_exp, X = p.n_expert;
  for (uint32_t i = 0; i < p.n_layer; ++i) {
    b.norm(blk(i, "attn_norm.weight"), E);
    b.mat(blk(i, "attn_q.weight"), {E, H * D});
    b.mat(blk(i, "attn_k.weight"), {E, Hkv * D});
    b.mat(blk(i, "attn_v.weight"), {E, Hkv * D});
    b.mat(blk(i, "attn_output.weight"), {H * D, E});
    b.norm(blk(i, "attn_q_norm.weight"), D);
    b.norm(blk(i, "attn_k_norm.weight"), D);
    b.norm(blk(i, "ffn_norm.weight"), E);
    b.mat(blk(i, "ffn_gate_inp.weight"), {E, X});
    b.mat(blk(i, "ffn_gate_exps.weight"), {E, F, X});
    b.mat(blk(i, "ffn_up_exps.weight"), {E, F, X});
    b.mat(blk(i, "ffn_down_exps.weight"), {F, E, X});
  }
}

void plan_deepseek2(Builder &b, const SynthPreset &p) {
  const int64_t E = p.n_embd, H = p.n_head, X = p.n_expert, Fe = p.n_ff_exp;
  const int64_t kv = p.kv_lora_rank, nope = p.qk_nope, rope = p.qk_rope, vh = p.v_head, ql = p.q_lora_rank;
  const int64_t Fs = Fe * p.n_expert_shared;
  for (uint32_t i = 0; i < p.n_layer; ++i) {
    b.norm(blk(i, "attn_norm.weight"), E);
    if (ql) b.norm(blk(i, "attn_q_a_norm.weight"), ql);
    b.norm(blk(i, "attn_kv_a_norm.weight"), kv);
    if (ql) {
      b.mat(blk(i, "attn_q_a.weight"), {E, ql});
      b.mat(blk(i, "attn_q_b.weight"), {ql, H * (nope + rope)});
    } else {
      b.mat(blk(i, "attn_q.weight"), {E, H * (nope + rope)});
    }
    b.mat(blk(i, "attn_kv_a_mqa.weight"), {E, kv + rope});
    b.mat(blk(i, "attn_k_b.weight"), {nope, kv, H});
    b.mat(blk(i, "attn_v_b.weight"), {kv, vh, H});
    b.mat(blk(i, "attn_output.weight"), {H * vh, E});
    b.norm(blk(i, "ffn_norm.weight"), E);
    if (i < p.n_leading_dense) {
      b.mat(blk(i, "ffn_gate.weight"), {E, p.n_ff});
      b.mat(blk(i, "ffn_up.weight"), {E, p.n_ff});
      b.mat(blk(i, "ffn_down.weight"), {p.n_ff, E});
      continue;
    }
    b.mat(blk(i, "ffn_gate_inp.weight"), {E, X});
    if (p.exp_probs_b) b.bias(blk(i, "exp_probs_b.bias"), {X}, 0.01f);
    b.mat(blk(i, "ffn_gate_exps.weight"), {E, Fe, X});
    b.mat(blk(i, "ffn_up_exps.weight"), {E, Fe, X});
    b.mat(blk(i, "ffn_down_exps.weight"), {Fe, E, X});
    if (Fs) {
      b.mat(blk(i, "ffn_gate_shexp.weight"), {E, Fs});
      b.mat(blk(i, "ffn_up_shexp.weight"), {E, Fs});
      b.mat(blk(i, "ffn_down_shexp.weight"), {Fs, E});
    }
  }
}

void plan_gpt_oss(Builder &b, const SynthPreset &p) {
  const int64_t E = p.n_embd, D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv, F = p.n_ff_exp, X = p.n_expert;
  for (uint32_t i = 0; i < p.n_layer; ++i) {
    b.norm(blk(i, "attn_norm.weight"), E);
    b.norm(blk(i, "post_attention_norm.weight"), E);
    b.mat(blk(i, "attn_q.weight"), {E, H * D});
    b.bias(blk(i, "attn_q.bias"), {H * D});
    b.mat(blk(i, "attn_k.weight"), {E, Hkv * D});
    b.bias(blk(i, "attn_k.bias"), {Hkv * D});
    b.mat(blk(i, "attn_v.weight"), {E, Hkv * D});
    b.bias(blk(i, "attn_v.bias"), {Hkv * D});
    b.mat(blk(i, "attn_output.weight"), {H * D, E});
    b.bias(blk(i, "attn_output.bias"), {E});
    b.bias(blk(i, "attn_sinks.weight"), {H}, 1.0f);
    b.mat(blk(i, "ffn_gate_inp.weight"), {E, X});
    b.bias(blk(i, "ffn_gate_inp.bias"), {X});
    b.mat(blk(i, "ffn_gate_exps.weight"), {E, F, X});
    b.bias(blk(i, "ffn_gate_exps.bias"), {F, X});
    b.mat(blk(i, "ffn_up_exps.weight"), {E, F, X});
    b.bias(blk(i, "ffn_up_exps.bias"), {F, X});
    b.mat(blk(i, "ffn_down_exps.weight"), {F, E, X});
    b.bias(blk(i, "ffn_down_exps.bias"), {E, X});
  }
}

// qwen3next / qwen35moe, with the shapes src/model/arch/qwen3next.cpp requires. DeltaNet
// values keep the recurrence stable: ssm_a = -exp(A_log) in [-1, -0.05] so each step's decay
// exp(ssm_a * softplus(alpha + dt_bias)) lies in (0, 1); the conv's four taps are N(0, 1/4) so
// it neither grows nor kills the signal; q and k are L2-normalised by the graph.
void plan_hybrid(Builder &b, const SynthPreset &p) {
  const int64_t E = p.n_embd, D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv, F = p.n_ff_exp, X = p.n_expert;
  const int64_t d = p.ssm_state, nk = p.ssm_k_heads, nv = p.ssm_v_heads, key_dim = d * nk, value_dim = d * nv;
  const int64_t conv_dim = 2 * key_dim + value_dim, Fs = p.n_ff_shexp;
  for (uint32_t i = 0; i < p.n_layer; ++i) {
    b.norm(blk(i, "attn_norm.weight"), E);
    b.norm(blk(i, "post_attention_norm.weight"), E);
    if ((i + 1) % p.full_attn_interval == 0) {
      b.mat(blk(i, "attn_q.weight"), {E, 2 * D * H});  // per head [q | output gate]
      b.mat(blk(i, "attn_k.weight"), {E, D * Hkv});
      b.mat(blk(i, "attn_v.weight"), {E, D * Hkv});
      b.mat(blk(i, "attn_output.weight"), {D * H, E});
      b.norm(blk(i, "attn_q_norm.weight"), D);
      b.norm(blk(i, "attn_k_norm.weight"), D);
    } else {
      b.mat(blk(i, "attn_qkv.weight"), {E, conv_dim});
      b.mat(blk(i, "attn_gate.weight"), {E, value_dim});
      b.mat(blk(i, "ssm_conv1d.weight"), {int64_t(p.ssm_conv), conv_dim});
      b.uniform(blk(i, "ssm_dt.bias"), nv, -1.0f, 1.0f);
      b.uniform(blk(i, "ssm_a"), nv, -1.0f, -0.05f);
      if (p.arch == "qwen3next") {
        b.mat(blk(i, "ssm_ba.weight"), {E, 2 * nv});
      } else {
        b.mat(blk(i, "ssm_beta.weight"), {E, nv});
        b.mat(blk(i, "ssm_alpha.weight"), {E, nv});
      }
      b.norm(blk(i, "ssm_norm.weight"), d);
      b.mat(blk(i, "ssm_out.weight"), {value_dim, E});
    }
    b.mat(blk(i, "ffn_gate_inp.weight"), {E, X});
    b.mat(blk(i, "ffn_gate_exps.weight"), {E, F, X});
    b.mat(blk(i, "ffn_up_exps.weight"), {E, F, X});
    b.mat(blk(i, "ffn_down_exps.weight"), {F, E, X});
    b.mat(blk(i, "ffn_gate_inp_shexp.weight"), {E, 1});
    b.mat(blk(i, "ffn_gate_shexp.weight"), {E, Fs});
    b.mat(blk(i, "ffn_up_shexp.weight"), {E, Fs});
    b.mat(blk(i, "ffn_down_shexp.weight"), {Fs, E});
  }
}

// ggml_n_dims: trailing dimensions of 1 do not count ({n, 1} is one-dimensional).
size_t n_dims(const std::vector<int64_t> &ne) {
  size_t n = ne.size();
  while (n > 1 && ne[n - 1] == 1) --n;
  return n;
}

// attn_v and the tensors llama.cpp's quantizer files with it (fused qkv: the DeltaNet input).
bool attn_v_like(const std::string &name) { return has(name, "attn_v.weight") || has(name, "attn_qkv.weight"); }

// Mirrors llama_tensor_get_type for the mixes we offer (MoE models; n_expert > 1).
void assign_types(std::vector<PlannedTensor> &ts, const SynthPreset &p, const std::string &mix) {
  const MixInfo &m = mix_info(mix);
  const bool k_mix = mix == "q4_k_m" || mix == "q5_k_m";
  // i_attn_v counts attn_v-like tensors in layer order (llama.cpp sorts tensors by block);
  // use_more_bits of ffn_down sees the block index out of n_layer.
  int n_attn_v = 0, i_attn_v = 0;
  const int n_ffn_down = int(p.n_layer);
  bool has_output = false;
  for (auto &t : ts) {
    n_attn_v += attn_v_like(t.info.name);
    has_output |= t.info.name == "output.weight";
  }
  for (auto &t : ts) {
    const std::string &name = t.info.name;
    const int64_t ne0 = t.info.ne[0];
    // Not quantized (tensor_allows_quantization): 1-D tensors (ffn_gate_inp_shexp {n, 1} too),
    // norms, routers, sinks, and the small DeltaNet conv (as the converter writes them: F32).
    const bool keep_f32 = n_dims(t.info.ne) < 2 || !ends_with(name, "weight") || has(name, "_norm.weight") ||
                          has(name, "ffn_gate_inp.weight") || has(name, "attn_sinks") || has(name, "ssm_conv1d");
    DType ty = m.base;
    if (keep_f32) {
      ty = DType::F32;
    } else if ((p.arch == "gpt-oss" || mix == "mxfp4") && has(name, "_exps.weight")) {
      ty = DType::MXFP4;  // gpt-oss: as the released checkpoints ship them, whatever the mix
    } else if (m.base == DType::F32 || m.base == DType::F16 || m.base == DType::BF16) {
      ty = m.base;
    } else if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
      ty = ne0 % type_traits(m.base).block_size ? DType::Q8_0 : (m.base == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K);
      if (mix == "q4_0") ty = ne0 % 256 ? DType::Q8_0 : DType::Q6_K;
    } else if (attn_v_like(name)) {
      // The DeltaNet attn_qkv shares attn_v's class (category_is_attn_v) and its counter, so
      // Q4_K_M gives the first and last eighth of the blocks and every third between Q6_K.
      if (k_mix && use_more_bits(i_attn_v, n_attn_v)) ty = DType::Q6_K;
      if (p.n_expert == 8 && m.base != DType::Q8_0) ty = DType::Q8_0;
      ++i_attn_v;
    } else if (has(name, "attn_k.weight")) {
      if (p.n_expert == 8 && m.base != DType::Q8_0) ty = DType::Q8_0;
    } else if (has(name, "ffn_down")) {
      if (k_mix && use_more_bits(layer_of(name), n_ffn_down)) ty = DType::Q6_K;
    } else if (has(name, "attn_output.weight")) {
      if (mix == "q4_k_m" && p.n_expert == 8) ty = DType::Q5_K;
    }
    if (!keep_f32) ty = fallback(ty, ne0);
    t.info.type = ty;
    uint64_t n = t.info.n_elements();
    t.info.nbytes = n / uint64_t(type_traits(ty).block_size) * type_traits(ty).type_size;
  }
}

}  // namespace

uint32_t mix_file_type(const std::string &mix) { return mix_info(mix).ftype; }

std::vector<PlannedTensor> plan_tensors(const SynthPreset &p, const std::string &mix, uint32_t n_vocab) {
  mix_info(mix);  // validate early
  Builder b;
  const int64_t E = p.n_embd, V = n_vocab;
  b.add("token_embd.weight", {E, V}, SynthInit::Matrix, 1.0f);
  b.norm("output_norm.weight", E);
  if (!p.tied) b.add("output.weight", {E, V}, SynthInit::Matrix, 2.0f / std::sqrt(float(E)));
  if (p.arch == "qwen3moe") plan_qwen3moe(b, p);
  else if (p.arch == "deepseek2") plan_deepseek2(b, p);
  else if (p.arch == "gpt-oss") plan_gpt_oss(b, p);
  else if (p.arch == "qwen3next" || p.arch == "qwen35moe") plan_hybrid(b, p);
  else fail(Status::Internal, "preset %s: no tensor plan for arch %s", p.name.c_str(), p.arch.c_str());
  assign_types(b.out, p, mix);
  return b.out;
}

}  // namespace moe
