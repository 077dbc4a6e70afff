// Helpers for the tokenizer tests: small vocabularies written with GgufWriter, an independent
// GPT-2 byte alphabet, and a random UTF-8 string generator covering all Unicode planes.
//
//   BpeSpec s;  s.merges = {{"h", "e"}};          // tokens 0..255 are the 256 single bytes
//   auto v = load_vocab(s.write());                // byte b has id b; merges append ids 256, ...
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "tokenizer/vocab.h"

namespace tok_test {

// GPT-2 byte alphabet, written from its definition (printable Latin-1 maps to itself, the rest
// to U+0100 + n in byte order).
inline std::string bl_char(uint8_t b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  uint32_t cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = 256 + uint32_t(n);
  }
  std::string s;
  if (cp < 0x80) s.push_back(char(cp));
  else { s.push_back(char(0xC0 | (cp >> 6))); s.push_back(char(0x80 | (cp & 0x3F))); }
  return s;
}
inline std::string bl(const std::string &bytes) {
  std::string s;
  for (unsigned char c : bytes) s += bl_char(c);
  return s;
}

struct BpeSpec {
  std::string model = "gpt2";
  std::string pre = "gpt2";
  bool has_pre = true;
  std::vector<std::pair<std::string, std::string>> merges;  // raw byte strings; result appended as a token
  std::vector<std::pair<std::string, int32_t>> extra;       // (text as stored, token type)
  std::map<std::string, int64_t> ints;                      // e.g. tokenizer.ggml.bos_token_id
  std::map<std::string, bool> flags;                        // e.g. tokenizer.ggml.add_bos_token
  std::vector<std::string> raw_merges;                      // stored as is, after `merges`

  std::vector<std::string> tokens() const {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(bl_char(uint8_t(b)));
    for (const auto &m : merges) t.push_back(bl(m.first + m.second));
    for (const auto &e : extra) t.push_back(e.first);
    return t;
  }
  std::vector<uint8_t> write() const {
    moe::GgufWriter w;
    w.set("general.architecture", moe::GgufValue::make_str("test"));
    w.set("tokenizer.ggml.model", moe::GgufValue::make_str(model));
    if (has_pre) w.set("tokenizer.ggml.pre", moe::GgufValue::make_str(pre));
    std::vector<std::string> toks = tokens();
    std::vector<int32_t> types(toks.size(), 1);
    for (size_t k = 0; k < extra.size(); ++k) types[256 + merges.size() + k] = extra[k].second;
    std::vector<std::string> ms;
    for (const auto &m : merges) ms.push_back(bl(m.first) + " " + bl(m.second));
    for (const auto &m : raw_merges) ms.push_back(m);
    w.set("tokenizer.ggml.tokens", moe::GgufValue::make_str_array(toks));
    w.set("tokenizer.ggml.token_type", moe::GgufValue::make_i32_array(types));
    w.set("tokenizer.ggml.merges", moe::GgufValue::make_str_array(ms));
    for (const auto &kv : ints) w.set(kv.first, moe::GgufValue::make_u32(uint32_t(kv.second)));
    for (const auto &kv : flags) w.set(kv.first, moe::GgufValue::make_bool(kv.second));
    return w.write_memory();
  }
};

inline std::unique_ptr<moe::Vocab> load_vocab(const std::vector<uint8_t> &bytes, bool allow_unknown_pre = false) {
  auto f = moe::GgufFile::from_memory(bytes.data(), bytes.size());
  return moe::Vocab::from_gguf(*f, allow_unknown_pre);
}

inline void append_utf8(std::string &s, uint32_t cp) {
  if (cp < 0x80) s.push_back(char(cp));
  else if (cp < 0x800) { s.push_back(char(0xC0 | (cp >> 6))); s.push_back(char(0x80 | (cp & 0x3F))); }
  else if (cp < 0x10000) {
    s.push_back(char(0xE0 | (cp >> 12))); s.push_back(char(0x80 | ((cp >> 6) & 0x3F))); s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xF0 | (cp >> 18))); s.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F))); s.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Random valid UTF-8: pieces of English, digits, punctuation, whitespace runs (ASCII and
// Unicode spaces, CR/LF), CJK, kana, Hangul, Devanagari with marks, combining accents, emoji
// with ZWJ and skin tones, and uniformly random scalar values from every plane.
inline std::string random_text(std::mt19937 &rng, size_t pieces) {
  auto pick = [&](uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng); };
  static const char *const words[] = {"the", "The", "HELLO", "don't", "I'm", "we'll", "x", "foo_bar", "CamelCase",
                                      "naïve", "e\xcc\x81", "def", "return", "<", "</", "|", "<|", "~"};
  static const uint32_t spaces[] = {' ', ' ', ' ', '\t', '\n', '\r', 0xA0, 0x3000, 0x2028, 0x85, 0x200B, 0x0B};
  std::string s;
  for (size_t i = 0; i < pieces; ++i) {
    switch (pick(0, 11)) {
      case 0: s += words[pick(0, sizeof(words) / sizeof(words[0]) - 1)]; break;
      case 1: for (uint32_t k = pick(1, 5); k--;) append_utf8(s, spaces[pick(0, 11)]); break;
      case 2: for (uint32_t k = pick(1, 9); k--;) append_utf8(s, pick('0', '9')); break;
      case 3: for (uint32_t k = pick(1, 4); k--;) append_utf8(s, pick(0x21, 0x2F)); break;
      case 4: for (uint32_t k = pick(1, 6); k--;) append_utf8(s, pick(0x4E00, 0x9FFF)); break;
      case 5: for (uint32_t k = pick(1, 6); k--;) append_utf8(s, pick(0x3040, 0x30FF)); break;
      case 6: for (uint32_t k = pick(1, 4); k--;) append_utf8(s, pick(0xAC00, 0xD7A3)); break;
      case 7: append_utf8(s, pick(0x0915, 0x0939)); append_utf8(s, pick(0x093E, 0x094D)); break;
      case 8:
        append_utf8(s, pick(0x1F300, 0x1FAFF));
        if (pick(0, 1)) {
          append_utf8(s, 0x200D);
          append_utf8(s, pick(0x1F300, 0x1F5FF));
        }
        if (pick(0, 1)) append_utf8(s, pick(0x1F3FB, 0x1F3FF));
        break;
      case 9: append_utf8(s, pick('a', 'z')); append_utf8(s, pick(0x0300, 0x036F)); break;
      default: {
        uint32_t cp = pick(0, 0x10FFFF);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        append_utf8(s, cp);
      }
    }
  }
  return s;
}

}  // namespace tok_test
