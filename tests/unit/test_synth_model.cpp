// Synthetic model generator: the files read back with the exact names, shapes, types and
// metadata of the architecture, finite weights, deterministic bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "gguf/gguf_reader.h"
#include "model/synth/synth_model.h"
#include "model/synth/synth_plan.h"
#include "model/synth/synth_preset.h"
#include "model/synth/synth_vocab.h"

using namespace moe;

namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::string &stem)
      : path((std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))).string()) {}
  ~TempFile() { std::remove(path.c_str()); }
};

std::vector<uint8_t> slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

size_t count_nonfinite(const GgufTensorInfo &t) {
  const int64_t ne0 = t.ne[0], rows = t.n_elements() / ne0;
  const size_t rb = row_size(t.type, ne0);
  std::vector<float> row(static_cast<size_t>(ne0));
  size_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, t.data + size_t(r) * rb, row.data(), ne0);
    for (float v : row) bad += !std::isfinite(v);
  }
  return bad;
}

}  // namespace

TEST_CASE("synth: tiny f16 reads back with the qwen3moe names, shapes and keys", "[synth]") {
  SynthSpec spec;
  spec.preset = "tiny";
  TempFile tmp("moe-synth-tiny.gguf");
  uint64_t reported = 0;
  write_synthetic_model(spec, tmp.path, [&](uint64_t done, uint64_t) { reported = done; return true; });
  CHECK(reported > 0);
  auto f = GgufFile::open(tmp.path);
  CHECK(f->file_size() == synthetic_model_size(spec));

  // The key set of the real qwen3moe conformance file (less nothing, plus nothing unknown).
  const std::set<std::string> want_keys = {
      "general.architecture", "general.name", "general.file_type", "qwen3moe.block_count",
      "qwen3moe.context_length", "qwen3moe.embedding_length", "qwen3moe.feed_forward_length",
      "qwen3moe.attention.head_count", "qwen3moe.attention.head_count_kv", "qwen3moe.rope.freq_base",
      "qwen3moe.attention.layer_norm_rms_epsilon", "qwen3moe.expert_count", "qwen3moe.expert_used_count",
      "qwen3moe.attention.key_length", "qwen3moe.attention.value_length", "qwen3moe.expert_feed_forward_length",
      "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
      "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
      "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"};
  std::set<std::string> keys;
  for (const auto &kv : f->metadata()) keys.insert(kv.first);
  CHECK(keys == want_keys);

  CHECK(f->get_str("general.architecture") == "qwen3moe");
  CHECK(f->get_u32("qwen3moe.block_count") == 2);
  CHECK(f->get_u32("qwen3moe.embedding_length") == 64);
  CHECK(f->get_u32("qwen3moe.attention.head_count") == 4);
  CHECK(f->get_u32("qwen3moe.attention.head_count_kv") == 2);
  CHECK(f->get_u32("qwen3moe.attention.key_length") == 32);
  CHECK(f->get_u32("qwen3moe.expert_count") == 8);
  CHECK(f->get_u32("qwen3moe.expert_used_count") == 2);
  CHECK(f->get_u32("qwen3moe.expert_feed_forward_length") == 32);
  CHECK(f->get_u32("qwen3moe.context_length") == 4096);
  CHECK(f->get_f32("qwen3moe.rope.freq_base") == 1e6f);
  CHECK(f->get_f32("qwen3moe.attention.layer_norm_rms_epsilon") == 1e-6f);
  CHECK(f->get_str("tokenizer.ggml.pre") == "qwen2");
  const GgufValue *tokens = f->find("tokenizer.ggml.tokens");
  REQUIRE(tokens);
  CHECK(tokens->count == 512);
  CHECK(tokens->strs[f->get_u32("tokenizer.ggml.eos_token_id")] == "<|im_end|>");
  CHECK(tokens->strs[f->get_u32("tokenizer.ggml.bos_token_id")] == "<|endoftext|>");

  // Tensor list as llama.cpp names and shapes them; F32 norms and router, F16 the rest.
  std::set<std::string> names;
  for (const auto &t : f->tensors()) names.insert(t.name);
  CHECK(f->tensors().size() == 3 + 2 * 12);
  CHECK(names.count("output.weight") == 1);
  const GgufTensorInfo *emb = f->tensor("token_embd.weight");
  REQUIRE(emb);
  CHECK((emb->ne[0] == 64 && emb->ne[1] == 512 && emb->type == DType::F16));
  const GgufTensorInfo *q = f->tensor("blk.1.attn_q.weight");
  REQUIRE(q);
  CHECK((q->ne[0] == 64 && q->ne[1] == 128));
  const GgufTensorInfo *k = f->tensor("blk.1.attn_k.weight");
  REQUIRE(k);
  CHECK((k->ne[0] == 64 && k->ne[1] == 64));
  const GgufTensorInfo *o = f->tensor("blk.0.attn_output.weight");
  REQUIRE(o);
  CHECK((o->ne[0] == 128 && o->ne[1] == 64));
  const GgufTensorInfo *qn = f->tensor("blk.0.attn_q_norm.weight");
  REQUIRE(qn);
  CHECK((qn->ne[0] == 32 && qn->type == DType::F32));
  const GgufTensorInfo *router = f->tensor("blk.0.ffn_gate_inp.weight");
  REQUIRE(router);
  CHECK((router->ne[0] == 64 && router->ne[1] == 8 && router->type == DType::F32));
  const GgufTensorInfo *down = f->tensor("blk.1.ffn_down_exps.weight");
  REQUIRE(down);
  CHECK((down->ne[0] == 32 && down->ne[1] == 64 && down->ne[2] == 8 && down->type == DType::F16));
  const GgufTensorInfo *up = f->tensor("blk.1.ffn_up_exps.weight");
  REQUIRE(up);
  CHECK((up->ne[0] == 64 && up->ne[1] == 32 && up->ne[2] == 8));

  for (const auto &t : f->tensors()) {
    INFO(t.name);
    CHECK(count_nonfinite(t) == 0);
  }
  // Norm weights sit around 1, matrices around 0 with 1/sqrt(fan_in) spread.
  std::vector<float> norm(64);
  dequantize_row(DType::F32, f->tensor("output_norm.weight")->data, norm.data(), 64);
  double mean = 0;
  for (float v : norm) mean += v / 64.0;
  CHECK(mean == Approx(1.0).margin(0.1));
  std::vector<float> row(64);
  dequantize_row(DType::F16, q->data, row.data(), 64);
  double ss = 0;
  for (float v : row) ss += double(v) * v / 64.0;
  CHECK(std::sqrt(ss) == Approx(0.125).epsilon(0.4));
}

TEST_CASE("synth: quantized mixes write valid blocks and are deterministic per seed", "[synth]") {
  for (const char *mix : {"q8_0", "q4_k_m", "q6_k", "q4_0"}) {
    SynthSpec spec;
    spec.preset = "tiny";
    spec.type_mix = mix;
    TempFile a(std::string("moe-synth-a-") + mix), b(std::string("moe-synth-b-") + mix),
        c(std::string("moe-synth-c-") + mix);
    write_synthetic_model(spec, a.path);
    write_synthetic_model(spec, b.path);
    spec.seed = 2;
    write_synthetic_model(spec, c.path);
    INFO(mix);
    CHECK(slurp(a.path) == slurp(b.path));
    CHECK(slurp(a.path) != slurp(c.path));
    auto f = GgufFile::open(a.path);
    CHECK(f->get_u32("general.quantization_version") == 2);
    for (const auto &t : f->tensors()) {
      INFO(t.name);
      CHECK(count_nonfinite(t) == 0);
      if (t.n_dims == 1 || t.name.find("ffn_gate_inp") != std::string::npos) CHECK(t.type == DType::F32);
      else CHECK(type_traits(t.type).is_quantized);
    }
  }
}

TEST_CASE("synth: q4_k_m follows llama.cpp's type rules (medium preset plan)", "[synth]") {
  SynthSpec spec;
  spec.preset = "medium";
  spec.type_mix = "q4_k_m";
  auto plan = synthetic_model_plan(spec);
  int v6 = 0, d6 = 0, v = 0, d = 0;
  uint64_t params = 0;
  for (const auto &t : plan) {
    params += t.n_elements();
    if (t.name == "output.weight") CHECK(t.type == DType::Q6_K);
    if (t.name == "token_embd.weight") CHECK(t.type == DType::Q4_K);
    if (t.name.find("attn_v.weight") != std::string::npos) { ++v; v6 += t.type == DType::Q6_K; }
    if (t.name.find("ffn_down_exps") != std::string::npos) { ++d; d6 += t.type == DType::Q6_K; }
    if (t.name == "blk.0.ffn_down_exps.weight" || t.name == "blk.15.ffn_down_exps.weight" ||
        t.name == "blk.4.ffn_down_exps.weight")
      CHECK(t.type == DType::Q6_K);
    if (t.name == "blk.2.ffn_down_exps.weight" || t.name == "blk.3.ffn_down_exps.weight") CHECK(t.type == DType::Q4_K);
    if (t.name.find("attn_q.weight") != std::string::npos || t.name.find("ffn_up_exps") != std::string::npos)
      CHECK(t.type == DType::Q4_K);
  }
  CHECK((v == 16 && d == 16));
  CHECK(v6 == 8);  // layers 0,1,4,7,10,13,14,15
  CHECK(d6 == 8);
  CHECK(params / 1e9 == Approx(2.81).margin(0.01));
  const double gib = double(synthetic_model_size(spec)) / double(1ull << 30);
  CHECK(gib == Approx(1.61).margin(0.01));
}

TEST_CASE("synth: every preset plans consistent shapes; 8-expert rules hit attn_k/attn_v", "[synth]") {
  for (const auto &name : synthetic_presets()) {
    SynthSpec spec;
    spec.preset = name;
    spec.type_mix = "q4_k_m";
    INFO(name);
    auto plan = synthetic_model_plan(spec);
    REQUIRE(!plan.empty());
    for (const auto &t : plan) {
      INFO(t.name);
      CHECK(t.ne[0] % type_traits(t.type).block_size == 0);
      if (name == "gpt-oss-20b" && t.name.find("_exps.weight") != std::string::npos) CHECK(t.type == DType::MXFP4);
      if (name == "tiny" && (t.name.find("attn_v.weight") != std::string::npos ||
                             t.name.find("attn_k.weight") != std::string::npos))
        CHECK(t.type == DType::Q8_0);
    }
  }
  SynthSpec unknown;
  unknown.preset = "no-such-model";
  CHECK_THROWS_AS(synthetic_model_plan(unknown), Error);
  SynthSpec bad;
  bad.preset = "tiny";
  bad.type_mix = "q3_z";
  CHECK_THROWS_AS(synthetic_model_plan(bad), Error);
}

TEST_CASE("synth: generated vocab is a valid byte-level BPE", "[synth]") {
  const SynthPreset p = synth_preset("tiny");  // a copy: g++ 13 sees a reference bound through a temporary string
  SynthVocab v = make_synthetic_vocab(p);
  REQUIRE(v.tokens.size() == 512);
  std::set<std::string> all(v.tokens.begin(), v.tokens.end());
  CHECK(all.size() == 512);  // no duplicate token texts
  CHECK(v.tokens[0] == "!");
  CHECK(byte_token(' ') == "\xC4\xA0");   // 'Ġ'
  CHECK(byte_token('\n') == "\xC4\x8A");  // 'Ċ'
  for (int b = 0; b < 256; ++b) CHECK(all.count(byte_token(uint8_t(b))) == 1);
  CHECK(v.merges.size() == 512 - 256 - 3);
  for (const auto &m : v.merges) {
    INFO(m);
    size_t sp = m.find(' ');
    REQUIRE(sp != std::string::npos);
    std::string l = m.substr(0, sp), r = m.substr(sp + 1);
    CHECK(all.count(l) == 1);
    CHECK(all.count(r) == 1);
    CHECK(all.count(l + r) == 1);
  }
  CHECK(v.types[511] == kTokControl);
  // A big preset pads to the vocab size with unused fillers after the real tokens.
  SynthVocab q = make_synthetic_vocab(synth_preset("medium"));
  REQUIRE(q.tokens.size() == 151936);
  CHECK(q.tokens[151645] == "<|im_end|>");
  CHECK(q.tokens[151935] == "[PAD151935]");
  CHECK(q.types[151935] == kTokUnused);
  CHECK(q.types[151668] == kTokNormal);
}

TEST_CASE("synth: Hugging Face tokenizer.json is read and padded", "[synth]") {
  TempFile tmp("moe-synth-tokenizer.json");
  {
    std::ofstream out(tmp.path);
    out << R"({"added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": true},
                                {"id": 6, "content": "<think>", "special": false}],
              "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u00e9\ud83d\ude00": 4},
                        "merges": ["a b", ["\u0120", "a"]]}})";
  }
  SynthPreset p = synth_preset("tiny");
  SynthVocab v = load_hf_vocab(tmp.path, p);
  REQUIRE(v.tokens.size() == 512);
  CHECK(v.tokens[2] == "ab");
  CHECK(v.tokens[3] == "\xC4\xA0");
  CHECK(v.tokens[4] == "\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(v.types[5] == kTokControl);
  CHECK(v.types[6] == kTokUserDefined);
  CHECK(v.tokens[7] == "[PAD7]");
  CHECK(v.types[7] == kTokUnused);
  CHECK(v.merges == std::vector<std::string>{"a b", "\xC4\xA0 a"});
  CHECK(v.bos == 5);  // preset's "<|endoftext|>" found by text
  CHECK(v.eos == 511);

  SynthSpec spec;
  spec.preset = "tiny";
  spec.vocab_json = tmp.path;
  TempFile model("moe-synth-hfvocab.gguf");
  write_synthetic_model(spec, model.path);
  auto f = GgufFile::open(model.path);
  CHECK(f->find("tokenizer.ggml.tokens")->strs[6] == "<think>");

  std::ofstream(tmp.path) << "{\"model\": {\"vocab\": [1, 2]}}";
  CHECK_THROWS_AS(load_hf_vocab(tmp.path, p), Error);
  std::ofstream(tmp.path) << "{\"model\": {\"vocab\": {\"a\": 0}";
  CHECK_THROWS_AS(load_hf_vocab(tmp.path, p), Error);
}

// Cross-check against the conformance files (real llama.cpp conversions): every metadata key
// and every per-layer tensor suffix we write also appears in the real file of that arch.
TEST_CASE("synth: keys and tensor names are those of the real conformance files", "[synth][conformance]") {
  const std::string dir = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/";
  struct Pair { const char *preset; const char *file; bool exact; };
  const Pair pairs[] = {{"tiny", "qwen3moe-f16.gguf", true},        {"qwen3-30b-a3b", "qwen3moe-f16.gguf", true},
                        {"medium", "qwen3moe-f16.gguf", true},      {"glm-4.7-flash", "deepseek2-f16.gguf", false},
                        {"deepseek-v2-lite", "deepseek2-f16.gguf", false}, {"gpt-oss-20b", "gpt-oss-f16.gguf", true},
                        {"small", "qwen3moe-f16.gguf", true}, {"tiny-deepseek2", "deepseek2-f16.gguf", true},
                        {"tiny-gpt-oss", "gpt-oss-f16.gguf", true}, {"tiny-qwen3next", "qwen3next-f16.gguf", true},
                        {"qwen3-next-80b-a3b", "qwen3next-f16.gguf", true}, {"tiny-qwen35moe", "qwen35moe-f16.gguf", true},
                        {"qwen3.5-35b-a3b", "qwen35moe-f16.gguf", true}};
  for (const auto &pr : pairs) {
    INFO(pr.preset << " vs " << pr.file);
    std::unique_ptr<GgufFile> f;
    try { f = GgufFile::open(dir + pr.file); } catch (const Error &) { WARN("conformance file missing"); continue; }
    std::set<std::string> theirs;
    for (const auto &kv : f->metadata()) theirs.insert(kv.first);
    SynthSpec spec;
    spec.preset = pr.preset;
    std::set<std::string> ours;
    for (const auto &k : synthetic_model_keys(spec)) ours.insert(k);
    for (const auto &k : ours) {
      INFO(k);
      if (k != "general.quantization_version") CHECK(theirs.count(k) == 1);  // written for quantized files
    }
    if (pr.exact) {
      for (const auto &k : theirs) {
        INFO(k);
        CHECK(ours.count(k) == 1);
      }
    }
    auto suffix = [](const std::string &n) {
      if (n.compare(0, 4, "blk.") != 0) return n;
      return n.substr(n.find('.', 4) + 1);
    };
    std::set<std::string> their_suffixes, our_suffixes;
    for (const auto &t : f->tensors()) their_suffixes.insert(suffix(t.name));
    for (const auto &t : synthetic_model_plan(spec)) our_suffixes.insert(suffix(t.name));
    our_suffixes.erase("output.weight");  // the conformance models are tied (except gpt-oss)
    their_suffixes.erase("output.weight");
    if (std::string(pr.preset) == "deepseek-v2-lite") {  // no q low-rank: plain attn_q, as llama.cpp names it
      CHECK(our_suffixes.erase("attn_q.weight") == 1);
      CHECK(our_suffixes.count("attn_q_a.weight") == 0);
    }
    for (const auto &s : our_suffixes) { INFO(s); CHECK(their_suffixes.count(s) == 1); }
    if (pr.exact) CHECK(our_suffixes == their_suffixes);
  }
}

TEST_CASE("synth: pool mode writes valid, varied blocks independent of thread count", "[synth]") {
  SynthSpec spec;
  spec.preset = "small";
  spec.type_mix = "q4_k_m";
  spec.pool_min_elements = 0;  // every tensor from the block pool
  spec.n_threads = 1;
  TempFile a("moe-synth-pool-1"), b("moe-synth-pool-3"), exact("moe-synth-exact");
  write_synthetic_model(spec, a.path);
  spec.n_threads = 3;
  write_synthetic_model(spec, b.path);
  CHECK(slurp(a.path) == slurp(b.path));
  spec.fast = false;
  write_synthetic_model(spec, exact.path);
  CHECK(slurp(a.path) != slurp(exact.path));
  CHECK(slurp(a.path).size() == slurp(exact.path).size());

  auto f = GgufFile::open(a.path);
  bool saw_k = false;
  for (const auto &t : f->tensors()) {
    INFO(t.name);
    CHECK(count_nonfinite(t) == 0);
    saw_k |= t.type == DType::Q4_K;
    // Rows differ from each other (blocks are drawn per position, not one block repeated).
    if (t.n_dims >= 2 && t.ne[1] >= 2) {
      const size_t rb = row_size(t.type, t.ne[0]);
      CHECK(std::memcmp(t.data, t.data + rb, rb) != 0);
    }
  }
  CHECK(saw_k);
}

TEST_CASE("synth: n_layer keeps a preset's per-layer shapes with fewer layers", "[synth]") {
  SynthSpec full;
  full.preset = "qwen3-30b-a3b";
  full.type_mix = "q4_k_m";
  SynthSpec cut = full;
  cut.n_layer = 2;
  const auto a = synthetic_model_plan(full), b = synthetic_model_plan(cut);
  auto layers = [](const std::vector<SynthTensorInfo> &plan) {
    std::set<std::string> blk;
    for (const auto &t : plan)
      if (t.name.rfind("blk.", 0) == 0) blk.insert(t.name.substr(0, t.name.find('.', 4)));
    return blk.size();
  };
  CHECK(layers(a) == 48);
  CHECK(layers(b) == 2);
  // Every tensor of the cut plan exists in the full one with the same shape (layer 0 and 1 alike).
  for (const auto &t : b) {
    INFO(t.name);
    auto it = std::find_if(a.begin(), a.end(), [&](const SynthTensorInfo &u) { return u.name == t.name; });
    REQUIRE(it != a.end());
    CHECK(it->ne == t.ne);
  }
  const auto keys = synthetic_model_keys(cut);
  CHECK(std::find(keys.begin(), keys.end(), "qwen3moe.block_count") != keys.end());
}
