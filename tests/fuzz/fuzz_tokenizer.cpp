// libFuzzer target for the tokenizer: arbitrary bytes as text to encode (fixed vocabularies,
// every pre-tokenizer, SentencePiece), as a raw GGUF file for the vocabulary loader, and as a
// recipe for a self-made vocabulary (tokens, types, merges, special ids) that is then loaded
// and used. moe::Error is the only accepted failure; invariants are checked with a trap.
//
//   fuzz-tokenizer -runs=20000 corpus/
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

using namespace moe;

namespace {

#define FUZZ_CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

std::string bl(const std::string &bytes) {
  std::string s;
  for (unsigned char c : bytes) utf8_append(s, byte_to_cp(c));
  return s;
}

std::unique_ptr<Vocab> load(const std::vector<uint8_t> &b, bool allow_unknown_pre = false) {
  auto f = GgufFile::from_memory(b.data(), b.size());
  return Vocab::from_gguf(*f, allow_unknown_pre);
}

std::vector<uint8_t> bpe_vocab(const char *pre) {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(bl(std::string(1, char(b))));
  const char *const merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "t"}, {" t", "he"}, {"e", "r"},
                                   {"i", "n"}, {" ", "a"}, {"\xe4", "\xb8"}, {"\xe4\xb8", "\xad"}, {"1", "2"}};
  std::vector<std::string> ms;
  for (const auto &m : merges) {
    toks.push_back(bl(std::string(m[0]) + m[1]));
    ms.push_back(bl(m[0]) + " " + bl(m[1]));
  }
  std::vector<int32_t> types(toks.size(), TOKEN_TYPE_NORMAL);
  for (const auto &sp : {std::make_pair("<|endoftext|>", 3), std::make_pair("<think>", 4), std::make_pair("<|im_start|>", 3),
                         std::make_pair("</think>", 4), std::make_pair("<x", 4)}) {
    toks.push_back(sp.first);
    types.push_back(sp.second);
  }
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::make_str(pre));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(toks));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  w.set("tokenizer.ggml.merges", GgufValue::make_str_array(ms));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::make_u32(uint32_t(toks.size() - 3)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::make_bool(true));
  return w.write_memory();
}

std::vector<uint8_t> spm_vocab() {
  std::vector<std::string> toks{"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types{2, 3, 3};
  std::vector<float> scores{0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    toks.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  for (const char *t : {"\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81" "a", "\xe2\x96\x81" "ab", "\xe4\xb8\xad"}) {
    toks.push_back(t);
    types.push_back(1);
    scores.push_back(-float(toks.size()));
  }
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::make_str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(toks));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  w.set("tokenizer.ggml.scores", GgufValue::make_f32_array(scores));
  return w.write_memory();
}

bool well_formed(const std::string &s) {
  const auto *u = reinterpret_cast<const unsigned char *>(s.data());
  for (size_t i = 0; i < s.size();) {
    int n = utf8_valid_len(u + i, s.size() - i);
    if (n <= 0) return false;
    i += size_t(n);
  }
  return true;
}

// What decode(encode(text)) gives back. SentencePiece writes spaces as U+2581 and decode maps
// every U+2581 to a space, so one typed by the user comes back as a space (as in the reference).
std::string expected_decode(const Vocab &v, const std::string &text) {
  if (v.kind() != VocabKind::SPM) return text;
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

// Encode, check ids, decode, stream. roundtrip: decode(encode(text)) must give expected_decode(text).
void exercise(const Vocab &v, const std::string &text, bool add_special, bool parse_special, bool roundtrip) {
  std::vector<int32_t> ids = v.encode(text, add_special, parse_special);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < v.n_tokens());
  std::string back = v.decode(ids.data(), ids.size(), false);
  if (roundtrip && !add_special && !parse_special && well_formed(text)) FUZZ_CHECK(back == expected_decode(v, text));
  StreamDetokenizer sd(v, parse_special);
  for (int32_t id : ids) FUZZ_CHECK(well_formed(sd.push(id)));
  FUZZ_CHECK(well_formed(sd.flush()));
  for (size_t k = 0; k < ids.size() && k < 8; ++k) {
    (void)v.token_to_piece(ids[k], true);
    (void)v.token_type(ids[k]);
    (void)v.is_eog(ids[k]);
  }
}

// Vocabulary recipe: lines of the input. "m<rest>" adds a merge, "k<digit><n>" sets a special
// id key, anything else adds a token whose type is the first byte mod 7.
void from_recipe(const uint8_t *data, size_t size) {
  std::string in(reinterpret_cast<const char *>(data), size);
  std::vector<std::string> toks;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  GgufWriter w;
  static const char *const pres[] = {"gpt2", "qwen2", "deepseek-v3", "gpt-4o", "llama-bpe", "deepseek-llm", "unknown-pre"};
  static const char *const keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                     "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id"};
  bool spm = !in.empty() && (uint8_t(in[0]) & 0x80);
  if (!spm) {
    for (int b = 0; b < 256; ++b) {
      toks.push_back(bl(std::string(1, char(b))));
      types.push_back(1);
    }
  }
  size_t start = 0;
  while (start <= in.size() && toks.size() < 2000) {
    size_t nl = in.find('\n', start);
    if (nl == std::string::npos) nl = in.size();
    std::string line = in.substr(start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    if (line[0] == 'm') {
      merges.push_back(line.substr(1));
    } else if (line[0] == 'k' && line.size() >= 3) {
      w.set(keys[uint8_t(line[1]) % 4], GgufValue::make_u32(uint32_t(uint8_t(line[2])) * 7));
    } else {
      types.push_back(uint8_t(line[0]) % 8);  // 7 is not a valid type
      toks.push_back(line.substr(1));
    }
  }
  w.set("tokenizer.ggml.model", GgufValue::make_str(spm ? "llama" : "gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::make_str(pres[size % 7]));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(toks));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  if (!spm) w.set("tokenizer.ggml.merges", GgufValue::make_str_array(merges));
  w.set("tokenizer.ggml.add_eos_token", GgufValue::make_bool(size & 1));
  std::unique_ptr<Vocab> v;
  try {
    v = load(w.write_memory(), size & 2);
  } catch (const Error &) {
    return;  // rejected: fine
  }
  if (!v) return;
  exercise(*v, in, size & 4, size & 8, false);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const pres[] = {"gpt2", "llama-bpe", "qwen2", "deepseek-v3", "gpt-4o", "deepseek-llm"};
  static std::vector<std::unique_ptr<Vocab>> fixed = [] {
    std::vector<std::unique_ptr<Vocab>> v;
    for (const char *p : pres) v.push_back(load(bpe_vocab(p)));
    v.push_back(load(spm_vocab()));
    return v;
  }();
  if (size < 1) return 0;
  uint8_t sel = data[0];
  ++data;
  --size;
  std::string text(reinterpret_cast<const char *>(data), size);
  switch (sel % 4) {
    case 0:
    case 1: {  // text through a fixed vocabulary
      const Vocab &v = *fixed[(sel >> 2) % fixed.size()];
      exercise(v, text, sel & 0x40, sel & 0x80, true);
      break;
    }
    case 2: {  // raw GGUF bytes
      try {
        auto f = GgufFile::from_memory(data, size);
        auto v = Vocab::from_gguf(*f, sel & 4);
        if (v) exercise(*v, "Hello world 123 \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>", sel & 8, sel & 16, false);
      } catch (const Error &) {
      }
      break;
    }
    default:
      from_recipe(data, size);
  }
  return 0;
}
