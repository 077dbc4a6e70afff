// Pre-tokenizers: split text (as code points) into the words that BPE then merges, exactly as
// the reference implementation's regex pipelines do, but with hand-written matchers.
//
//   PreTokenizer pre = PreTokenizer::from_name("qwen2");        // throws InvalidVocab if unknown
//   std::vector<uint32_t> words;  pre.split(cps.data(), cps.size(), words);  // word lengths in code points
//
// Semantics follow the reference rather than the original Python/Rust regexes where they differ:
// for the regex-engine pipelines (qwen2, deepseek-v3, gpt-4o) non-ASCII code points are reduced
// to their category (so e.g. \p{M} never counts as a letter in gpt-4o's letter classes, and
// ASCII '~' is neither \p{P} nor \p{S}); gpt2 and llama3 use full category flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moe {

enum class PreType : int {
  Gpt2,        // "gpt2", "gpt-2", ... : 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Llama3,      // "llama3", "llama-bpe", ...: contractions, [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}, ...
  Qwen2,       // "qwen2": as llama3 but single digits
  DeepseekV3,  // "deepseek-v3": \p{N}{1,3} | CJK/kana runs | punctuation-aware letter words
  DeepseekLlm, // "deepseek-llm" (DeepSeek-V2): newlines | cased-letter runs | punctuation | CJK/Hangul | digits
  Gpt4o,       // "gpt-4o" (o200k, gpt-oss): case-aware words, \p{N}{1,3}, [\r\n/]* tails
};

class PreTokenizer {
public:
  explicit PreTokenizer(PreType t = PreType::Gpt2, bool ignore_merges = false)
      : type_(t), ignore_merges_(ignore_merges) {}
  // Known tokenizer.ggml.pre names; returns false when the name is not recognised.
  static bool from_name(const std::string &name, PreTokenizer *out);
  static const char *type_name(PreType t);

  PreType type() const { return type_; }
  // llama3-family vocabularies emit a whole word as one token when it is in the vocabulary.
  bool ignore_merges() const { return ignore_merges_; }

  // Appends the length (in code points) of every word of cps[0..n), in order; they sum to n.
  void split(const uint32_t *cps, size_t n, std::vector<uint32_t> &word_lens) const;

private:
  PreType type_;
  bool ignore_merges_;
};

}  // namespace moe
