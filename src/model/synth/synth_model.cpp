#include "model/synth/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/synth/synth_plan.h"
#include "model/synth/synth_preset.h"
#include "model/synth/synth_vocab.h"

namespace moe {

uint64_t SynthTensorInfo::n_elements() const {
  uint64_t n = 1;
  for (int64_t d : ne) n *= uint64_t(d);
  return n;
}

std::vector<std::string> synthetic_presets() {
  std::vector<std::string> v;
  for (const auto &p : synth_presets()) v.push_back(p.name);
  return v;
}

bool is_synthetic_preset(const std::string &name) {
  for (const auto &p : synth_presets())
    if (p.name == name) return true;
  return false;
}

std::vector<std::string> synthetic_type_mixes() {
  return {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "mxfp4",
          "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m",
          "iq1_s"};
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string &s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) { h ^= c; h *= 0x100000001b3ull; }
  return h;
}

// xorshift64* stream; normals by Box-Muller (two per draw pair).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(splitmix64(seed) | 1) {}
  uint64_t next() { s ^= s >> 12; s ^= s << 25; s ^= s >> 27; return s * 0x2545F4914F6CDD1Dull; }
  void normals(float *out, int64_t n, float scale) {
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      uint64_t r = next();
      float u1 = (float((r >> 40) & 0xFFFFFF) + 0.5f) * (1.0f / 16777216.0f);
      float u2 = float((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
      float rad = std::sqrt(-2.0f * std::log(u1)) * scale;
      out[i] = rad * std::cos(6.2831853f * u2);
      out[i + 1] = rad * std::sin(6.2831853f * u2);
    }
    if (i < n) { float t[2]; normals(t, 2, scale); out[i] = t[0]; }
  }
};

void fill_values(const PlannedTensor &t, Rng &rng, float *x, int64_t n) {
  if (t.init == SynthInit::Uniform) {
    for (int64_t k = 0; k < n; ++k) x[k] = t.lo + (t.hi - t.lo) * float((rng.next() >> 40) & 0xFFFFFF) * (1.0f / 16777216.0f);
    return;
  }
  rng.normals(x, n, t.scale);
  if (t.init == SynthInit::Norm)
    for (int64_t k = 0; k < n; ++k) x[k] += 1.0f;
}

int thread_count(int requested) {
  if (requested > 0) return requested;
  unsigned hc = std::thread::hardware_concurrency();
  return hc ? int(std::min(hc, 64u)) : 1;
}

// Run fn(begin, end) over [0, n) split across threads; rethrows the first failure.
template <typename Fn> void parallel_for(int64_t n, int threads, int64_t min_per_thread, Fn fn) {
  int t = int(std::max<int64_t>(1, std::min<int64_t>(threads, n / std::max<int64_t>(1, min_per_thread))));
  if (t <= 1) { fn(int64_t(0), n); return; }
  std::vector<std::thread> pool;
  std::exception_ptr err;
  std::mutex mu;
  for (int k = 0; k < t; ++k) {
    int64_t b = n * k / t, e = n * (k + 1) / t;
    pool.emplace_back([&, b, e] {
      try { fn(b, e); } catch (...) { std::lock_guard<std::mutex> l(mu); if (!err) err = std::current_exception(); }
    });
  }
  for (auto &th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

// Streams one tensor's bytes. Exact mode: row r is drawn from Rng(seed, name, r) and quantized.
// Pool mode: unit k (one quantization block, or 32 plain values) copies pool[hash(k) % P].
struct TensorSource {
  PlannedTensor t;
  uint64_t seed;
  int threads;
  bool pool_mode;
  int64_t ne0 = 0, n_rows = 0;
  size_t row_bytes = 0;
  // pool mode
  int64_t unit = 0;
  size_t unit_bytes = 0;
  std::vector<uint8_t> pool;
  static constexpr int64_t kPool = 4096;

  TensorSource(const PlannedTensor &pt, uint64_t s, int th, bool fast, uint64_t pool_min) : t(pt), threads(th) {
    seed = splitmix64(s ^ hash_name(pt.info.name));
    ne0 = pt.info.ne[0];
    n_rows = int64_t(pt.info.n_elements() / uint64_t(ne0));
    row_bytes = row_size(pt.info.type, ne0);
    const TypeTraits &tr = type_traits(pt.info.type);
    unit = tr.is_quantized ? tr.block_size : 32;
    pool_mode = fast && pt.info.n_elements() >= pool_min && ne0 % unit == 0;
    unit_bytes = row_size(pt.info.type, unit);
  }

  void make_row(int64_t r, uint8_t *dst, std::vector<float> &buf) const {
    Rng rng(seed ^ splitmix64(uint64_t(r) + 0x51ED2705ull));
    buf.resize(size_t(ne0));
    fill_values(t, rng, buf.data(), ne0);
    quantize_row(t.info.type, buf.data(), dst, ne0);
  }

  void build_pool() {
    pool.resize(size_t(kPool) * unit_bytes);
    parallel_for(kPool, threads, 256, [&](int64_t b, int64_t e) {
      std::vector<float> buf(static_cast<size_t>(unit));
      for (int64_t k = b; k < e; ++k) {
        Rng rng(seed ^ splitmix64(uint64_t(k) ^ 0xA5A5A5A5ull));
        fill_values(t, rng, buf.data(), unit);
        quantize_row(t.info.type, buf.data(), pool.data() + size_t(k) * unit_bytes, unit);
      }
    });
  }

  void fill(uint8_t *dst, size_t off, size_t n) {
    if (pool_mode) {
      if (pool.empty()) build_pool();
      size_t first = off / unit_bytes, last = (off + n - 1) / unit_bytes;
      for (size_t k = first; k <= last; ++k) {
        const uint8_t *src = pool.data() + (splitmix64(seed + k) % uint64_t(kPool)) * unit_bytes;
        size_t u0 = k * unit_bytes, a = std::max(u0, off), b = std::min(u0 + unit_bytes, off + n);
        std::memcpy(dst + (a - off), src + (a - u0), b - a);
      }
      // Chunks arrive in order: after the last one the pool is dead weight (hundreds of
      // tensors would otherwise keep ~0.5 MiB each until the file is closed).
      if (off + n >= size_t(t.info.nbytes)) std::vector<uint8_t>().swap(pool);
      return;
    }
    const int64_t r0 = int64_t(off / row_bytes), r1 = int64_t((off + n - 1) / row_bytes) + 1;
    parallel_for(r1 - r0, threads, 16, [&](int64_t b, int64_t e) {
      std::vector<float> buf;
      std::vector<uint8_t> tmp(row_bytes);
      for (int64_t r = r0 + b; r < r0 + e; ++r) {
        size_t s0 = size_t(r) * row_bytes, lo = std::max(s0, off), hi = std::min(s0 + row_bytes, off + n);
        if (lo == s0 && hi == s0 + row_bytes) {
          make_row(r, dst + (s0 - off), buf);
        } else {
          make_row(r, tmp.data(), buf);
          std::memcpy(dst + (lo - off), tmp.data() + (lo - s0), hi - lo);
        }
      }
    });
  }
};

struct Prepared {
  SynthPreset preset;  // the named preset, with spec.n_layer applied
  SynthVocab vocab;
  std::vector<PlannedTensor> tensors;
};

Prepared prepare(const SynthSpec &spec) {
  Prepared pr;
  pr.preset = synth_preset(spec.preset);
  if (spec.n_layer > 0) pr.preset.n_layer = spec.n_layer;
  if (!spec.vocab_json.empty()) pr.vocab = load_hf_vocab(spec.vocab_json, pr.preset);
  else pr.vocab = make_synthetic_vocab(pr.preset);
  pr.tensors = plan_tensors(pr.preset, spec.type_mix, uint32_t(pr.vocab.tokens.size()));
  return pr;
}

void set_metadata(GgufWriter &w, const SynthSpec &spec, const Prepared &pr) {
  const SynthPreset &p = pr.preset;
  const std::string a = p.arch + ".";
  auto u32 = [&](const std::string &k, uint32_t v) { w.set(a + k, GgufValue::make_u32(v)); };
  auto f32 = [&](const std::string &k, float v) { w.set(a + k, GgufValue::make_f32(v)); };
  w.set("general.architecture", GgufValue::make_str(p.arch));
  w.set("general.name", GgufValue::make_str(p.model_name));
  w.set("general.file_type", GgufValue::make_u32(mix_file_type(spec.type_mix)));
  u32("block_count", p.n_layer);
  u32("context_length", p.n_ctx);
  u32("embedding_length", p.n_embd);
  if (p.n_ff) u32("feed_forward_length", p.n_ff);
  u32("attention.head_count", p.n_head);
  u32("attention.head_count_kv", p.arch == "deepseek2" ? 1u : p.n_head_kv);
  if (!p.rope_sections.empty()) w.set(a + "rope.dimension_sections", GgufValue::make_i32_array(p.rope_sections));
  f32("rope.freq_base", p.rope_base);
  f32("attention.layer_norm_rms_epsilon", p.rms_eps);
  u32("expert_count", p.n_expert);
  u32("expert_used_count", p.n_expert_used);
  if (p.arch == "deepseek2") {
    if (p.n_group) { u32("expert_group_count", p.n_group); u32("expert_group_used_count", p.n_group_used); }
    if (p.gating) u32("expert_gating_func", p.gating);
    u32("leading_dense_block_count", p.n_leading_dense);
    u32("vocab_size", uint32_t(pr.vocab.tokens.size()));
    if (p.q_lora_rank) u32("attention.q_lora_rank", p.q_lora_rank);
    u32("attention.kv_lora_rank", p.kv_lora_rank);
    // Split-MLA layout: the cache holds the latent (kv_lora + rope) for K and kv_lora for V.
    u32("attention.key_length", p.kv_lora_rank + p.qk_rope);
    u32("attention.value_length", p.kv_lora_rank);
    u32("attention.key_length_mla", p.qk_nope + p.qk_rope);
    u32("attention.value_length_mla", p.v_head);
    u32("expert_feed_forward_length", p.n_ff_exp);
    u32("expert_shared_count", p.n_expert_shared);
    if (p.weights_scale > 0) f32("expert_weights_scale", p.weights_scale);
    if (p.has_weights_norm_key) w.set(a + "expert_weights_norm", GgufValue::make_bool(p.weights_norm));
    u32("rope.dimension_count", p.qk_rope);
  } else {
    u32("attention.key_length", p.head_dim);
    u32("attention.value_length", p.head_dim);
    if (p.sliding_window) u32("attention.sliding_window", p.sliding_window);
    u32("expert_feed_forward_length", p.n_ff_exp);
  }
  if (p.full_attn_interval) {  // qwen3next / qwen35moe
    u32("expert_shared_feed_forward_length", p.n_ff_shexp);
    u32("ssm.conv_kernel", p.ssm_conv);
    u32("ssm.state_size", p.ssm_state);
    u32("ssm.group_count", p.ssm_k_heads);
    u32("ssm.time_step_rank", p.ssm_v_heads);
    u32("ssm.inner_size", p.ssm_state * p.ssm_v_heads);
    u32("full_attention_interval", p.full_attn_interval);
  }
  if (p.n_rot) u32("rope.dimension_count", p.n_rot);
  if (p.rope_scaling == "yarn") {
    w.set(a + "rope.scaling.type", GgufValue::make_str("yarn"));
    f32("rope.scaling.factor", p.rope_factor);
    u32("rope.scaling.original_context_length", p.rope_orig_ctx);
    if (p.yarn_log_mul > 0) f32("rope.scaling.yarn_log_multiplier", p.yarn_log_mul);
  }
  const SynthVocab &v = pr.vocab;
  w.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::make_str(p.tok_pre));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(v.tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(v.types));
  w.set("tokenizer.ggml.merges", GgufValue::make_str_array(v.merges));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::make_u32(v.bos));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(v.eos));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::make_u32(v.pad));
  if (p.add_bos >= 0) w.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(p.add_bos != 0));
  if (p.add_eos >= 0) w.set("tokenizer.ggml.add_eos_token", GgufValue::make_bool(p.add_eos != 0));
  if (!p.chat_template.empty()) w.set("tokenizer.chat_template", GgufValue::make_str(p.chat_template));
  bool quantized = false;
  for (const auto &t : pr.tensors) quantized |= type_traits(t.info.type).is_quantized;
  if (quantized) w.set("general.quantization_version", GgufValue::make_u32(2));
}

void build_writer(GgufWriter &w, const SynthSpec &spec, const Prepared &pr, bool with_data) {
  set_metadata(w, spec, pr);
  const int threads = thread_count(spec.n_threads);
  for (const auto &t : pr.tensors) {
    GgufWriter::FillFn fill;
    if (with_data) {
      auto src = std::make_shared<TensorSource>(t, spec.seed, threads, spec.fast, spec.pool_min_elements);
      fill = [src](uint8_t *dst, size_t off, size_t n) { src->fill(dst, off, n); };
    } else {
      fill = [](uint8_t *, size_t, size_t) {};
    }
    w.add_tensor_streamed(t.info.name, t.info.type, t.info.ne, std::move(fill));
  }
}

}  // namespace

std::vector<SynthTensorInfo> synthetic_model_plan(const SynthSpec &spec) {
  Prepared pr = prepare(spec);
  std::vector<SynthTensorInfo> out;
  for (const auto &t : pr.tensors) out.push_back(t.info);
  return out;
}

uint64_t synthetic_model_size(const SynthSpec &spec) {
  Prepared pr = prepare(spec);
  GgufWriter w;
  build_writer(w, spec, pr, false);
  return w.total_bytes();
}

std::vector<std::string> synthetic_model_keys(const SynthSpec &spec) {
  Prepared pr = prepare(spec);
  GgufWriter w;
  set_metadata(w, spec, pr);  // metadata only: no tensors, so the image stays small
  auto bytes = w.write_memory();
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  std::vector<std::string> keys;
  for (const auto &kv : f->metadata()) keys.push_back(kv.first);
  return keys;
}

std::vector<std::string> write_synthetic_model(const SynthSpec &spec, const std::string &path,
                                               const std::function<bool(uint64_t, uint64_t)> &progress) {
  Prepared pr = prepare(spec);
  // Quantized types whose quantizer is missing fail here, before any byte is written.
  for (const auto &t : pr.tensors)
    if (!type_traits(t.info.type).supported)
      fail(Status::Unsupported, "type mix %s: tensor %s needs %s, which has no quantizer yet",
           spec.type_mix.c_str(), t.info.name.c_str(), dtype_name(t.info.type));
  GgufWriter w;
  build_writer(w, spec, pr, true);
  if (spec.split_max_bytes > 0) {
    const bool ext = path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
    return w.write_split(ext ? path.substr(0, path.size() - 5) : path, spec.split_max_bytes, progress);
  }
  w.write_file(path, progress);
  return {path};
}

}  // namespace moe
